# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Eager TIDE-AG / TIDE-RS as replays of graphs the library captured itself (docs/architecture.md "Eager calls as
graph replays"), on loopback worlds.

With NCCL_TIDE_EAGER_GRAPHS=1 (the default; these tests skip with NCCL_TIDE_EAGER_GRAPHS=0) an eager single-node AG, or RS of
at most NCCL_TIDE_TOKEN_RS_CHUNKS chunks (64 by default; the "pipelined" tests need at least 8 and
run in a subprocess with 64 where it is lower; test_interleaved_routes needs 2 or 3, in a subprocess where it is
higher), runs the token
protocol: the first call with a binding is issued directly, the second is captured into a graph on the comm's
private stream and launched, later ones replay that graph. Every call here gets fresh random inputs (never zeros)
and poisoned outputs, and is compared bit for bit with the host executor; the debug dump says how each rank issued
its last call, so the tests also check that the graph route was taken when it should be (and not when it should
not). Interleaved on one world: eager graph-route calls, eager epoch-protocol calls (RS of 4 chunks) and
user-captured graphs of TIDE calls. The switch off (a subprocess, since the parameter is read once) is exactly the
epoch protocol. The test-only switches (docs/env.md, "Test builds") are flipped in subprocesses with
NCCL_TIDE_TEST_SWITCHES=1; those tests skip on a library that is no test build (-DTIDE_TEST_SWITCHES=ON).
"""

import ctypes
import os
import subprocess
import sys
import textwrap

import nccl_tide
import numpy as np
import pytest
from fixtures import NO_TEST_SWITCHES, has_test_switches
from gpu_util import POISON, as_bits, bits_dtype, make_layouts, random_bytes, random_float, seeded
from nccl_tide import _native as N
from nccl_tide.errors import UnsupportedError
from test_graph_capture import (  # noqa: F401 (world_of: the fixture, shared)
    AgCase, RsCase, capture_each_rank, destroy, launch_all, rs_layouts, world_of)

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

CALLS = 5
DIRECT = "issued directly"
CAPTURED = "captured into a graph and replayed from it"
REPLAYED = "replayed from a graph"


def route_on() -> bool:
    return os.environ.get("NCCL_TIDE_EAGER_GRAPHS", "1") == "1"  # on by default (docs/env.md)


# NCCL_TIDE_TOKEN_RS_CHUNKS in force in this process (the library's effective value, default included): RSs of more
# chunks than 2 take the token protocol (2 staging buffers behind consumed tokens) up to it. The "pipelined" tests
# need at least 8; below, test_pipelined_in_a_subprocess runs them in a process that sets 64.
TOKEN_RS_CHUNKS = int(N.param_value("NCCL_TIDE_TOKEN_RS_CHUNKS"))
needs_pipelined = pytest.mark.skipif(not route_on() or TOKEN_RS_CHUNKS < 8,
                                     reason="needs NCCL_TIDE_TOKEN_RS_CHUNKS >= 8 (test_pipelined_in_a_subprocess)")


def last_program(world, r, coll):
    """The debug dump's "last AG/RS program: ..." line of rank r (call between collectives)."""
    buf = ctypes.create_string_buffer(64 * 1024)
    assert N.lib().tideCommDebugDump(world.comms[r], buf, len(buf)) == N.tideSuccess
    text = buf.value.decode()
    for line in text.splitlines():
        if line.strip().startswith(f"last {coll} program:"):
            return line.strip()
    pytest.fail(f"rank {r}: no 'last {coll} program' line in the dump:\n{text}")


def expect_issue(world, coll, how, what):
    """Every rank's last call of `coll` was a token call issued `how` (DIRECT, CAPTURED, REPLAYED), or an epoch
    call when how is None."""
    for r in range(world.n_ranks):
        line = last_program(world, r, coll)
        if how is None:
            assert "token-protocol" not in line, f"{what}: rank {r}: {line}"
        else:
            assert f"token-protocol issue: {how};" in line, f"{what}: rank {r}: expected '{how}': {line}"


