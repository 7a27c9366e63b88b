"""LoopbackWorld's Python side without a GPU (the library calls replaced by a recorder): a world-wide collective
checks every rank's arguments before it issues the first rank's call, so a bad argument of rank k never leaves
ranks < k queued (their streams would wait forever for the others)."""

import threading

import pytest

import nccl_tide
from nccl_tide import _native as N
from nccl_tide import cuda as C
from nccl_tide._lifetime import Lifetime
from nccl_tide.errors import InvalidArgumentError

W = 3


class _Recorder:
    """tideAllGather / tideReduceScatter recorded; every other entry point is the real library's (layouts)."""

    def __init__(self, real):
        self.calls = []
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def tideAllGather(self, comm, layout, send, table, slot, stream):
        self.calls.append(("ag", comm, stream))
        return 0

    def tideReduceScatter(self, comm, layout, table, out, out_code, op, scale, staging, stream):
        self.calls.append(("rs", comm, stream))
        return 0


@pytest.fixture
def world(monkeypatch):
    rec = _Recorder(N.lib())
    monkeypatch.setattr(N, "lib", lambda: rec)
    w = object.__new__(C.LoopbackWorld)  # no tideLoopbackCreate: the Python logic only
    w._life = Lifetime("LoopbackWorld")
    w._aborted = set()
    w._comms = [101, 102, 103]
    w._streams = [201, 202, 203]  # raw stream addresses
    w._slots = []
    w.n_ranks = W
    monkeypatch.setattr(C.LoopbackWorld, "_rank_streams", lambda self, streams: list(self._streams))
    yield w, rec
    w._comms = []  # nothing to destroy


@pytest.fixture
def layouts():
    ls = [nccl_tide.Layout([1000, 37], "bf16", W, rank=r) for r in range(W)]
    yield ls
    for lay in ls:
        lay.close()


def test_all_gather_checks_every_rank_before_issuing(world, layouts):
    w, rec = world
    good = [0x10000 * (r + 1) for r in range(W)]
    with pytest.raises(InvalidArgumentError, match=r"sendbufs\[2\]"):
        w.all_gather(layouts, good, sendbufs=[good[0], good[1], "not a buffer"])
    assert rec.calls == [], "ranks 0 and 1 were issued before rank 2's bad argument was found"
    w.all_gather(layouts, good, sendbufs=good)
    assert rec.calls == [("ag", 101, 201), ("ag", 102, 202), ("ag", 103, 203)]


def test_reduce_scatter_checks_every_rank_before_issuing(world, layouts):
    w, rec = world
    grads = [[0x100000 * (r + 1), 0x200000 * (r + 1)] for r in range(W)]
    outs = [0x400000 * (r + 1) for r in range(W)]
    bad = [g[:] for g in grads]
    bad[1] = bad[1][:1]  # one gradient missing on rank 1
    with pytest.raises(InvalidArgumentError, match=r"grads\[1\]: 1 tensors"):
        w.reduce_scatter(layouts, bad, outs, out_dtype="fp32")
    with pytest.raises(Exception, match="op"):
        w.reduce_scatter(layouts, grads, outs, op="max-ish", out_dtype="fp32")
    assert rec.calls == []
    w.reduce_scatter(layouts, grads, outs, op="avg", out_dtype="fp32")
    assert [c[:2] for c in rec.calls] == [("rs", 101), ("rs", 102), ("rs", 103)]


def test_a_collective_in_flight_reaches_every_rank_when_close_begins(world, layouts, monkeypatch):
    """close() on another thread while the collective is being issued: the remaining ranks are still issued (the
    in-flight span), and calls after close() are refused."""
    w, rec = world
    started, go = threading.Event(), threading.Event()
    orig = rec.tideAllGather

    def slow(*a):
        if not rec.calls:
            started.set()
            go.wait(10)
        return orig(*a)

    rec.tideAllGather = slow
    good = [0x10000 * (r + 1) for r in range(W)]
    t = threading.Thread(target=lambda: w.all_gather(layouts, good, sendbufs=good))
    t.start()
    assert started.wait(10)
    assert w._life.close(wait=False) and w._life.others_in_flight()
    go.set()
    t.join(10)
    assert [c[1] for c in rec.calls] == [101, 102, 103]
    with pytest.raises(InvalidArgumentError, match="LoopbackWorld is closed"):
        w.all_gather(layouts, good, sendbufs=good)
