# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Regression tests of a bad-input probe: handles, threads, integers, alignment, NaN bits, messages.

Cases whose failure crashes the process (use after destroy, double destroy, garbage handles, a close racing a call)
run in a child interpreter, so that a regression fails one test instead of killing the run. docs/reliability.md
("Bad-input probe") lists the case classes.
"""

import ctypes
import gc
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import nccl_tide
from nccl_tide import _native as N
from nccl_tide import reference as ref
from nccl_tide.errors import InvalidArgumentError, TideError, UnsupportedError
from nccl_tide.host import host_all_gather, host_reduce_scatter
from nccl_tide.layout import Layout

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNDER_ASAN = "asan" in os.environ.get("LD_PRELOAD", "")


def run_child(code: str, env_extra=None, timeout=240) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.setdefault("NCCL_TIDE_DEBUG", "NONE")
    env.update(env_extra or {})
    # The child imports the same nccl_tide as this process (installed, or the source tree on PYTHONPATH).
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(nccl_tide.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=timeout
    )


def assert_child_ok(p: subprocess.CompletedProcess) -> None:
    assert p.returncode == 0 and "CHILD-OK" in p.stdout, (
        f"child exit {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    )


def cuda_build() -> bool:
    """The loaded library has the CUDA data path (it then refuses a loopback world for lack of a GPU here, or
    because device 999 does not exist, not for lack of CUDA)."""
    arr = (N.tideComm_t * 2)()
    rc = N.lib().tideLoopbackCreate(2, 999, arr)
    return not (rc == N.tideUnsupported and "without CUDA" in N.last_error())


def info_struct():
    info = N.tideLayoutInfo_t()
    info.size, info.version = ctypes.sizeof(info), N.TIDE_LAYOUT_INFO_VERSION
    return info


# -- 1. close while another thread uses the object ------------------------------------------------------------------

CLOSE_RACE = """
import os, resource, sys, threading, time
import numpy as np
from nccl_tide.errors import InvalidArgumentError
from nccl_tide.host import host_all_gather, host_reduce_scatter
from nccl_tide.layout import Layout
if not {asan}:
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # runaway memory fails fast instead of swapping
rng = np.random.default_rng(18)
W, P, n = 8, 4, {numel}
ok = closed = 0
for rnd in range(20):
    l = Layout([n] * P, "fp32", W, ranks_per_node=4)
    sh = l.params[0].shard_numel
    shards = [[rng.standard_normal(sh).astype(np.float32) for _ in range(P)] for _ in range(W)]
    grads = [[rng.standard_normal(n).astype(np.float32) for _ in range(P)] for _ in range(W)]
    params = [[np.empty(sh * W, np.float32) for _ in range(P)] for _ in range(W)]
    errors = []
    def worker():
        global ok, closed
        for _ in range(3):
            try:
                if "{what}" == "ag":
                    out = host_all_gather(l, shards, params)
                    for r in (0, W - 1):
                        for i in range(P):
                            assert np.array_equal(out[r][i], np.concatenate([shards[s][i] for s in range(W)]))
                else:
                    out = host_reduce_scatter(l, grads)
                    assert np.isfinite(out[0]).all()
                ok += 1
            except InvalidArgumentError as e:
                if "layout is closed" not in str(e):
                    errors.append(repr(e))
                closed += 1
            except BaseException as e:
                errors.append(repr(e))
    t = threading.Thread(target=worker)
    t.start()
    time.sleep(0.002 + (rnd % 10) * 0.005)  # lands before, inside and between the C calls
    l.close()
    t.join()
    assert not errors, errors