def amortised(call_index):
    """How the call_index-th call (0-based) with one binding and unchanged values is issued."""
    return DIRECT if call_index == 0 else CAPTURED if call_index == 1 else REPLAYED


class ShardAgCase(AgCase):
    """AgCase through per-parameter shard pointers (views of the send buffers) instead of the packed buffer."""

    def eager(self):
        shards = [
            [self.send[r][p.send_offset : p.send_offset + p.shard_numel * p.elem_size].view(bits_dtype(self.torch, p.dtype))
             for p in self.L.params]
            for r in range(self.world.n_ranks)
        ]
        self.world.all_gather(self.layouts, self.slots, shards=shards, streams=self.world.streams)


# ----------------------------------------------------------------------------------------------------------------
# Bit-exact, graph route taken
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not route_on(), reason="NCCL_TIDE_EAGER_GRAPHS=0")
@pytest.mark.parametrize("W", [2, 4, 8])
def test_eager_all_gather_graph_route_bit_exact(torch_cuda, world_of, W):
    torch = torch_cuda
    world = world_of(W)
    for li in range(3):
        cls = ShardAgCase if li == 2 else AgCase
        case = cls(torch, world, seeded("eager-ag", W, li), ["bf16", "fp32", "int8", "fp16", "fp8_e4m3"])
        try:
            for it in range(CALLS):
                case.new_inputs()
                case.eager()
                case.check(case.result(), f"layout {li} ({cls.__name__}) call {it}")
                expect_issue(world, "AG", amortised(it), f"layout {li} call {it}")
        finally:
            case.close()


@pytest.mark.skipif(not route_on(), reason="NCCL_TIDE_EAGER_GRAPHS=0")
@pytest.mark.parametrize("W", [2, 4, 8])
def test_eager_all_gather_strided_runs_bit_exact(torch_cuda, world_of, W):
    """Same-size parameters from packed send buffers: the per-copy path plans strided runs (plugin/core/copy_runs.h),
    so the library's graph holds one 2D memcpy node per destination rank and size block (the dump says how many)
    instead of one per copy; direct, captured and replayed calls stay bit-exact with the host executor. 16
    parameters of one size (W runs), then 5 of one size and 3 of another (2W runs)."""
    torch = torch_cuda
    world = world_of(W)
    for li, numels in enumerate([[W * 1024] * 16, [W * 1024] * 5 + [W * 512] * 3]):
        spec = (numels, [1] * len(numels), ["bf16"] * len(numels))
        case = AgCase(torch, world, seeded("eager-ag-strided", W, li), None, spec=spec)
        blocks = 1 if li == 0 else 2
        try:
            for it in range(CALLS):
                case.new_inputs()
                case.eager()
                case.check(case.result(), f"layout {li} call {it}")
                expect_issue(world, "AG", amortised(it), f"layout {li} call {it}")
                for r in range(W):
                    line = last_program(world, r, "AG")
                    want = f"{len(numels) * W} copy entries, {blocks * W} as graph copy nodes"
                    assert line.endswith(want), f"layout {li} rank {r}: {line} (want '{want}')"
        finally:
            case.close()


RS_CASES = [
    # W, gradient dtype, output dtype, op, chunks, own staging
    (2, "bf16", "fp32", "sum", 1, False),
    (2, "fp32", "fp32", "avg", 2, True),
    (4, "bf16", "bf16", "premul", 2, False),
    (4, "fp16", "fp32", "avg", 1, True),
    (8, "bf16", "fp32", "sum", 2, True),
    (8, "bf16", "bf16", "premul", 1, False),
    (8, "fp32", "fp32", "sum", 1, True),
]


@pytest.mark.skipif(not route_on(), reason="NCCL_TIDE_EAGER_GRAPHS=0")
@pytest.mark.parametrize("W,gdt,odt,op,chunks,own", RS_CASES)
def test_eager_reduce_scatter_graph_route_bit_exact(torch_cuda, world_of, W, gdt, odt, op, chunks, own):
    eager_rs_calls(torch_cuda, world_of(W), "eager-rs", W, gdt, odt, op, chunks, own)


