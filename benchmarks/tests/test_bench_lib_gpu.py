# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The benchmark library (libnccl-tide-bench.so through bench_lib) on the GPU: the link pacer paces copy-engine
copies without kernels and copies right and releases blocked streams when destroyed; the NCCL-like persistent
baseline lasts the link time and folds right. (The pacer's child-process cases, a transfer of more pieces than a
stream queues and transfers on two streams arriving out of order, are in test_share_gpu.py.)
"""

import time

import bench_lib as B
import pytest

pytestmark = pytest.mark.gpu


def test_pacer_paces_without_kernels_and_copies_right(torch_cuda):
    torch = torch_cuda
    n = 64 << 20
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
    pacer = B.Pacer(10.0, 1 << 20)  # 10 GB/s: 64 MiB takes >= 6.7 ms
    try:
        s = torch.cuda.Stream()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(s)
        half = n // 2
        pacer.paced_copy([(dst.data_ptr(), src.data_ptr(), half),
                          (dst.data_ptr() + half, src.data_ptr() + half, half)], s.cuda_stream)
        b.record(s)
        torch.cuda.synchronize()
        ms = a.elapsed_time(b)
        floor = n / 10e9 * 1e3
        assert floor * 0.97 <= ms <= floor * 1.6 + 2, (ms, floor)
        assert torch.equal(dst, src)
        st = pacer.stats()
        assert st["pieces_released"] == st["pieces_enqueued"] == 64 and st["transfers"] == 1
        # No kernel ran for it.
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            pacer.paced_copy([(dst.data_ptr(), src.data_ptr(), 8 << 20)], s.cuda_stream)
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
        assert not kernels, [e.name for e in kernels]
    finally:
        torch.cuda.synchronize()
        pacer.close()


def test_pacer_destroy_releases_blocked_streams(torch_cuda):
    torch = torch_cuda
    n = 32 << 20
    src = torch.ones(n, dtype=torch.uint8, device="cuda")
    dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
    pacer = B.Pacer(0.001, 1 << 20)  # 1 MB/s: would take 33 s
    s = torch.cuda.Stream()
    pacer.paced_copy([(dst.data_ptr(), src.data_ptr(), n)], s.cuda_stream)
    time.sleep(0.05)
    t0 = time.perf_counter()
    pacer.close()  # releases every piece; the stream drains
    s.synchronize()
    assert time.perf_counter() - t0 < 5
    assert torch.equal(dst, src)


def test_persistent_baseline_lasts_the_link_time(torch_cuda):
    torch = torch_cuda
    W, n = 8, 1 << 22
    x = torch.randn(W * n, device="cuda").bfloat16()
    out = torch.full((n,), float("nan"), device="cuda")
    args = B.reduce_args(x.data_ptr(), n * 2, W, n, out.data_ptr())
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    B.persistent_reduce(args, 16, 0.004, torch.cuda.current_stream().cuda_stream)
    b.record()
    torch.cuda.synchronize()
    assert 3.9 <= a.elapsed_time(b) <= 8.0
    xv = x.view(W, n).float()
    ref = xv[0].clone()
    for s in range(1, W):
        ref = ref + xv[s]
    assert torch.equal(out, ref)
    with pytest.raises(Exception):
        B.persistent_reduce(B.reduce_args(x.data_ptr(), n * 2, W, n, out.data_ptr(), op="avg"), 16, 0.001,
                            torch.cuda.current_stream().cuda_stream)
