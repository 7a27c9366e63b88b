# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""One rank's share (benchmarks/share/) runs on the GPU: every side's output is right (AG slot byte
for byte, RS bit for bit against the left fold, the baseline too), the paced shares take at least the link-rate
floor and the unpaced ones less, SM time is accounted, and the side work covered the GEMM."""

import json
import os

import pytest

pytestmark = pytest.mark.gpu

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env() -> dict:
    """The environment of a child python that imports bench_lib as the tests here do."""
    path = [BENCHMARKS] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))


def test_share_mode_runs_and_checks(torch_cuda, tmp_path):
    from share import cli, sides

    out = tmp_path / "share.json"
    rc = cli.main(["both", "--ranks", "4", "--layout", "llama3-8b-layer", "--runs", "5", "--link-gbps", "370",
                     "--sides", ",".join(sides.SIDES), "-J", str(out)])
    res = json.loads(out.read_text())
    assert not res["errors"], res["errors"]
    assert rc == 0
    by = {d["side"]: d for d in res["sides"]}
    assert set(by) == set(sides.SIDES)
    for name in ("ag-share", "ag-share-unpaced", "rs-share", "rs-share-unpaced", "rs-share-serial", "nccl-like-16",
                 "nccl-like-32"):
        assert by[name]["check"]["ok"], (name, by[name]["check"])
    # The timeline mapped every chunk's copies and reduce launches (timeline.unit_timeline: bytes and launch counts add up)
    for name in ("rs-share", "rs-share-serial"):
        tl = by[name]["timeline"]
        assert "error" not in tl and len(tl["rows"]) == res["rs_num_chunks"] >= 2, (name, tl)
        assert all(r["in_start_us"] < r["in_end_us"] <= r["red_end_us"] for r in tl["rows"]), (name, tl)
    for name, d in by.items():
        assert d["slowdown"] > 0.8 and d["covered_runs"] >= 1, (name, d)
    # Pacing: never faster than the link; the unpaced share is faster than the paced one.
    for kind in ("ag", "rs"):
        paced, unpaced = by[f"{kind}-share"], by[f"{kind}-share-unpaced"]
        assert paced["e2e_over_floor"] >= 0.97, paced
        assert unpaced["unit_ms"]["median"] < paced["unit_ms"]["median"]
    # SM time: AG share runs no kernel; RS share only the library's reduce, each chunk's paced to the next chunk's
    # arrival (reduce_kernel.h: 4 bf16 inputs -> fp32 at 370 GB/s with a full chunk next: 370 * 12/6 = 740 GB/s,
    # x 1.2 headroom, ceil(888 / kReduceCtaGBps = 66) = 14 CTAs (10 with a rate of 94 and 1.25); the first
    # chunk's shape is reported), the last one a drain of at most kReduceMaxPacedCtas = 32 CTAs (fewer for a small
    # last chunk: one CTA per MiB of traffic); the baseline its CTAs.
    assert by["ag-share"]["sm"]["kernel_us"] == 0
    assert by["rs-share"]["reduce_shape"]["ctas"] == 14, by["rs-share"]["reduce_shape"]
    assert 14 <= by["rs-share"]["sm"]["max_ctas"] <= 32, by["rs-share"]["sm"]
    assert by["nccl-like-32"]["sm"]["max_ctas"] == 32
    assert by["nccl-like-32"]["sm"]["sm_weighted_us"] > by["rs-share"]["sm"]["sm_weighted_us"]
    assert res["pacer"]["pieces_released"] == res["pacer"]["pieces_enqueued"] > 0
    assert res["gemm_shape"].get("ctas", 0) > 0
    assert {r["metric"] for r in res["summary"]} >= {"GEMM slowdown beside TIDE-RS share",
                                                     "RS share end to end / link floor"}


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
    """A 1 MiB-piece Llama-70B run once hung: the pacer's thread learned of a transfer's pieces only once all
    were enqueued, and enqueueing blocked when the stream's queue filled behind the first unreleased wait. Pieces
    now reach the thread as they are enqueued. In a child process, so that a regression fails instead of hanging."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _MANY_PIECES], capture_output=True, text=True, timeout=90,
                       env=_env())
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
    """The RS share paces each staging buffer's chunks on a stream of its own. Here the later transfer's
    stream reports its arrival first and the earlier one's while the thread still releases the earlier transfer:
    with one shared arrival word the earlier report overwrote the later one, and the thread,
    then waiting for the later transfer, never saw it arrive (a hang). Both transfers still take the link's time.
    In a child process, so that a regression fails instead of hanging."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _TWO_STREAMS], capture_output=True, text=True, timeout=90,
                       env=_env())
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), (r.stdout[-2000:], r.stderr[-2000:])