def eager_rs_calls(torch, world, tag, W, gdt, odt, op, chunks, own):
    """CALLS eager RSs of one binding (direct, captured, then replayed), each bit-exact with the host executor."""
    case = RsCase(torch, world, seeded(tag, W, gdt, odt, op, chunks, own), gdt, odt, op, chunks)
    try:
        for it in range(CALLS):
            case.new_inputs()
            case.eager(own_staging=own)
            case.check(case.result(), f"call {it} ({'own' if own else 'slot'} staging)")
            expect_issue(world, "RS", amortised(it), f"call {it}")
    finally:
        case.close()


# More chunks than staging buffers (NCCL_TIDE_TOKEN_RS_CHUNKS raised; docs/architecture.md "More chunks than buffers")
PIPELINED_CASES = [
    # W, gradient dtype, output dtype, op, chunks, own staging
    (2, "bf16", "fp32", "sum", 3, False),
    (2, "fp32", "fp32", "avg", 8, True),
    (4, "bf16", "bf16", "premul", 4, False),
    (4, "fp16", "fp32", "avg", 5, True),
    (8, "bf16", "fp32", "sum", 4, True),
    (8, "bf16", "bf16", "premul", 6, False),
    (8, "fp32", "fp32", "sum", 3, False),
]


@needs_pipelined
@pytest.mark.parametrize("W,gdt,odt,op,chunks,own", PIPELINED_CASES)
def test_eager_reduce_scatter_pipelined_bit_exact(torch_cuda, world_of, W, gdt, odt, op, chunks, own):
    """An eager token RS of 3-8 chunks over 2 staging buffers (pushes of chunk k wait for every owner's consumed token
    of chunk k - 2): direct, captured, then replayed, each call bit-exact with the host executor."""
    eager_rs_calls(torch_cuda, world_of(W), "eager-rs-pipelined", W, gdt, odt, op, chunks, own)


@needs_pipelined
@pytest.mark.parametrize("W,chunks", [(2, 3), (4, 5), (8, 4)])
def test_captured_reduce_scatter_pipelined_refused_on_loopback(torch_cuda, world_of, W, chunks):
    """A user capture of an RS of more chunks than buffers is refused on loopback (a rank's whole graph, launched
    ahead of the next rank's, could fill the shared copy queues: tests/unit/test_program_model.py shows the hang), with
    nothing enqueued and the capture still valid; eager token RSs of the same layout around it stay bit-exact and
    the eager token AG beside them too."""
    torch = torch_cuda
    world = world_of(W)
    rng = seeded("captured-rs-pipelined", W, chunks)
    rs = RsCase(torch, world, rng, "bf16", "fp32", "sum", chunks)
    ag = AgCase(torch, world, rng, ["bf16", "fp32"])
    try:
        for it in range(4):
            rs.new_inputs()
            ag.new_inputs()
            ag.eager()
            rs.eager(own_staging=it % 2 == 1)
            rs.check(rs.result(), f"eager RS {it}")
            ag.check(ag.result(), f"eager AG {it}")

        def refused(r):
            with pytest.raises(UnsupportedError, match="at most 2 pipeline chunks"):
                rs.call(r)
            ag.call(r)  # the capture is still valid: an AG captures after the refusal

        execs = capture_each_rank(torch, world, refused)
        try:
            for it in range(3):
                ag.new_inputs()
                launch_all(world, execs)
                ag.check(ag.result(), f"AG graph after the refusal, replay {it}")
                rs.new_inputs()
                rs.eager()
                rs.check(rs.result(), f"eager RS after the refusal {it}")
                expect_issue(world, "RS", REPLAYED, f"eager RS after the refusal {it}")
        finally:
            destroy(world, execs)
    finally:
        rs.close()
        ag.close()


