# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The side work measured beside the GEMM: the TIDE shares (AG, RS, their variants), the NCCL-like persistent reduce
and TIDE over a loopback world (upper bound). Each enqueues one collective's worth per unit() and checks its output."""

import math

from .gpu import Gpu
from .plan import ag_plan, incoming_hbm_bytes, rs_chunk_plan, source_tag


SIDES = ("ag-share", "ag-share-unpaced", "ag-share-incoming", "rs-share", "rs-share-unpaced", "rs-share-serial",
         "rs-share-staged", "nccl-like-16", "nccl-like-32", "ag-loopback", "rs-loopback")
DEFAULT_SIDES = tuple(s for s in SIDES if s not in ("rs-share-serial", "ag-share-incoming", "rs-share-staged"))


def known_side(name: str) -> bool:
    """A side of SIDES, or rs-share-drainN: the RS share with its last reduce on N CTAs (1..1024)."""
    if name in SIDES:
        return True
    n = name[len("rs-share-drain"):] if name.startswith("rs-share-drain") else ""
    return n.isascii() and n.isdigit() and 1 <= int(n) <= 1024 and str(int(n)) == n  # "²".isdigit(), int() refuses it


class Side:
    """One kind of side work: unit() enqueues one collective's worth on self.streams and leaves its end on
    self.streams[0] (the others joined into it). bytes: modelled HBM traffic of one unit."""

    name = "?"
    streams: list
    bytes = 0
    floor_s = None
    tide = False

    def unit(self):
        raise NotImplementedError

    def check(self) -> dict:
        return {}

    def close(self):
        pass


class AgShare(Side):
    """own=False (side ag-share-incoming): the incoming copies only. Rank 0's own shard into its own slot is a
    same-device copy, which runs on SMs on a node too (docs/architecture.md "Copies run on SMs on one GPU"); without
    it the GEMM sees only what the peers' copy engines put on this GPU."""

    def __init__(self, g: Gpu, lay, world, pacer, seed, source="device", own=True):
        import bench_lib as B

        t = g.torch
        self.B, self.g, self.pacer, self.source, self.with_own = B, g, pacer, source, own
        self.name = ("TIDE-AG share" + ("" if pacer else " (unpaced)") + ("" if own else ", incoming only") +
                     source_tag(source))
        self.tide = True
        self.world = world
        send_elems = lay.send_bytes // 2
        self.send = g.rand(send_elems, t.bfloat16, seed)
        self.images = g.images((world - 1) * send_elems, seed + 1, source)
        self.slot = t.empty(lay.slot_bytes, dtype=t.uint8, device=g.dev)
        ib = self.images.data_ptr()
        self.own, self.incoming = ag_plan(lay.params, world, lambda s: ib + (s - 1) * send_elems * 2,
                                          self.send.data_ptr(), self.slot.data_ptr())
        if not own:
            self.own = []
        self.s_in, self.s_own = g.stream(), g.stream()
        self.streams = [self.s_in, self.s_own]
        self.bytes = incoming_hbm_bytes(sum(c[2] for c in self.own), sum(c[2] for c in self.incoming), source)
        self.floor_s = sum(c[2] for c in self.incoming) / (pacer.gbps * 1e9) if pacer else None
        self.incoming_bytes = sum(c[2] for c in self.incoming)
        self.lay = lay

    def unit(self):
        self.s_own.wait_stream(self.s_in)
        self.B.copy(self.own, self.s_own.cuda_stream)
        if self.pacer:
            self.pacer.paced_copy(self.incoming, self.s_in.cuda_stream)
        else:
            self.B.copy(self.incoming, self.s_in.cuda_stream)
        self.s_in.wait_stream(self.s_own)

    def check(self):
        t = self.g.torch
        self.slot.fill_(0xFF)
        t.cuda.synchronize()
        self.unit()
        t.cuda.synchronize()
        wrong = 0
        send_b = self.send.view(t.uint8)
        img_b = self.images.view(t.uint8).to(self.g.dev)
        per = self.lay.send_bytes
        for p in self.lay.params:
            sb = p.shard_numel * p.elem_size
            for s in range(0 if self.with_own else 1, self.world):
                got = self.slot[p.slot_offset + s * sb: p.slot_offset + (s + 1) * sb]
                src = send_b if s == 0 else img_b[(s - 1) * per:s * per]
                want = src[p.send_offset:p.send_offset + sb]
                wrong += int((got != want).sum())
        return {"wrong_bytes": wrong, "ok": wrong == 0}


