# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Host issue time and GPU latency of TIDE calls, measured apart: tide-perf's `host` and `gpu` columns.

* host us (per rank per call): the ranks' streams are held behind a sleeping kernel on a gate stream, so nothing the
  library enqueues can run (or make the host wait) while the host issues; `calls` rounds of every rank's call are
  issued with prebuilt ctypes arguments (no Python tensor handling in the timed loop) and the wall time is divided
  by calls x ranks. A sample counts only if the gate was still closed when the issue loop ended (else the GPU ran
  during it and the sample is dropped). Median over samples.
* gpu us (per call of the whole world): every rank's call is issued behind the gate; a start event after the gate
  and an end event after every rank's stream give the device time of the call alone, without host launch gaps.

Every rank's call is the whole collective of one GPU of the world (a loopback world has all ranks on one device), so
gpu us is the world's time on one GPU, while host us is what one rank's process would spend issuing.
"""

import ctypes
import statistics
import time
from typing import Callable, List

GATE_CYCLES = 400_000_000  # ~200 ms at H200 clocks: longer than any issue loop measured here (the cap)
_CYCLES_PER_US = 2_000  # torch.cuda._sleep spins in clock cycles; about 2 GHz (an estimate: validity is checked)


def _torch():
    import torch

    return torch


class PreparedCalls:
    """One collective of every rank of a LoopbackWorld as prebuilt ctypes calls: issue(r) makes rank r's call."""

    def __init__(self, world, fns: List[Callable[[], int]]):
        self.world = world
        self.fns = fns
        # What calls_per_sample needs (set by the prepare_* functions from the layout, _describe): copy entries per
        # rank and call of an eager (epoch) call, about, and whether the call takes the graph route.
        self.copies = 1
        self.graph_route = False

    def issue_all(self) -> None:
        for f in self.fns:  # inline, not issue_one: one Python call less per rank in the timed loop
            if f() != 0:
                self._raise_failed()

    def issue_one(self, i: int) -> None:
        if self.fns[i]() != 0:
            self._raise_failed()

    @staticmethod
    def _raise_failed() -> None:
        from .. import _native as N

        raise RuntimeError(f"TIDE call failed: {N.last_error()}")


def prepare_all_gather(world, layouts, slots, sendbufs=None, shards=None) -> PreparedCalls:
    from .. import _native as N

    lib = N.lib()
    fns = []
    keep = []
    for r in range(world.n_ranks):
        comm = world.comms[r]
        h = layouts[r].handle
        slot = ctypes.c_void_p(int(slots[r].data_ptr()))
        stream = ctypes.c_void_p(int(world.streams[r].cuda_stream))
        if sendbufs is not None:
            send = ctypes.c_void_p(int(sendbufs[r].data_ptr()))
            table = None
        else:
            send = None
            table = N.pointer_table([int(t.data_ptr()) for t in shards[r]])
        keep.append((slot, stream, send, table))
        fns.append(lambda c=comm, h=h, s=send, t=table, sl=slot, st=stream: lib.tideAllGather(c, h, s, t, sl, st))
    p = _describe(PreparedCalls(world, fns), layouts[0], "ag")
    p._keep = keep
    return p


def prepare_reduce_scatter(
    world, layouts, grads, outs, op_code: int, out_code: int, staging=None, scale: float = 1.0
) -> PreparedCalls:
    from .. import _native as N

    lib = N.lib()
    fns = []
    keep = []
    for r in range(world.n_ranks):
        comm = world.comms[r]
        h = layouts[r].handle
        table = N.pointer_table([int(g.data_ptr()) for g in grads[r]])
        out = ctypes.c_void_p(int(outs[r].data_ptr()))
        stag = None if staging is None else ctypes.c_void_p(int(staging[r].data_ptr()))
        stream = ctypes.c_void_p(int(world.streams[r].cuda_stream))
        keep.append((table, out, stag, stream))
        fns.append(
            lambda c=comm, h=h, t=table, o=out, s=stag, st=stream: lib.tideReduceScatter(
                c, h, t, o, out_code, op_code, ctypes.c_float(scale), s, st
            )
        )
    p = _describe(PreparedCalls(world, fns), layouts[0], "rs")
    p._keep = keep
    return p