def _in_a_subprocess(token_rs_chunks, select, n_expected, files=(), **extra_env):
    """Runs this file's tests (or those of `files`: paths or node ids) matching `select` (pytest -k; None: all) in a
    process with NCCL_TIDE_TOKEN_RS_CHUNKS (and extra_env) set (the library reads them once per process), and asserts
    that exactly n_expected passed and none was skipped."""
    env = dict(os.environ, NCCL_TIDE_TOKEN_RS_CHUNKS=str(token_rs_chunks), CUDA_DEVICE_MAX_CONNECTIONS="32",
               NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1", **extra_env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", ""), *sys.path] if p)
    # -x: after a hang the GPU is wedged, the rest would only burn time; the child dumps its stacks before the
    # parent's timeout, which fits inside ci/gpu.sh's per-file limit and reports what the child printed.
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-rs", "-p", "no:cacheprovider", "-o",
                            "faulthandler_timeout=110", *(files or [__file__]), *(["-k", select] if select else [])],
                           capture_output=True, text=True, env=env, timeout=130)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"{select or files!r} did not finish in 130 s:\n" + out[-4000:] + err[-3000:])
    assert p.returncode == 0 and f"{n_expected} passed" in p.stdout and "skipped" not in p.stdout, (
        p.stdout[-4000:] + p.stderr[-2000:])


def test_pipelined_in_a_subprocess(torch_cuda, cuda_lib):
    """The pipelined tests above, in a process with NCCL_TIDE_TOKEN_RS_CHUNKS=64, where this one's limit is lower."""
    if TOKEN_RS_CHUNKS >= 8 or not route_on():
        pytest.skip("this process runs the pipelined tests itself (or the route is off)")
    _in_a_subprocess(64, "pipelined and not subprocess", len(PIPELINED_CASES) + 3)


def node(test, params=None, file=__file__):
    """The pytest node id of `test` in `file` (this one by default), with its parametrization id if given."""
    return f"{os.path.abspath(file)}::{test}" + (f"[{params}]" if params is not None else "")


# The switches below change how every graph is built, not what it computes for a world size, dtype or op: each
# flipped run takes one test per kind of graph, and this process runs the sweeps with the library's own settings.
CAPTURE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_graph_capture.py")
# AG graphs: the graph route at 8 ranks (the most flag batches), strided runs; user-captured, alone and beside RS.
AG_GRAPH_TESTS = [node("test_eager_all_gather_graph_route_bit_exact", 8),
                  node("test_eager_all_gather_strided_runs_bit_exact", 4),
                  node("test_captured_all_gather_replays", 4, CAPTURE_FILE),
                  node("test_captured_ag_and_rs_graphs_interleaved", file=CAPTURE_FILE)]
# RS graphs: the graph route and the pipelined route (more chunks than buffers), each with own and Slot-Reuse staging.
RS_GRAPH_TESTS = [node("test_eager_reduce_scatter_graph_route_bit_exact", "8-bf16-fp32-sum-2-True"),
                  node("test_eager_reduce_scatter_graph_route_bit_exact", "4-bf16-bf16-premul-2-False"),
                  node("test_eager_reduce_scatter_pipelined_bit_exact", "8-bf16-fp32-sum-4-True"),
                  node("test_eager_reduce_scatter_pipelined_bit_exact", "4-bf16-bf16-premul-4-False")]
# Both, and user-captured RS of one and two chunks, the capture refusals, value and pointer changes between calls.
GRAPH_TESTS = AG_GRAPH_TESTS + RS_GRAPH_TESTS + [
    node("test_captured_reduce_scatter_replays", "2-bf16-fp32-sum-1", CAPTURE_FILE),
    node("test_captured_reduce_scatter_replays", "4-bf16-bf16-sum-2", CAPTURE_FILE),
    node("test_captured_reduce_scatter_pipelined_refused_on_loopback", "4-5"),
    node("test_uncapturable_is_refused_at_capture_time", file=CAPTURE_FILE),
    node("test_values_and_pointer_changes")]


needs_test_switches = pytest.mark.skipif(not has_test_switches(), reason=NO_TEST_SWITCHES)


def _flipped_in_a_subprocess(param, tests):
    """The tests (node ids) in a process with the test-only bool switch `param` flipped (this process runs them with
    its own setting); every one must pass."""
    other = "0" if N.param_value(param) == "1" else "1"
    _in_a_subprocess(64, None, len(tests), files=tests, NCCL_TIDE_TEST_SWITCHES="1", **{param: other})


