"""Host issue time and GPU latency of TIDE calls on a loopback world, measured apart (issue 15).

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
from typing import Callable, List, Sequence, Tuple

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
        for f in self.fns:  # inline (not issue_one): host_us stays comparable with earlier sessions' rows
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


class _Graphs:
    """Driver graph calls (libcuda via ctypes) for capturing each loopback rank's call into a graph of its own."""

    _lib = None

    @classmethod
    def lib(cls):
        if cls._lib is None:
            lib = ctypes.CDLL("libcuda.so.1")
            vp = ctypes.c_void_p
            for name, args in {
                "cuStreamBeginCapture_v2": [vp, ctypes.c_int],
                "cuStreamEndCapture": [vp, ctypes.POINTER(vp)],
                "cuGraphInstantiateWithFlags": [ctypes.POINTER(vp), vp, ctypes.c_ulonglong],
                "cuGraphUpload": [vp, vp],
                "cuGraphLaunch": [vp, vp],
                "cuGraphExecDestroy": [vp],
                "cuGraphDestroy": [vp],
                "cuMemsetD32Async": [ctypes.c_ulonglong, ctypes.c_uint, ctypes.c_size_t, vp],
                "cuGraphGetNodes": [vp, ctypes.POINTER(vp), ctypes.POINTER(ctypes.c_size_t)],
                "cuGraphNodeGetType": [vp, ctypes.POINTER(ctypes.c_int)],
                "cuGraphBatchMemOpNodeGetParams": [vp, vp],
            }.items():
                fn = getattr(lib, name)
                fn.argtypes = args
                fn.restype = ctypes.c_int
            cls._lib = lib
        return cls._lib


# CUgraphNodeType (cuda.h): what a captured graph holds, by kind (graph_census).
GRAPH_NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
                    7: "event_record", 8: "ext_sem_signal", 9: "ext_sem_wait", 10: "mem_alloc", 11: "mem_free",
                    12: "memop", 13: "conditional"}


def census_summary(types: List[int], memop_ops: List[int], edges: int) -> dict:
    """A graph's nodes by kind, the operations its memop nodes hold in all, and its edges (dependencies): what a
    launch's host cost grows with (benchmarks/RESULTS.md session 24: each memop node after the first about 0.8 us,
    each operation in one about 0.05-0.1, kernel and memcpy nodes hundredths)."""
    by: dict = {}
    for t in types:
        name = GRAPH_NODE_TYPES.get(int(t), f"type{int(t)}")
        by[name] = by.get(name, 0) + 1
    return {"nodes": len(types), "by_type": dict(sorted(by.items())), "memop_ops": int(sum(memop_ops)),
            "edges": int(edges)}


def format_census(c: dict) -> str:
    if "error" in c:
        return f"census failed ({c['error']})"
    parts = [f"{k} {v}" + (f" ({c['memop_ops']} ops)" if k == "memop" else "") for k, v in c["by_type"].items()]
    return f"{c['nodes']} nodes: " + ", ".join(parts) + f"; {c['edges']} edges"


class _MemOpNodeParams(ctypes.Structure):
    _fields_ = [("ctx", ctypes.c_void_p), ("count", ctypes.c_uint), ("paramArray", ctypes.c_void_p),
                ("flags", ctypes.c_uint)]


def graph_census(graph) -> dict:
    """census_summary of a captured (not yet instantiated) driver graph; {"error": ...} if the driver lacks a call."""
    try:
        lib = _Graphs.lib()
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        n = sz(0)
        if lib.cuGraphGetNodes(graph, None, ctypes.byref(n)) != 0:
            return {"error": "cuGraphGetNodes"}
        nodes = (vp * n.value)()
        if n.value and lib.cuGraphGetNodes(graph, nodes, ctypes.byref(n)) != 0:
            return {"error": "cuGraphGetNodes"}
        types, ops = [], []
        for node in nodes:
            t = ctypes.c_int(-1)
            if lib.cuGraphNodeGetType(vp(node), ctypes.byref(t)) != 0:
                return {"error": "cuGraphNodeGetType"}
            types.append(t.value)
            if t.value == 12:
                prm = _MemOpNodeParams()
                if lib.cuGraphBatchMemOpNodeGetParams(vp(node), ctypes.addressof(prm)) == 0:
                    ops.append(prm.count)
        e = sz(0)
        get_edges = getattr(lib, "cuGraphGetEdges_v2", None)
        rc = (get_edges(graph, None, None, None, ctypes.byref(e)) if get_edges is not None
              else lib.cuGraphGetEdges(graph, None, None, ctypes.byref(e)))
        return census_summary(types, ops, e.value if rc == 0 else -1)
    except Exception as ex:  # a diagnostic: it must never cost the row its replay figure
        return {"error": f"{type(ex).__name__}: {str(ex)[:120]}"}


