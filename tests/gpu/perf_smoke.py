# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Quick figures for the CUDA path on one GPU (not a benchmark suite; benchmarks/ has those):
device-to-device copy bandwidth (torch), TIDE-AG and TIDE-RS of a Llama-3.1-70B decoder layer in a loopback world of
8 virtual ranks, and the reduce kernel's bandwidth and total SM time read from the profiler trace.

    NCCL_TIDE_LIBRARY_PATH=build/gpu/libnccl-tide.so PYTHONPATH=pytorch_glue:tests/gpu python3 tests/gpu/perf_smoke.py
"""

import json
import os
import statistics
import sys
import tempfile

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import torch  # noqa: E402

import nccl_tide  # noqa: E402
from nccl_tide.cuda import LoopbackWorld  # noqa: E402

H, KV, FF = 8192, 1024, 28672
LLAMA70B_LAYER = [H * H, KV * H, KV * H, H * H, FF * H, FF * H, H * FF, H, H]
ROWS = [H, H, H, H, H, H, FF, 1, 1]


def time_ms(fn, streams, iters=5, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        for s in streams:
            s.wait_stream(torch.cuda.current_stream())
        fn()
        for s in streams:
            torch.cuda.current_stream().wait_stream(s)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return statistics.median(out), min(out), max(out)


def main() -> int:
    W = int(os.environ.get("TIDE_PERF_RANKS", "8"))
    print(f"device {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"library {nccl_tide.library_path()}")
    # Copy bandwidth (bytes read + written).
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    med, lo, hi = time_ms(lambda: b.copy_(a), [], iters=10)
    print(f"torch D2D copy 1 GiB: {med:.3f} ms -> {2 * a.numel() / med / 1e6:.0f} GB/s (read+write)")
    del a, b

    world = LoopbackWorld(W)
    layouts = [nccl_tide.Layout(LLAMA70B_LAYER, "bf16", W, ranks_per_node=W, rank=r, row_numels=[1] * 9)
               for r in range(W)]
    L = layouts[0]
    slots = world.alloc_slot(L.slot_bytes)
    send = [torch.empty(L.send_bytes, dtype=torch.uint8, device="cuda").random_() for _ in range(W)]
    med, lo, hi = time_ms(lambda: world.all_gather(layouts, slots, sendbufs=send), world.streams)
    moved = W * W * L.send_bytes  # every rank writes its shard into every rank's slot
    print(f"TIDE-AG 70B layer, {W} virtual ranks: {med:.3f} ms (min {lo:.3f}, max {hi:.3f}); "
          f"{moved / 1e9:.2f} GB placed -> {2 * moved / med / 1e6:.0f} GB/s read+write over the device")
    world.synchronize()
    world.free_slot(slots)
    del send

    grads = [[torch.randn(n, dtype=torch.bfloat16, device="cuda") for n in LLAMA70B_LAYER] for _ in range(W)]
    outs = [torch.empty(L.rs_out_numel, dtype=torch.float32, device="cuda") for _ in range(W)]
    med, lo, hi = time_ms(lambda: world.reduce_scatter(layouts, grads, outs, op="avg"), world.streams)
    gbytes = sum(LLAMA70B_LAYER) * 2 * W
    print(f"TIDE-RS 70B layer, {W} virtual ranks, bf16 -> fp32 avg, chunk {L.rs_chunk_numel} elements x "
          f"{L.rs_num_chunks}: {med:.3f} ms (min {lo:.3f}, max {hi:.3f}); {gbytes / 1e9:.2f} GB of gradients")

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        world.reduce_scatter(layouts, grads, outs, op="avg")
        world.synchronize()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    ksum_us = sum(e["dur"] for e in kernels)
    # Each kernel reads W inputs of n bf16 and writes n fp32: 2*W + 4 bytes per output element.
    kbytes = L.rs_out_numel * W * (2 * W + 4)
    print(f"RS reduce kernels: {len(kernels)} launches, total SM-kernel time {ksum_us / 1e3:.3f} ms for {W} ranks, "
          f"{kbytes / (ksum_us * 1e-6) / 1e9:.0f} GB/s (bytes read+written / summed kernel time; kernels of different "
          f"ranks may overlap); {len(copies)} copy records")
    if kernels:
        k = max(kernels, key=lambda e: e["dur"])
        print(f"  longest kernel {k['dur']:.1f} us, grid {k.get('args', {}).get('grid')}, "
              f"block {k.get('args', {}).get('block')}")
    world.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