def _gate(world, cycles: int = GATE_CYCLES):
    """Closes the gate: a sleeping kernel on a fresh stream, every rank stream waits for it. Returns the event."""
    torch = _torch()
    gate = torch.cuda.Stream(device=world.device)
    with torch.cuda.stream(gate):
        torch.cuda._sleep(int(cycles))
    ev = torch.cuda.Event()
    ev.record(gate)
    for s in world.streams:
        s.wait_event(ev)
    return ev


def host_issue_us(prepared: PreparedCalls, calls: int = 8, samples: int = 15, per_rank: bool = False) -> dict:
    """Median host time per rank per call (us), with the GPU gated; also how many samples were valid.

    per_rank: also time each rank's call on its own and report "last_rank_us" (the last rank's call, median over
    valid samples) and "other_ranks_us" (the mean of the other ranks' calls). On loopback a rank's call issues its
    announce and the last rank's call also issues every rank's deferred rounds (docs/architecture.md "Issue
    rounds"), so the two split the per-call bookkeeping from the rounds' launches. The per-call timer reads add
    about 0.1 us per call to host_us."""
    torch = _torch()
    world = prepared.world
    prepared.issue_all()  # warm-up: caches, agreement, own staging growth
    world.synchronize()
    # The gate only has to outlast the issue loop: sized from one ungated loop (x4, at least 5 ms), doubled after a
    # sample it did not cover (such a sample is dropped), at most GATE_CYCLES. A fixed 200 ms gate made every row of
    # tide-perf cost a second here.
    t0 = time.perf_counter()
    for _ in range(calls):
        prepared.issue_all()
    est_us = (time.perf_counter() - t0) * 1e6
    world.synchronize()
    cycles = min(GATE_CYCLES, max(_CYCLES_PER_US * 5_000, int(4 * est_us * _CYCLES_PER_US)))
    vals, last, others = [], [], []
    n = len(prepared.fns)
    for _ in range(samples):
        ev = _gate(world, cycles)
        per = [0.0] * n
        t0 = time.perf_counter()
        for _ in range(calls):
            if per_rank:
                for i in range(n):
                    ta = time.perf_counter()
                    prepared.issue_one(i)
                    per[i] += time.perf_counter() - ta
            else:
                prepared.issue_all()
        t1 = time.perf_counter()
        closed = not ev.query()
        world.synchronize()
        if closed:
            vals.append((t1 - t0) * 1e6 / (calls * world.n_ranks))
            if per_rank:
                last.append(per[-1] * 1e6 / calls)
                others.append(sum(per[:-1]) * 1e6 / (calls * (n - 1)) if n > 1 else float("nan"))
        else:
            cycles = min(GATE_CYCLES, 2 * cycles)
    torch.cuda.synchronize()
    out = {"host_us": statistics.median(vals) if vals else float("nan"), "valid_samples": len(vals)}
    if per_rank:
        out["last_rank_us"] = statistics.median(last) if last else float("nan")
        out["other_ranks_us"] = statistics.median(others) if others else float("nan")
    if len(vals) >= 4:
        q = statistics.quantiles(vals, n=4)
        out["host_iqr_us"] = q[2] - q[0]
    return out


def gpu_latency_us(prepared: PreparedCalls, samples: int = 15) -> dict:
    """Median device time of one call of the whole world (us), issued entirely behind the gate. A sample whose gate
    opened before the last rank's call was issued (host gaps inside the interval) is dropped and the gate doubled."""
    torch = _torch()
    world = prepared.world
    vals = []
    cycles = 10 * _CYCLES_PER_US * 1000  # ~10 ms
    for _ in range(2 * samples):
        if len(vals) >= samples:
            break
        torch.cuda.synchronize()
        gate_stream = torch.cuda.Stream(device=world.device)
        with torch.cuda.stream(gate_stream):
            torch.cuda._sleep(int(cycles))
        start = torch.cuda.Event(enable_timing=True)
        start.record(gate_stream)
        for s in world.streams:
            s.wait_event(start)
        prepared.issue_all()
        end = torch.cuda.Event(enable_timing=True)
        for s in world.streams:
            gate_stream.wait_stream(s)
        end.record(gate_stream)
        covered = not start.query()  # after the end event is enqueued: no host gap inside the interval
        world.synchronize()
        torch.cuda.synchronize()
        if covered:
            vals.append(start.elapsed_time(end) * 1e3)
        else:
            cycles = min(GATE_CYCLES, 2 * cycles)
    return {"gpu_us": statistics.median(vals) if vals else float("nan"), "gpu_valid_samples": len(vals)}


