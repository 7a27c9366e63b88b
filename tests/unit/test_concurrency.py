# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Thread-safety rules of docs/reliability.md ("Thread safety"), CPU side: 8 threads at once creating and destroying
layouts, running the host executors, querying parameters and reading error strings, with random inputs, every
result checked against the numpy reference (nccl_tide.reference); tideGetLastError is per thread."""

import ctypes
import threading
import zlib

import nccl_tide
import numpy as np
import pytest
from nccl_tide import _native as N
from nccl_tide import reference as ref
from nccl_tide.data import random_values
from nccl_tide.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(300)

THREADS = 8
ROUNDS = 25


def _ag_case(rng):
    world = int(rng.choice([2, 3, 4, 8]))
    rpn = int(rng.choice([d for d in range(1, world + 1) if world % d == 0]))
    n = int(rng.integers(1, 6))
    numels = [int(rng.integers(1, 3000)) for _ in range(n)]
    dts = [str(rng.choice(["bf16", "fp16", "fp32", "int8", "int32"])) for _ in range(n)]
    with nccl_tide.Layout(numels, dts, world, rpn, pace_bytes=int(rng.choice([4096, 1 << 20]))) as lay:
        shards = [[random_values(rng, p.dtype, p.shard_numel) for p in lay.params] for _ in range(world)]
        got = nccl_tide.host_all_gather(lay, shards)
        for r in range(world):
            for i in range(n):
                want = ref.all_gather_param([shards[s][i] for s in range(world)])
                assert np.array_equal(np.asarray(got[r][i]).view(np.uint8), np.asarray(want).view(np.uint8))


def _rs_case(rng):
    world = int(rng.choice([2, 4, 6]))
    rpn = int(rng.choice([d for d in range(1, world + 1) if world % d == 0]))
    n = int(rng.integers(1, 5))
    numels = [int(rng.integers(1, 2000)) for _ in range(n)]
    dts = [str(rng.choice(["bf16", "fp16", "fp32"])) for _ in range(n)]
    out, op = str(rng.choice(["fp32", "bf16"])), str(rng.choice(["sum", "avg", "premul"]))
    scale = float(rng.choice([1.0, 0.5, -3.0]))
    with nccl_tide.Layout(numels, dts, world, rpn, rs_chunk_bytes=int(rng.choice([4096, 1 << 20]))) as lay:
        grads = [[random_values(rng, d, k) for d, k in zip(dts, numels)] for _ in range(world)]
        got = nccl_tide.host_reduce_scatter(lay, grads, out, op, scale)
        want = ref.rs_reference(grads, numels, [1] * n, dts, rpn, out, op, scale)
        for r in range(world):
            assert np.array_equal(np.asarray(got[r]).view(np.uint8), np.asarray(want[r]).view(np.uint8))


def _param_case(rng):
    count = ctypes.c_int(0)
    N.check(N.lib().tideParamCount(ctypes.byref(count)))
    assert count.value >= 9
    i = int(rng.integers(0, count.value))
    name, value = ctypes.c_char_p(), ctypes.c_char_p()
    assert N.lib().tideParamDescribe(i, ctypes.byref(name), None, None, None, ctypes.byref(value)) == N.tideSuccess
    assert name.value.startswith(b"NCCL_TIDE_") and value.value is not None
    assert N.param_value("NCCL_TIDE_TIMEOUT_MS") == "0"  # the test environment leaves it unset


def _error_case(rng, tid):
    """A failing call whose message carries a value unique to this thread; the message must still be this
    thread's after other threads failed in between (tideGetLastError is thread-local)."""
    bad_world = 70000 + 1000 * tid + int(rng.integers(0, 1000))  # > TIDE_MAX world: rejected, value in the message
    with pytest.raises(InvalidArgumentError) as info:
        nccl_tide.Layout([10], "bf16", bad_world)
    assert str(bad_world) in str(info.value)
    for _ in range(3):
        threading.Event().wait(0.001)  # let the other threads fail meanwhile
        assert str(bad_world) in N.last_error(), (bad_world, N.last_error())
    code = N.lib().tideGetErrorString(N.tideInvalidArgument)
    assert code and b"invalid" in code.lower()


