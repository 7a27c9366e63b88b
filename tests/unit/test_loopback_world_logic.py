# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""LoopbackWorld's Python side without a GPU (the library calls replaced by a recorder, CUDA events and the world's
streams by fakes): a world-wide collective checks every rank's arguments before it issues the first rank's call, so a
bad argument of rank k never leaves ranks < k queued (their streams would wait forever for the others); close() waits
for the work queued on the callers' streams (streams= / stream=) before it destroys anything; close() and abort()
racing on two threads destroy (or abort) each comm and stream exactly once."""

import threading
import time

import pytest

import nccl_tide
from nccl_tide import _native as N
from nccl_tide import cuda as C
from nccl_tide._fences import CallerStreamFences
from nccl_tide._lifetime import Lifetime
from nccl_tide.errors import InvalidArgumentError, TideTimeoutError

W = 3
OWN = [201, 202, 203]  # the world's own streams (raw addresses)
CALLER = [501, 502, 503]  # streams of the caller


class _Recorder:
    """tideAllGather / tideReduceScatter recorded, the teardown calls and the world's stream destroys counted (each
    optionally slowed down, to widen the windows of a race); every other entry point is the real library's
    (layouts)."""

    def __init__(self, real):
        self.calls = []
        self.log = []  # ("destroy" | "abort" | "free" | "stream", handle), in order
        self.delay = 0.0
        self._lock = threading.Lock()
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def tideAllGather(self, comm, layout, send, table, slot, stream):
        self.calls.append(("ag", comm, stream))
        return 0

    def tideReduceScatter(self, comm, layout, table, out, out_code, op, scale, staging, stream):
        self.calls.append(("rs", comm, stream))
        return 0

    def _note(self, kind, h):
        if self.delay:
            time.sleep(self.delay)  # lets the other thread run in between
        with self._lock:
            self.log.append((kind, h))
        return 0

    def tideCommDestroy(self, comm):
        return self._note("destroy", comm)

    def tideCommAbort(self, comm):
        return self._note("abort", comm)

    def tideCommDebugDump(self, comm, buf, size):
        buf.value = f"fake dump of comm {comm}\n".encode()
        return 0

    def tideSlotFree(self, comm, ptr):
        return self._note("free", comm)

    def destroy_streams(self, raw):
        for h in raw:
            self._note("stream", h)

    def count(self, kind, h=None):
        with self._lock:
            return sum(1 for k, x in self.log if k == kind and (h is None or x == h))


class _FakeEvent:
    __slots__ = ("stream", "pending")

    def __init__(self):
        self.stream, self.pending = None, False


class _FakeEvents:
    """nccl_tide.cuda._Events over fake streams (raw addresses): an event recorded on a stream in `busy` stays
    pending until the test calls finish(stream) (from its own thread: the stream's work completed)."""

    def __init__(self):
        self.busy = set()
        self.capturing_streams = set()
        self.made = []
        self.records = []  # the stream of every record
        self._lock = threading.Lock()

    def new(self):
        e = _FakeEvent()
        with self._lock:
            self.made.append(e)
        return e

    def on(self, stream, handle, device):
        return handle

    def record(self, event, stream):
        with self._lock:
            self.records.append(stream)
            event.stream, event.pending = stream, stream in self.busy

    def done(self, event):
        return not event.pending

    def capturing(self, handle):
        return handle in self.capturing_streams

    def finish(self, stream):
        with self._lock:
            self.busy.discard(stream)
            for e in self.made:
                if e.stream == stream:
                    e.pending = False


def _bare_world(events, prune_at=64):
    """A LoopbackWorld without tideLoopbackCreate: the Python logic only."""
    w = object.__new__(C.LoopbackWorld)
    w._teardown = threading.Lock()
    w._closing = False
    w._life = Lifetime("LoopbackWorld")
    w._aborted = set()
    w._comms = [101, 102, 103]
    w._streams = list(OWN)
    w._raw_streams = list(OWN)
    w._own_handles = frozenset(OWN)
    w._slots = []
    w.n_ranks = W
    w._events = events
    w._fences = CallerStreamFences(events, None, prune_at)
    w._held_calls = False
    w._last_streams = {}
    return w


def _disarm(w):
    w._comms, w._raw_streams = [], []  # nothing left for __del__ to destroy with the real library


@pytest.fixture
def fakes(monkeypatch):
    rec = _Recorder(N.lib())
    monkeypatch.setattr(N, "lib", lambda: rec)
    monkeypatch.setattr(C._DriverStreams, "destroy", classmethod(lambda cls, raw: rec.destroy_streams(raw)))
    real = C.LoopbackWorld._rank_streams  # with streams given it only checks them (no torch.cuda call)
    monkeypatch.setattr(
        C.LoopbackWorld, "_rank_streams", lambda self, s: list(self._streams) if s is None else real(self, s)
    )
    return rec, _FakeEvents()


@pytest.fixture
def world(fakes):
    rec, ev = fakes
    w = _bare_world(ev)
    yield w, rec
    _disarm(w)


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


def _held_all_gather(w, rec, layouts, **kw):
    """A world-wide all-gather on another thread, held inside its first rank's library call until `go` is set.
    Returns (thread, go) once the call is held there."""
    started, go = threading.Event(), threading.Event()
    orig = rec.tideAllGather

    def slow(*a):
        if not rec.calls:
            started.set()
            go.wait(10)
        return orig(*a)

    rec.tideAllGather = slow
    good = [0x10000 * (r + 1) for r in range(W)]
    t = threading.Thread(target=lambda: w.all_gather(layouts, good, sendbufs=good, **kw))
    t.start()
    assert started.wait(10)
    return t, go


def test_a_collective_in_flight_reaches_every_rank_when_close_begins(world, layouts, monkeypatch):
    """close() on another thread while the collective is being issued: the remaining ranks are still issued (the
    in-flight span), and calls after close() are refused."""
    w, rec = world
    t, go = _held_all_gather(w, rec, layouts)
    assert w._life.close(wait=False) and w._life.others_in_flight()
    go.set()
    t.join(10)
    assert [c[1] for c in rec.calls] == [101, 102, 103]
    good = [0x10000 * (r + 1) for r in range(W)]
    with pytest.raises(InvalidArgumentError, match="LoopbackWorld is closed"):
        w.all_gather(layouts, good, sendbufs=good)


# -- close() and the callers' streams ------------------------------------------------------------------------------
def _ag_on(w, layouts, form):
    """One all-gather of every rank; form: 'world' (streams=CALLER), 'rank' (rank calls, stream=CALLER[r]) or
    'mixed' (ranks 0 and 1 on the world's own streams, rank 2 on CALLER[2])."""
    good = [0x10000 * (r + 1) for r in range(W)]
    if form == "world":
        w.all_gather(layouts, good, sendbufs=good, streams=CALLER)
    else:
        for r in range(W):
            stream = CALLER[r] if form == "rank" or r == 2 else None
            w.rank_all_gather(r, layouts[r], good[r], sendbuf=good[r], stream=stream)


def _gone(rec):
    return [x for x in rec.log if x[0] in ("destroy", "free", "stream")]


@pytest.mark.parametrize("form", ["world", "rank", "mixed"])
def test_close_waits_for_the_callers_streams_before_destroying(fakes, layouts, form):
    rec, ev = fakes
    w = _bare_world(ev)
    busy = CALLER if form != "mixed" else CALLER[2:]
    ev.busy.update(busy)
    w._slots = [[0x1, 0x2, 0x3]]
    _ag_on(w, layouts, form)
    _ag_on(w, layouts, form)  # a second call re-records the same events
    assert len(ev.made) == len(busy) and len(ev.records) == 2 * len(busy)
    closer = threading.Thread(target=w.close, daemon=True)
    closer.start()
    for s in busy:
        time.sleep(0.15)
        assert closer.is_alive() and not _gone(rec), f"close() destroyed {_gone(rec)} before {s}'s work was done"
        with pytest.raises(InvalidArgumentError, match="LoopbackWorld is closed"):  # closed while it waits
            _ag_on(w, layouts, form)
        ev.finish(s)
    closer.join(10)
    assert not closer.is_alive()
    for c in (101, 102, 103):
        assert rec.count("destroy", c) == 1 and rec.count("free", c) == 1 and rec.count("abort", c) == 0
    assert [rec.count("stream", s) for s in OWN] == [1, 1, 1]
    assert len(w._fences) == 0 and w._comms == []
    w.close()  # idempotent
    assert len(rec.log) == 9


def test_caller_stream_events_are_one_per_stream_and_dropped_once_done(fakes, layouts):
    rec, ev = fakes
    w = _bare_world(ev, prune_at=4)
    for _ in range(200):  # the same streams, call after call: one event each, re-recorded
        _ag_on(w, layouts, "world")
    assert len(ev.made) == W and len(ev.records) == 200 * W and len(w._fences) == W
    for i in range(40):  # a new stream every call, its work done at once: completed entries are dropped and reused
        w.rank_all_gather(0, layouts[0], 0x10000, sendbuf=0x10000, stream=1000 + i)
        assert len(w._fences) <= 4
    assert len(ev.made) <= 4, "completed events were not reused"
    pending = [2000 + i for i in range(10)]  # never dropped while pending, however many
    ev.busy.update(pending)
    for s in pending:
        w.rank_all_gather(0, layouts[0], 0x10000, sendbuf=0x10000, stream=s)
    assert set(pending) <= set(w._fences._by_handle)
    for s in pending[:7]:
        ev.finish(s)
    assert len(w._fences.pending()) == 3 and set(w._fences._by_handle) == set(pending[7:])
    closer = threading.Thread(target=w.close, daemon=True)
    closer.start()
    time.sleep(0.1)
    assert closer.is_alive() and not _gone(rec)
    for s in pending[7:]:
        ev.finish(s)
    closer.join(10)
    assert not closer.is_alive() and rec.count("destroy") == W and len(w._fences) == 0


def test_own_and_capturing_streams_get_no_event(world, layouts):
    w, rec = world
    ev = w._events
    good = [0x10000 * (r + 1) for r in range(W)]
    w.all_gather(layouts, good, sendbufs=good, streams=OWN)  # the world's own, passed explicitly
    w.all_gather(layouts, good, sendbufs=good)
    ev.capturing_streams.add(777)  # a stream being captured into a graph: its work runs at replay
    w.rank_all_gather(0, layouts[0], good[0], sendbuf=good[0], stream=777)
    assert ev.records == [] and len(w._fences) == 0 and len(rec.calls) == 2 * W + 1


def test_a_failed_rank_issue_still_records_the_streams_of_the_world_wide_call(world, layouts):
    w, rec = world
    ev = w._events
    orig = rec.tideAllGather
    rec.tideAllGather = lambda comm, *a: 5 if comm == 103 else orig(comm, *a)  # rank 2's call fails
    good = [0x10000 * (r + 1) for r in range(W)]
    with pytest.raises(Exception, match="rank 2"):
        w.all_gather(layouts, good, sendbufs=good, streams=CALLER)
    assert ev.records == CALLER, "ranks 0 and 1 queued work that close() would not wait for"


# -- abort() and close() on two threads -------------------------------------------------------------------------
def test_abort_racing_close_destroys_each_comm_and_stream_once(fakes):
    rec, ev = fakes
    rec.delay = 0.0002
    for rnd in range(150):
        rec.log.clear()
        w = _bare_world(ev)
        w._slots = [[0x1, 0x2, 0x3]]
        if rnd % 3 == 1:  # a caller stream still busy: close() waits, and only abort() can end that
            busy = 900 + rnd
            ev.busy.add(busy)
            w._fences.record([busy], [busy], w._own_handles)
        ops = [w.close, w.abort] + ([w.abort, w.close][rnd % 2 :] if rnd % 4 == 0 else [])
        if rnd % 2:
            ops.reverse()
        barrier, errors = threading.Barrier(len(ops)), []

        def run(op, barrier=barrier, errors=errors):
            barrier.wait()
            try:
                op()
            except BaseException as e:  # noqa: BLE001
                errors.append(repr(e))

        threads = [threading.Thread(target=run, args=(op,)) for op in ops]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads), f"round {rnd}: close()/abort() hung"
        assert not errors, f"round {rnd}: {errors}"
        for c in (101, 102, 103):
            destroyed, aborted = rec.count("destroy", c), rec.count("abort", c)
            assert destroyed + aborted == 1, f"round {rnd}: comm {c} destroyed {destroyed}x, aborted {aborted}x"
            assert rec.count("free", c) == destroyed, f"round {rnd}: slot of comm {c} freed after its abort"
        assert [rec.count("stream", s) for s in OWN] == [1, 1, 1], f"round {rnd}: {rec.log}"
        assert w._comms == [] and not w._closing
        _disarm(w)


