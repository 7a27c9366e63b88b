# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Executors of TIDE layouts between processes: the reference executor on torch.distributed.

The reference executor computes exactly the results that include/tide.h defines, from the
same Layout (offsets, padding, ranks per node) as every other executor, using ordinary
torch.distributed collectives on any backend (gloo on CPU). It is the oracle for the GPU
path and how the FSDP2 integration runs in CI. It is NOT the fast path: it allocates a
gather buffer and copies into the parameter views (AG), and builds a chunked send buffer
and gathers every rank's chunk (RS), which are exactly the copies TIDE exists to remove.

"native" (CUDA + NCCL through tideComm, communicator from ProcessGroupNCCL._comm_ptr()) is
nccl_tide.native_executor; get_executor() returns either.

Importing this module imports torch.
"""

from collections.abc import Sequence
from typing import List, Optional

import torch
import torch.distributed as dist

from ._dist import all_gather_flat
from .dtypes import dtype as to_dtype
from .errors import InvalidArgumentError, UnsupportedError
from .layout import Layout

_TORCH_DTYPES = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "int8": torch.int8,
    "int32": torch.int32,
}


def torch_dtype(name) -> torch.dtype:
    """torch dtype of a TIDE dtype name (bf16, fp16, fp32, int8, int32)."""
    dt = to_dtype(name)
    if dt.name not in _TORCH_DTYPES:
        raise InvalidArgumentError(f"dtype {dt.name} has no torch equivalent handled by the reference executor")
    return _TORCH_DTYPES[dt.name]


def tide_dtype_name(dtype: torch.dtype) -> str:
    """TIDE dtype name of a torch dtype ('bf16' for torch.bfloat16)."""
    return to_dtype(str(dtype)).name


def _uniform_dtype(layout: Layout) -> torch.dtype:
    names = {d.name for d in layout.dtypes}
    if len(names) != 1:
        raise InvalidArgumentError(f"the reference executor needs one dtype per layout, got {sorted(names)}")
    return torch_dtype(names.pop())


def _elem_offsets(layout: Layout, field: str) -> List[int]:
    return [getattr(p, field) // p.elem_size for p in layout.params]


class ReferenceExecutor:
    """TIDE-AG and TIDE-RS of one rank, on a torch.distributed process group.

    Every rank of `group` must make the same calls in the same order with layouts of the
    same hash (as with any collective). Synchronous: results are complete on return.
    """

    name = "reference"
    fast_path = False

    def __init__(self, group: Optional[dist.ProcessGroup] = None):
        self.group = group

    def _check(self, layout: Layout) -> None:
        world = dist.get_world_size(self.group)
        rank = dist.get_rank(self.group)
        if layout.world_size != world or layout.rank != rank:
            raise InvalidArgumentError(
                f"layout is for rank {layout.rank} of {layout.world_size}, the process group has rank {rank} of {world}"
            )

    # -- all-gather --------------------------------------------------------------------------
    def pack(self, layout: Layout, shards: Sequence[torch.Tensor], out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Packed send buffer (tide.h): shard i at sendOffset_i. Casts while copying."""
        dt = _uniform_dtype(layout)
        infos = layout.params
        offs = _elem_offsets(layout, "send_offset")
        numel = layout.send_bytes // infos[0].elem_size
        if out is None:
            out = torch.empty(numel, dtype=dt, device=shards[0].device)
        dsts = [out.narrow(0, o, p.shard_numel) for o, p in zip(offs, infos)]
        for s, p in zip(shards, infos):
            if s.numel() != p.shard_numel:
                raise InvalidArgumentError(f"shard has {s.numel()} elements, layout needs {p.shard_numel}")
        with torch.no_grad():
            torch._foreach_copy_(dsts, [s.reshape(-1) for s in shards])
        return out

    def all_gather(self, layout: Layout, send: torch.Tensor, params: Sequence[torch.Tensor]) -> int:
        """TIDE-AG: send = this rank's packed send buffer; params[i] = unsharded storage of
        parameter i (shard_numel_i * W elements), written with every rank's shard at
        [s * shard_numel_i, (s + 1) * shard_numel_i). Returns the bytes of temporary buffers.

        Reference data path: one flat all-gather of the packed buffers, then a copy
        of each rank's block into the parameter storage (the copy-out TIDE removes).
        """
        self._check(layout)
        W, dt = layout.world_size, _uniform_dtype(layout)
        infos = layout.params
        if send.dtype != dt or send.numel() * send.element_size() != layout.send_bytes:
            raise InvalidArgumentError("send buffer does not match the layout (dtype or sendBytes)")
        if len(params) != len(infos):
            raise InvalidArgumentError(f"{len(params)} parameter outputs, layout has {len(infos)}")
        for t, p in zip(params, infos):
            if t.dtype != dt or t.numel() != p.shard_numel * W:
                raise InvalidArgumentError(f"parameter output {tuple(t.shape)} {t.dtype}: need {p.shard_numel * W}")
        gathered = torch.empty(W * send.numel(), dtype=dt, device=send.device)
        all_gather_flat(gathered, send.contiguous(), group=self.group)
        rows = gathered.view(W, -1)
        with torch.no_grad():
            for o, p, dst in zip(_elem_offsets(layout, "send_offset"), infos, params):
                dst.view(W, p.shard_numel).copy_(rows.narrow(1, o, p.shard_numel))
        return gathered.numel() * gathered.element_size()

    # -- reduce-scatter ----------------------------------------------------------------------
    @staticmethod
    def staging_numel(layout: Layout) -> int:
        """Elements (of the gradient dtype) of the receive buffer reduce_scatter may take as `staging`."""
        return layout.world_size * layout.rs_out_numel

    def reduce_scatter(
        self,
        layout: Layout,
        grads: Sequence[torch.Tensor],
        out: torch.Tensor,
        op: str = "sum",
        scale: float = 1.0,
        staging: Optional[torch.Tensor] = None,
    ) -> int:
        """TIDE-RS: grads[i] = this rank's full gradient of parameter i (numel_i elements, any
        shape, bf16/fp16/fp32, one dtype); out = this rank's packed output (rs_out_numel
        elements, fp32/bf16/fp16), parameter i at rs_out_offset_i. op: 'sum', 'avg', 'premul'.
        staging: optional buffer of >= staging_numel(layout) elements of the gradient dtype
        for the received chunks (Slot-Reuse passes the vacated AG slot). Returns the bytes
        of temporary buffers allocated.

        Reference data path: one all_to_all_single exchanges the zero-padded chunks, then the
        fold of tide.h in fp32 (node-local left to right, then over nodes), each operation a
        separate torch op (individually rounded, no FMA).
        """
        self._check(layout)
        W, R, S = layout.world_size, layout.ranks_per_node, layout.rs_out_numel
        infos = layout.params
        if op not in ("sum", "avg", "premul"):
            raise InvalidArgumentError(f"op {op!r}: use 'sum', 'avg' or 'premul'")
        if len(grads) != len(infos):
            raise InvalidArgumentError(f"{len(grads)} gradients, layout has {len(infos)}")
        gdt = grads[0].dtype
        if gdt not in (torch.bfloat16, torch.float16, torch.float32):
            raise InvalidArgumentError(f"gradient dtype {gdt}: reduce-scatter takes bf16, fp16 or fp32")
        for g, p in zip(grads, infos):
            if g.dtype != gdt or g.numel() != p.numel:
                raise InvalidArgumentError(f"gradient {tuple(g.shape)} {g.dtype}: need {p.numel} elements of {gdt}")
        if out.dtype not in (torch.float32, torch.bfloat16, torch.float16) or out.numel() != S:
            raise InvalidArgumentError(f"output {tuple(out.shape)} {out.dtype}: need {S} elements of fp32/bf16/fp16")
        if op == "premul" and not torch.isfinite(torch.tensor(scale, dtype=torch.float32)):
            raise InvalidArgumentError(f"scale {scale} is not finite in fp32")
        device = grads[0].device
        temp = 0

        # Row d of `send` = [chunk_d(g_0) zero-padded | chunk_d(g_1) | ...] (FSDP2 chunk_cat order).
        send = torch.empty((W, S), dtype=gdt, device=device)
        temp += send.numel() * send.element_size()
        with torch.no_grad():
            for g, p in zip(grads, infos):
                sh, region = p.shard_numel, send.narrow(1, p.rs_out_offset, p.shard_numel)
                flat = g.reshape(-1)
                full = p.numel // sh
                if full:
                    region[:full].copy_(flat[: full * sh].view(full, sh))
                if full < W:
                    region[full:].zero_()
                    rem = p.numel - full * sh
                    if rem:
                        region[full, :rem].copy_(flat[full * sh :])
        if staging is not None:
            if staging.dtype != gdt or staging.numel() < W * S or not staging.is_contiguous():
                raise InvalidArgumentError(f"staging: need {W * S} contiguous elements of {gdt}")
            recv = staging.narrow(0, 0, W * S)
        else:
            recv = torch.empty(W * S, dtype=gdt, device=device)
            temp += recv.numel() * recv.element_size()
        dist.all_to_all_single(recv, send.view(-1), group=self.group)
        rows = recv.view(W, S)

        scale_t = torch.full((S,), float(scale), dtype=torch.float32, device=device)  # fp32 rounding of scale

        def x(s: int) -> torch.Tensor:
            v = rows[s].to(torch.float32)  # exact
            return torch.mul(v, scale_t) if op == "premul" else v

        total = None
        for m in range(W // R):
            partial = x(m * R)
            for s in range(m * R + 1, (m + 1) * R):
                partial = torch.add(partial, x(s))
            total = partial if total is None else torch.add(total, partial)
        if op == "avg":
            total = torch.div(total, torch.full_like(total, float(W)))  # IEEE division, not a reciprocal
        with torch.no_grad():
            out.copy_(total)  # fp32, or round to nearest even
        return temp


def get_executor(name: str, group: Optional[dist.ProcessGroup] = None, device=None):
    """Executor by name: 'reference' (any backend) or 'native' (nccl_tide.native_executor: a NCCL
    process group on CUDA; raises UnsupportedError saying why it cannot be created)."""
    if name == "reference":
        return ReferenceExecutor(group)
    if name == "native":
        if device is None:
            device = (
                torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
            )
        device = torch.device(device)
        if device.type != "cuda":
            raise UnsupportedError(
                f"executor='native' needs CUDA tensors and a NCCL process group (the parameters are on {device}); "
                "use executor='reference' (or 'auto') on CPU/gloo"
            )
        from .native_executor import NativeExecutor

        try:
            return NativeExecutor(group, device)
        except UnsupportedError:
            raise
        except Exception as e:  # tideCommCreate refused, library without CUDA/NCCL, ...
            raise UnsupportedError(f"executor='native': tideCommCreate on the process group failed: {e}") from e
    raise InvalidArgumentError(f"unknown executor {name!r}: use 'auto', 'reference' or 'native'")
