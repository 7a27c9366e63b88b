# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The NCCL_TIDE_ENABLE interposer in a real NCCL world: what the frameworks send, taken by TIDE. W ranks sharing
one GPU as W NCCL hosts declared one TIDE node (test_nccl_hosts.py's set-up), libnccl-tide.so preloaded, every call
counted (nccl_tide.interposer.counters). Marker gpu: one card.

Per rank, the calls of Megatron-Core (reduce-scatters and all-gathers in place inside torch's coalescing manager,
i.e. ncclGroupStart / ncclGroupEnd, two buckets per group, SUM and AVG), DeepSpeed ZeRO-3 (an ungrouped in-place
bf16 reduce-scatter, with NCCL_TIDE_RS_ACCUM=FP32) and torchtitan (an fp32 reduce-scatter with PREMUL_SUM(1.0),
and one with another host scalar). The oracle is TIDE's documented order on the CPU (include/tide.h: each input
premultiplied in fp32, a left fold in rank order, one rounding), computed from every rank's seeded inputs; all
of the calls' bytes must be TIDE's.
"""

import json

import pytest
import test_nccl_hosts as hosts

pytestmark = [pytest.mark.gpu]


@pytest.fixture(autouse=True)
def _gpu(torch_cuda, cuda_lib):
    pass


def _inputs(torch, world, key, numel, dtype):
    g = torch.Generator().manual_seed(key)
    return [torch.randn(world * numel, generator=g).to(dtype) for _ in range(world)]


def _fold(torch, grads, rank, numel, scale, out_dtype):
    """Rank `rank`'s block of the reduce-scatter in TIDE's order (one node): fp32 inputs times scale, left fold."""
    acc = None
    for g in grads:
        x = g[rank * numel:(rank + 1) * numel].float()
        if scale is not None:
            x = x * scale
        acc = x if acc is None else acc + x
    return acc.to(out_dtype)


def _frameworks(rank, world, report):
    import torch
    import torch.distributed as dist
    from nccl_tide import interposer

    pg = dist.group.WORLD
    n = (1 << 18) + 3 * world  # odd per-rank counts

    def check(what, got, want):
        report["checked"] += 1
        if not torch.equal(got.cpu(), want):
            bad = (got.cpu() != want).sum().item()
            report["errors"].append(f"{what}: {bad} of {want.numel()} elements differ")

    # Megatron-Core: two gradient buckets reduced in place in one group, fp32, SUM then AVG (average_in_collective).
    for op, key, scale in ((dist.ReduceOp.SUM, 1, None), (dist.ReduceOp.AVG, 2, float(1.0 / world))):
        grads = [_inputs(torch, world, key * 10 + b, n + b, torch.float32) for b in range(2)]
        bufs = [grads[b][rank].cuda() for b in range(2)]
        with dist._coalescing_manager(group=pg, device=torch.device("cuda")):
            for b in range(2):
                dist.reduce_scatter_tensor(bufs[b].view(world, -1)[rank], bufs[b], op=op, group=pg)
        torch.cuda.synchronize()
        for b in range(2):
            want = _fold(torch, grads[b], rank, n + b, torch.tensor(scale) if scale else None, torch.float32)
            check(f"Megatron grouped in-place RS {op} bucket {b}", bufs[b].view(world, -1)[rank], want)
    # Megatron-Core: the parameter all-gather, in place, grouped.
    shards = _inputs(torch, world, 3, n, torch.bfloat16)[0].view(world, -1)
    param = torch.full((world * n,), 7.0, dtype=torch.bfloat16, device="cuda")
    param.view(world, -1)[rank].copy_(shards[rank])
    with dist._coalescing_manager(group=pg, device=torch.device("cuda")):
        dist.all_gather_into_tensor(param, param.view(world, -1)[rank], group=pg)
    torch.cuda.synchronize()
    check("Megatron grouped in-place AG", param, shards.reshape(-1))
    # DeepSpeed ZeRO-3: an ungrouped in-place bf16 reduce-scatter of a pre-divided buffer.
    grads = _inputs(torch, world, 4, n, torch.bfloat16)
    buf = grads[rank].cuda()
    dist.reduce_scatter_tensor(buf.view(world, -1)[rank], buf, group=pg)
    torch.cuda.synchronize()
    check("DeepSpeed in-place bf16 RS", buf.view(world, -1)[rank], _fold(torch, grads, rank, n, None, torch.bfloat16))
    # torchtitan: fp32 reduce-scatter with PREMUL_SUM(1.0) (a sum), and another host scalar.
    for key, factor in ((5, 1.0), (6, 0.375)):
        grads = _inputs(torch, world, key, n, torch.float32)
        out = torch.full((n,), float("nan"), device="cuda")
        op = dist._make_nccl_premul_sum(factor)
        dist.reduce_scatter_tensor(out, grads[rank].cuda(), op=op, group=pg)
        torch.cuda.synchronize()
        scale = None if factor == 1.0 else torch.tensor(factor)
        check(f"torchtitan PREMUL_SUM({factor}) RS", out, _fold(torch, grads, rank, n, scale, torch.float32))
    c = interposer.counters()
    report["counters"] = c
    for coll in ("all_gather", "reduce_scatter"):
        if c[coll]["to_nccl"] or c[coll]["taken"]["calls"] == 0:
            report["errors"].append(f"{coll}: not all taken by TIDE: {c[coll]}")


@pytest.mark.parametrize("world", [2, 4])
def test_framework_calls_all_taken_and_exact(tmp_path, world):
    from nccl_tide import _native

    env = {"NCCL_TIDE_RANKS_PER_NODE": str(world), "LD_PRELOAD": _native.library_path(), "NCCL_TIDE_ENABLE": "1",
           "NCCL_TIDE_DEBUG": "INFO", "NCCL_TIDE_ENABLE_MIN_BYTES": "0", "NCCL_TIDE_RS_ACCUM": "FP32"}
    for rep in hosts.launch(tmp_path, world, _frameworks, env):
        assert rep["checked"] == 8, rep
        rs = rep["counters"]["reduce_scatter"]["taken"]["calls"]
        assert rs == 7 and rep["counters"]["all_gather"]["taken"]["calls"] >= 1, rep["counters"]


def _device_bytes(torch, ptr, nbytes):
    """A uint8 tensor over device memory the test allocated outside torch (ncclMemAlloc)."""

    class Memory:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}

    return torch.as_tensor(Memory(), device="cuda")


def _windows(rank, world, report):
    """All-gathers into buffers of NCCL windows the application registered: straight into a symmetric window (also
    one registered inside a group, and in place), through the bounce slot and a copy-out everywhere else."""
    import ctypes

    import torch
    import torch.distributed as dist
    from nccl_tide import interposer

    pg = dist.group.WORLD
    comm = ctypes.c_void_p(pg._get_backend(torch.device("cuda"))._comm_ptr())
    nccl = ctypes.CDLL(None)  # the global scope: the preloaded interposer's NCCL names first, then NCCL's
    n = (1 << 20) + 3 * 128  # bf16 elements per rank
    size, offset = 8 << 20, 3 * 4096 + 512  # the window, and recvbuff's offset in it (the same on every rank)
    g = torch.Generator().manual_seed(7)
    shards = torch.randn(world, n, generator=g).to(torch.bfloat16)

    def window(flags, grouped=False):
        ptr, win = ctypes.c_void_p(), ctypes.c_void_p()
        assert nccl.ncclMemAlloc(ctypes.byref(ptr), ctypes.c_size_t(size)) == 0
        if grouped:
            assert nccl.ncclGroupStart() == 0
        rc = nccl.ncclCommWindowRegister(comm, ptr, ctypes.c_size_t(size), ctypes.byref(win), ctypes.c_int(flags))
        if grouped:
            assert nccl.ncclGroupEnd() == 0
        assert rc == 0 and win.value, f"ncclCommWindowRegister: {rc}, window {win.value}"
        return ptr, win

    def gather(what, ptr, in_place=False):
        memory = _device_bytes(torch, ptr.value, size)
        memory.fill_(0x5A)
        out = memory[offset: offset + world * n * 2].view(torch.bfloat16)
        if in_place:
            out.view(world, n)[rank].copy_(shards[rank])
            send = out.view(world, n)[rank]
        else:
            send = shards[rank].cuda()
        before = interposer.counters()["all_gather"]
        dist.all_gather_into_tensor(out, send, group=pg)
        torch.cuda.synchronize()
        after = interposer.counters()["all_gather"]
        report["checked"] += 1
        if not torch.equal(out.cpu(), shards.reshape(-1)):
            report["errors"].append(f"{what}: the gathered data differ")
        outside = torch.cat([memory[:offset], memory[offset + world * n * 2:]])
        if not bool((outside == 0x5A).all()):
            report["errors"].append(f"{what}: bytes outside recvbuff were written")
        taken = after["taken"]["calls"] - before["taken"]["calls"]
        copied = after["copy_out"]["calls"] - before["copy_out"]["calls"]
        return taken, copied

    sym, sym_win = window(1)  # NCCL_WIN_COLL_SYMMETRIC
    report["direct"] = gather("symmetric window", sym)
    report["direct_in_place"] = gather("symmetric window, in place", sym, in_place=True)
    grouped, grouped_win = window(1, grouped=True)
    report["direct_grouped"] = gather("symmetric window registered in a group", grouped)
    plain, plain_win = window(0)  # NCCL_WIN_DEFAULT
    report["plain"] = gather("window without NCCL_WIN_COLL_SYMMETRIC", plain)
    assert nccl.ncclCommWindowDeregister(comm, sym_win) == 0
    report["deregistered"] = gather("a deregistered window's buffer", sym)
    # What each copy-out costs on SMs: the same-device copy of the whole recvbuff, timed on rank 0 alone.
    if rank == 0:
        src = torch.empty(world * n * 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dst.copy_(src)
        start.record()
        for _ in range(20):
            dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        report["copy_out_us"] = start.elapsed_time(end) * 1000 / 20
    dist.barrier()
    for win in (grouped_win, plain_win):
        assert nccl.ncclCommWindowDeregister(comm, win) == 0
    for ptr in (sym, grouped, plain):
        assert nccl.ncclMemFree(ptr) == 0


@hosts.needs_multi_rank_nccl
def test_all_gathers_into_symmetric_windows_need_no_copy_out(tmp_path):
    from nccl_tide import _native

    env = {**hosts.MULTI_RANK_ENV, "LD_PRELOAD": f"{_native.library_path()}:{hosts.NCCL_MULTI_RANK}",
           "NCCL_TIDE_ENABLE": "1", "NCCL_TIDE_DEBUG": "INFO", "NCCL_TIDE_ENABLE_MIN_BYTES": "0"}
    reports = hosts.launch(tmp_path, 2, _windows, env, host_of=lambda r: "tide-one-host")
    for rep in reports:
        assert rep["checked"] == 5, rep
        # (taken, copied out) per case
        assert rep["direct"] == rep["direct_in_place"] == rep["direct_grouped"] == [1, 0], rep
        assert rep["plain"] == rep["deregistered"] == [1, 1], rep
        log = (tmp_path / f"tide-rank{rep['rank']}.log").read_text()
        assert "are gathered straight into it" in log, log[-3000:]
        assert "NCCL_WIN_COLL_SYMMETRIC: its offset may differ between ranks" in log, log[-3000:]
    print(json.dumps({"copy_out_us_per_all_gather": round(reports[0]["copy_out_us"], 1),
                      "recvbuff_bytes": 2 * ((1 << 20) + 3 * 128) * 2}))