@needs_test_switches
@pytest.mark.skipif(not route_on(), reason="NCCL_TIDE_EAGER_GRAPHS=0")
def test_signal_kernels_other_setting_in_a_subprocess(torch_cuda, cuda_lib):
    """RS_GRAPH_TESTS with NCCL_TIDE_SIGNAL_KERNELS flipped (this process runs every RS test with its own setting):
    write-only flag batches in the RS graphs as memop nodes (0) or as signal kernels (1), bit-exact with the host
    executor either way."""
    _flipped_in_a_subprocess("NCCL_TIDE_SIGNAL_KERNELS", RS_GRAPH_TESTS)


@needs_test_switches
@pytest.mark.skipif(not route_on(), reason="NCCL_TIDE_EAGER_GRAPHS=0")
def test_merge_flag_batches_other_setting_in_a_subprocess(torch_cuda, cuda_lib):
    """GRAPH_TESTS with NCCL_TIDE_MERGE_FLAG_BATCHES flipped: adjacent flag batches in a graph as one memop node (1)
    or one node each (0), bit-exact with the host executor either way."""
    _flipped_in_a_subprocess("NCCL_TIDE_MERGE_FLAG_BATCHES", GRAPH_TESTS)


@needs_test_switches
@pytest.mark.skipif(not route_on(), reason="NCCL_TIDE_EAGER_GRAPHS=0")
def test_pair_tokens_other_setting_in_a_subprocess(torch_cuda, cuda_lib):
    """GRAPH_TESTS with NCCL_TIDE_PAIR_TOKENS flipped: the tokens waited for (and the barrier tokens reset) two words
    per 64-bit memop (1) or one word per 32-bit memop (0), bit-exact with the host executor either way."""
    _flipped_in_a_subprocess("NCCL_TIDE_PAIR_TOKENS", GRAPH_TESTS)


@needs_test_switches
@pytest.mark.skipif(not route_on(), reason="NCCL_TIDE_EAGER_GRAPHS=0")
def test_ag_signal_kernels_other_setting_in_a_subprocess(torch_cuda, cuda_lib):
    """AG_GRAPH_TESTS with NCCL_TIDE_AG_SIGNAL_KERNELS flipped: the all-gather's write-only flag batches (announce,
    done tokens) as one-warp kernel nodes (1) or memop operations (0), bit-exact with the host executor either way."""
    _flipped_in_a_subprocess("NCCL_TIDE_AG_SIGNAL_KERNELS", AG_GRAPH_TESTS)


# ----------------------------------------------------------------------------------------------------------------
# Interleaving: graph route, epoch protocol and user captures on one world
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not route_on(), reason="NCCL_TIDE_EAGER_GRAPHS=0")
@pytest.mark.skipif(TOKEN_RS_CHUNKS >= 4, reason="NCCL_TIDE_TOKEN_RS_CHUNKS >= 4: the RS of 4 chunks takes tokens "
                    "(test_interleaved_routes_in_a_subprocess runs it with the limit at 2)")
