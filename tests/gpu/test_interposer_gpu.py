# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The NCCL_TIDE_ENABLE interposer on a real NCCL (marker gpu, one GPU).

torch.distributed with the NCCL backend at world size 1, libnccl-tide.so in LD_PRELOAD: torch's ncclAllGather /
ncclReduceScatter calls reach the interposer, eligible ones are run by TIDE (tideCommCreate over torch's NCCL
communicator, bounce slot for the flat all-gather, fp32-accumulating reduce-scatter; the reduce-scatter is called
through the global ncclReduceScatter symbol because torch skips it at world size 1), and the results must equal
what NCCL computes for one rank (the input itself; bf16 -> fp32 -> bf16 is exact). The TRACE log counts the calls
TIDE took, so a run that silently passed everything to NCCL fails. Each case runs in a fresh process (the preload
and the parameters are read once per process) with a timeout.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = textwrap.dedent(
    r"""
    import datetime, os, socket, sys
    import torch
    import torch.distributed as dist

    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", 0))
    g = torch.Generator(device="cpu").manual_seed(20261202)
    calls = 0
    bad = []
    # All-gather: several sizes (a bounce-slot growth in between) and dtypes, also an odd byte count.
    for numel, dtype in [(3 << 20, torch.float32), (1 << 20, torch.bfloat16), (5 << 20, torch.float32),
                         ((1 << 20) + 3, torch.uint8)]:
        if dtype == torch.uint8:
            x = torch.randint(0, 256, (numel,), generator=g, dtype=torch.uint8).cuda()
        else:
            x = torch.randn(numel, generator=g).to(dtype).cuda()
        out = torch.full_like(x, 7)
        dist.all_gather_into_tensor(out, x)
        calls += 1
        torch.cuda.synchronize()
        if not torch.equal(out, x):
            bad.append(f"all_gather {dtype} {numel}")
    # Reduce-scatter, sum. At world size 1 ProcessGroupNCCL does not call ncclReduceScatter (a single-rank
    # shortcut), so call NCCL the way a C program does: the global symbol (which the
    # preload makes the interposer's) on torch's communicator. fp32 is always eligible; bf16 only with
    # NCCL_TIDE_RS_ACCUM=FP32.
    import ctypes
    nccl = ctypes.CDLL(None)
    rs = nccl.ncclReduceScatter
    rs.restype = ctypes.c_int
    rs.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                   ctypes.c_void_p]
    comm = dist.group.WORLD._get_backend(torch.device("cuda"))._comm_ptr()
    NCCL_TYPES = {torch.float32: 7, torch.bfloat16: 9}
    for numel, dtype in [(2 << 20, torch.float32), (1 << 20, torch.bfloat16), ((3 << 20) + 8, torch.float32)]:
        x = torch.randn(numel, generator=g).to(dtype).cuda()
        out = torch.full_like(x, float("nan"))
        stream = torch.cuda.current_stream()
        rc = rs(x.data_ptr(), out.data_ptr(), numel, NCCL_TYPES[dtype], 0, comm, stream.cuda_stream)
        calls += 1
        torch.cuda.synchronize()
        if rc != 0 or not torch.equal(out, x):
            bad.append(f"reduce_scatter {dtype} {numel} rc {rc}")
    print("CALLS", calls)
    print("BAD", bad)
    dist.destroy_process_group()
    print("DONE")
    sys.stdout.flush()
    """
)


def run_case(tmp_path, enable, rs_accum=None, timeout=180, script=SCRIPT):
    from nccl_tide import _native

    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_TIDE_")}
    env.update(
        LD_PRELOAD=_native.library_path(),
        NCCL_TIDE_ENABLE=enable,
        NCCL_TIDE_DEBUG="TRACE",
        NCCL_TIDE_ENABLE_MIN_BYTES="0",
        NCCL_NVLS_ENABLE="0",
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NVSHMEM_DISABLE_NVLS="1",
    )
    if "NCCL_TIDE_LIBRARY_PATH" in os.environ:
        env["NCCL_TIDE_LIBRARY_PATH"] = os.environ["NCCL_TIDE_LIBRARY_PATH"]
    if rs_accum is not None:
        env["NCCL_TIDE_RS_ACCUM"] = rs_accum
    path = tmp_path / "interposed.py"
    path.write_text(script)
    p = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=timeout)
    return p


def taken(p, what):
    return sum(1 for x in p.stderr.splitlines() if f"TRACE Interposer: {what} on" in x and "taken by TIDE" in x)


def test_enabled_calls_run_through_tide(torch_cuda, cuda_lib, tmp_path):
    p = run_case(tmp_path, "1", rs_accum="FP32")
    assert p.returncode == 0 and "DONE" in p.stdout, p.stdout + p.stderr[-4000:]
    assert "BAD []" in p.stdout, p.stdout
    assert "CALLS 7" in p.stdout
    assert "TIDE takes its eligible calls" in p.stderr, p.stderr[-4000:]
    assert "TIDE is off for NCCL communicator" not in p.stderr, p.stderr[-4000:]
    assert taken(p, "ncclAllGather") == 4, p.stderr[-4000:]
    assert taken(p, "ncclReduceScatter") == 3, p.stderr[-4000:]