def test_abort_during_close_ends_its_wait_and_nothing_is_destroyed_twice(world, layouts):
    w, rec = world
    ev = w._events
    ev.busy.update(CALLER)  # never finished: the work is stuck
    w._slots = [[0x1, 0x2, 0x3]]
    _ag_on(w, layouts, "world")
    closer = threading.Thread(target=w.close, daemon=True)
    closer.start()
    time.sleep(0.15)
    assert closer.is_alive() and not rec.log
    w.abort()
    assert [x[0] for x in rec.log] == ["abort"] * W, "abort() released the streams close() waits on"
    closer.join(5)
    assert not closer.is_alive(), "close() kept waiting after every rank was aborted"
    assert sorted(rec.log) == sorted([("abort", c) for c in (101, 102, 103)] + [("stream", s) for s in OWN])
    w.abort()
    w.close()
    assert len(rec.log) == 2 * W


def test_abort_with_a_call_in_flight_keeps_handles_and_streams_until_it_leaves(world, layouts):
    w, rec = world
    t, go = _held_all_gather(w, rec, layouts)
    w.abort()
    assert rec.count("abort") == W and rec.count("stream") == 0 and w._comms == [101, 102, 103]
    w.close()  # after abort(): nothing for close() to do
    assert rec.count("destroy") == 0 and rec.count("stream") == 0
    go.set()
    t.join(10)
    assert [c[1] for c in rec.calls] == [101, 102, 103]  # the call in flight reached every rank
    w.abort()  # no call left: the Python side goes now
    assert [rec.count("stream", s) for s in OWN] == [1, 1, 1] and w._comms == [] and rec.count("abort") == W