class RsShare(Side):
    """drain_ctas > 0: the last reduce (the drain) on that many CTAs instead of the rule's cap (the `rs-share-drainN`
    sides: what a different drain cap in the library would do, measured beside the rule in the same run).

    Incoming streams: one per staging buffer, so that chunk k+1's pieces reach the pacer as soon as their buffer
    is free, as the peers' pushes of chunk k+1 follow their pushes of chunk k on a node. serial=True (the
    `rs-share-serial` side) puts every chunk on one stream: the pacer then learns of
    chunk k+1 only after chunk k's last copy has run and its arrival write has reached the host, and releases the
    first piece a piece's link time after that, so the link idles about 19 us at every chunk boundary (the timeline
    of a 70B share on an H200, 12 boundaries), which no node does.

    kernel: the reduce's 16-byte-path kernel (bench_lib.KERNELS; `rs-share-staged`: "staged"); cta_gbps > 0: the
    grid rule sized by that per-CTA rate instead of the library's (benchmarks/reduce_sweep.py: the grid a measured
    rate gives)."""

    def __init__(self, g: Gpu, lay, world, pacer, seed, shapes, max_ctas=0, cta_bytes=0, drain_ctas=0,
                 source="device", serial=False, kernel="library", cta_gbps=0.0):
        import bench_lib as B

        t = g.torch
        self.B, self.g, self.pacer, self.lay, self.world, self.source = B, g, pacer, lay, world, source
        drain = f", drain {drain_ctas} CTAs" if drain_ctas else ""
        variant = (", staged kernel" if kernel == "staged" else ", loads kernel" if kernel == "loads" else "") + (
            f", grid for {cta_gbps:g} GB/s per CTA" if cta_gbps else "")
        self.name = ("TIDE-RS share" + ("" if pacer else " (unpaced)") + drain + (", one incoming stream" if serial else "")
                     + variant + source_tag(source))
        self.tide = True
        M = lay.rs_out_numel
        self.grads = [g.rand(math.prod(s), t.bfloat16, seed + 100 + i) for i, s in enumerate(shapes)]
        self.images = g.images((world - 1) * M, seed + 7, source)
        chunk = lay.rs_chunk_numel
        n_chunks = lay.rs_num_chunks
        nb = 2 if n_chunks > 1 else 1
        self.staging = t.empty(nb * world * chunk, dtype=t.bfloat16, device=g.dev)
        self.zeros = t.zeros(1 << 20, dtype=t.uint8, device=g.dev)
        self.out = t.empty(M, dtype=t.float32, device=g.dev)
        ib = self.images.data_ptr()
        self.plans, self.nb = rs_chunk_plan(lay.params, world, chunk, M, [x.data_ptr() for x in self.grads],
                                            lambda s: ib + (s - 1) * M * 2, self.staging.data_ptr(),
                                            self.zeros.data_ptr(), self.zeros.numel())
        assert self.nb == nb and len(self.plans) == n_chunks, (self.nb, nb, len(self.plans), n_chunks)
        # Each chunk's reduce has until the next chunk has arrived (its bytes: the deadline); the last is a drain.
        # As the library's programs do (program_exec.cc).
        following = [sum(c[2] for c in inc) for _, inc, _ in self.plans[1:]] + [0]
        self.args = [B.reduce_args(buf, chunk * 2, world, n, self.out.data_ptr() + c0 * 4, "bf16", "fp32", "sum",
                                   1.0, float(world), None, max_ctas, cta_bytes, following_bytes=f, kernel=kernel,
                                   cta_gbps=cta_gbps)
                     for (_, _, (buf, n, c0)), f in zip(self.plans, following)]
        if drain_ctas:
            buf, n, c0 = self.plans[-1][2]
            self.args[-1] = B.reduce_args(buf, chunk * 2, world, n, self.out.data_ptr() + c0 * 4, "bf16", "fp32",
                                          "sum", 1.0, float(world), None, drain_ctas, cta_bytes, following_bytes=0,
                                          kernel=kernel, cta_gbps=cta_gbps)
        self.shapes = [B.reduce_shape(a) for a in self.args]
        self.s_in, self.s_own, self.s_red = g.stream(), g.stream(), g.stream()
        self.streams = [self.s_in, self.s_own, self.s_red]
        # incoming stream of chunk k: s_ins[k % len(s_ins)] (one per staging buffer unless serial)
        self.s_ins = [self.s_in] + ([g.stream() for _ in range(nb - 1)] if not serial else [])
        self.streams += self.s_ins[1:]
        ev = t.cuda.Event
        self.in_done = [ev() for _ in self.plans]
        self.own_done = [ev() for _ in self.plans]
        self.red_done = [ev() for _ in self.plans]
        self.incoming_bytes = sum(sum(c[2] for c in inc) for _, inc, _ in self.plans)
        own_bytes = sum(sum(c[2] for c in own) for own, _, _ in self.plans)
        red_bytes = sum(sh["bytes"] for sh in self.shapes)
        self.bytes = incoming_hbm_bytes(own_bytes, self.incoming_bytes, source) + red_bytes
        self.floor_s = self.incoming_bytes / (pacer.gbps * 1e9) if pacer else None

    def unit(self):
        for s in self.streams[1:]:
            s.wait_stream(self.s_in)
        for k, (own, incoming, _) in enumerate(self.plans):
            s_in = self.s_ins[k % len(self.s_ins)]
            if k >= self.nb:  # the buffer's previous chunk must be reduced first
                s_in.wait_event(self.red_done[k - self.nb])
                self.s_own.wait_event(self.red_done[k - self.nb])
            if self.pacer:  # the pacer releases the transfers' pieces in the order they are enqueued here
                self.pacer.paced_copy(incoming, s_in.cuda_stream)
            else:
                self.B.copy(incoming, s_in.cuda_stream)
            self.in_done[k].record(s_in)
            self.B.copy(own, self.s_own.cuda_stream)
            self.own_done[k].record(self.s_own)
            self.s_red.wait_event(self.in_done[k])
            self.s_red.wait_event(self.own_done[k])
            self.B.reduce(self.args[k], self.s_red.cuda_stream)
            self.red_done[k].record(self.s_red)
        for s in self.streams[1:]:
            self.s_in.wait_stream(s)

    def check(self):
        t = self.g.torch
        self.out.fill_(float("nan"))
        t.cuda.synchronize()
        self.unit()
        t.cuda.synchronize()
        lay, W, M = self.lay, self.world, self.lay.rs_out_numel
        own = t.zeros(M, dtype=t.bfloat16, device=self.g.dev)
        for p, gr in zip(lay.params, self.grads):
            k = min(p.shard_numel, p.numel)
            own[p.rs_out_offset:p.rs_out_offset + k] = gr[:k]
        ref = own.float()
        for s in range(1, W):
            ref = ref + self.images[(s - 1) * M:s * M].to(self.g.dev).float()  # ((x0 + x1) + x2) + ...: tide.h's order
        nan = int(t.isnan(self.out).sum())
        exact = bool(t.equal(self.out, ref))
        return {"bit_exact": exact, "nan": nan, "max_abs_diff": float((self.out - ref).abs().max()),
                "ok": exact and nan == 0}


