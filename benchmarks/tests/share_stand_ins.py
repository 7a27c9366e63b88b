# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Host stand-ins for the GPU pieces of one rank's share (benchmarks/share), so that whole runs of its Python paths
execute on the CPU: copies by memmove at the planned addresses, the reduce and the NCCL-like baseline as fp32 left
folds (bf16 inputs), a pacer that releases at once, events on the host clock, and a trace with one event per copy
and per reduce launch. The shares' own output checks then pass for real. install() puts them in place for one test
(a tiny Llama-style layer "tiny-test-layer", a 16x32x64 GEMM) and returns the stand-in Gpu class and what the
stand-ins recorded.
"""

import contextlib
import ctypes as C
import time
from types import SimpleNamespace

import numpy as np
from share import cli, gpu, harness, plan, timeline


class _FakeStream:
    _n = 0

    def __init__(self):
        _FakeStream._n += 1
        self.cuda_stream = 1000 + _FakeStream._n

    def wait_stream(self, other):
        assert isinstance(other, _FakeStream)

    def wait_event(self, ev):
        assert isinstance(ev, _FakeEvent)


class _FakeEvent:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3

    def query(self):
        return False  # the stand-in "GPU" runs nothing before synchronize: the host is never late


def _bf16_at(addr, n):
    bits = np.ctypeslib.as_array((C.c_uint16 * n).from_address(addr)).astype(np.uint32) << 16
    return bits.view(np.float32)


def _fold_into(args):
    n = int(args.n)
    acc = _bf16_at(args.staging, n).copy()
    for s in range(1, args.nSrc):
        acc = (acc + _bf16_at(args.staging + s * args.srcStride, n)).astype(np.float32)
    np.ctypeslib.as_array((C.c_float * n).from_address(args.out))[:] = acc


def install(monkeypatch, torch) -> SimpleNamespace:
    """The stand-ins in place of bench_lib's GPU calls, the profiler trace and torch.cuda; returns Gpu (the stand-in
    class, for the caller to put where its code looks for share.gpu.Gpu), released (pieces per paced transfer) and
    kernels (the CTAs of each reduce)."""
    import bench_lib as B
    from nccl_tide import models

    monkeypatch.setitem(models.MODELS, "tiny-test-layer", models._llama_layer(48, 136, 3, 1, 16))
    monkeypatch.setattr(harness, "GEMM_MKN", (16, 32, 64))

    class FakeGpu(gpu.Gpu):
        def __init__(self):
            self.torch = torch
            self.dev = torch.device("cpu")
            self.n_sm = 132

        def rand(self, n, dtype, seed):
            return torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(dtype)

        def stream(self):
            return _FakeStream()

        def sleep_ms(self, ms, stream=None):  # as torch.cuda._sleep: ATen's spin kernel, which the timeline skips
            trace.append({"cat": "kernel", "name": "void at::cuda::(anonymous namespace)::spin_kernel(long)",
                          "ts": float(len(trace)), "dur": 1.0, "stream": getattr(stream, "cuda_stream", 0), "bytes": 0,
                          "ctas": 1, "args": {}})

        def images(self, n, seed, source):
            return self.rand(n, torch.bfloat16, seed)  # no pinned memory without CUDA; the plans are the same

    trace = []  # the stand-in trace: one event per copy and per reduce launch, on a clock of 1 us per event

    def fake_copy(copies, stream):
        for dst, src, nb in copies:
            C.memmove(dst, src, nb)
            trace.append({"cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": float(len(trace)), "dur": 1.0,
                          "stream": stream, "bytes": nb, "ctas": 0, "args": {}})

    released = []

    class FakePacer:
        def __init__(self, gbps, piece_bytes):
            self.gbps, self.piece_bytes = gbps, piece_bytes

        def paced_copy(self, copies, stream):
            fake_copy(copies, stream)
            released.append(len(plan.cut_pieces([c[2] for c in copies], self.piece_bytes)))

        def stats(self):
            return {"pieces_released": sum(released), "pieces_enqueued": sum(released), "transfers": len(released)}

        def close(self):
            pass

    kernels = []

    def fake_reduce(args, stream):
        sh = B.reduce_shape(args)
        kernels.append(sh["ctas"] if B.available() else 1)
        for _ in range(sh["launches"]):
            trace.append({"cat": "kernel", "name": "reduce", "ts": float(len(trace)), "dur": 1.0, "stream": stream,
                          "bytes": 0, "ctas": sh["ctas"], "args": {}})
        _fold_into(args)

    def fake_trace(g, fn, iters=3):
        del trace[:]
        for _ in range(iters):
            fn()
        return list(trace)

    fake_profile = lambda g, fn, iters=3: (fn(), [("reduce", 5.0, 4, {})], [(1.0, True)])[1:]  # noqa: E731
    monkeypatch.setattr(cli, "profile_unit", fake_profile)
    monkeypatch.setattr(harness, "profile_unit", fake_profile)
    monkeypatch.setattr(timeline, "trace", fake_trace)
    monkeypatch.setattr(B, "copy", fake_copy)
    monkeypatch.setattr(B, "Pacer", FakePacer)
    monkeypatch.setattr(B, "reduce", fake_reduce)
    monkeypatch.setattr(B, "persistent_reduce", lambda args, ctas, seconds, stream: _fold_into(args))
    if not B.available():
        monkeypatch.setattr(B, "reduce_shape", lambda args: {
            "ctas": 1, "launches": 1, "threads": 512, "vector": True, "bytes": int(args.n) * 20,
            "kernel": "staged" if args.kernel == B.KERNELS["staged"] else "loads"})
    for name, fn in (("synchronize", lambda *a: None), ("empty_cache", lambda: None),
                     ("get_device_name", lambda *a: "cpu stand-in"), ("is_available", lambda: True),
                     ("Event", _FakeEvent), ("stream", lambda s: contextlib.nullcontext())):
        monkeypatch.setattr(torch.cuda, name, fn)
    return SimpleNamespace(Gpu=FakeGpu, released=released, kernels=kernels)

