# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf's host-backend memory estimate counts what the run holds at its peak (every rank's buffers, the
reference only where a check reads it, the temporaries of making inputs and of checking them), measured here with
tracemalloc on small shapes; and its refusal advises what lowers the need for the run's kind (a model layout ignores
-b/-e)."""

import io
import random
import tracemalloc

import pytest
from nccl_tide.dtypes import dtype
from nccl_tide.perf import collectives, harness, host_backend, host_memory, reduce_scatter
from nccl_tide.perf.options import check_flags, parser, resolve

SLACK = 256 << 10  # the run's Python objects (lists, the layout's tables): a few KiB to a few tens of KiB


def options(*argv):
    a = parser().parse_args(list(argv))
    check_flags(a)
    return resolve(a, list(argv), gpu=lambda: False)


def traced_peak(coll: str, numels, rows, world, dt, out_dt, check) -> int:
    case = host_backend.Case(list(numels), list(rows), world, None)
    o = host_backend.Opts(dtype(dt), dtype(out_dt), "sum", 1.0, 1, 0, check, random.randrange(1 << 20))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        host_backend.measure(collectives.by_name(coll), case, o)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def scratch(numels, rows, world) -> int:
    """The C reduce-scatter's fp32 vectors, which tracemalloc does not see."""
    return reduce_scatter.REDUCE_SCRATCH * 4 * max(-(-n // r // world) * r for n, r in zip(numels, rows))


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("check", ["0", "1"])
def test_flat_estimate_covers_the_runs_peak(coll, check):
    rng = random.Random()
    ranks = rng.choice([2, 3, 4])
    d = rng.choice(["bf16", "fp16", "float"])
    out = rng.choice(["fp32", d]) if d != "float" else "fp32"  # an output type equal to -d is also run in place
    size = 16 * ranks * rng.randint(1 << 12, 1 << 14)
    argv = [coll, "--backend", "host", "--ranks", str(ranks), "-b", str(size), "-e", str(size), "-d", d, "-c", check]
    o = options(*argv, *(["--out-type", out] if coll == "reduce_scatter" else []))
    case = harness.cases(o, io.StringIO())[-1]
    est = host_memory.host_bytes(o)
    peak = traced_peak(coll, case.numels, case.rows, ranks, o.dtype.name, o.out_dtype.name, int(check))
    assert peak <= est + SLACK, (peak, est)  # the refusal's figure is never below what the run holds
    untraced = scratch(case.numels, case.rows, ranks) if coll == "reduce_scatter" else 0
    assert est <= 1.3 * peak + untraced, (peak, est)  # nor far above it


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_model_shaped_estimate_covers_the_runs_peak(coll):
    rng = random.Random()
    world = rng.choice([2, 3, 4, 8])
    rows = [rng.choice([1, 64, 256]) for _ in range(rng.randint(2, 6))]
    numels = [r * rng.randint(100, 4000) for r in rows]
    d = rng.choice(["bf16", "fp16", "fp32"])
    out = "fp32" if coll == "reduce_scatter" else d
    for check in (0, 1):
        est = collectives.by_name(coll).host_peak_bytes(numels, rows, world, dtype(d).size, dtype(out).size,
                                                        bool(check))
        peak = traced_peak(coll, numels, rows, world, d, out, check)
        assert peak <= est + SLACK, (check, peak, est)
        assert est <= 1.3 * peak + (scratch(numels, rows, world) if coll == "reduce_scatter" else 0), (check, peak, est)


def test_an_unchecked_all_gather_holds_no_reference():
    # -c 0 reads no reference: the run makes none, and the estimate is every rank's shards and outputs, (W + 1) x S
    o = options("all_gather", "--backend", "host", "--ranks", "2", "-b", "1M", "-e", "1M", "-c", "0")
    S = host_memory.largest_case_bytes(o)
    assert host_memory.host_bytes(o) == 3 * S
    assert traced_peak("all_gather", [S // 4], [1], 2, "fp32", "fp32", 0) <= 3 * S + SLACK


def refusal(capsys, monkeypatch, *argv) -> str:
    monkeypatch.setattr(host_memory, "available_host_memory", lambda: (1 << 20, "a test's figure"))
    with pytest.raises(SystemExit) as e:
        host_memory.check(options(*argv))
    assert e.value.code == 255
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs about" in err and "0.0 GiB are available (a test's figure)" in err
    return err


@pytest.mark.parametrize("check", ["0", "1"])
def test_a_model_layouts_refusal_advises_what_sizes_it(capsys, monkeypatch, check):
    err = refusal(capsys, monkeypatch, "all_gather", "--backend", "host", "--ranks", "8", "--layout",
                  "qwen3-30b-a3b-layer", "-c", check)
    assert "lower -e" not in err and "use a smaller -e" not in err  # -e sizes no model layout
    assert "use fewer --ranks, a smaller --layout (llama3-8b-layer)" in err
    assert "a narrower -d (bf16)" in err  # -d float is the default
    assert "-b/-e do not size a model layout: --layout qwen3-30b-a3b-layer fixes the size" in err
    assert ("-c 0" in err) == (check == "1")


def test_a_flat_runs_refusal_advises_e_and_ranks(capsys, monkeypatch):
    err = refusal(capsys, monkeypatch, "reduce_scatter", "--backend", "host", "--ranks", "8", "-b", "64M", "-e", "64M")
    assert "for its largest size" in err and "use a smaller -e, fewer --ranks or -c 0 (no reference copy)" in err
    assert "--layout" not in err
