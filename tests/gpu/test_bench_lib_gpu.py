"""The benchmark library (libnccl-tide-bench.so through benchmarks/bench_lib.py) on the GPU: the link pacer paces
copy-engine copies without kernels and copies right, releases blocked streams when destroyed, survives transfers
of more pieces than a stream queues and transfers on two streams arriving out of order; the NCCL-like persistent
baseline lasts the link time and folds right.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")
sys.path.insert(0, BENCHMARKS)
_CHILD_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([BENCHMARKS, os.environ.get("PYTHONPATH", "")]))

import bench_lib as B  # noqa: E402

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


_MANY_PIECES = r"""
import sys, torch
import bench_lib as B
from nccl_tide.cuda import new_streams
(s,), _ = new_streams(1, 0)
n = 16 << 20  # 4096 pieces of 4 KiB: 8192 stream operations, several times what the driver queues on one stream
src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
dst = torch.zeros_like(src)
host = src.cpu().pin_memory()
dst2 = torch.zeros_like(src)
p = B.Pacer(400.0, 4096)
torch.cuda.synchronize()
with torch.cuda.stream(s):
    torch.cuda._sleep(40_000_000)  # the GPU is held while the host enqueues: the queue fills, the host blocks
p.paced_copy([(dst.data_ptr(), src.data_ptr(), n)], s.cuda_stream)
p.paced_copy([(dst2.data_ptr(), host.data_ptr(), n)], s.cuda_stream)  # pinned host source: host-to-device pieces
torch.cuda.synchronize()
st = p.stats()
p.close()
ok = torch.equal(dst, src) and torch.equal(dst2, src) and st["pieces_released"] == st["pieces_enqueued"] == 8192
print("OK" if ok else f"WRONG {st}")
"""


def test_pacer_transfer_of_more_pieces_than_the_stream_queues(torch_cuda, cuda_lib):
    """A transfer of more pieces than the driver queues on one stream: enqueueing blocks once the stream's queue
    fills behind the first unreleased wait, so the pacer's thread must learn of each piece as it is enqueued, not
    after the whole transfer. In a child process, so that a regression fails instead of hanging."""
    r = subprocess.run([sys.executable, "-c", _MANY_PIECES], capture_output=True, text=True, timeout=90,
                       env=_CHILD_ENV)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), (r.stdout[-2000:], r.stderr[-2000:])


_TWO_STREAMS = r"""
import sys, time, torch
import bench_lib as B
from nccl_tide.cuda import new_streams
(a, b), _ = new_streams(2, 0)
n = 32 << 20
src = torch.randint(0, 255, (2, n), dtype=torch.uint8, device="cuda")
dst = torch.zeros_like(src)
rate = 10.0  # GB/s: each transfer 3.4 ms on the link, 32 pieces of 1 MiB
p = B.Pacer(rate, 1 << 20)
torch.cuda.synchronize()
t0 = time.perf_counter()  # before anything is enqueued: no piece can have been released earlier
with torch.cuda.stream(a):
    torch.cuda._sleep(20_000_000)  # stream a reaches its transfer ~10 ms after b, long after the host enqueued both
p.paced_copy([(dst[0].data_ptr(), src[0].data_ptr(), n)], a.cuda_stream)  # the link's first transfer
p.paced_copy([(dst[1].data_ptr(), src[1].data_ptr(), n)], b.cuda_stream)  # second: waits for the link, not for a
torch.cuda.synchronize()
dt = time.perf_counter() - t0
st = p.stats()
p.close()
equal = torch.equal(dst, src)
counts = st["pieces_released"] == st["pieces_enqueued"] == 64 and st["transfers"] == 2
paced = 2 * n / (rate * 1e9) <= dt < 10
print("OK" if equal and counts and paced else f"WRONG equal={equal} counts={counts} paced={paced} {st} {dt:.4f} s")
"""


def test_pacer_transfers_on_two_streams_arriving_out_of_order(torch_cuda, cuda_lib):
    """The RS share paces each staging buffer's chunks on a stream of its own. Here the later transfer's stream
    reports its arrival first and the earlier one's while the thread still releases the earlier transfer: with one
    shared arrival word the earlier report would overwrite the later one, and the thread, then waiting for the later
    transfer, would never see it arrive (a hang). Both transfers still take the link's time. In a child process,
    so that a regression fails instead of hanging."""
    r = subprocess.run([sys.executable, "-c", _TWO_STREAMS], capture_output=True, text=True, timeout=90,
                       env=_CHILD_ENV)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), (r.stdout[-2000:], r.stderr[-2000:])
