# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""TIDE-AG and TIDE-RS captured into CUDA graphs and replayed, in loopback worlds.

Every virtual rank captures its collective on its own stream into its own graph (begin capture on every rank's
stream, make every rank's call, end every capture), through the driver API (libcuda via ctypes: no torch graph
machinery, no allocation during capture). Each replay gets fresh random inputs copied into the captured input
buffers and is compared bit for bit with the host executor and with an eager run of the same collective on the same
buffers (eager and captured calls interleave: they use separate flag words). What cannot be captured raises
UnsupportedError at capture time and leaves the capture valid (docs/architecture.md, "CUDA graphs").

Host issue order: all inputs are written (and the device synchronized) before any graph of a round is launched, and
every round launches each rank's graph once, rank by rank: the loopback ranks share the device's copy-engine queues,
so a rank's copies must not be enqueued ahead of work of another rank that they wait for (as with eager calls).
"""

import ctypes

import nccl_tide
import numpy as np
import pytest
from gpu_util import POISON, as_bits, bits_dtype, make_layouts, random_bytes, random_float, random_layout_spec, seeded

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

REPLAYS = 24
CU_STREAM_CAPTURE_MODE_GLOBAL = 0


class Driver:
    """The few driver graph calls the tests need."""

    _lib = None

    @classmethod
    def lib(cls):
        if cls._lib is None:
            lib = ctypes.CDLL("libcuda.so.1")
            vp = ctypes.c_void_p
            sigs = {
                "cuStreamBeginCapture_v2": [vp, ctypes.c_int],
                "cuStreamEndCapture": [vp, ctypes.POINTER(vp)],
                "cuGraphInstantiateWithFlags": [ctypes.POINTER(vp), vp, ctypes.c_ulonglong],
                "cuGraphUpload": [vp, vp],
                "cuGraphLaunch": [vp, vp],
                "cuGraphExecDestroy": [vp],
                "cuGraphDestroy": [vp],
                "cuGraphGetNodes": [vp, ctypes.POINTER(vp), ctypes.POINTER(ctypes.c_size_t)],
            }
            for name, args in sigs.items():
                fn = getattr(lib, name)
                fn.argtypes = args
                fn.restype = ctypes.c_int
            cls._lib = lib
        return cls._lib

    @classmethod
    def check(cls, res, what):
        assert res == 0, f"{what} failed with CUresult {res}"


def stream_handle(s):
    return ctypes.c_void_p(int(s.cuda_stream))


def capture_each_rank(torch, world, calls):
    """Begins a capture on every rank's stream, runs calls(r) for every rank, ends every capture (also when a call
    raised), and returns the instantiated, uploaded graph execs (one per rank)."""
    lib = Driver.lib()
    W = world.n_ranks
    streams = world.streams
    torch.cuda.synchronize()
    world.synchronize()
    for r in range(W):
        Driver.check(lib.cuStreamBeginCapture_v2(stream_handle(streams[r]), CU_STREAM_CAPTURE_MODE_GLOBAL), "begin")
    graphs = []
    try:
        for r in range(W):
            calls(r)
    finally:
        for r in range(W):
            g = ctypes.c_void_p()
            res = lib.cuStreamEndCapture(stream_handle(streams[r]), ctypes.byref(g))
            graphs.append(g)
            Driver.check(res, f"cuStreamEndCapture(rank {r}) (the capture must still be valid)")
    execs = []
    for r, g in enumerate(graphs):
        n = ctypes.c_size_t(0)
        Driver.check(lib.cuGraphGetNodes(g, None, ctypes.byref(n)), "cuGraphGetNodes")
        assert n.value > 0, f"rank {r}: empty graph"
        e = ctypes.c_void_p()
        Driver.check(lib.cuGraphInstantiateWithFlags(ctypes.byref(e), g, 0), "cuGraphInstantiateWithFlags")
        Driver.check(lib.cuGraphDestroy(g), "cuGraphDestroy")
        execs.append(e)
    for r, e in enumerate(execs):
        Driver.check(lib.cuGraphUpload(e, stream_handle(streams[r])), "cuGraphUpload")
    world.synchronize()
    return execs


def launch_all(world, execs):
    lib = Driver.lib()
    for r, e in enumerate(execs):
        Driver.check(lib.cuGraphLaunch(e, stream_handle(world.streams[r])), f"cuGraphLaunch(rank {r})")


def destroy(world, execs):
    world.synchronize()
    for e in execs:
        Driver.lib().cuGraphExecDestroy(e)


# ----------------------------------------------------------------------------------------------------------------
# All-gather
# ----------------------------------------------------------------------------------------------------------------


class AgCase:
    def __init__(self, torch, world, rng, dtypes, spec=None):
        """A random layout of these dtypes, or spec = (numels, row_numels, dtypes) as given."""
        W = world.n_ranks
        numels, rows, dts = spec if spec is not None else random_layout_spec(rng, W, dtypes)
        self.torch, self.world, self.rng = torch, world, rng
        self.layouts = make_layouts(numels, rows, dts, W)
        self.L = self.layouts[0]
        self.slots = world.alloc_slot(self.L.slot_bytes)
        self.send = [torch.empty(self.L.send_bytes, dtype=torch.uint8, device="cuda") for _ in range(W)]

    def new_inputs(self):
        """Fresh random shards into the captured send buffers, the slots poisoned; returns the host's result."""
        torch, W = self.torch, self.world.n_ranks
        send_cpu = [random_bytes(torch, self.rng, self.L.send_bytes) for _ in range(W)]
        shards = [
            [
                send_cpu[r][p.send_offset : p.send_offset + p.shard_numel * p.elem_size].view(
                    bits_dtype(torch, p.dtype)
                )
                for p in self.L.params
            ]
            for r in range(W)
        ]
        self.expected = nccl_tide.host_all_gather(self.L, shards)
        for r in range(W):
            self.send[r].copy_(send_cpu[r])
        self.poison()
        return self.expected

    def poison(self):
        for s in self.slots:
            s.fill_(POISON)
        self.torch.cuda.synchronize()

    def call(self, r):
        w = self.world
        w.rank_all_gather(r, self.layouts[r], self.slots[r], sendbuf=self.send[r], stream=w.streams[r])

    def eager(self):
        self.world.all_gather(self.layouts, self.slots, sendbufs=self.send, streams=self.world.streams)

    def result(self):
        self.world.synchronize(timeout=60)
        return [s.cpu().numpy().copy() for s in self.slots]

    def check(self, got, what):
        W = self.world.n_ranks
        for r in range(W):
            for i, p in enumerate(self.L.params):
                n = p.shard_numel * W * p.elem_size
                region = got[r][p.slot_offset : p.slot_offset + n]
                exp = np.ascontiguousarray(self.expected[r][i]).view(np.uint8)
                if not np.array_equal(region, exp):
                    bad = np.flatnonzero(region != exp)
                    pytest.fail(f"{what} AG W={W}: rank {r} param {i}: {bad.size} bytes differ, first at {bad[0]}")

    def close(self):
        self.world.synchronize()
        self.world.free_slot(self.slots)