def test_interleaved_routes(torch_cuda, world_of):
    """Per round, on each rank's one stream: eager AG (graph route), eager RS of 4 chunks (epoch protocol, deferred),
    a user-captured AG graph, eager RS of 2 chunks (graph route; own staging every other round), a user-captured RS
    graph; no host synchronization inside a round, every result bit-exact each round."""
    torch = torch_cuda
    W = 4
    world = world_of(W)
    rng = seeded("interleaved")
    ag = AgCase(torch, world, rng, ["bf16", "fp32"])
    rs4 = RsCase(torch, world, rng, "bf16", "fp32", "sum", 4)
    ag_cap = AgCase(torch, world, rng, ["fp16", "int8"])
    rs2 = RsCase(torch, world, rng, "bf16", "bf16", "avg", 2)
    rs_cap = RsCase(torch, world, rng, "fp32", "fp32", "premul", 1)
    cases = [ag, rs4, ag_cap, rs2, rs_cap]
    try:
        for c in cases:  # eager calls before the captures (and the first, direct, token calls)
            c.new_inputs()
        ag.eager()
        rs4.eager()
        ag_cap.eager()
        rs2.eager()
        rs_cap.eager()
        for c in cases:
            c.check(c.result(), "eager before the captures")
        ag_execs = capture_each_rank(torch, world, ag_cap.call)
        rs_execs = capture_each_rank(torch, world, rs_cap.call)
        try:
            for it in range(10):
                for c in cases:
                    c.new_inputs()
                ag.eager()
                rs4.eager(own_staging=it % 2 == 0)
                launch_all(world, ag_execs)
                rs2.eager(own_staging=it % 2 == 1)
                launch_all(world, rs_execs)
                for c, name in zip(cases, ["eager AG", "eager RS 4 chunks", "AG graph", "eager RS 2 chunks", "RS graph"]):
                    c.check(c.result(), f"round {it} {name}")
                expect_issue(world, "AG", REPLAYED if it >= 1 else CAPTURED, f"round {it} AG")
                # rs2 alternates Slot-Reuse (even rounds; its first use was before the captures) and own staging (odd
                # rounds; grown once, then stable): two bindings, each captured at its second use.
                expect_issue(world, "RS", {0: CAPTURED, 1: DIRECT, 2: REPLAYED, 3: CAPTURED}.get(it, REPLAYED),
                             f"round {it} RS")
            # The RS of 4 chunks stays on the epoch protocol.
            rs4.new_inputs()
            rs4.eager()
            rs4.check(rs4.result(), "eager RS 4 chunks at the end")
            expect_issue(world, "RS", None, "RS of 4 chunks")
        finally:
            destroy(world, ag_execs)
            destroy(world, rs_execs)
    finally:
        for c in cases:
            c.close()


@pytest.mark.skipif(not route_on(), reason="NCCL_TIDE_EAGER_GRAPHS=0")
def test_interleaved_routes_in_a_subprocess(torch_cuda, cuda_lib):
    """test_interleaved_routes in a process with NCCL_TIDE_TOKEN_RS_CHUNKS=2, where this one's limit (64 by default)
    would put its RS of 4 chunks on tokens: the epoch protocol interleaved with the graph route keeps its test."""
    if TOKEN_RS_CHUNKS < 4:
        pytest.skip("this process runs test_interleaved_routes itself")
    _in_a_subprocess(2, "test_interleaved_routes and not subprocess", 1)


