# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""FSDP2's own copy ops, as tide-perf's fsdp2 rows and their loopback stand-ins call them: each lookup returns
(the op's name for the row's note, a function), the torch.ops.fsdp.* op where torch registers it, else the plain torch
function FSDP2 falls back to."""


def _torch():
    import torch

    return torch


def _register_fsdp_ops() -> None:
    try:
        import torch.distributed.fsdp  # noqa: F401  (registers torch.ops.fsdp.*)
    except Exception:
        pass


def copy_out_impl():
    """FSDP2's copy-out op: torch.ops.fsdp.split_with_sizes_copy, else torch.split_with_sizes_copy."""
    torch = _torch()
    _register_fsdp_ops()
    try:
        op = torch.ops.fsdp.split_with_sizes_copy
        return "torch.ops.fsdp.split_with_sizes_copy", lambda flat, sizes, outs: op(flat, sizes, dim=1, out=outs)
    except (AttributeError, RuntimeError):
        pass
    return "torch.split_with_sizes_copy", lambda flat, sizes, outs: torch.split_with_sizes_copy(
        flat, sizes, dim=1, out=outs
    )


def chunk_cat_impl():
    """FSDP2's copy-in op: torch.ops.fsdp.chunk_cat, else torch._chunk_cat (fp32 output from bf16 grads)."""
    torch = _torch()
    _register_fsdp_ops()
    try:
        op = torch.ops.fsdp.chunk_cat
        return "torch.ops.fsdp.chunk_cat", lambda ts, n, out: op(ts, dim=0, num_chunks=n, out=out)
    except (AttributeError, RuntimeError):
        pass
    return "torch._chunk_cat", lambda ts, n, out: torch._chunk_cat(ts, 0, n, out=out)


def all_gather_copy_in_impl():
    """FSDP2's AG copy-in, torch.ops.fsdp.all_gather_copy_in (every parameter's shard into this rank's block of the
    flat AG output, one foreach copy), as (name, fn(shards, flat_out, sizes, numel, rank) -> input view); None
    where torch has no such op."""
    torch = _torch()
    _register_fsdp_ops()
    try:
        op = torch.ops.fsdp.all_gather_copy_in
    except (AttributeError, RuntimeError):
        return None
    return "torch.ops.fsdp.all_gather_copy_in", lambda shards, out, sizes, n, rank: op(shards, out, sizes, n, rank)[0]


def param_views(buf_u8, layout, world: int, bits):
    """Per-parameter (world, shard_numel) views (element type `bits`) of a slot-layout byte buffer: the copy-out's
    destinations, one per parameter, where TIDE's all-gather writes the same parameters."""
    out = []
    for p in layout.params:
        nb = p.shard_numel * world * p.elem_size
        out.append(buf_u8[p.slot_offset : p.slot_offset + nb].view(bits).view(world, p.shard_numel))
    return out