def _graph_per_rank(world, enqueue, keep) -> PreparedCalls:
    """Captures what enqueue(streams) issues on every rank's stream (global capture mode) into a graph per rank and
    returns PreparedCalls whose calls launch those graphs (one cuGraphLaunch per rank); `keep` stays alive with them.
    close() destroys them."""
    torch = _torch()
    lib = _Graphs.lib()
    torch.cuda.synchronize()
    world.synchronize()
    streams = [ctypes.c_void_p(int(s.cuda_stream)) for s in world.streams]
    for s in streams:
        if lib.cuStreamBeginCapture_v2(s, 0) != 0:
            raise RuntimeError("cuStreamBeginCapture failed")
    graphs = []
    try:
        enqueue(streams)
    finally:
        for s in streams:
            g = ctypes.c_void_p()
            rc = lib.cuStreamEndCapture(s, ctypes.byref(g))
            graphs.append(g)
            if rc != 0:
                raise RuntimeError(f"cuStreamEndCapture failed ({rc})")
    census = [graph_census(g) for g in graphs]  # what each rank's launch carries (host_issue.py prints rank 0's)
    execs = []
    for g in graphs:
        e = ctypes.c_void_p()
        if lib.cuGraphInstantiateWithFlags(ctypes.byref(e), g, 0) != 0:
            raise RuntimeError("cuGraphInstantiateWithFlags failed")
        lib.cuGraphDestroy(g)
        execs.append(e)
    for e, s in zip(execs, streams):
        lib.cuGraphUpload(e, s)
    world.synchronize()
    fns = [lambda e=e, s=s: lib.cuGraphLaunch(e, s) for e, s in zip(execs, streams)]
    p = PreparedCalls(world, fns)
    p._keep = (execs, streams, keep)
    p.census = census

    def close():
        world.synchronize()
        for e in execs:
            lib.cuGraphExecDestroy(e)

    p.close = close
    return p


def flat_all_gather_copies(layout, slots, sendbufs) -> List[Tuple[int, int, int]]:
    """(dst, src, bytes) of the copies a flat all-gather makes on one GPU: every rank's send buffer into every rank's
    slot at that rank's row (its own row included), each a whole padded shard, as the library's AG copies them
    (plugin/core/program_ag.cc: shardBytes per pair, row s at slotOffset + s * shardBytes). For prepare_copy_floor."""
    (p,) = layout.params
    shard = p.shard_numel * p.elem_size
    return [(int(slots[d].data_ptr()) + p.slot_offset + s * shard, int(sendbufs[s].data_ptr()) + p.send_offset, shard)
            for d in range(len(slots)) for s in range(len(sendbufs))]


def prepare_copy_floor(world, copies: Sequence[Tuple[int, int, int]]) -> PreparedCalls:
    """The GPU floor of an all-gather (issue 15: a 64 MiB flat AG within 1.15x of it): the same copies as ONE hinted
    cudaMemcpyBatchAsync (the library's copy-engine path, tideBenchCopy) on rank 0's stream, no flags. For
    gpu_latency_us; its host time means nothing (one call for the world)."""
    from .. import _bench as B

    lib = B.lib()
    n = len(copies)
    if n == 0:
        raise ValueError("prepare_copy_floor: no copies")
    dst = (ctypes.c_void_p * n)(*[c[0] for c in copies])
    src = (ctypes.c_void_p * n)(*[c[1] for c in copies])
    nb = (ctypes.c_size_t * n)(*[c[2] for c in copies])
    stream = ctypes.c_void_p(int(world.streams[0].cuda_stream))
    p = PreparedCalls(world, [lambda: lib.tideBenchCopy(n, dst, src, nb, stream)])
    p._keep = (dst, src, nb, stream)
    return p


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
    too, 1.4-16.5 us per rank more than a call in a run of six (benchmarks/RESULTS.md session 30)."""
    if graph_route:
        return calls
    return max(1, min(calls, 600 // max(1, copies)))


def prepare_graph_replays(prepared: PreparedCalls) -> PreparedCalls:
    """Captures every rank's call of `prepared` into a graph of its own and returns PreparedCalls whose calls launch
    those graphs (one cuGraphLaunch per rank). close() destroys them."""
    return _graph_per_rank(prepared.world, lambda streams: prepared.issue_all(), prepared)


def prepare_launch_floor(world) -> PreparedCalls:
    """The floor under the replay column: per rank, a graph of one node (a 4-byte memset) launched through the same
    path as prepare_graph_replays' (one cuGraphLaunch per rank). Its host time is what any replay costs here before
    TIDE's nodes. close() destroys the graphs."""
    torch = _torch()
    lib = _Graphs.lib()
    buf = torch.empty(world.n_ranks, dtype=torch.int32, device=torch.device("cuda", world.device))

    def memsets(streams):
        for r, s in enumerate(streams):
            rc = lib.cuMemsetD32Async(buf.data_ptr() + 4 * r, 0, 1, s)
            if rc != 0:
                raise RuntimeError(f"cuMemsetD32Async failed ({rc})")

    return _graph_per_rank(world, memsets, buf)


class _OneRank:
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
    one = _OneRank(comm)
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
    one = _OneRank(comm)
    table = N.pointer_table([int(g.data_ptr()) for g in grads])
    stag = None if staging is None else ctypes.c_void_p(int(staging.data_ptr()))
    args = (comm.handle, layout.handle, table, ctypes.c_void_p(int(out.data_ptr())), out_code, op_code,
            ctypes.c_float(scale), stag, ctypes.c_void_p(int(one.streams[0].cuda_stream)))
    p = _describe(PreparedCalls(one, [lambda: lib.tideReduceScatter(*args)]), layout, "rs")
    p._keep = table
    return p