# ----------------------------------------------------------------------------------------------------------------
# Pointer and value changes between calls
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not route_on(), reason="NCCL_TIDE_EAGER_GRAPHS=0")
def test_values_and_pointer_changes(torch_cuda, world_of):
    """A binding is the layout plus every pointer; a graph also bakes the RS call values in. Pointer changes rebind
    (direct first, captured at the second use); value changes issue directly and recapture when they repeat."""
    torch = torch_cuda
    W = 4
    world = world_of(W)
    rng = seeded("changes")
    Ls = make_layouts([3001, 64 * 7, 5, 999], [1, 64, 1, 1], ["bf16", "bf16", "fp32", "fp16"], W)
    L = Ls[0]
    # Every slot first: a slot allocation changes the memory generation, which is part of every binding.
    slots = {k: world.alloc_slot(L.slot_bytes) for k in "AB"}
    rsL = rs_layouts(W, [2999, 37, 64 * 48, 1, 700 + W], [1, 1, 64, 1, 1], "bf16", 2)
    staging = world.alloc_slot(rsL[0].rs_staging_bytes)
    sends = {k: [torch.empty(L.send_bytes, dtype=torch.uint8, device="cuda") for _ in range(W)] for k in "ABC"}

    def ag_call(slot_key, send_key, how, what):
        send_cpu = [random_bytes(torch, rng, L.send_bytes) for _ in range(W)]
        shards = [
            [send_cpu[r][p.send_offset : p.send_offset + p.shard_numel * p.elem_size].view(bits_dtype(torch, p.dtype))
             for p in L.params]
            for r in range(W)
        ]
        expected = nccl_tide.host_all_gather(L, shards)
        for r in range(W):
            sends[send_key][r].copy_(send_cpu[r])
        for s in slots[slot_key]:
            s.fill_(POISON)
        torch.cuda.synchronize()
        world.all_gather(Ls, slots[slot_key], sendbufs=sends[send_key], streams=world.streams)
        world.synchronize(timeout=60)
        for r in range(W):
            got = slots[slot_key][r].cpu().numpy()
            for i, p in enumerate(L.params):
                n = p.shard_numel * W * p.elem_size
                exp = np.ascontiguousarray(expected[r][i]).view(np.uint8)
                assert np.array_equal(got[p.slot_offset : p.slot_offset + n], exp), f"{what}: rank {r} param {i}"
        expect_issue(world, "AG", how, what)

    ag_seq = [("A", "A", DIRECT), ("A", "A", CAPTURED), ("B", "A", DIRECT), ("A", "A", REPLAYED), ("B", "B", DIRECT),
              ("B", "B", CAPTURED), ("B", "B", REPLAYED), ("A", "B", DIRECT), ("A", "C", DIRECT), ("A", "C", CAPTURED),
              ("A", "A", REPLAYED)]
    for k, (sk, dk, how) in enumerate(ag_seq):
        ag_call(sk, dk, how, f"AG call {k} slot {sk} send {dk}")

    tdt = {"fp32": torch.float32, "bf16": torch.bfloat16}
    R = rsL[0]
    grads = {k: [[torch.empty(p.numel, dtype=torch.bfloat16, device="cuda") for p in R.params] for _ in range(W)]
             for k in "AB"}
    outs = {o: [torch.empty(R.rs_out_numel, dtype=tdt[o], device="cuda") for _ in range(W)] for o in tdt}

    def rs_call(gk, odt, op, scale, how, what):
        grads_cpu = [[random_float(torch, rng, p.numel, "bf16") for p in R.params] for _ in range(W)]
        expected = nccl_tide.host_reduce_scatter(R, grads_cpu, out_dtype=odt, op=op, scale=scale)
        for r in range(W):
            for g, c in zip(grads[gk][r], grads_cpu[r]):
                g.copy_(c)
            outs[odt][r].view(torch.uint8).fill_(POISON)
        torch.cuda.synchronize()
        world.reduce_scatter(rsL, grads[gk], outs[odt], op=op, scale=scale, staging=staging, streams=world.streams)
        world.synchronize(timeout=60)
        for r in range(W):
            got = as_bits(torch, outs[odt][r]).view(np.uint8)
            exp = np.ascontiguousarray(expected[r]).view(np.uint8)
            assert np.array_equal(got, exp), f"{what}: rank {r}: {np.count_nonzero(got != exp)} bytes differ"
        expect_issue(world, "RS", how, what)

    rs_seq = [("A", "fp32", "sum", 1.0, DIRECT), ("A", "fp32", "sum", 1.0, CAPTURED),
              ("A", "fp32", "premul", 0.5, DIRECT), ("A", "fp32", "premul", 0.5, CAPTURED),
              ("A", "fp32", "premul", 0.25, DIRECT), ("A", "fp32", "sum", 1.0, DIRECT),
              ("A", "bf16", "avg", 1.0, DIRECT), ("A", "bf16", "avg", 1.0, CAPTURED),
              ("B", "fp32", "sum", 1.0, DIRECT), ("B", "fp32", "sum", 1.0, CAPTURED),
              ("A", "fp32", "sum", 1.0, CAPTURED), ("A", "fp32", "sum", 1.0, REPLAYED),
              ("A", "fp32", "premul", 0.5, DIRECT)]
    try:
        for k, (gk, odt, op, scale, how) in enumerate(rs_seq):
            rs_call(gk, odt, op, scale, how, f"RS call {k} grads {gk} {odt} {op} {scale}")
    finally:
        world.synchronize()
        for s in list(slots.values()) + [staging]:
            world.free_slot(s)


# ----------------------------------------------------------------------------------------------------------------
# The switch
# ----------------------------------------------------------------------------------------------------------------