def takes_graph_route(layout, coll: str, params=None) -> bool:
    """Whether an eager call of `layout` is replayed from the library's graphs (docs/architecture.md "Eager calls as
    graph replays"): NCCL_TIDE_EAGER_GRAPHS on, one node, and for RS at most NCCL_TIDE_TOKEN_RS_CHUNKS chunks. Such a
    call is a few graph launches per rank whatever P and W, so the P x W cap of calls_per_sample does not apply.
    `params` (name -> value text) replaces the library's values (tests); default: _native.param_value."""
    if params is None:
        from .. import _native as N

        get = N.param_value
    else:
        get = params.__getitem__
    if get("NCCL_TIDE_EAGER_GRAPHS") != "1" or layout.n_nodes != 1:
        return False
    return coll == "ag" or layout.rs_num_chunks <= int(get("NCCL_TIDE_TOKEN_RS_CHUNKS"))


def _describe(p: PreparedCalls, layout, coll: str) -> PreparedCalls:
    """Sets p.copies (P x W copy entries per rank and call of an eager call, about) and p.graph_route."""
    p.copies = layout.n_params * layout.world_size
    p.graph_route = takes_graph_route(layout, coll)
    return p


def calls_per_sample(copies: int, graph_route: bool, calls: int = 6) -> int:
    """Calls issued back to back per host sample. Eager (epoch) calls enqueue about `copies` copy entries per rank
    and call: keep a sample under ~600 so the device queue never fills (a full queue makes the host wait for the GPU
    and voids the sample). Graph-route calls keep `calls`: one call per sample prices the first call after the gate
    too, 1.4-16.5 us per rank more than a call in a run of six on an H100."""
    if graph_route:
        return calls
    return max(1, min(calls, 600 // max(1, copies)))


class OneRank:
    """The world interface above for one rank of a real communicator (torchrun backend): its current stream."""

    def __init__(self, comm):
        torch = _torch()
        self.comm = comm
        self.n_ranks = 1
        self.device = comm.device
        self.streams = [torch.cuda.current_stream(torch.device("cuda", comm.device))]

    def synchronize(self, timeout=None):
        self.comm.synchronize(timeout=timeout)


def prepare_comm_all_gather(comm, layout, slot, sendbuf=None, shards=None) -> PreparedCalls:
    """One rank's AG from a flat send buffer, or (shards) from per-parameter shards through a pointer table."""
    from .. import _native as N

    lib = N.lib()
    one = OneRank(comm)
    send = None if sendbuf is None else ctypes.c_void_p(int(sendbuf.data_ptr()))
    table = None if shards is None else N.pointer_table([int(t.data_ptr()) for t in shards])
    args = (comm.handle, layout.handle, send, table, ctypes.c_void_p(int(slot.data_ptr())),
            ctypes.c_void_p(int(one.streams[0].cuda_stream)))
    p = _describe(PreparedCalls(one, [lambda: lib.tideAllGather(*args)]), layout, "ag")
    p._keep = table
    return p


def prepare_comm_reduce_scatter(comm, layout, grads, out, op_code: int, out_code: int, scale: float = 1.0,
                                staging=None):
    """One rank's RS through a pointer table; staging: a slot region of layout.rs_staging_bytes (Slot-Reuse, which a
    captured RS needs) or None for the comm's own staging."""
    from .. import _native as N

    lib = N.lib()
    one = OneRank(comm)
    table = N.pointer_table([int(g.data_ptr()) for g in grads])
    stag = None if staging is None else ctypes.c_void_p(int(staging.data_ptr()))
    args = (comm.handle, layout.handle, table, ctypes.c_void_p(int(out.data_ptr())), out_code, op_code,
            ctypes.c_float(scale), stag, ctypes.c_void_p(int(one.streams[0].cuda_stream)))
    p = _describe(PreparedCalls(one, [lambda: lib.tideReduceScatter(*args)]), layout, "rs")
    p._keep = table
    return p
