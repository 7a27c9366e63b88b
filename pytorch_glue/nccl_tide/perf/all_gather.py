# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""all_gather as tide-perf measures it (nccl-tests' all_gather.cu): every rank's shard of every parameter lands in
every rank's unsharded storage of that parameter. No reduction: results are checked bit-exact.

On the GPU backends every rank's input is one packed send buffer of random bytes (any bit pattern, NaN payloads
included) and every output is compared with the slot image, the slot every rank holds after the collective. The
loopback stand-ins gather one rank-major flat buffer with TIDE (+ FSDP2's copy-out for fsdp2); the torchrun rows are
NCCL's flat all-gather, FSDP2's copies around it, and NCCL's copy-engine all-gather on symmetric windows."""

from typing import List

from .. import reference as ref
from ..data import random_values, rank_rng
from ..host import host_all_gather, poisoned
from . import fsdp2_ops, gpu
from .collective import Collective, HostVariant, not_run, shard_numels
from .host_backend import RANDOM_TEMPORARIES, corrupt, count_wrong, fill
from .impls import NO_AG_DTYPE_ROW, loopback_stand_in
from .runner import SYNC_TIMEOUT_S, Bench, Unavailable


def _torch():
    import torch

    return torch


def send_buffers(backend, case, layout) -> list:
    """Every rank's packed send buffer: random bytes from that rank's generator."""
    torch = _torch()
    return [
        torch.randint(0, 256, (layout.send_bytes,), dtype=torch.uint8, device=backend.device, generator=g)
        for g in backend.rank_generators(case.seed)
    ]


class SlotImage:
    """The slot every rank holds after the all-gather: rank s's shard of parameter p at p.slot_offset + s x its bytes.
    Compared bit-exact over each parameter's W shards (what lies between parameters is not written)."""

    def __init__(self, layout, sends, bits, device):
        torch = _torch()
        W = len(sends)
        self.bits = bits
        self.expect = torch.full((layout.slot_bytes,), 255, dtype=torch.uint8, device=device)
        self.regions = []
        for p in layout.params:
            nb = p.shard_numel * p.elem_size
            for s in range(W):
                self.expect[p.slot_offset + s * nb : p.slot_offset + (s + 1) * nb] = sends[s][
                    p.send_offset : p.send_offset + nb
                ]
            self.regions.append((p.slot_offset, p.slot_offset + W * nb))

    def wrong(self, slots) -> int:
        """Wrong elements over every slot of `slots`."""
        e, bits = self.expect, self.bits
        return sum(gpu.count_wrong_bits(s[lo:hi].view(bits), e[lo:hi].view(bits)) for s in slots
                   for lo, hi in self.regions)


# -- loopback stand-ins ------------------------------------------------------------------------------------------------


class _FlatAllGather:
    """The stand-ins' all-gather: TIDE's all-gather of one rank-major flat buffer (rank s's whole send buffer is its
    block) over the same (virtual) nodes, the bytes NCCL's flat all-gather moves. `views[r]`: rank r's gathered
    buffer as (W, S) elements of the copy type."""

    def __init__(self, backend, case, layout, sends):
        W, size = backend.W, case.dtype.size
        S = layout.send_bytes // size
        self.tide, self.sends = backend.tide(), sends
        self.layouts = backend.layouts(case, [W * S], [1])
        self.slots = self.tide.alloc_slot(self.layouts[0].slot_bytes)
        cdt = gpu.copy_dtype(case.dtype.name, size)
        self.views = [f[: W * S * size].view(cdt).view(W, S) for f in self.slots]

    def __call__(self) -> None:
        self.tide.all_gather(self.layouts, self.slots, self.sends)

    def free(self) -> None:
        self.tide.free_slot(self.slots)


def _stand_in_nccl(backend, case) -> Bench:
    torch = _torch()
    bits = gpu.bits_dtype(case.dtype.size)
    layout = backend.layouts(case, case.numels, case.rows)[0]
    sends = send_buffers(backend, case, layout)
    flat = _FlatAllGather(backend, case, layout, sends)
    want = torch.cat([s.view(bits) for s in sends])

    def check():
        for f in flat.slots:
            f.fill_(255)
        flat()
        torch.cuda.synchronize()
        return sum(gpu.count_wrong_bits(v.reshape(-1).view(bits), want) for v in flat.views)

    note = loopback_stand_in("nccl", "all_gather", backend.nodes)
    assert note is not None  # impls.LOOPBACK_STAND_INS describes every stand-in
    if len(case.numels) == 1:
        note += " (for a flat layout the same copies as the tide row)"
    return Bench(flat, check, note=note, cleanup=flat.free)


def _stand_in_fsdp2(backend, case) -> Bench:
    torch = _torch()
    W = backend.W
    layout = backend.layouts(case, case.numels, case.rows)[0]
    sends = send_buffers(backend, case, layout)
    image = SlotImage(layout, sends, gpu.bits_dtype(case.dtype.size), backend.device)
    flat = _FlatAllGather(backend, case, layout, sends)
    op_name, copy_out = fsdp2_ops.copy_out_impl()
    sizes = [p.shard_numel for p in layout.params]
    cdt = gpu.copy_dtype(case.dtype.name, case.dtype.size)
    outs = [torch.empty(layout.slot_bytes, dtype=torch.uint8, device=backend.device) for _ in range(W)]
    out_views = [fsdp2_ops.param_views(o, layout, W, cdt) for o in outs]

    def call():
        flat()
        for r in range(W):
            copy_out(flat.views[r], sizes, out_views[r])

    def check():
        for o in outs:
            o.fill_(255)
        call()
        torch.cuda.synchronize()
        return image.wrong(outs)

    note = loopback_stand_in("fsdp2", "all_gather", backend.nodes)
    assert note is not None  # impls.LOOPBACK_STAND_INS describes every stand-in
    return Bench(call, check, note=note.format(copy_op=op_name), cleanup=flat.free)


# -- torchrun rows: NCCL on the process group --------------------------------------------------------------------------


def _flat_name(dist) -> str:
    """The torch.distributed function nccl_tide._dist calls for a flat all-gather (row notes)."""
    return "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"


def _nccl(backend, case) -> Bench:
    torch = _torch()
    from .. import _dist

    bits = gpu.bits_dtype(case.dtype.size)
    layout = backend.layouts(case, case.numels, case.rows)[0]
    sends = send_buffers(backend, case, layout)
    want = torch.cat([x.view(bits) for x in sends])
    send = sends[backend.rank]
    # NCCL collectives move bytes here (uint8): NCCL has no 16-bit integer type, and the bytes are what counts.
    out = torch.empty(backend.W * layout.send_bytes, dtype=torch.uint8, device=backend.device)

    def call():
        _dist.all_gather_flat(out, send)

    def check():
        out.fill_(255)
        call()
        torch.cuda.synchronize()
        return gpu.count_wrong_bits(out.view(bits), want)

    return Bench(call, check, note=f"torch.distributed.{_flat_name(backend.dist)}")


def _fsdp2(backend, case) -> Bench:
    """FSDP2's foreach_all_gather and foreach_all_gather_copy_out around the same NCCL call: every parameter's shard
    (its own tensor, as FSDP2's sharded parameters are) copied into this rank's block of the flat output, the
    all-gather in place from that block, the copy-out into each parameter's storage."""
    torch = _torch()
    from .. import _dist

    W, me, dev = backend.W, backend.rank, backend.device
    layout = backend.layouts(case, case.numels, case.rows)[0]
    sends = send_buffers(backend, case, layout)
    cdt = gpu.copy_dtype(case.dtype.name, case.dtype.size)
    for s in sends:  # FSDP2's copy-in keeps values, not NaN payloads: its inputs hold no NaN
        gpu.zero_nans(s, cdt)
    image = SlotImage(layout, sends, gpu.bits_dtype(case.dtype.size), dev)
    send = sends[me]
    S = layout.send_bytes // case.dtype.size
    sizes = [p.shard_numel for p in layout.params]
    shards = [send[p.send_offset : p.send_offset + n * case.dtype.size].view(cdt).clone()
              for p, n in zip(layout.params, sizes)]
    flat_out = torch.empty(W * layout.send_bytes, dtype=torch.uint8, device=dev)
    flat_c = flat_out.view(cdt)
    copy_in = fsdp2_ops.all_gather_copy_in_impl()
    if copy_in is None:
        in_name = f"no torch.ops.fsdp.all_gather_copy_in in torch {torch.__version__}: input copied by one torch.cat"
        block = flat_c[me * S : (me + 1) * S]

        def gather_in():
            torch.cat(shards, out=block)
            return block

    else:
        in_name = copy_in[0]

        def gather_in():
            return copy_in[1](shards, flat_c, sizes, S, me)

    op_name, copy_out = fsdp2_ops.copy_out_impl()
    out = torch.empty(layout.slot_bytes, dtype=torch.uint8, device=dev)
    views = fsdp2_ops.param_views(out, layout, W, cdt)
    flat2d = flat_c.view(W, S)

    def call():
        _dist.all_gather_flat(flat_c, gather_in())
        copy_out(flat2d, sizes, views)

    def check():
        out.fill_(255)
        flat_out.fill_(255)
        call()
        torch.cuda.synchronize()
        return image.wrong([out])

    note = (f"copy-in: {in_name}; torch.distributed.{_flat_name(backend.dist)}; copy-out: {op_name}"
            + ("; inputs without NaNs (the CUDA copy-in canonicalises them)" if cdt.is_floating_point else ""))
    return Bench(call, check, note=note)


def _nccl_ce(backend, case) -> Bench:
    """NCCL's CE AllGather: symmetric buffers registered as NCCL windows (torch symmetric memory, NCCL backend).
    Whether NCCL took the zero-CTA path shows in the SM column (0 us: no kernel)."""
    torch = _torch()
    from .. import _dist

    W = backend.W
    if W < 2:
        raise Unavailable("not run: world size 1 (NCCL's CE AllGather copies between GPUs: run with >= 2 ranks)")
    v = torch.cuda.nccl.version()
    v = v if isinstance(v, tuple) else (v // 10000, (v % 10000) // 100, v % 100)
    if tuple(v[:2]) < (2, 28):
        raise Unavailable(f"not run: NCCL {'.'.join(map(str, v))} in torch; CE collectives need NCCL >= 2.28")
    try:
        import torch.distributed._symmetric_memory as symm
    except ImportError as e:
        raise Unavailable(f"not run: torch {torch.__version__} has no symmetric memory module ({e})") from None
    if not hasattr(symm, "set_backend"):
        raise Unavailable(f"not run: torch {torch.__version__} cannot put symmetric memory on NCCL windows")
    symm.set_backend("NCCL")
    group, policy = backend.zero_cta_group()
    bits = gpu.bits_dtype(case.dtype.size)
    layout = backend.layouts(case, case.numels, case.rows)[0]
    sends = send_buffers(backend, case, layout)
    want = torch.cat([x.view(bits) for x in sends])
    n = layout.send_bytes
    inp = symm.empty(n, dtype=torch.uint8, device=backend.device)
    out = symm.empty(n * W, dtype=torch.uint8, device=backend.device)
    symm.rendezvous(inp, group)
    symm.rendezvous(out, group)
    inp.copy_(sends[backend.rank])

    def call():
        _dist.all_gather_flat(out, inp, group=group)

    def check():
        out.fill_(255)
        call()
        torch.cuda.synchronize()
        return gpu.count_wrong_bits(out.view(bits), want)

    note = f"symmetric windows (torch symm_mem, NCCL backend), {policy}; SM column 0 = no kernel (CE path)"
    return Bench(call, check, note=note)


# -- the descriptor ----------------------------------------------------------------------------------------------------


class AllGather(Collective):
    name = "all_gather"
    perf_name = "all_gather_perf"
    reduces = False
    fsdp2_copy_op = "split_with_sizes_copy"

    def host_peak_bytes(self, numels: List[int], rows: List[int], world: int, elem: int, out_elem: int,
                        check: bool) -> int:
        """While the shards are made, the shards so far and random_values' temporaries of one shard; then every
        rank's shards (S = W x one rank's shard bytes), every rank's gathered parameters (W x S), and with -c the
        reference (S) with the comparison's one byte per element of a gathered parameter."""
        shards = shard_numels(numels, rows, world)
        S = sum(shards) * elem * world
        making = S + RANDOM_TEMPORARIES * max(shards) * elem
        compare = world * max(shards) if check else 0  # count_wrong's one byte per element of a gathered parameter
        return max(making, S + world * S + (S + compare if check else 0))

    def host_variants(self, layout, o):
        W, infos = layout.world_size, layout.params
        shards = [[random_values(rank_rng(o.seed, r), o.dtype, p.shard_numel) for p in infos] for r in range(W)]
        params = [[poisoned(p.shard_numel * W, o.dtype) for p in infos] for _ in range(W)]
        # The reference is one more unsharded copy of the layer: made only when a check reads it (-c 0: none).
        expected = [ref.all_gather_param([shards[s][i] for s in range(W)]) for i in range(len(infos) if o.check else 0)]

        def check() -> int:
            corrupt(params[-1][-1])
            return sum(count_wrong(params[r][i], expected[i]) for r in range(W) for i in range(len(infos)))

        # in place: each rank's shard is read from its own position in its unsharded storage
        ip_shards = [
            [params[r][i][r * p.shard_numel : (r + 1) * p.shard_numel] for i, p in enumerate(infos)] for r in range(W)
        ]

        def reset() -> None:
            for r in range(W):
                for i in range(len(infos)):
                    fill(params[r][i])
                    ip_shards[r][i][...] = shards[r][i]

        return (
            HostVariant(lambda: host_all_gather(layout, shards, params), check),
            HostVariant(lambda: host_all_gather(layout, ip_shards, params), check, reset),
        )

    def tide_bench(self, backend, case) -> Bench:
        torch = _torch()
        tide = backend.tide()
        layouts = backend.layouts(case, case.numels, case.rows)
        sends = send_buffers(backend, case, layouts[0])
        image = SlotImage(layouts[0], sends, gpu.bits_dtype(case.dtype.size), backend.device)
        mine = [sends[r] for r in backend.mine]  # every other rank's input was the image's only
        slots = tide.alloc_slot(layouts[0].slot_bytes)

        def call():
            tide.all_gather(layouts, slots, mine)

        def check():
            for s in slots:
                s.fill_(255)
            call()
            tide.synchronize(SYNC_TIMEOUT_S)  # a hung peer raises instead of hanging
            torch.cuda.synchronize()
            return image.wrong(slots)

        return Bench(call, check, cleanup=lambda: tide.free_slot(slots),
                     prepare_issue=lambda: tide.prepare_all_gather(layouts, slots, mine))

    stand_ins = {"nccl": _stand_in_nccl, "fsdp2": _stand_in_fsdp2}
    nccl_rows = {"nccl": _nccl, "fsdp2": _fsdp2, "nccl-ce": _nccl_ce, "nccl-dtype": not_run(NO_AG_DTYPE_ROW)}


ALL_GATHER = AllGather()