class NcclLike(Side):
    """The NCCL-like baseline: a persistent reduce of `ctas` CTAs over the share's reduce work (W bf16 inputs ->
    fp32), spread over the link-rate transfer time."""

    def __init__(self, g: Gpu, lay, world, ctas, link_gbps, seed):
        import bench_lib as B

        t = g.torch
        self.B, self.g = B, g
        self.name = f"NCCL-like persistent reduce, {ctas} CTAs"
        M = lay.rs_out_numel
        M8 = M // 8 * 8
        self.inp = g.rand(world * M8, t.bfloat16, seed + 3)
        self.out = t.empty(M8, dtype=t.float32, device=g.dev)
        self.args = B.reduce_args(self.inp.data_ptr(), M8 * 2, world, M8, self.out.data_ptr())
        self.ctas = ctas
        self.seconds = (world - 1) * M * 2 / (link_gbps * 1e9)  # the same link time as the share's pushes
        self.floor_s = self.seconds
        self.s = g.stream()
        self.streams = [self.s]
        self.bytes = M8 * (world * 2 + 4)
        self.world, self.M8 = world, M8

    def unit(self):
        self.B.persistent_reduce(self.args, self.ctas, self.seconds, self.s.cuda_stream)

    def check(self):
        t = self.g.torch
        self.out.fill_(float("nan"))
        t.cuda.synchronize()
        self.unit()
        t.cuda.synchronize()
        x = self.inp.view(self.world, self.M8)
        ref = x[0].float()
        for s in range(1, self.world):
            ref = ref + x[s].float()
        exact = bool(t.equal(self.out, ref))
        return {"bit_exact": exact, "ok": exact}