print("calls completed", ok, "refused as closed", closed)
assert ok + closed == 60
print("CHILD-OK")
"""


@pytest.mark.parametrize("what,numel", [("ag", 1 << 20), ("rs", 1 << 16)])
def test_layout_close_while_another_thread_runs_host_collective(what, numel):
    p = run_child(CLOSE_RACE.format(what=what, numel=numel, asan=UNDER_ASAN), timeout=400)
    assert_child_ok(p)


def test_c_layout_destroy_while_another_thread_calls_host_all_gather():
    # Straight at the C API (no Python lock): every call completes (tideSuccess) or is refused (tideInvalidArgument
    # naming the destroyed layout); never a use after free.
    p = run_child(
        """
        import ctypes, threading
        import numpy as np
        from nccl_tide import _native as N
        lib = N.lib()
        W, n = 4, 1 << 18
        numels = (ctypes.c_uint64 * 2)(n, n)
        dts = (N.tideDataType_t * 2)(2, 2)
        desc = N.tideLayoutDesc_t(ctypes.sizeof(N.tideLayoutDesc_t), 1, 2, numels, None, dts, W, W, 0)
        shards = [np.ones(n // W, np.float32) for _ in range(2 * W)]
        params = [np.zeros(n, np.float32) for _ in range(2 * W)]
        src = N.pointer_table([a.ctypes.data for a in shards])
        dst = N.pointer_table([a.ctypes.data for a in params])
        results = []
        for _ in range(30):
            h = N.tideLayout_t()
            assert lib.tideLayoutCreate(ctypes.byref(desc), None, ctypes.byref(h)) == 0
            def worker():
                for _ in range(4):
                    rc = lib.tideHostAllGather(h, src, dst)
                    results.append((rc, N.last_error() if rc else ""))
            t = threading.Thread(target=worker)
            t.start()
            assert lib.tideLayoutDestroy(h) == 0
            t.join()
        for rc, msg in results:
            assert rc == 0 or (rc == N.tideInvalidArgument and "destroyed" in msg), (rc, msg)
        print("CHILD-OK", sum(1 for rc, _ in results if rc == 0), "completed")
        """
    )
    assert_child_ok(p)


# -- 2. integers that cross into C are range-checked ------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,shown",
    [
        (dict(numels=[2**64 + 5], dtypes="bf16", world_size=8), "18446744073709551621"),
        (dict(numels=[5], dtypes="bf16", world_size=2**32 + 8), "4294967304"),
        (dict(numels=[16], dtypes="bf16", world_size=8, rank=2**32 + 3), "4294967299"),
        (dict(numels=[16], dtypes="bf16", world_size=8, ranks_per_node=2**32 + 4), "4294967300"),
        (dict(numels=[8], dtypes="bf16", world_size=2, row_numels=[2**64 + 2]), "18446744073709551618"),
        (dict(numels=[8], dtypes="bf16", world_size=2, pace_bytes=-1), "-1"),
        (dict(numels=[8], dtypes="bf16", world_size=2, rs_chunk_bytes=-4096), "-4096"),
        (dict(numels=[8], dtypes="bf16", world_size=2, rs_chunk_bytes=2**64), "18446744073709551616"),
        (dict(numels=[-3], dtypes="bf16", world_size=2), "-3"),
        (dict(numels=[8.5], dtypes="bf16", world_size=2), "8.5"),
        (dict(numels=[8], dtypes="bf16", world_size=-(2**31) - 1), "-2147483649"),
    ],
)
def test_out_of_range_integers_are_refused_showing_the_value(kwargs, shown):
    with pytest.raises(InvalidArgumentError) as ei:
        Layout(**kwargs)
    assert shown in str(ei.value)


def test_schedule_node_out_of_int_range():
    with Layout([64] * 3, "fp32", 8, ranks_per_node=2) as l:
        assert len(l.schedule(1)) > 0
        for node in (2**32, 2**32 + 1, -(2**31) - 1):
            with pytest.raises(InvalidArgumentError, match=str(node)):
                l.schedule(node)
        with pytest.raises(InvalidArgumentError, match="node 4 out of range"):
            l.schedule(4)


def test_config_and_bool_integers_are_checked():
    for args, shown in [((-1, 0), "-1"), ((0, 2**64), "18446744073709551616"), ((4096.5, 0), "4096.5")]:
        with pytest.raises(InvalidArgumentError, match=re.escape(shown)):
            N.make_config(*args)
    with pytest.raises(InvalidArgumentError, match="not a bool"):
        Layout([16], "fp32", True)
    cfg = N.make_config(2**64 - 1, 4096)
    assert (cfg.rsChunkBytes, cfg.paceBytes) == (2**64 - 1, 4096)


def test_loopback_world_sizes_range_checked():
    pytest.importorskip("torch")
    from nccl_tide.cuda import LoopbackWorld

    for kw, shown in [(dict(n_ranks=2**32 + 2), "4294967298"), (dict(n_ranks=2, device=2**32), "4294967296")]:
        with pytest.raises(InvalidArgumentError, match=shown):
            LoopbackWorld(**kw)


# -- 3. checked handle identity -------------------------------------------------------------------------------------

HANDLE_CASES = """
import ctypes
import numpy as np
from nccl_tide import _native as N
from nccl_tide.layout import Layout
lib = N.lib()
IA = N.tideInvalidArgument
def expect(rc, *words):
    msg = N.last_error()
    assert rc == IA, (rc, msg)
    for w in words:
        assert w in msg, (w, msg)
def info():
    i = N.tideLayoutInfo_t(); i.size, i.version = ctypes.sizeof(i), 1; return i
def param():
    p = N.tideParamInfo_t(); p.size, p.version = ctypes.sizeof(p), 1; return p
def step():
    s = N.tideScheduleStep_t(); s.size, s.version = ctypes.sizeof(s), 1; return s
alive = Layout([100, 40], "fp32", 4, ranks_per_node=2)
l = Layout([100, 40], "fp32", 4, ranks_per_node=2)
dead = N.tideLayout_t(l.handle.value)
l.close()
junk = ctypes.create_string_buffer(b"\\xab" * 256)
bad = {{"destroyed": (dead, "destroyed"), "garbage": (N.tideLayout_t(0x1234560), "never created"),
       "heap": (N.tideLayout_t(ctypes.addressof(junk)), "never created")}}
t = N.pointer_table([0] * 8)
for name, (h, why) in bad.items():
    expect(lib.tideLayoutGetInfo(h, ctypes.byref(info())), "tideLayoutGetInfo", "layout", why)
    expect(lib.tideLayoutGetParam(h, 0, ctypes.byref(param())), "tideLayoutGetParam", why)
    c = ctypes.c_int(-7)
    expect(lib.tideLayoutGetScheduleLength(h, 0, ctypes.byref(c)), "tideLayoutGetScheduleLength", why)
    assert c.value == -7
    expect(lib.tideLayoutGetScheduleStep(h, 0, 0, ctypes.byref(step())), "tideLayoutGetScheduleStep", why)
    expect(lib.tideHostAllGather(h, t, t), "tideHostAllGather", why)
    expect(lib.tideHostReduceScatter(h, t, t, 2, 0, 1.0), "tideHostReduceScatter", why)
    expect(lib.tideAttachLayout(0x1000, 0x2000, h), "tideAttachLayout", why)
    expect(lib.tideLayoutDestroy(h), "tideLayoutDestroy", why)
# the live layout is untouched by all of that
i = info()
assert lib.tideLayoutGetInfo(alive.handle, ctypes.byref(i)) == 0 and i.worldSize == 4
# a second create never reuses the destroyed value
l2 = Layout([100, 40], "fp32", 4, ranks_per_node=2)
assert l2.handle.value != dead.value
expect(lib.tideLayoutGetInfo(dead, ctypes.byref(info())), "destroyed")
# comm entry points: a garbage handle, a layout handle, a destroyed-looking one
cuda = {cuda}
for h, why in [(0x1234560, "never created"), (alive.handle.value, "it is a tideLayout_t")]:
    r, w = ctypes.c_int(), ctypes.c_int()
    calls = [lambda: lib.tideCommGetRank(h, ctypes.byref(r), ctypes.byref(w)),
             lambda: lib.tideCommGetRanksPerNode(h, ctypes.byref(r)),
             lambda: lib.tideSlotAlloc(h, 4096, ctypes.byref(ctypes.c_void_p())),
             lambda: lib.tideSlotFree(h, ctypes.c_void_p(0x1000)),
             lambda: lib.tideAllGather(h, alive.handle, None, None, None, None),
             lambda: lib.tideReduceScatter(h, alive.handle, None, None, 2, 0, 1.0, None, None),
             lambda: lib.tideCommDestroy(h), lambda: lib.tideCommAbort(h),
             lambda: lib.tideCommDebugDump(h, ctypes.create_string_buffer(64), 64),
             lambda: lib.tideCommGetProvider(h, ctypes.byref(ctypes.c_char_p()))]
    for call in calls:
        rc = call()
        if cuda:
            expect(rc, "comm", why)
        else:
            assert rc == N.tideUnsupported, (rc, N.last_error())
print("CHILD-OK")
"""


def test_handles_destroyed_garbage_and_wrong_type_are_refused():
    assert_child_ok(run_child(HANDLE_CASES.format(cuda=cuda_build())))


def test_python_attach_layout_keeps_the_layout_alive():
    if not cuda_build():
        pytest.skip("tideAttachLayout needs a CUDA build (this library is host-only)")
    from nccl_tide import interposer

    comm, buf = 0x7000_0000_1000, 0x7000_0002_0000  # attachments are only recorded: no NCCL call is made
    l = Layout([256, 64], "bf16", 2)
    interposer.attach_layout(comm, buf, l)
    h = l.handle.value
    del l
    gc.collect()
    kept = interposer._attached[(comm, buf)]
    assert not kept.closed and kept.handle.value == h
    assert N.lib().tideLayoutGetInfo(kept.handle, ctypes.byref(info_struct())) == 0
    interposer.detach_layout(comm, buf)
    assert (comm, buf) not in interposer._attached
    with pytest.raises(InvalidArgumentError, match="no layout is attached"):
        interposer.detach_layout(comm, buf)


def test_c_attachment_survives_the_callers_destroy():
    if not cuda_build():
        pytest.skip("tideAttachLayout needs a CUDA build (this library is host-only)")
    lib = N.lib()
    comm, buf = 0x7000_0000_3000, 0x7000_0004_0000
    l = Layout([256], "fp32", 2)
    h = N.tideLayout_t(l.handle.value)
    assert lib.tideAttachLayout(comm, buf, h) == 0
    l.close()  # the library keeps its own reference while attached
    assert lib.tideLayoutGetInfo(h, ctypes.byref(info_struct())) == N.tideInvalidArgument
    assert lib.tideDetachLayout(comm, buf) == 0


def test_attach_layout_on_a_gloo_group_says_it_needs_nccl():
    p = run_child(
        """
        import socket
        import torch.distributed as dist
        from nccl_tide import interposer
        from nccl_tide.errors import InvalidArgumentError
        from nccl_tide.layout import Layout
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        try:
            interposer.attach_layout(dist.group.WORLD, 0x1000, Layout([64], "fp32", 1))
        except InvalidArgumentError as e:
            assert "needs an NCCL process group" in str(e) and "gloo" in str(e), e
            print("CHILD-OK")
        finally:
            dist.destroy_process_group()
        """
    )
    assert_child_ok(p)


# -- 4. element alignment -------------------------------------------------------------------------------------------


def misaligned(n: int, dtype, fill) -> np.ndarray:
    raw = bytearray(n * np.dtype(dtype).itemsize + 1)
    a = np.frombuffer(raw, dtype=dtype, count=n, offset=1)
    a[...] = fill
    assert a.ctypes.data % np.dtype(dtype).itemsize == 1
    return a


def test_misaligned_bf16_fp16_buffers_are_refused_in_python(rng):
    with Layout([40, 24], ["bf16", "fp16"], 2) as l:
        grads = [[ref.f32_to_bf16_bits(rng.standard_normal(40).astype(np.float32)),
                  rng.standard_normal(24).astype(np.float16)] for _ in range(2)]  # fmt: skip
        bad = [row[:] for row in grads]
        bad[1][0] = misaligned(40, np.uint16, grads[1][0])
        with pytest.raises(InvalidArgumentError, match=r"grads\[1\]\[0\].*not aligned"):
            host_reduce_scatter(l, bad)
        outs = [np.empty(l.rs_out_numel, np.uint16), misaligned(l.rs_out_numel, np.uint16, 0)]
        with pytest.raises(InvalidArgumentError, match=r"outs\[1\].*not aligned"):
            host_reduce_scatter(l, grads, out_dtype="bf16", outs=outs)
        shards = [[np.ones(p.shard_numel, t) for p, t in zip(l.params, (np.uint16, np.float16))] for _ in range(2)]
        shards[0][1] = misaligned(l.params[1].shard_numel, np.float16, 1)
        with pytest.raises(InvalidArgumentError, match=r"shards\[0\]\[1\].*not aligned"):
            host_all_gather(l, shards)


def test_misaligned_buffers_are_refused_by_the_c_api(rng):
    lib = N.lib()
    with Layout([40], "bf16", 2) as l:
        g = [ref.f32_to_bf16_bits(rng.standard_normal(40).astype(np.float32)) for _ in range(2)]
        odd = misaligned(40, np.uint16, g[1])
        outs = [np.full(l.rs_out_numel, 7, np.float32) for _ in range(2)]
        rc = lib.tideHostReduceScatter(
            l.handle, N.pointer_table([g[0].ctypes.data, odd.ctypes.data]),
            N.pointer_table([o.ctypes.data for o in outs]), 2, 0, 1.0,
        )  # fmt: skip
        assert rc == N.tideInvalidArgument and "not aligned" in N.last_error() and "grads[1]" in N.last_error()
        assert all((o == 7).all() for o in outs)  # nothing written
        sh = [np.ones(20, np.uint16), misaligned(20, np.uint16, 3)]
        ps = [np.zeros(40, np.uint16) for _ in range(2)]
        rc = lib.tideHostAllGather(l.handle, N.pointer_table([a.ctypes.data for a in sh]),
                                   N.pointer_table([a.ctypes.data for a in ps]))  # fmt: skip
        assert rc == N.tideInvalidArgument and "shards[1]" in N.last_error() and "aligned" in N.last_error()
        assert all((p == 0).all() for p in ps)


# -- 5. deterministic NaN bits --------------------------------------------------------------------------------------

NAN_BITS = {"fp32": (np.uint32, 0x7FC00000), "bf16": (np.uint16, 0x7FC0), "fp16": (np.uint16, 0x7E00)}


def nan_inputs(n: int, dt: str, rng, world: int):
    """Per rank: random values with NaNs of both signs and odd payloads, mixed so that NaN + (-NaN), NaN + x and
    x + NaN all occur, in vectorised bodies and in scalar tails."""
    f32 = [rng.standard_normal(n).astype(np.float32) for _ in range(world)]
    payload_nans = np.array([0x7FC00000, 0xFFC00000, 0x7FA00001, 0xFFE12345, 0x7F800001], np.uint32)
    for r in range(world):
        k = rng.permutation(n)[: n // 2 + 1]
        f32[r].view(np.uint32)[k] = rng.choice(payload_nans, k.size)
    if dt == "fp32":
        return f32
    if dt == "bf16":
        return [(a.view(np.uint32) >> 16).astype(np.uint16) for a in f32]  # truncation: signed NaNs, payloads, Infs
    return [np.where(np.isnan(a), np.float16(np.nan), a.astype(np.float16)).astype(np.float16) for a in f32]


@pytest.mark.parametrize("in_dt", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("out_dt", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("op", ["sum", "avg", "premul"])
def test_rs_nan_results_are_the_canonical_nan(in_dt, out_dt, op, rng):
    W, n = 4, 77  # 77: vectorised bodies and scalar tails in every shard
    with Layout([n, 13], in_dt, W, ranks_per_node=2) as l:
        grads = [[a, b] for a, b in zip(nan_inputs(n, in_dt, rng, W), nan_inputs(13, in_dt, rng, W))]
        if in_dt == "fp16":  # negative NaNs too (np.float16(nan) is positive)
            for r in range(W):
                g = grads[r][0].view(np.uint16)
                g[np.isnan(grads[r][0]) & (np.arange(n) % 2 == 0)] = 0xFE01
        outs = host_reduce_scatter(l, grads, out_dtype=out_dt, op=op, scale=0.5)
        st, canon = NAN_BITS[out_dt]
        allv = np.concatenate(outs).view(st)
        isnan = np.isnan(ref.to_f32(allv, out_dt))
        assert isnan.sum() > 10
        assert set(allv[isnan].tolist()) == {canon}
        with np.errstate(all="ignore"):
            want = ref.rs_reference(grads, [n, 13], [1, 1], [in_dt, in_dt], 2, out_dt, op, 0.5)
        for r in range(W):
            assert outs[r].tobytes() == want[r].tobytes(), f"rank {r}: host executor and reference differ in bits"


def test_reference_from_f32_writes_canonical_nans():
    x = np.array([0x7FC00000, 0xFFC00000, 0x7FA00001, 0xFFFFFFFF, 0x3F800000], np.uint32).view(np.float32)
    assert ref.from_f32(x, "fp32").view(np.uint32).tolist()[:4] == [0x7FC00000] * 4
    assert ref.from_f32(x, "bf16").tolist()[:4] == [0x7FC0] * 4
    assert ref.from_f32(x, "fp16").view(np.uint16).tolist()[:4] == [0x7E00] * 4
    assert ref.from_f32(x, "bf16")[4] == 0x3F80 and ref.from_f32(x, "fp16")[4] == np.float16(1.0)


# -- 7. messages, environment, loopback failure, runnable docs ---------------------------------------------------------


def test_messages_do_not_repeat_their_prefix():
    pytest.importorskip("torch")
    from nccl_tide.cuda import LoopbackWorld

    with pytest.raises(TideError) as ei:
        LoopbackWorld(2, device=999)  # fails on every machine: no CUDA build, no GPU, or no device 999
    assert str(ei.value).count("tideLoopbackCreate:") == 1, str(ei.value)
    with pytest.raises(InvalidArgumentError) as ei:
        N.check(N.lib().tideLayoutGetInfo(None, ctypes.byref(info_struct())), "tideLayoutGetInfo")
    assert str(ei.value).count("tideLayoutGetInfo:") == 1, str(ei.value)


def test_failed_loopback_create_leaves_comms_null():
    # Both builds: a failure with a valid nRanks leaves comms[0 .. nRanks-1] NULL.
    for n in (2, 8):
        arr = (N.tideComm_t * n)(*([0x5A5A5A5A] * n))
        assert N.lib().tideLoopbackCreate(n, 999, arr) != 0
        assert [arr[i] for i in range(n)] == [None] * n
    arr = (N.tideComm_t * 2)(0x5A5A5A5A, 0x5A5A5A5A)
    assert N.lib().tideLoopbackCreate(9, 0, arr) == N.tideInvalidArgument or not cuda_build()


@pytest.mark.parametrize("var", ["NCCL_TIDE_RS_CHUNK_BYTES", "NCCL_TIDE_PACE_BYTES"])
def test_invalid_plan_variable_fails_layout_create_with_an_environment_hint(var):
    p = run_child(
        f"""
        from nccl_tide.errors import InvalidArgumentError
        from nccl_tide.layout import Layout
        try:
            Layout([4096], "fp32", 2)
        except InvalidArgumentError as e:
            s = str(e)
            assert "{var}='12abc'" in s and "docs/env.md" in s and "check sizes" not in s, s
            print("CHILD-OK")
        """,
        env_extra={var: "12abc", "NCCL_TIDE_DEBUG": "WARN"},
    )
    assert_child_ok(p)
    warn = [ln for ln in p.stderr.splitlines() if var in ln]
    assert warn and not any("using the default" in ln for ln in warn), p.stderr
    assert any("fail until it is fixed or unset" in ln for ln in warn), p.stderr


@pytest.mark.parametrize("text,ok", [("1T", True), ("1TiB", True), ("4K", True), ("2T", False), ("1P", False)])
def test_size_parser_accepts_what_its_message_says(text, ok):
    p = run_child(
        f"""
        from nccl_tide import _native as N
        from nccl_tide.errors import InvalidArgumentError
        try:
            v = N.param_value("NCCL_TIDE_PACE_BYTES")
            print("VALUE", v)
        except InvalidArgumentError as e:
            assert "from 4K to 1T" in str(e) and "T, KiB" in str(e), e
            print("REFUSED")
        print("CHILD-OK")
        """,
        env_extra={"NCCL_TIDE_PACE_BYTES": text},
    )
    assert_child_ok(p)
    want = {"1T": "1099511627776", "1TiB": "1099511627776", "4K": "4096"}
    assert (f"VALUE {want[text]}" in p.stdout) if ok else ("REFUSED" in p.stdout), p.stdout


def doc_examples(path: str):
    """```python blocks that follow a `<!-- runnable example -->` marker."""
    text = open(os.path.join(REPO, path)).read()
    return re.findall(r"<!-- runnable example -->\s*```python\n(.*?)```", text, flags=re.DOTALL)


def test_usage_doc_python_example_runs():
    blocks = doc_examples("docs/python.md")
    assert blocks, "docs/python.md lost its runnable Python example"
    for code in blocks:
        assert "Layout(" in code and "host_all_gather" in code and "host_reduce_scatter" in code
        p = run_child(code + "\nprint('CHILD-OK')\n")
        assert_child_ok(p)
