# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""What one rank's share puts on the GPU: its copies (AG slot rows, RS pipeline chunks), how the pacer cuts and
releases them at the link rate, and the HBM bytes they model. Pure logic: tests run it on the CPU."""

import argparse
import math
from typing import Callable, List, Sequence


SOURCES = ("device", "host")  # where the images of the other ranks' data live (--incoming-source)


def parse_bytes(text: str) -> int:
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    mult = 1
    if t and t[-1] in "KMG":
        mult, t = 1 << (10 * ("KMG".index(t[-1]) + 1)), t[:-1]
    try:
        v = int(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: an integer with an optional K, M or G suffix") from None
    return v


def link_release_times(transfers: Sequence[Sequence[int]], rate_bps: float, arrivals: Sequence[float]) -> List[List[float]]:
    """The pacer's timeline (native/tide_bench.h), in seconds: transfer t (a list of piece sizes in bytes) starts at
    t0 = max(arrivals[t], release time of the previous transfer's last piece); its piece j is released at
    t0 + (bytes of pieces 0..j) / rate. Mirrors native/bench_pacer.cc (LinkPacer::run)."""
    if not rate_bps > 0:
        raise ValueError("rate must be > 0")
    if len(arrivals) != len(transfers):
        raise ValueError("one arrival time per transfer")
    out, link_free = [], -math.inf
    for pieces, arr in zip(transfers, arrivals):
        t0 = max(arr, link_free)
        cum, rel = 0, []
        for b in pieces:
            if b <= 0:
                raise ValueError("piece sizes must be > 0")
            cum += b
            rel.append(t0 + cum / rate_bps)
        if rel:
            link_free = rel[-1]
        out.append(rel)
    return out


def cut_pieces(sizes: Sequence[int], piece: int) -> List[int]:
    """Piece sizes of one transfer whose copies have `sizes` bytes (copies may span pieces), as the pacer cuts it."""
    total = sum(int(s) for s in sizes)
    if piece <= 0:
        raise ValueError("piece must be > 0")
    return [piece] * (total // piece) + ([total % piece] if total % piece else [])


def paced_stream_ops(transfers: Sequence[Sequence[int]], piece: int) -> int:
    """Stream operations the pacer enqueues for these transfers (each a list of copy sizes): per piece a flag wait
    and a copy batch, per transfer one arrival write (native/bench_pacer.cc). The driver queues a bounded
    number per stream; past it the enqueueing host thread blocks until the GPU has drained some."""
    return sum(2 * len(p) + 1 for p in (cut_pieces(t, piece) for t in transfers) if p)


def link_floor_s(kind: str, world: int, full_bytes: int, rate_bps: float) -> float:
    """(W-1)/W x bytes / rate: the incoming share of `full_bytes` (AG: the gathered slot; RS: one rank's whole
    gradient set, padded) crossing a link of rate_bps."""
    if kind not in ("ag", "rs"):
        raise ValueError(kind)
    return (world - 1) / world * full_bytes / rate_bps


def ag_plan(params, world: int, peer_base: Callable[[int], int], own_base: int, slot_base: int):
    """Copies (dst, src, bytes) of rank 0's AG share: own shard of every parameter into slot position 0, and for
    every parameter and peer s = 1..W-1 (parameter-major, so the peers' data interleave as they arrive) the image
    of s's shard into slot position s. peer_base(s) is the address of s's send-buffer image."""
    own, incoming = [], []
    for p in params:
        sb = p.shard_numel * p.elem_size
        if sb == 0:
            continue
        own.append((slot_base + p.slot_offset, own_base + p.send_offset, sb))
        for s in range(1, world):
            incoming.append((slot_base + p.slot_offset + s * sb, peer_base(s) + p.send_offset, sb))
    return own, incoming


def rs_chunk_plan(params, world: int, chunk: int, out_numel: int, grad_ptrs: Sequence[int], image_ptr: Callable[[int], int],
                  staging: int, zeros: int, zero_bytes: int, elem: int = 2):
    """Per pipeline chunk k: (own copies, incoming copies, reduce tuple) of rank 0's RS share.
    Staging: nb = 2 buffers (1 with one chunk) of W inputs of `chunk` elements, input s at buffer + s * chunk *
    elem, as rs_executor.cc lays it out. Own copies: rank 0's gradient elements q < shard of each parameter
    overlapping the chunk (zeros past numel, from `zeros`), as the executor's push for d = me = 0. Incoming: image
    s (rank s's elements for rank 0, packed in output order) into input s. Reduce: (staging buffer, n, out offset)."""
    n_chunks = -(-out_numel // chunk) if out_numel else 0
    nb = 2 if n_chunks > 1 else 1
    stride = chunk * elem
    buf_bytes = world * stride
    plans = []
    pi = 0
    for k in range(n_chunks):
        c0, c1 = k * chunk, min((k + 1) * chunk, out_numel)
        buf = staging + (k % nb) * buf_bytes
        own = []
        while pi < len(params) and params[pi].rs_out_offset + params[pi].shard_numel <= c0:
            pi += 1
        i = pi
        while i < len(params) and params[i].rs_out_offset < c1:
            p = params[i]
            lo, hi = max(c0, p.rs_out_offset), min(c1, p.rs_out_offset + p.shard_numel)
            if lo < hi:
                q = lo - p.rs_out_offset
                count = hi - lo
                valid = 0 if q >= p.numel else min(count, p.numel - q)
                to = buf + (lo - c0) * elem
                if valid:
                    own.append((to, grad_ptrs[i] + q * elem, valid * elem))
                z = valid * elem
                while z < count * elem:
                    nbz = min(zero_bytes, count * elem - z)
                    own.append((to + z, zeros, nbz))
                    z += nbz
            i += 1
        incoming = [(buf + s * stride, image_ptr(s) + c0 * elem, (c1 - c0) * elem) for s in range(1, world)]
        plans.append((own, incoming, (buf, c1 - c0, c0)))
    return plans, nb


def source_tag(source: str) -> str:
    if source not in SOURCES:
        raise ValueError(f"incoming source must be one of {', '.join(SOURCES)}, got {source!r}")
    return "" if source == "device" else ", incoming from host"


def incoming_hbm_bytes(own_bytes: int, incoming_bytes: int, source: str) -> int:
    """This GPU's modelled HBM traffic of a share's copies. Own copies read and write it (2 per byte). Incoming
    from "device" images: read + write (2 per byte: the stand-in for the peer's write plus rank 0's own outgoing
    pushes reading its data, which the share does not issue); from "host": the write alone (1 per byte)."""
    source_tag(source)
    return 2 * int(own_bytes) + (2 if source == "device" else 1) * int(incoming_bytes)
