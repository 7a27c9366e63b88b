# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Graph replays of TIDE calls and their floors, for the host-issue benchmarks (host_issue.py, host_issue_ipc.py):
every rank's call captured into a driver graph of its own and launched with one cuGraphLaunch per rank, what such a
graph holds (its census), the launch floor of a one-node graph, and the copy-engine floor of a flat all-gather.
Prepared calls are nccl_tide.perf.issue_cost's, so tide-perf's host column and these rows are timed alike."""

import ctypes
from typing import List, Sequence, Tuple

from nccl_tide.perf.issue_cost import PreparedCalls

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
    launch's host cost grows with (on an H100: each memop node after the first about 0.8 us,
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
    import torch

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
    """The GPU floor of an all-gather (the target: a 64 MiB flat AG within 1.15x of it): the same copies as ONE hinted
    cudaMemcpyBatchAsync (the library's copy-engine path, tideBenchCopy) on rank 0's stream, no flags. For
    gpu_latency_us; its host time means nothing (one call for the world)."""
    import bench_lib as B

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


def prepare_graph_replays(prepared: PreparedCalls) -> PreparedCalls:
    """Captures every rank's call of `prepared` into a graph of its own and returns PreparedCalls whose calls launch
    those graphs (one cuGraphLaunch per rank). close() destroys them."""
    return _graph_per_rank(prepared.world, lambda streams: prepared.issue_all(), prepared)


def prepare_launch_floor(world) -> PreparedCalls:
    """The floor under the replay column: per rank, a graph of one node (a 4-byte memset) launched through the same
    path as prepare_graph_replays' (one cuGraphLaunch per rank). Its host time is what any replay costs here before
    TIDE's nodes. close() destroys the graphs."""
    import torch

    lib = _Graphs.lib()
    buf = torch.empty(world.n_ranks, dtype=torch.int32, device=torch.device("cuda", world.device))

    def memsets(streams):
        for r, s in enumerate(streams):
            rc = lib.cuMemsetD32Async(buf.data_ptr() + 4 * r, 0, 1, s)
            if rc != 0:
                raise RuntimeError(f"cuMemsetD32Async failed ({rc})")

    return _graph_per_rank(world, memsets, buf)