# ----------------------------------------------------------------------------------------------------------------
# Reduce-scatter
# ----------------------------------------------------------------------------------------------------------------


def rs_layouts(W, numels, rows, gdt, chunks):
    """Layouts with exactly `chunks` RS pipeline chunks (1 or 2: what a capture takes)."""
    for cb in [1 << 24] + [int(x) for x in np.geomspace(1 << 20, 32, 80)]:
        layouts = make_layouts(numels, rows, [gdt] * len(numels), W, rs_chunk_bytes=cb)
        if layouts[0].rs_num_chunks == chunks:
            return layouts
    pytest.fail(f"no chunk size gives {chunks} chunks")


class RsCase:
    def __init__(self, torch, world, rng, gdt, odt, op, chunks):
        W = world.n_ranks
        numels, rows = [2999, 37, 64 * 48, 1, 700 + W], [1, 1, 64, 1, 1]
        self.torch, self.world, self.rng = torch, world, rng
        self.gdt, self.odt, self.op = gdt, odt, op
        self.scale = 0.3125 if op == "premul" else 1.0
        self.layouts = rs_layouts(W, numels, rows, gdt, chunks)
        self.L = self.layouts[0]
        assert self.L.rs_num_chunks == chunks
        tdt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        self.grads = [[torch.empty(p.numel, dtype=tdt[gdt], device="cuda") for p in self.L.params] for _ in range(W)]
        self.outs = [torch.empty(self.L.rs_out_numel, dtype=tdt[odt], device="cuda") for _ in range(W)]
        self.staging = world.alloc_slot(self.L.rs_staging_bytes)

    def new_inputs(self):
        torch, W = self.torch, self.world.n_ranks
        grads_cpu = [[random_float(torch, self.rng, p.numel, self.gdt) for p in self.L.params] for _ in range(W)]
        self.expected = nccl_tide.host_reduce_scatter(
            self.L, grads_cpu, out_dtype=self.odt, op=self.op, scale=self.scale
        )
        for r in range(W):
            for g, c in zip(self.grads[r], grads_cpu[r]):
                g.copy_(c)
        self.poison()
        return self.expected

    def poison(self):
        for o in self.outs:
            o.view(self.torch.uint8).fill_(POISON)
        self.torch.cuda.synchronize()

    def call(self, r):
        self.world.rank_reduce_scatter(
            r,
            self.layouts[r],
            self.grads[r],
            self.outs[r],
            op=self.op,
            scale=self.scale,
            staging=self.staging[r],
            stream=self.world.streams[r],
        )

    def eager(self, own_staging=False):
        self.world.reduce_scatter(
            self.layouts,
            self.grads,
            self.outs,
            op=self.op,
            scale=self.scale,
            staging=None if own_staging else self.staging,
            streams=self.world.streams,
        )

    def result(self):
        self.world.synchronize(timeout=60)
        return [as_bits(self.torch, o).view(np.uint8).copy() for o in self.outs]

    def check(self, got, what):
        for r in range(self.world.n_ranks):
            exp = np.ascontiguousarray(self.expected[r]).view(np.uint8)
            if not np.array_equal(got[r], exp):
                bad = np.flatnonzero(got[r] != exp)
                pytest.fail(
                    f"{what} RS W={self.world.n_ranks} {self.gdt}->{self.odt} {self.op} "
                    f"chunks={self.L.rs_num_chunks}: rank {r}: {bad.size} bytes differ, first at {bad[0]}"
                )

    def close(self):
        self.world.synchronize()
        self.world.free_slot(self.staging)