def test_half_precision_reduce_scatter_left_to_nccl_by_default(torch_cuda, cuda_lib, tmp_path):
    p = run_case(tmp_path, "1")
    assert p.returncode == 0 and "DONE" in p.stdout, p.stdout + p.stderr[-4000:]
    assert "BAD []" in p.stdout, p.stdout
    assert taken(p, "ncclAllGather") == 4, p.stderr[-4000:]
    assert taken(p, "ncclReduceScatter") == 2, p.stderr[-4000:]  # the bf16 one went to NCCL
    assert "without NCCL_TIDE_RS_ACCUM=FP32" in p.stderr


def test_disabled_is_pass_through(torch_cuda, cuda_lib, tmp_path):
    p = run_case(tmp_path, "0")
    assert p.returncode == 0 and "DONE" in p.stdout, p.stdout + p.stderr[-4000:]
    assert "BAD []" in p.stdout, p.stdout
    assert "Interposer:" not in p.stderr, p.stderr[-4000:]


LAYOUT_SCRIPT = textwrap.dedent(
    r"""
    import ctypes, datetime, socket, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    import nccl_tide
    import nccl_tide.interposer as ti

    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", 0))
    g = torch.Generator(device="cpu").manual_seed(1202)
    bad = []
    # Three bf16 parameters whose slot offsets (256-byte aligned) differ from their send offsets (2-byte aligned),
    # so a flat all-gather and a layout-aware one leave different bytes in the buffer.
    L = nccl_tide.Layout([1000, 3, 64 * 5], "bf16", 1, rank=0, row_numels=[1, 1, 64])
    assert any(p.slot_offset != p.send_offset for p in L.params)
    n = (max(L.send_bytes, L.slot_bytes) + 1) // 2  # padded so that the NCCL-sized buffer covers slotBytes
    send = torch.randn(n, generator=g).to(torch.bfloat16).cuda()
    recv = torch.full((n,), 7.0, dtype=torch.bfloat16).cuda()
    ti.attach_layout(dist.group.WORLD, recv, L)
    dist.all_gather_into_tensor(recv, send)
    torch.cuda.synchronize()
    sb = send.cpu().view(torch.uint8).numpy(); rb = recv.cpu().view(torch.uint8).numpy()
    for i, p in enumerate(L.params):
        nb = p.numel * 2
        if not np.array_equal(rb[p.slot_offset:p.slot_offset + nb], sb[p.send_offset:p.send_offset + nb]):
            bad.append(f"all_gather param {i} not at its slot offset")
    seven = torch.full((n,), 7.0, dtype=torch.bfloat16).view(torch.uint8).numpy()
    if not np.array_equal(rb[L.slot_bytes:], seven[L.slot_bytes:]):
        bad.append("all_gather wrote past slotBytes")
    ti.detach_layout(dist.group.WORLD, recv)
    # Reduce-scatter from a gradient image (every parameter's full gradient at its slot offset).
    nccl = ctypes.CDLL(None)
    rs = nccl.ncclReduceScatter
    rs.restype = ctypes.c_int
    rs.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                   ctypes.c_void_p]
    comm = dist.group.WORLD._get_backend(torch.device("cuda"))._comm_ptr()
    count = max(L.rs_out_numel, (L.slot_bytes + 1) // 2)
    grads = torch.randn(count, generator=g).to(torch.bfloat16).cuda()
    out = torch.full((count,), float("nan"), dtype=torch.bfloat16).cuda()
    ti.attach_layout(comm, grads, L)
    rc = rs(grads.data_ptr(), out.data_ptr(), count, 9, 0, comm, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    gb = grads.cpu().view(torch.uint8).numpy(); ob = out.cpu().view(torch.uint8).numpy()
    if rc != 0:
        bad.append(f"reduce_scatter rc {rc}")
    for i, p in enumerate(L.params):
        nb = p.numel * 2
        if not np.array_equal(ob[p.rs_out_offset * 2:p.rs_out_offset * 2 + nb], gb[p.slot_offset:p.slot_offset + nb]):
            bad.append(f"reduce_scatter param {i} not packed at its output offset")
    if not torch.isnan(out[L.rs_out_numel:].float()).all():
        bad.append("reduce_scatter wrote past rsOutNumel")
    print("BAD", bad)
    dist.destroy_process_group()
    print("DONE")
    sys.stdout.flush()
    """
)


def test_attached_layout_places_by_the_layout(torch_cuda, cuda_lib, tmp_path):
    """tideAttachLayout: an interposed all-gather into the attached buffer leaves the layout's slot image (not NCCL's
    rank-major bytes), and a reduce-scatter from an attached gradient image packs by the layout (world size 1)."""
    p = run_case(tmp_path, "1", rs_accum="FP32", script=LAYOUT_SCRIPT)
    assert p.returncode == 0 and "DONE" in p.stdout, p.stdout + p.stderr[-4000:]
    assert "BAD []" in p.stdout, p.stdout
    assert taken(p, "ncclAllGather") == 1 and taken(p, "ncclReduceScatter") == 1, p.stderr[-4000:]
    assert "does not match it" not in p.stderr, p.stderr[-4000:]  # the attachments were used, not the flat path