class Loopback(Side):
    """Upper bound: TIDE's real AG / RS over a loopback world of W virtual ranks (all W ranks' work on this GPU)."""

    def __init__(self, g: Gpu, kind, numels, rows, shapes, world, seed):
        from nccl_tide import Layout
        from nccl_tide.cuda import LoopbackWorld

        t = g.torch
        self.g, self.kind = g, kind
        self.name = f"TIDE-{kind.upper()} loopback-{world} (upper bound)"
        self.tide = True
        self.world_obj = LoopbackWorld(world, device=g.dev.index)
        self.layouts = [Layout(numels, "bf16", world, rank=r, row_numels=rows) for r in range(world)]
        lay = self.layouts[0]
        self.streams = list(self.world_obj.streams)
        if kind == "ag":
            self.slots = self.world_obj.alloc_slot(lay.slot_bytes)
            self.send = [g.rand(lay.send_bytes // 2, t.bfloat16, seed + r).view(t.uint8) for r in range(world)]
            self.bytes = world * 2 * lay.slot_bytes
        else:
            self.grads = [[g.rand(math.prod(s), t.bfloat16, seed + 100 * r + i) for i, s in enumerate(shapes)]
                          for r in range(world)]
            self.outs = [t.empty(lay.rs_out_numel, dtype=t.float32, device=g.dev) for _ in range(world)]
            M = lay.rs_out_numel
            self.bytes = world * (2 * sum(numels) + 2 * 2 * world * M + 2 * world * M + 4 * M)

    def unit(self):
        # The world's streams wait for the first one (so a unit starts after the previous one), run, then join it.
        first = self.streams[0]
        for s in self.streams[1:]:
            s.wait_stream(first)
        if self.kind == "ag":
            self.world_obj.all_gather(self.layouts, self.slots, sendbufs=self.send, streams=self.streams)
        else:
            self.world_obj.reduce_scatter(self.layouts, self.grads, self.outs, op="sum", streams=self.streams)
        for s in self.streams[1:]:
            first.wait_stream(s)

    def close(self):
        self.g.torch.cuda.synchronize()
        self.world_obj.close()


def make_side(name, g, a, lay, shapes, numels, rows, pacer):
    W, src = a.ranks, a.incoming_source
    if name == "ag-share":
        return AgShare(g, lay, W, pacer, a.seed, src)
    if name == "ag-share-unpaced":
        return AgShare(g, lay, W, None, a.seed, src)
    if name == "ag-share-incoming":
        return AgShare(g, lay, W, pacer, a.seed, src, own=False)
    if name == "rs-share":
        return RsShare(g, lay, W, pacer, a.seed, shapes, a.reduce_max_ctas, a.reduce_cta_bytes, source=src)
    if name == "rs-share-serial":
        return RsShare(g, lay, W, pacer, a.seed, shapes, a.reduce_max_ctas, a.reduce_cta_bytes, source=src, serial=True)
    if name == "rs-share-staged":
        return RsShare(g, lay, W, pacer, a.seed, shapes, a.reduce_max_ctas, a.reduce_cta_bytes, source=src,
                       kernel="staged")
    if name == "rs-share-unpaced":
        return RsShare(g, lay, W, None, a.seed, shapes, a.reduce_max_ctas, a.reduce_cta_bytes, source=src)
    if name.startswith("rs-share-drain"):
        return RsShare(g, lay, W, pacer, a.seed, shapes, a.reduce_max_ctas, a.reduce_cta_bytes,
                       drain_ctas=int(name[len("rs-share-drain"):]), source=src)
    if name.startswith("nccl-like-"):
        return NcclLike(g, lay, W, int(name.rsplit("-", 1)[1]), a.link_gbps, a.seed)
    if name == "ag-loopback":
        return Loopback(g, "ag", numels, rows, shapes, W, a.seed)
    if name == "rs-loopback":
        return Loopback(g, "rs", numels, rows, shapes, W, a.seed)
    raise ValueError(name)