# ----------------------------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture
def world_of(torch_cuda, cuda_lib):
    from nccl_tide.cuda import LoopbackWorld

    made = []

    def get(n):
        made.append(LoopbackWorld(n))
        return made[-1]

    yield get
    for w in made:
        w.synchronize()
        w.close()


def replay_and_compare(torch, world, case, execs, replays=REPLAYS):
    """Each replay: fresh inputs, launch every rank's graph, compare with the host; then an eager run of the same
    collective on the same buffers, compared with the host and with the replay."""
    for it in range(replays):
        case.new_inputs()
        launch_all(world, execs)
        got = case.result()
        case.check(got, f"replay {it}")
        case.poison()
        case.eager()
        eager = case.result()
        case.check(eager, f"eager after replay {it}")
        for r in range(world.n_ranks):
            assert np.array_equal(got[r], eager[r]), f"replay {it}: rank {r}: replay and eager run differ"


@pytest.mark.parametrize("W", [2, 3, 4])
def test_captured_all_gather_replays(torch_cuda, world_of, W):
    torch = torch_cuda
    world = world_of(W)
    case = AgCase(torch, world, seeded("cap-ag", W), ["bf16", "fp32", "int8", "fp16"])
    try:
        case.new_inputs()
        case.eager()  # eager calls before the capture
        case.check(case.result(), "eager before capture")
        execs = capture_each_rank(torch, world, case.call)
        try:
            replay_and_compare(torch, world, case, execs)
            # Several replays back to back without host synchronization (same inputs), then an eager call.
            case.new_inputs()
            for _ in range(5):
                launch_all(world, execs)
            case.check(case.result(), "back-to-back replays")
            case.poison()
            case.eager()
            case.check(case.result(), "eager after back-to-back replays")
        finally:
            destroy(world, execs)
    finally:
        case.close()


@pytest.mark.parametrize(
    "W,gdt,odt,op,chunks",
    [
        (2, "bf16", "fp32", "sum", 1),
        (2, "fp32", "fp32", "avg", 2),
        (3, "bf16", "bf16", "premul", 2),
        (4, "fp16", "fp32", "avg", 1),
        (4, "bf16", "bf16", "sum", 2),
    ],
)
def test_captured_reduce_scatter_replays(torch_cuda, world_of, W, gdt, odt, op, chunks):
    torch = torch_cuda
    world = world_of(W)
    case = RsCase(torch, world, seeded("cap-rs", W, gdt, odt, op, chunks), gdt, odt, op, chunks)
    try:
        case.new_inputs()
        case.eager()
        case.check(case.result(), "eager before capture")
        execs = capture_each_rank(torch, world, case.call)
        try:
            replay_and_compare(torch, world, case, execs, replays=20)
            # Eager with the world's own staging between replays, then replays back to back.
            case.poison()
            case.eager(own_staging=True)
            case.check(case.result(), "eager own staging")
            case.new_inputs()
            for _ in range(5):
                launch_all(world, execs)
            case.check(case.result(), "back-to-back replays")
        finally:
            destroy(world, execs)
    finally:
        case.close()