def test_close_waits_for_the_event_of_a_call_that_was_in_flight_when_it_began(world, layouts):
    """The call records its caller-stream events after close() began (inside its span): close() waits for the call
    to leave, then for those events."""
    w, rec = world
    ev = w._events
    ev.busy.update(CALLER)
    t, go = _held_all_gather(w, rec, layouts, streams=CALLER)
    closer = threading.Thread(target=w.close, daemon=True)
    closer.start()
    time.sleep(0.1)
    assert closer.is_alive() and not _gone(rec) and ev.records == []
    go.set()
    t.join(10)
    assert [c[1] for c in rec.calls] == [101, 102, 103] and [s for s in ev.records if s not in OWN] == CALLER
    time.sleep(0.1)
    assert closer.is_alive() and not _gone(rec), "close() did not wait for the events the call recorded"
    for s in CALLER:
        ev.finish(s)
    closer.join(10)
    assert not closer.is_alive() and rec.count("destroy") == W


def test_synchronize_waits_for_a_collective_held_on_the_host(world, monkeypatch):
    """Eager graph route: rank 0's token call is held until rank 1 calls, so its stream is idle with a pending wait
    (docs/architecture.md "Issue rounds"). synchronize() must not return then: it times out naming the held rank and
    the peer it waits for, and returns once the pending waits clear; with the route off it never asks."""
    w, rec = world
    held = {101: [{"step": "capAgReady[1]", "owner": 0, "peer": 1, "want": 1, "have": 0, "word": 257,
                   "collective": "AG", "stream": 0, "where": "the caller's stream"}]}
    asked = []

    def fake_pending(comm, capacity=8):
        asked.append(comm)
        return list(held.get(comm, []))

    monkeypatch.setattr(N, "pending_waits", fake_pending)
    w.synchronize(timeout=0.05)  # route off: idle streams are enough, nobody asked
    assert asked == []
    w._held_calls = True
    t0 = time.monotonic()
    with pytest.raises(TideTimeoutError) as info:
        w.synchronize(timeout=0.2)
    assert 0.2 <= time.monotonic() - t0 < 5
    msg = str(info.value)
    assert "collectives of ranks [0]" in msg and "held on the host" in msg, msg
    assert "rank 0 waits for peer rank 1" in msg and "capAgReady[1]" in msg, msg
    assert info.value.pending["rank"] == 0 and info.value.pending["peer"] == 1
    # rank 1 calls (the held rounds are issued and done): the pending wait clears and synchronize returns
    threading.Timer(0.1, lambda: held.pop(101)).start()
    t0 = time.monotonic()
    w.synchronize(timeout=5)
    assert 0.05 <= time.monotonic() - t0 < 4
    # busy streams are waited for first: no pending query while a stream still runs
    ev = w._events
    ev.busy.add(OWN[1])
    asked.clear()
    threading.Timer(0.1, lambda: ev.finish(OWN[1])).start()
    w.synchronize(timeout=5)
    assert asked == [101, 102, 103], asked  # asked once, after the streams went idle


