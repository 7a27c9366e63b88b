# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""A small AG + RS case for compute-sanitizer (memcheck, racecheck): 2 and 3 virtual ranks, several RS chunks,
both staging kinds, bf16 -> fp32 and fp16 -> bf16, checked against the host executor. Exit status 0 iff correct.

    NCCL_TIDE_LIBRARY_PATH=build/libnccl-tide.so PYTHONPATH=pytorch_glue:tests/gpu \
        compute-sanitizer --tool memcheck python3 tests/gpu/sanitizer_case.py
"""

import os
import sys

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import nccl_tide  # noqa: E402
from gpu_util import as_bits, make_layouts, random_bytes, random_float  # noqa: E402
from nccl_tide.cuda import LoopbackWorld  # noqa: E402


def main() -> int:
    rng = np.random.default_rng(1)
    failures = 0
    for W in (2, 3):
        world = LoopbackWorld(W)
        numels, rows = [1001, 64 * 5, 7], [1, 64, 1]
        for gdt, odt, staging_kind in (("bf16", "fp32", "own"), ("fp16", "bf16", "slot")):
            layouts = make_layouts(numels, rows, [gdt] * 3, W, rs_chunk_bytes=512)
            L = layouts[0]
            slots = world.alloc_slot(max(L.slot_bytes, L.rs_staging_bytes))
            send = [random_bytes(torch, rng, L.send_bytes, "cuda") for _ in range(W)]
            world.all_gather(layouts, slots, sendbufs=send)
            world.synchronize()
            for r in range(W):
                got = slots[r].cpu().numpy()
                for i, p in enumerate(L.params):
                    for s in range(W):
                        n = p.shard_numel * p.elem_size
                        a = got[p.slot_offset + s * n : p.slot_offset + (s + 1) * n]
                        b = send[s].cpu().numpy()[p.send_offset : p.send_offset + n]
                        failures += int(not np.array_equal(a, b))
            grads_cpu = [[random_float(torch, rng, p.numel, gdt) for p in L.params] for _ in range(W)]
            expected = nccl_tide.host_reduce_scatter(L, grads_cpu, out_dtype=odt, op="premul", scale=0.5)
            grads = [[g.cuda() for g in gr] for gr in grads_cpu]
            tdt = {"fp32": torch.float32, "bf16": torch.bfloat16}[odt]
            outs = [torch.empty(L.rs_out_numel, dtype=tdt, device="cuda") for _ in range(W)]
            world.reduce_scatter(layouts, grads, outs, op="premul", scale=0.5,
                                 staging=slots if staging_kind == "slot" else None)
            world.synchronize()
            for r in range(W):
                failures += int(not np.array_equal(as_bits(torch, outs[r]).view(np.uint8),
                                                   np.asarray(expected[r]).view(np.uint8)))
            print(f"W={W} {gdt}->{odt} staging={staging_kind} chunks={L.rs_num_chunks}: failures so far {failures}")
            world.free_slot(slots)
        world.close()
    print("sanitizer_case:", "OK" if failures == 0 else f"{failures} FAILURES")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