def test_captured_ag_and_rs_graphs_interleaved(torch_cuda, world_of):
    """Each rank captures an AG graph and an RS graph; rounds launch every rank's AG graph, then every rank's RS
    graph, then eager AG and RS, with no host synchronization inside a round."""
    torch = torch_cuda
    W = 3
    world = world_of(W)
    rng = seeded("cap-mixed")
    ag = AgCase(torch, world, rng, ["bf16"])
    rs = RsCase(torch, world, rng, "bf16", "fp32", "sum", 2)
    try:
        ag.new_inputs()
        rs.new_inputs()
        ag.eager()  # eager calls before the captures
        rs.eager()
        ag.check(ag.result(), "eager AG before capture")
        rs.check(rs.result(), "eager RS before capture")
        ag_execs = capture_each_rank(torch, world, ag.call)
        rs_execs = capture_each_rank(torch, world, rs.call)
        try:
            for it in range(REPLAYS):
                ag.new_inputs()
                rs.new_inputs()
                launch_all(world, ag_execs)
                launch_all(world, rs_execs)
                ag.check(ag.result(), f"round {it} AG graph")
                rs.check(rs.result(), f"round {it} RS graph")
                if it % 4 == 3:
                    ag.poison()
                    rs.poison()
                    ag.eager()
                    rs.eager()
                    launch_all(world, ag_execs)  # replay right after eager calls, before any host sync
                    ag.check(ag.result(), f"round {it} eager AG + AG graph")
                    rs.check(rs.result(), f"round {it} eager RS")
        finally:
            destroy(world, ag_execs)
            destroy(world, rs_execs)
    finally:
        ag.close()
        rs.close()


def test_uncapturable_is_refused_at_capture_time(torch_cuda, world_of):
    """A second TIDE collective in one rank's loopback graph, RS with the world's own staging, RS with more than 2
    chunks, and layouts of several (virtual) nodes: UnsupportedError at capture time, nothing enqueued, every capture
    stays valid, and the graphs holding the accepted AG replay correctly."""
    from nccl_tide.errors import UnsupportedError

    torch = torch_cuda
    W = 2
    world = world_of(W)
    rng = seeded("cap-refused")
    ag = AgCase(torch, world, rng, ["bf16"])
    rs = RsCase(torch, world, rng, "bf16", "fp32", "sum", 1)
    many = make_layouts([4000, 37, 5 * 64], [1, 1, 64], ["bf16"] * 3, W, rs_chunk_bytes=256)
    assert many[0].rs_num_chunks > 2
    many_staging = world.alloc_slot(many[0].rs_staging_bytes)
    many_grads = [[torch.zeros(p.numel, dtype=torch.bfloat16, device="cuda") for p in many[0].params] for _ in range(W)]
    many_out = torch.empty(many[0].rs_out_numel, dtype=torch.float32, device="cuda")
    vn = make_layouts([999, 5], [1, 1], ["bf16", "bf16"], W, rpn=1, pace_bytes=512)  # 2 virtual nodes
    vn_slots = world.alloc_slot(vn[0].slot_bytes)
    vn_send = [torch.zeros(vn[0].send_bytes, dtype=torch.uint8, device="cuda") for _ in range(W)]
    vn_grads = [[torch.zeros(p.numel, dtype=torch.bfloat16, device="cuda") for p in vn[0].params] for _ in range(W)]
    vn_out = torch.empty(vn[0].rs_out_numel, dtype=torch.float32, device="cuda")
    vn_staging = world.alloc_slot(max(vn[0].rs_staging_bytes, 1))
    refused = []

    def calls(r):
        s = world.streams[r]
        if r == 0:
            # Refused before anything is enqueued: these must not disturb the captures.
            with pytest.raises(UnsupportedError, match="Slot-Reuse"):
                world.rank_reduce_scatter(0, rs.layouts[0], rs.grads[0], rs.outs[0], op="sum", stream=s)
            with pytest.raises(UnsupportedError, match="at most 2"):
                world.rank_reduce_scatter(0, many[0], many_grads[0], many_out, staging=many_staging[0], stream=s)
            with pytest.raises(UnsupportedError, match="several nodes"):
                world.rank_all_gather(0, vn[0], vn_slots[0], sendbuf=vn_send[0], stream=s)
            with pytest.raises(UnsupportedError, match="several nodes"):
                world.rank_reduce_scatter(0, vn[0], vn_grads[0], vn_out, staging=vn_staging[0], stream=s)
        ag.call(r)
        with pytest.raises(UnsupportedError, match="only one TIDE collective"):
            rs.call(r)
        refused.append(r)

    try:
        ag.new_inputs()
        ag.eager()
        ag.check(ag.result(), "eager AG before capture")
        execs = capture_each_rank(torch, world, calls)
        assert refused == list(range(W))
        try:
            replay_and_compare(torch, world, ag, execs, replays=4)
        finally:
            destroy(world, execs)
        # Nothing of the refused calls was taken: eager collectives still pair up across ranks.
        rs.new_inputs()
        rs.eager()
        rs.check(rs.result(), "eager RS after refusals")
        rs.poison()
        rs.eager(own_staging=True)
        rs.check(rs.result(), "eager RS (own staging) after refusals")
    finally:
        world.synchronize()
        for s in (many_staging, vn_slots, vn_staging):
            world.free_slot(s)
        ag.close()
        rs.close()