def _fake_held(monkeypatch, held):
    """tideCommGetPendingWaits replaced: comm -> its pending waits (a held token call), from the dict `held`."""
    asked = []

    def fake_pending(comm, capacity=8):
        asked.append(comm)
        return list(held.get(comm, []))

    monkeypatch.setattr(N, "pending_waits", fake_pending)
    return asked


_HELD_AG = {"step": "agReadyTok[1]", "owner": 0, "peer": 1, "want": 1, "have": 0, "word": 257, "collective": "AG",
            "stream": 0, "where": "the caller's stream"}


def test_close_drops_a_collective_held_on_the_host_and_frees_everything(world, layouts, monkeypatch, caplog):
    """Eager graph route: rank 0 called, ranks 1 and 2 never will (close() refuses new calls), so rank 0's held
    collective can never complete. close() must not wait for it (it waited its 60 s bound, then raised): it drops it
    with a warning naming rank 0 and destroys every comm, slot and stream once."""
    w, rec = world
    w._held_calls = True
    held = {101: [_HELD_AG]}  # never cleared: no rank can call any more
    _fake_held(monkeypatch, held)
    w._slots = [[0x1, 0x2, 0x3]]
    w.rank_all_gather(0, layouts[0], 0x10000, sendbuf=0x10000)
    errors = []

    def run():
        try:
            w.close()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    caplog.set_level("WARNING", logger="nccl_tide")
    t0 = time.monotonic()
    closer = threading.Thread(target=run, daemon=True)
    closer.start()
    closer.join(5)
    assert not closer.is_alive(), "close() waits for a held collective that can never complete"
    assert not errors, errors
    assert time.monotonic() - t0 < 5
    for c in (101, 102, 103):
        assert rec.count("destroy", c) == 1 and rec.count("free", c) == 1
    assert [rec.count("stream", s) for s in OWN] == [1, 1, 1] and w._comms == []
    warned = [r.getMessage() for r in caplog.records if "dropping the collectives" in r.getMessage()]
    assert warned and "ranks [0]" in warned[0], [r.getMessage() for r in caplog.records]
    with pytest.raises(InvalidArgumentError, match="LoopbackWorld is closed"):
        w.rank_all_gather(1, layouts[1], 0x20000, sendbuf=0x20000)