def test_eight_threads_at_once():
    barrier = threading.Barrier(THREADS)
    failures = []
    counts = [0] * THREADS

    def run(tid):
        rng = np.random.default_rng(zlib.crc32(f"concurrency-{tid}".encode()))
        try:
            barrier.wait(timeout=60)
            for k in range(ROUNDS):
                kind = (tid + k) % 4
                if kind == 0:
                    _ag_case(rng)
                elif kind == 1:
                    _rs_case(rng)
                elif kind == 2:
                    _param_case(rng)
                else:
                    _error_case(rng, tid)
                counts[tid] += 1
        except BaseException as e:  # reported by the main thread
            import traceback

            failures.append(f"thread {tid}: {e!r}\n{traceback.format_exc()}")

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "a thread is stuck (deadlock?)"
    assert not failures, "\n".join(failures[:3])
    assert counts == [ROUNDS] * THREADS


def test_layouts_destroyed_while_others_run():
    """One thread creates and destroys layouts in a tight loop while others run executors on their own layouts:
    handles are independent (no shared mutable state between layouts)."""
    stop = threading.Event()
    failures = []

    def churn():
        rng = np.random.default_rng(7)
        try:
            while not stop.is_set():
                lay = nccl_tide.Layout([int(rng.integers(1, 10**6))] * 3, "bf16", 8, 4)
                assert lay.slot_bytes > 0
                lay.close()
        except BaseException as e:
            failures.append(repr(e))

    def work(tid):
        rng = np.random.default_rng(100 + tid)
        try:
            for _ in range(15):
                _rs_case(rng)
                _ag_case(rng)
        except BaseException as e:
            failures.append(f"worker {tid}: {e!r}")

    churners = [threading.Thread(target=churn) for _ in range(2)]
    workers = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in churners + workers:
        t.start()
    for t in workers:
        t.join(timeout=240)
    stop.set()
    for t in churners:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in churners + workers)
    assert not failures, failures[:3]


def test_last_error_is_thread_local():
    """Deterministic: thread B's failure does not replace thread A's message; a thread that never failed reads ''."""
    a_ready, b_done = threading.Event(), threading.Event()
    seen = {}

    def a():
        with pytest.raises(InvalidArgumentError):
            nccl_tide.Layout([10], "bf16", 123457)
        a_ready.set()
        b_done.wait(30)
        seen["a"] = N.last_error()

    def b():
        a_ready.wait(30)
        with pytest.raises(InvalidArgumentError):
            nccl_tide.Layout([10], "bf16", 98765)
        seen["b"] = N.last_error()
        b_done.set()

    def c():
        b_done.wait(30)
        seen["c"] = N.last_error()

    ts = [threading.Thread(target=f) for f in (a, b, c)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert "123457" in seen["a"] and "98765" not in seen["a"], seen
    assert "98765" in seen["b"], seen
    assert seen["c"] == "", seen


def test_native_threads_c_driver(native, tmp_path):
    """tests/native/concurrency_driver.cc: 8 native threads (no GIL anywhere) on the C API, every result checked. With
    TIDE_TSAN_LIBRARY set to a libnccl-tide.so built with -DTIDE_SANITIZE=thread, the driver is built with
    -fsanitize=thread against it and any ThreadSanitizer report fails the test."""
    import os
    import shutil
    import subprocess

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tsan = os.environ.get("TIDE_TSAN_LIBRARY")
    lib = tsan or native.library_path()
    libdir = os.path.dirname(lib)
    exe = str(tmp_path / "concurrency_driver")
    flags = ["-fsanitize=thread"] if tsan else []
    link = ["-L", libdir, "-l:" + os.path.basename(lib), f"-Wl,-rpath,{libdir}"]
    subprocess.run(
        [
            cxx,
            "-std=c++17",
            "-O1",
            "-g",
            *flags,
            "-I",
            os.path.join(repo, "include"),
            os.path.join(repo, "tests", "native", "concurrency_driver.cc"),
            "-o",
            exe,
            *link,
            "-pthread",
        ],
        check=True,
    )
    env = dict(os.environ, NCCL_TIDE_DEBUG="NONE", TSAN_OPTIONS="halt_on_error=1:exitcode=66")
    p = subprocess.run([exe, "300" if tsan else "200"], capture_output=True, text=True, env=env, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "ThreadSanitizer" not in p.stderr, p.stderr[-3000:]
    assert p.stdout.strip().startswith("OK 8 threads"), p.stdout