SWITCH_SCRIPT = textwrap.dedent(
    r"""
    import ctypes, sys
    import numpy as np, torch, nccl_tide
    from nccl_tide import _native as N
    from nccl_tide.cuda import LoopbackWorld
    expect_tokens = sys.argv[1] == "1"
    W = 2
    rng = np.random.default_rng(7)
    w = LoopbackWorld(W)
    Ls = [nccl_tide.Layout([4099, 64 * 3, 17], ["bf16", "fp32", "bf16"], W, rank=r, row_numels=[1, 64, 1])
          for r in range(W)]
    L = Ls[0]
    slots = w.alloc_slot(L.slot_bytes)

    def line(r, coll):
        buf = ctypes.create_string_buffer(65536)
        assert N.lib().tideCommDebugDump(w.comms[r], buf, len(buf)) == 0
        return [x.strip() for x in buf.value.decode().splitlines() if x.strip().startswith("last %s program" % coll)][0]

    for it in range(4):
        send_cpu = [torch.from_numpy(rng.integers(0, 256, L.send_bytes, dtype=np.uint8)) for _ in range(W)]
        shards = [[send_cpu[r][p.send_offset:p.send_offset + p.shard_numel * p.elem_size].view(
            {"bf16": torch.uint16, "fp32": torch.uint32}[p.dtype]) for p in L.params] for r in range(W)]
        exp = nccl_tide.host_all_gather(L, shards)
        sends = [t.cuda() for t in send_cpu]
        for s in slots:
            s.fill_(0xFF)
        torch.cuda.synchronize()
        w.all_gather(Ls, slots, sendbufs=sends, streams=w.streams)
        w.synchronize(timeout=60)
        for r in range(W):
            got = slots[r].cpu().numpy()
            for i, p in enumerate(L.params):
                n = p.shard_numel * W * p.elem_size
                assert np.array_equal(got[p.slot_offset:p.slot_offset + n],
                                      np.ascontiguousarray(exp[r][i]).view(np.uint8)), ("AG", it, r, i)
        print("AG", it, line(0, "AG"))
        ok = ("token-protocol" in line(0, "AG")) == expect_tokens
        assert ok, line(0, "AG")

    R = [nccl_tide.Layout([3000, 77], "bf16", W, rank=r) for r in range(W)]
    assert R[0].rs_num_chunks <= 2
    rstag = w.alloc_slot(R[0].rs_staging_bytes)
    outs = [torch.empty(R[0].rs_out_numel, dtype=torch.float32, device="cuda") for _ in range(W)]
    for it in range(4):
        gc = [[torch.from_numpy((rng.standard_normal(p.numel) + 3).astype(np.float32)).to(torch.bfloat16)
               for p in R[0].params] for _ in range(W)]
        exp = nccl_tide.host_reduce_scatter(R[0], gc, out_dtype="fp32", op="sum")
        grads = [[g.cuda() for g in gc[r]] for r in range(W)]
        for o in outs:
            o.fill_(float("nan"))
        torch.cuda.synchronize()
        w.reduce_scatter(R, grads, outs, op="sum", staging=None if it % 2 else rstag, streams=w.streams)
        w.synchronize(timeout=60)
        for r in range(W):
            assert np.array_equal(outs[r].cpu().numpy().view(np.uint8),
                                  np.ascontiguousarray(exp[r]).view(np.uint8)), ("RS", it, r)
        l = line(0, "RS")
        print("RS", it, l)
        assert ("token-protocol" in l) == expect_tokens, l
        if not expect_tokens:
            assert "deferred" in l, l
    w.synchronize()
    w.free_slot(slots)
    w.free_slot(rstag)
    w.close()
    print("SWITCH OK", flush=True)
    """
)


@pytest.mark.parametrize("value", ["0", "1"])
def test_switch(torch_cuda, cuda_lib, value):
    """NCCL_TIDE_EAGER_GRAPHS=0: every eager call is the epoch protocol (single-node AG in order, RS deferred), with
    exact results; =1: the token protocol. Each in its own process (the parameter is read once)."""
    env = dict(os.environ, NCCL_TIDE_EAGER_GRAPHS=value, CUDA_DEVICE_MAX_CONNECTIONS="32", NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", ""), *sys.path] if p)
    p = subprocess.run([sys.executable, "-c", SWITCH_SCRIPT, value], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0 and "SWITCH OK" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
