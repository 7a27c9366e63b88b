# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""One rank's share (benchmarks/share/): the interference method on the CPU.

Where the harness enqueues the GEMM (after the first side unit, before the others), how a run is judged valid
(side work outlasting the GEMM, GEMM enqueued before the GPU started, no gap in the side work), the stream
operations a paced share needs per unit (why a Llama-70B share outran the driver's queue and a Llama-8B one did
not), the incoming-source option's HBM accounting, and the reduce grid's rate constant against its header.
"""

import contextlib
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from share import cli, harness, method, plan

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------------------------
# A stand-in GPU whose stream queue holds `depth` side units: enqueueing unit u > depth blocks until unit u - depth
# has run, so the GPU has started (left the head sleep) once more than `depth` units were enqueued. That is what
# a paced Llama-70B share did on the H200 (about 700 stream operations per unit, K = 3 units).
# ---------------------------------------------------------------------------------------------------------------


class _Queue:
    def __init__(self, depth):
        self.depth, self.units, self.log, self.ticks = depth, 0, [], 0

    def finished_units(self):
        return max(0, self.units - self.depth)


class _Event:
    def __init__(self, q, enable_timing=False):
        self.q, self.at, self.after_units = q, None, None

    def record(self, stream=None):
        self.q.ticks += 1  # enqueue order stands in for time: a later record is a later timestamp
        self.at, self.after_units = self.q.ticks, self.q.units

    def query(self):
        if self.after_units == 0:  # recorded behind the head sleep only: reached once the GPU started
            return self.q.units > self.q.depth
        return self.q.finished_units() >= self.after_units

    def elapsed_time(self, other):
        return float(other.at - self.at)


class _Stream:
    def wait_stream(self, other):
        pass

    def wait_event(self, ev):
        pass


def _harness(depth, runs=3):
    q = _Queue(depth)
    cuda = SimpleNamespace(synchronize=lambda: None, Event=lambda enable_timing=False: _Event(q, enable_timing),
                           stream=lambda s: contextlib.nullcontext())
    g = SimpleNamespace(torch=SimpleNamespace(cuda=cuda), sleep_ms=lambda ms, stream=None: None)
    h = harness.Harness.__new__(harness.Harness)
    h.g, h.runs, h.gs, h.head = g, runs, _Stream(), _Stream()
    h.gemm = lambda: q.log.append("gemm")

    class Side:
        streams = [_Stream()]

        def unit(self):
            q.units += 1
            q.log.append("unit")

    return h, Side(), q


@pytest.mark.parametrize("order,expected", [("gemm-after-first", ["unit", "gemm", "unit", "unit"]),
                                            ("side-first", ["unit", "unit", "unit", "gemm"])])
def test_harness_enqueue_order(order, expected):
    h, side, q = _harness(depth=10, runs=2)
    out = h.beside(side, 3, 0.1, order)
    assert q.log == expected * 2
    assert out["gemm_late"] == [False, False] and out["side_gap"] == [False, False]
    assert out["run_valid"] == [True, True] and all(m > 0 for m in out["margins"])


def test_side_first_order_enqueues_the_gemm_late_when_the_queue_fills():
    """The failure this guards: with more side work than the driver queues, the host blocks in the side's enqueue
    until the GPU (past the gate) has drained some, and the GEMM lands on its stream at an uncontrolled point. The
    default order puts it there after the first unit, before any blocking."""
    h, side, q = _harness(depth=2)
    old = h.beside(side, 3, 0.1, "side-first")
    assert old["gemm_late"] == [True] * 3 and old["run_valid"] == [False] * 3
    h, side, q = _harness(depth=2)
    new = h.beside(side, 3, 0.1, "gemm-after-first")
    assert new["gemm_late"] == [False] * 3 and new["run_valid"] == [True] * 3
    s = method.beside_summary(new, 1.0)
    assert s["valid_runs"] == 3 and s["gemm_late_runs"] == 0
    s = method.beside_summary(old, 1.0)
    assert s["valid_runs"] == 0 and s["gemm_late_runs"] == 3


def test_a_side_whose_stream_runs_dry_is_flagged():
    h, side, q = _harness(depth=10)

    class Ev(_Event):
        def query(self):  # the GPU finished everything the host enqueued: the side stream ran dry
            return True

    h.g.torch.cuda.Event = lambda enable_timing=False: Ev(q, enable_timing)
    out = h.beside(side, 3, 0.1, "gemm-after-first")
    assert out["side_gap"] == [True] * 3 and out["run_valid"] == [False] * 3


def test_beside_summary_takes_the_valid_runs():
    runs = {"times": [1.0, 1.1, 3.0, 1.2], "margins": [1.0, 1.0, 1.0, -0.5], "gemm_late": [False, False, True, False],
            "side_gap": [False, False, False, False]}
    runs["run_valid"] = [m > 0 and not la and not gp for m, la, gp in zip(runs["margins"], runs["gemm_late"],
                                                                          runs["side_gap"])]
    s = method.beside_summary(runs, 0.5)
    assert s["valid_runs"] == 2 and s["gemm_late_runs"] == 1 and s["covered_runs"] == 3
    assert s["slowdown"] == pytest.approx(1.05 / 0.5)  # median of the valid 1.0 and 1.1
    assert s["slowdown_all"] == pytest.approx(1.15 / 0.5)
    assert s["with_ms"]["n"] == 2 and s["margin_ms"]["n"] == 4
    none = dict(runs, run_valid=[False] * 4)
    assert method.beside_summary(none, 0.5)["with_ms"]["n"] == 4  # falls back to every run, valid_runs says 0
    with pytest.raises(ValueError):
        method.beside_summary(dict(runs, margins=[1.0]), 0.5)
    with pytest.raises(ValueError):
        method.beside_summary(runs, 0.0)


def test_paced_stream_ops_count_the_pieces():
    # one transfer of 10 MiB in 4 MiB pieces: 3 pieces, a wait and a copy batch each, one arrival write
    assert plan.paced_stream_ops([[10 << 20]], 4 << 20) == 3 * 2 + 1
    assert plan.paced_stream_ops([[4 << 20], [1, 2]], 4 << 20) == (2 + 1) + (2 + 1)
    assert plan.paced_stream_ops([[]], 4 << 20) == 0
    with pytest.raises(ValueError):
        plan.paced_stream_ops([[1]], 0)


def test_llama70b_paced_share_is_four_times_the_stream_ops_of_8b(native):
    """Why 70B and not 8B: the same 4 MiB pieces, but ~4x the bytes, so ~4x the stream operations per unit; with
    K = 3 units the 70B share enqueues about 2,100 operations on one stream before the GEMM (side-first order)."""
    from nccl_tide import Layout
    from nccl_tide.models import model_params, numels_and_rows

    ops = {}
    for name in ("llama3-8b-layer", "llama3-70b-layer"):
        numels, rows = numels_and_rows(model_params(name))
        lay = Layout(numels, "bf16", 8, rank=0, row_numels=rows)
        _, incoming = plan.ag_plan(lay.params, 8, lambda s: 1 << 40, 0, 1 << 41)
        ops[name] = plan.paced_stream_ops([[c[2] for c in incoming]], 4 << 20)
        assert ops[name] == 2 * math.ceil(sum(c[2] for c in incoming) / (4 << 20)) + 1
    assert 150 < ops["llama3-8b-layer"] < 250 and 600 < ops["llama3-70b-layer"] < 800
    assert 3 * ops["llama3-70b-layer"] > 2000 > 3 * ops["llama3-8b-layer"]


def test_incoming_source_accounting_and_validation():
    assert plan.incoming_hbm_bytes(10, 100, "device") == 20 + 200
    assert plan.incoming_hbm_bytes(10, 100, "host") == 20 + 100  # the write into this GPU's HBM only
    assert plan.source_tag("device") == "" and "host" in plan.source_tag("host")
    with pytest.raises(ValueError):
        plan.incoming_hbm_bytes(1, 1, "peer")
    a = cli.parser().parse_args([])
    assert a.incoming_source == "device" and a.order == "gemm-after-first"
    a = cli.parser().parse_args(["--incoming-source", "host", "--order", "side-first"])
    assert cli.validate(a) is None
    for key, bad in (("incoming_source", "peer"), ("order", "gemm-first")):
        b = cli.parser().parse_args([])
        setattr(b, key, bad)
        assert "--" + key.replace("_", "-") in cli.validate(b)


def test_reduce_rate_constant_matches_the_recorded_figures():
    """kReduceCtaGBps is the per-CTA rate of the reduce beside the arrivals it keeps pace with, at the grid size its
    own rule picks (10 CTAs for 8 bf16 inputs at 370 GB/s): share timelines on an H100 measured 64.5-67.0 GB/s per
    CTA at 10 CTAs and 66.7-68.5 at 8, each run's median over its full chunks."""
    text = (REPO / "plugin/cuda/reduce_kernel.h").read_text()
    rate = float(re.search(r"constexpr double kReduceCtaGBps = ([0-9.]+);", text).group(1))
    headroom = float(re.search(r"constexpr double kReducePaceHeadroom = ([0-9.]+);", text).group(1))
    per_cta_at = {8: (66.7, 68.5), 10: (64.5, 67.0)}  # GB/s per CTA beside the arrivals: lowest and highest run median
    arrivals = 370 * 20 / 14  # reduce traffic that keeps pace with 370 GB/s of incoming bf16 (8 inputs, fp32 out)
    ctas = math.ceil(headroom * arrivals / rate)
    assert ctas == 10
    lo, hi = per_cta_at[ctas]
    assert lo <= rate <= hi + 1  # the constant is what the grid it picks sustained
    assert ctas * lo >= 1.2 * arrivals  # and that grid kept pace with a fifth to spare even at its slowest run
    assert 8 * per_cta_at[8][0] < 1.05 * arrivals  # where 8 CTAs (the rule before) had almost none