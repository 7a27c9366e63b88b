# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""nccl_tide.perf.issue_cost (tide-perf's host and gpu columns) on the CPU.

host_issue_us(per_rank=True): the last rank's call is timed apart from the others', so that on loopback (where the
last rank's call issues every rank's deferred rounds) the rounds' launches and the per-call bookkeeping can be told
apart; the gate and the device are stand-ins, the "calls" are Python functions of known, different durations. And
the calls per host sample: the P x W cap applies only off the graph route."""

import random
import time
import types
from types import SimpleNamespace

import pytest

from nccl_tide.perf import issue_cost as ic


class _Gate:
    """The gate event: query() False = still closed when the issue loop ended (the sample counts)."""

    def __init__(self, opened: bool):
        self.opened = opened

    def query(self):
        return self.opened


class _World:
    def __init__(self, n):
        self.n_ranks = n
        self.syncs = 0

    def synchronize(self):
        self.syncs += 1


def _busy(us):
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass
    return 0


@pytest.fixture
def stand_ins(monkeypatch):
    torch_stub = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: None))
    monkeypatch.setattr(ic, "_torch", lambda: torch_stub)
    gates = []

    def gate(world, cycles=ic.GATE_CYCLES):
        g = _Gate(opened=False)
        gates.append(g)
        return g

    monkeypatch.setattr(ic, "_gate", gate)
    return gates


@pytest.mark.parametrize("n", [2, 5])
def test_per_rank_split_attributes_the_last_call(stand_ins, n):
    rng = random.Random(24 + n)
    other_us = rng.uniform(100, 150)
    last_us = rng.uniform(2500, 3000)
    calls = [lambda: _busy(other_us)] * (n - 1) + [lambda: _busy(last_us)]
    prep = ic.PreparedCalls(_World(n), calls)
    out = ic.host_issue_us(prep, calls=2, samples=5, per_rank=True)
    assert out["valid_samples"] == 5
    # A busy-wait lasts at least its duration; a loaded CI machine may stretch it (preemption), so the upper bounds
    # only rule out misattribution: the last call's time counted among the others' (others would then exceed
    # last_us / (n - 1) >= 625 us, 4x the longest other call), or the others' counted as the last's.
    assert last_us <= out["last_rank_us"] < 3 * last_us + 1000, out
    assert other_us <= out["other_ranks_us"] < min(last_us / (n - 1), 3 * other_us + 1000), out
    assert out["last_rank_us"] > 3 * out["other_ranks_us"], out
    mean = (last_us + (n - 1) * other_us) / n
    assert mean <= out["host_us"] < 3 * mean + 1000, out


def test_without_per_rank_no_split_keys(stand_ins):
    prep = ic.PreparedCalls(_World(3), [lambda: _busy(50)] * 3)
    out = ic.host_issue_us(prep, calls=1, samples=3)
    assert "last_rank_us" not in out and "other_ranks_us" not in out
    assert out["valid_samples"] == 3 and out["host_us"] >= 50


def test_opened_gate_voids_samples(stand_ins, monkeypatch):
    """A sample whose gate opened during the loop is dropped, per-rank figures included."""
    monkeypatch.setattr(ic, "_gate", lambda world, cycles=ic.GATE_CYCLES: _Gate(opened=True))
    prep = ic.PreparedCalls(_World(2), [lambda: _busy(20)] * 2)
    out = ic.host_issue_us(prep, calls=1, samples=3, per_rank=True)
    assert out["valid_samples"] == 0
    assert out["host_us"] != out["host_us"] and out["last_rank_us"] != out["last_rank_us"]  # NaN


def test_failed_call_raises(stand_ins, monkeypatch):
    from nccl_tide import _native as N

    monkeypatch.setattr(N, "last_error", lambda: "stand-in failure")
    prep = ic.PreparedCalls(_World(2), [lambda: 0, lambda: 7])
    with pytest.raises(RuntimeError, match="stand-in failure"):
        prep.issue_one(1)
    with pytest.raises(RuntimeError, match="stand-in failure"):
        prep.issue_all()


# -- calls per host sample: the P x W cap only off the graph route ---------------------------------------------------

@pytest.mark.parametrize("limit", [2, 4, 64])
def test_graph_route_rule(limit):
    params = {"NCCL_TIDE_EAGER_GRAPHS": "1", "NCCL_TIDE_TOKEN_RS_CHUNKS": str(limit)}
    for chunks, graph in ((1, True), (limit, True), (limit + 1, False)):
        one_node = SimpleNamespace(n_nodes=1, rs_num_chunks=chunks)
        assert ic.takes_graph_route(one_node, "ag", params)
        assert ic.takes_graph_route(one_node, "rs", params) is graph
        off = dict(params, NCCL_TIDE_EAGER_GRAPHS="0")
        assert not ic.takes_graph_route(one_node, "ag", off) and not ic.takes_graph_route(one_node, "rs", off)
    two_nodes = SimpleNamespace(n_nodes=2, rs_num_chunks=1)
    assert not ic.takes_graph_route(two_nodes, "ag", params) and not ic.takes_graph_route(two_nodes, "rs", params)


def test_calls_per_sample_caps_only_eager_calls():
    assert ic.calls_per_sample(512, True) == 6  # 64 parameters at W = 8 on the graph route
    assert ic.calls_per_sample(512, False) == 1  # the same eager: one call per sample (queue bound)
    assert ic.calls_per_sample(72, False) == 6 and ic.calls_per_sample(150, False) == 4
    assert ic.calls_per_sample(300, False) == 2 and ic.calls_per_sample(301, False) == 1  # ~600 entries a sample
    assert ic.calls_per_sample(100, False) == 6 and ic.calls_per_sample(101, False) == 5
    assert ic.calls_per_sample(10_000, False, calls=9) == 1 and ic.calls_per_sample(3, True, calls=9) == 9