def test_close_waits_for_busy_streams_but_not_for_held_collectives(world, layouts, monkeypatch):
    """held=False in close() skips only the held collectives: a busy stream is still waited for."""
    w, rec = world
    w._held_calls = True
    _fake_held(monkeypatch, {101: [_HELD_AG]})
    ev = w._events
    ev.busy.add(OWN[2])
    closer = threading.Thread(target=w.close, daemon=True)
    closer.start()
    time.sleep(0.15)
    assert closer.is_alive() and not _gone(rec), "close() destroyed the world under a busy stream"
    ev.finish(OWN[2])
    closer.join(5)
    assert not closer.is_alive() and rec.count("destroy") == W


def test_synchronize_of_some_ranks_waits_for_their_last_streams_and_held_calls(world, layouts, monkeypatch):
    """synchronize(ranks=) waits for the stream each rank last used (a caller's stream here) and for the rank's
    collective held on the host; synchronize(streams=) of a subset counts the held collectives of the ranks whose
    last call ran there (it skipped the held check for any subset and returned with rank 0's call not done);
    ranks whose calls are done, or ran elsewhere, do not make it wait."""
    w, rec = world
    ev = w._events
    w._held_calls = True
    held = {101: [_HELD_AG]}
    asked = _fake_held(monkeypatch, held)
    w.rank_all_gather(0, layouts[0], 0x10000, sendbuf=0x10000, stream=CALLER[0])  # held: ranks 1, 2 not called
    with pytest.raises(TideTimeoutError) as info:
        w.synchronize(streams=[CALLER[0]], timeout=0.2)
    assert "collectives of ranks [0]" in str(info.value) and info.value.pending["peer"] == 1
    ev.records.clear()
    with pytest.raises(TideTimeoutError, match=r"collectives of ranks \[0\]"):
        w.synchronize(ranks=[0], timeout=0.2)
    assert ev.records and set(ev.records) == {CALLER[0]}, ev.records  # rank 0's last stream, not its own
    asked.clear()
    w.synchronize(ranks=[1, 2], timeout=2)  # their streams idle, nothing held: returns at once
    assert set(asked) <= {102, 103}, asked
    w.synchronize(streams=[CALLER[1]], timeout=2)  # no rank's last call ran there
    w.synchronize(timeout=2)  # the world's own streams: rank 0's last call ran on CALLER[0]
    # a busy last stream is waited for, and named by rank
    ev.busy.add(CALLER[0])
    held.clear()
    with pytest.raises(TideTimeoutError, match=r"the streams of ranks \[0\]"):
        w.synchronize(ranks=[0], timeout=0.2)
    threading.Timer(0.1, lambda: ev.finish(CALLER[0])).start()
    w.synchronize(ranks=[0], timeout=5)
    with pytest.raises(InvalidArgumentError, match="streams or ranks"):
        w.synchronize(streams=[CALLER[0]], ranks=[0])
    with pytest.raises(Exception, match="ranks"):
        w.synchronize(ranks=[W])
