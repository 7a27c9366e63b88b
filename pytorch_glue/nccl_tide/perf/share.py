"""One rank's share (issue 16): on one GPU, exactly what ONE GPU of a W-rank node does during TIDE-AG / TIDE-RS.

    tide-perf share [all_gather|reduce_scatter|both] [--ranks 8] [--layout llama3-8b-layer] [--link-gbps 370]
                    [--piece-bytes 4M] [--runs 31] [--sides LIST] [--order gemm-after-first|side-first]
                    [--incoming-source device|host] [--timeline 0|1] [-J FILE.json] [--plot FILE.png]

Loopback-8 puts all eight ranks' copies through one GPU's HBM, which overstates what one GPU of a node sees. Here
the GPU holds rank 0's real buffers plus pre-staged images of the other ranks' data, and runs rank 0's part only:
* AG: rank 0's own shard into its slot (local copy-engine copy, unpaced) and the W-1 incoming shards into their
  places in rank 0's slot, paced to the link rate;
* RS: per pipeline chunk, the W-1 incoming chunk pushes into rank 0's staging (paced) and rank 0's own push
  (local, unpaced), then rank 0's reduce with the library's own kernel and shape rule (tideBenchReduce), two
  staging buffers as the plan has them, a push into a buffer waiting for the reduce that frees it; each buffer's
  pushes on an incoming stream of their own, so that the link carries chunk k+1 right behind chunk k as the peers'
  pushes would (`rs-share-serial`: every chunk on one stream, the harness of sessions 15-25, whose link idled about
  19 us at each chunk boundary).
--timeline (default 1) prints, per side, where one unit's time went: per chunk the incoming copies, own copies and
reduce (from a profiled unit behind the same gate as the timed ones), the link's gaps and the tail after the last
incoming byte.
Pacing (tideBenchPacedCopy): copies cut into pieces, each gated by a stream wait on a host-memory word that a host
thread releases when the piece's bytes could have crossed a link of --link-gbps (aggregate over the W-1 peers); the
pacer itself runs nothing on the SMs. HBM traffic matches the node: an incoming copy here reads an image and writes
rank 0's buffer (2 bytes of HBM traffic per byte), where on the node the peer's write lands in rank 0's HBM and rank
0's own outgoing pushes read it (also 2 per byte); what is not modelled is the NVLink port itself.

Where the incoming copies run (--incoming-source), measured on the H200 (session 19,
benchmarks/data/h200-share-diag-session19.txt): a same-device copy, even the hinted cudaMemcpyBatchAsync, runs as
an SM kernel and waits behind a kernel that holds every SM (a 256 MiB copy issued during a full-GPU GEMM ended when
the GEMM ended). So with "device" images (the default, comparable with sessions 15-18) the pieces released during a
single-wave GEMM stall until it ends: the GEMM sees almost none of their HBM traffic, which on a node (peer writes
through NVLink, no receiver SM) it would. With "host" images (pinned host memory) the pieces are host-to-device
copies, copy-engine work that runs beside the GEMM as NVLink writes would, costing rank 0 only the HBM write (1 byte
per byte; the outgoing pushes' reads are then not modelled); but they arrive at most at the host link's rate (about
52 GB/s on the H200's PCIe, 7x below 370), so the unit takes far longer than the link floor and the HBM rate beside
the GEMM is that much lower. Neither is a node; the two bracket it: device = right bytes, wrong overlap; host =
right overlap, too few bytes per second. Compare both before trusting a GEMM slowdown below ~1.1x.

Measured, per side work, with the method of DESIGN.md section 9 (side streams busy before the GEMM starts and past
its end; median and IQR over --runs >= 31 runs that met it): the single-wave GEMM's slowdown; the side work's time
alone (end to end, against the link-rate floor (W-1)/W x bytes / rate), its modelled HBM bytes/s, and its SM time
weighted by occupancy (sum over kernels of duration x min(1, CTAs / SMs), torch.profiler); the GEMM's kernel, grid
and cluster shape. A run meets the method when the side work outlasted the GEMM, the GEMM was enqueued before the
GPU left the gate (a sleep on a head stream), and the side's stream never ran dry between units. The GEMM is
enqueued right after the first side unit (--order gemm-after-first): a paced Llama-70B share is about 700 stream
operations per unit and the driver queues about 1,020 per stream, so with the GEMM after all K = 3 units (the
side-first order of sessions 15-18) the host blocked in the side's enqueue, the GEMM went onto its stream after the
GPU had started, in every run, and its events timed host latency too: 2.3x instead of 1.06x (same session-19 run).
Controls in the same run: GEMM alone (before and after), an NCCL-like persistent reduce of 16 and 32 CTAs paced to
the same link time (tideBenchPersistentReduce), the unpaced share, loopback-8 (upper bound).
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

SIDES = ("ag-share", "ag-share-unpaced", "ag-share-incoming", "rs-share", "rs-share-unpaced", "rs-share-serial",
         "nccl-like-16", "nccl-like-32", "ag-loopback", "rs-loopback")
# Diagnostic sides, run only when named: rs-share-serial (session 26's one-stream link model) and ag-share-incoming
# (the AG share without its own-shard copy, which is a same-device copy, SM work on a node too: session 27).
DEFAULT_SIDES = tuple(s for s in SIDES if s not in ("rs-share-serial", "ag-share-incoming"))
MIN_RUNS = 31  # DESIGN.md section 9 / issue 16: median and IQR over at least 31 runs
GEMM_MKN = (1024, 4096, 16384)
ORDERS = ("gemm-after-first", "side-first")  # Harness.beside: where the GEMM is enqueued (DESIGN.md section 9)
SOURCES = ("device", "host")  # where the images of the other ranks' data live (--incoming-source)
SLEEP_CYCLES_PER_MS = 2_000_000  # torch.cuda._sleep cycles per ms at H200 clocks (approximate)


# ---------------------------------------------------------------------------------------------------------------
# Pure logic (CPU-tested: tests/test_share_logic.py)
# ---------------------------------------------------------------------------------------------------------------


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
    """The pacer's timeline (include/tide_bench.h), in seconds: transfer t (a list of piece sizes in bytes) starts at
    t0 = max(arrivals[t], release time of the previous transfer's last piece); its piece j is released at
    t0 + (bytes of pieces 0..j) / rate. Mirrors plugin/cuda/bench_pacer.cc (LinkPacer::run)."""
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
    and a copy batch, per transfer one arrival write (plugin/cuda/bench_pacer.cc). The driver queues a bounded
    number per stream; past it the enqueueing host thread blocks until the GPU has drained some."""
    return sum(2 * len(p) + 1 for p in (cut_pieces(t, piece) for t in transfers) if p)


def occupancy_weighted_us(kernels: Sequence[Tuple[float, int]], n_sm: int) -> float:
    """Sum of duration x min(1, CTAs / SMs) over (duration_us, ctas) pairs: the SM time of kernels that hold only
    part of the GPU, weighted by the share of SMs their grid can occupy."""
    if n_sm <= 0:
        raise ValueError("n_sm must be > 0")
    return sum(float(d) * min(1.0, max(0, int(c)) / n_sm) for d, c in kernels)


def link_floor_s(kind: str, world: int, full_bytes: int, rate_bps: float) -> float:
    """(W-1)/W x bytes / rate: the incoming share of `full_bytes` (AG: the gathered slot; RS: one rank's whole
    gradient set, padded) crossing a link of rate_bps."""
    if kind not in ("ag", "rs"):
        raise ValueError(kind)
    return (world - 1) / world * full_bytes / rate_bps


def side_ops_for(unit_ms: float, gemm_ms: float) -> int:
    """K side units so the side work outlasts 3x the GEMM + 1 ms (interference.py's rule), at least 3, at most 200."""
    return int(min(200, 1 + max(2, math.ceil((3 * gemm_ms + 1.0) / max(unit_ms, 1e-3)))))


def stats(xs: Sequence[float]) -> dict:
    xs = sorted(float(x) for x in xs)
    if not xs:
        return {"n": 0}
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return {"n": len(xs), "median": statistics.median(xs), "p25": q[0], "p75": q[2], "min": xs[0], "max": xs[-1]}


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


def is_gate_kernel(name: str) -> bool:
    """torch.cuda._sleep's kernel (ATen's spin_kernel), which gates units behind the host's enqueueing."""
    n = name.lower()
    return "sleep" in n or "spin_kernel" in n


def chunk_spans(events: Sequence[Tuple[float, float, int]], chunk_bytes: Sequence[int]) -> List[Tuple[float, float, int]]:
    """(first start, last end, events) per chunk of one stream's copies. events: (start_us, end_us, bytes) in start
    order; chunk_bytes: the bytes each chunk puts on that stream, in order. A copy belongs to the chunk in which its
    first byte lies (the side's copies never straddle chunks). ValueError if the bytes do not add up (the trace lost
    or merged copies): a timeline built on a wrong mapping would mislead."""
    total = sum(int(b) for b in chunk_bytes)
    got = sum(int(e[2]) for e in events)
    if got != total:
        raise ValueError(f"the stream's copies carry {got} bytes, the chunks {total}")
    if not chunk_bytes:
        raise ValueError("no chunks")
    out, cum, k, bound = [], 0, 0, 0
    spans: List[List[float]] = [[math.inf, -math.inf, 0] for _ in chunk_bytes]
    for start, end, nbytes in events:
        while k < len(chunk_bytes) - 1 and cum >= bound + int(chunk_bytes[k]):
            bound += int(chunk_bytes[k])
            k += 1
        sp = spans[k]  # an empty copy after the last byte stays with the last chunk
        sp[0], sp[1], sp[2] = min(sp[0], start), max(sp[1], end), sp[2] + 1
        cum += int(nbytes)
    for a, b, n in spans:
        out.append((a, b, int(n)) if n else (math.nan, math.nan, 0))
    return out


def launch_spans(events: Sequence[Tuple[float, float, int]], launches: Sequence[int]) -> List[Tuple[float, float, int]]:
    """(first start, last end, max CTAs) per chunk of the reduce stream's kernels, launches[k] of them for chunk k,
    in start order. ValueError if the counts do not add up."""
    if len(events) != sum(launches):
        raise ValueError(f"{len(events)} kernels on the reduce stream, the shapes say {sum(launches)}")
    out, i = [], 0
    for n in launches:
        ev = events[i:i + n]
        i += n
        out.append((min(e[0] for e in ev), max(e[1] for e in ev), max(e[2] for e in ev)) if ev
                   else (math.nan, math.nan, 0))
    return out


def check_streams_distinct(own_total: int, incoming_totals: Sequence[int]) -> None:
    """The timeline tells a unit's copy streams apart by their bytes only. Incoming streams that tie are taken in
    start order, which is the link's order of their first chunks; the own stream (unpaced, it starts first) must
    not tie with any of them (W = 2, or W = 3 with full chunks on two streams): ValueError then."""
    if own_total in incoming_totals:
        raise ValueError(f"own and incoming copies both carry {own_total} bytes: their streams cannot be told apart")


def timeline_rows(incoming, own, reduce, unit_end_us: float) -> List[dict]:
    """One row per chunk from the spans above (own and reduce may be empty lists: the AG share has one "chunk" and
    no reduce). gap_before_us: the chunk's first incoming copy's start after the previous chunk's last one's end
    (pieces inside a chunk are a piece's link time apart, so a gap above that is idle link; negative when the chunk
    began on its own stream before the previous one's last copy ended); tail_us on the last row: the unit's end
    after the last incoming byte (the drain and what follows it)."""
    rows = []
    for k, (a, b, n) in enumerate(incoming):
        r = {"chunk": k, "in_start_us": a, "in_end_us": b, "in_copies": n}
        if k > 0:
            r["gap_before_us"] = a - incoming[k - 1][1]
        if k < len(own):
            r["own_start_us"], r["own_end_us"] = own[k][0], own[k][1]
        if k < len(reduce):
            r["red_start_us"], r["red_end_us"], r["red_ctas"] = reduce[k]
        rows.append(r)
    if rows:
        rows[-1]["tail_us"] = unit_end_us - rows[-1]["in_end_us"]
    return rows


def timeline_lines(name: str, rows: Sequence[dict], unit_end_us: float, floor_us: Optional[float]) -> List[str]:
    out = [f"[timeline] {name}: unit {unit_end_us:.1f} us" + (f", link floor {floor_us:.1f} us" if floor_us else "")]
    for r in rows:
        line = f"[timeline]   chunk {r['chunk']}: in {r['in_start_us']:7.1f}-{r['in_end_us']:7.1f} ({r['in_copies']} copies)"
        if "gap_before_us" in r:
            line += f" gap before {r['gap_before_us']:6.1f}"
        if "own_end_us" in r:
            line += f" | own {r['own_start_us']:7.1f}-{r['own_end_us']:7.1f}"
        if "red_start_us" in r:
            line += f" | reduce {r['red_start_us']:7.1f}-{r['red_end_us']:7.1f} ({r['red_ctas']} CTAs)"
        if "tail_us" in r:
            line += f" | tail {r['tail_us']:.1f}"
        out.append(line)
    return out


def beside_summary(runs: dict, base_ms: float) -> dict:
    """The GEMM's figures from Harness.beside's per-run lists, against its median time alone (base_ms). The
    slowdown is the median over the runs that met the method (run_valid: the side work outlasted the GEMM, the
    GEMM was enqueued before the GPU started, the side's stream never ran dry between units); slowdown_all keeps
    every run. With no valid run the figures fall back to all runs and valid_runs says 0."""
    if not base_ms > 0:
        raise ValueError("base_ms must be > 0")
    times = [float(x) for x in runs["times"]]
    n = len(times)
    for key in ("margins", "gemm_late", "side_gap", "run_valid"):
        if len(runs[key]) != n:
            raise ValueError(f"runs[{key!r}] has {len(runs[key])} entries, times has {n}")
    valid = [x for x, ok in zip(times, runs["run_valid"]) if ok]
    st = stats(valid if valid else times)
    return {"with_ms": st, "slowdown": st["median"] / base_ms, "slowdown_p25": st["p25"] / base_ms,
            "slowdown_p75": st["p75"] / base_ms, "slowdown_all": statistics.median(times) / base_ms if times else None,
            "covered_runs": sum(m > 0 for m in runs["margins"]), "gemm_late_runs": sum(map(bool, runs["gemm_late"])),
            "side_gap_runs": sum(map(bool, runs["side_gap"])), "valid_runs": len(valid),
            "margin_ms": stats(runs["margins"])}


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


def validate(a) -> Optional[str]:
    """The first problem with the arguments, or None."""
    if not a.link_gbps > 0 or not math.isfinite(a.link_gbps):
        return f"--link-gbps must be a positive number (GB/s, 1e9 bytes/s), got {a.link_gbps}"
    if not 2 <= a.ranks <= 8:
        return f"--ranks must be 2..8 (the GPUs of one node), got {a.ranks}"
    if a.piece_bytes < 64 << 10 or a.piece_bytes > 1 << 30:
        return f"--piece-bytes must be 64K..1G, got {a.piece_bytes}"
    if a.runs < 1:
        return f"--runs must be >= 1 (the method asks for >= {MIN_RUNS}), got {a.runs}"
    bad = [s for s in a.sides if not _known_side(s)]
    if bad:
        return f"unknown --sides {', '.join(bad)}; choose from {', '.join(SIDES)}, rs-share-drainN (N = 1..1024)"
    if a.incoming_source not in SOURCES:
        return f"--incoming-source must be one of {', '.join(SOURCES)}, got {a.incoming_source}"
    if a.order not in ORDERS:
        return f"--order must be one of {', '.join(ORDERS)}, got {a.order}"
    if a.collective not in ("all_gather", "reduce_scatter", "both"):
        return f"collective must be all_gather, reduce_scatter or both, got {a.collective}"
    return None


def _known_side(name: str) -> bool:
    """A side of SIDES, or rs-share-drainN: the RS share with its last reduce on N CTAs (1..1024)."""
    if name in SIDES:
        return True
    n = name[len("rs-share-drain"):] if name.startswith("rs-share-drain") else ""
    return n.isascii() and n.isdigit() and 1 <= int(n) <= 1024 and str(int(n)) == n  # "²".isdigit(), int() refuses it


def parser() -> argparse.ArgumentParser:
    from ..models import MODELS

    p = argparse.ArgumentParser(prog="tide-perf share", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("collective", nargs="?", default="both", help="all_gather, reduce_scatter or both (default)")
    p.add_argument("--ranks", type=int, default=8, help="W, the GPUs of the node (2..8)")
    p.add_argument("--layout", default="llama3-8b-layer", choices=sorted(MODELS))
    p.add_argument("--link-gbps", type=float, default=370.0, help="aggregate incoming link rate, GB/s (default 370)")
    p.add_argument("--piece-bytes", type=parse_bytes, default=4 << 20, help="pacing granularity (default 4M)")
    p.add_argument("--runs", type=int, default=MIN_RUNS, help=f"GEMM runs per median (default {MIN_RUNS})")
    p.add_argument("--sides", type=lambda s: [x for x in s.split(",") if x], default=list(DEFAULT_SIDES),
                   help="comma list of " + ",".join(SIDES))
    p.add_argument("--reduce-max-ctas", type=int, default=0, help="override the reduce rule's CTA cap (0: library's)")
    p.add_argument("--reduce-cta-bytes", type=parse_bytes, default=0, help="override the rule's bytes per CTA")
    p.add_argument("--rs-chunk-bytes", type=parse_bytes, default=0, help="layout RS chunk (0: the library's)")
    p.add_argument("--order", default=ORDERS[0], help="gemm-after-first (default): unit 1, the GEMM, the other units; "
                   "side-first: every unit, then the GEMM (sessions 15-18; the host can fall behind the GPU)")
    p.add_argument("--incoming-source", default=SOURCES[0],
                   help="device (default): incoming pushes copy from images in this GPU's HBM; host: from pinned "
                   "host memory (copy engines, at most the host link's rate)")
    p.add_argument("--timeline", type=int, default=1,
                   help="1 (default): print where one unit's time goes, per chunk (incoming, own, reduce, link gaps)")
    p.add_argument("--check", type=int, default=1, help="1: verify the share's outputs bit for bit")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("-J", "--output_file", default=None)
    p.add_argument("--plot", default=None, help="PNG: GEMM slowdown against side-work HBM rate")
    return p


# ---------------------------------------------------------------------------------------------------------------
# GPU part
# ---------------------------------------------------------------------------------------------------------------


class _Gpu:
    def __init__(self):
        import torch

        self.torch = torch
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.n_sm = torch.cuda.get_device_properties(self.dev).multi_processor_count

    def rand(self, n, dtype, seed):
        g = self.torch.Generator(device=self.dev).manual_seed(seed)
        return self.torch.randn(n, dtype=dtype, device=self.dev, generator=g)

    def stream(self):
        """A fresh stream of its own (driver-created, nccl_tide.cuda.new_streams): torch's pool of 32 wraps, and a
        side stream that happened to be the GEMM's would serialize the two and void the measurement. The few
        streams of a run live until the process ends."""
        from ..cuda import new_streams

        (s,), _release = new_streams(1, self.dev.index)
        return s

    def images(self, n, seed, source):
        """The other ranks' data: n random bf16 on this GPU (source "device") or in pinned host memory ("host":
        incoming copies are then host-to-device, copy-engine work, see the module docstring)."""
        x = self.rand(n, self.torch.bfloat16, seed)
        if source == "device":
            return x
        h = self.torch.empty(n, dtype=self.torch.bfloat16, pin_memory=True)
        h.copy_(x)
        return h

    def sleep_ms(self, ms, stream=None):
        with self.torch.cuda.stream(stream or self.torch.cuda.current_stream()):
            self.torch.cuda._sleep(int(max(ms, 0.05) * SLEEP_CYCLES_PER_MS))


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

    def __init__(self, g: _Gpu, lay, world, pacer, seed, source="device", own=True):
        from .. import _bench as B

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

    Incoming streams: one per staging buffer (session 26), so that chunk k+1's pieces reach the pacer as soon as
    their buffer is free, as the peers' pushes of chunk k+1 follow their pushes of chunk k on a node. serial=True
    (the `rs-share-serial` side, sessions 15-25's harness) puts every chunk on one stream: the pacer then learns of
    chunk k+1 only after chunk k's last copy has run and its arrival write has reached the host, and releases the
    first piece a piece's link time after that, so the link idled about 19 us at every chunk boundary (the timeline
    of run 26.2: 70B, 12 boundaries), which no node does."""

    def __init__(self, g: _Gpu, lay, world, pacer, seed, shapes, max_ctas=0, cta_bytes=0, drain_ctas=0,
                 source="device", serial=False):
        from .. import _bench as B

        t = g.torch
        self.B, self.g, self.pacer, self.lay, self.world, self.source = B, g, pacer, lay, world, source
        drain = f", drain {drain_ctas} CTAs" if drain_ctas else ""
        self.name = ("TIDE-RS share" + ("" if pacer else " (unpaced)") + drain + (", one incoming stream" if serial else "")
                     + source_tag(source))
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
                                   1.0, float(world), None, max_ctas, cta_bytes, following_bytes=f)
                     for (_, _, (buf, n, c0)), f in zip(self.plans, following)]
        if drain_ctas:
            buf, n, c0 = self.plans[-1][2]
            self.args[-1] = B.reduce_args(buf, chunk * 2, world, n, self.out.data_ptr() + c0 * 4, "bf16", "fp32",
                                          "sum", 1.0, float(world), None, drain_ctas, cta_bytes, following_bytes=0)
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

    def __init__(self, g: _Gpu, lay, world, ctas, link_gbps, seed):
        from .. import _bench as B

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

    def __init__(self, g: _Gpu, kind, numels, rows, shapes, world, seed):
        from .. import Layout
        from ..cuda import LoopbackWorld

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


def _trace(g: _Gpu, fn, iters=3) -> List[dict]:
    """The CUDA events of `iters` calls of fn (torch.profiler): dicts of cat ("kernel", "gpu_memcpy", "gpu_memset"),
    name, ts and dur (us), stream, ctas (kernels) and bytes (copies; 0 where the trace has none)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    t = g.torch
    t.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        t.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            data = json.load(f)
    out = []
    for e in data.get("traceEvents", []) if isinstance(data, dict) else data:
        cat = str(e.get("cat", "")).lower()
        if e.get("ph") != "X" or cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        args = e.get("args") or {}
        grid = args.get("grid") or [0]
        out.append({"cat": cat, "name": str(e.get("name", "?")), "ts": float(e.get("ts", 0.0)),
                    "dur": float(e.get("dur", 0.0)), "stream": args.get("stream"), "args": args,
                    "ctas": math.prod(int(x) for x in grid) if isinstance(grid, list) else 0,
                    "bytes": int(args.get("bytes", 0) or 0)})
    return out


def _profile(g: _Gpu, fn, iters=3):
    """Kernels and copies of `iters` calls of fn: [(name, dur_us, ctas, args)], [(dur_us, on_sms)] of the copies and
    memsets (on_sms: a same-device copy or a memset, which run on SMs on the H200: perf/gpu.py runs_on_sms)."""
    from nccl_tide.perf.gpu import runs_on_sms

    kernels, mem = [], []
    for e in _trace(g, fn, iters):
        if e["cat"] == "kernel":
            kernels.append((e["name"], e["dur"], e["ctas"], e["args"]))
        else:
            mem.append((e["dur"], runs_on_sms(e["cat"], e["name"])))
    return kernels, mem


def _timeline(g: _Gpu, side, host_ms: float) -> Optional[dict]:
    """Where one unit's time goes (issue 16's 8B RS gap): per chunk, when its incoming copies ran, its own copies,
    its reduce; the link's idle time between chunks and the tail after the last incoming byte. One unit after the
    side's warm-up, enqueued behind a sleep as unit_time's are (without it the host's enqueueing, slowed by the
    profiler, paces the unit). None for sides without chunks (NCCL-like, loopback)."""
    if not isinstance(side, (AgShare, RsShare)):
        return None

    def gated():
        g.sleep_ms(1.0 + 1.5 * host_ms, side.streams[0])
        side.unit()

    ev = [e for e in _trace(g, gated, iters=1) if not is_gate_kernel(e["name"])]
    if not ev:
        return {"error": "no CUDA events in the trace"}
    t0 = min(e["ts"] for e in ev)
    end = max(e["ts"] + e["dur"] for e in ev) - t0
    copies: Dict[object, List[Tuple[float, float, int]]] = {}
    for e in ev:
        if e["cat"] == "gpu_memcpy":
            copies.setdefault(e["stream"], []).append((e["ts"] - t0, e["ts"] - t0 + e["dur"], e["bytes"]))
    used: set = set()

    def stream_of(total):  # the unused stream whose copies carry exactly `total` bytes (ties: the earliest first)
        for key in sorted(copies, key=lambda k: min(c[0] for c in copies[k])):
            if key not in used and sum(c[2] for c in copies[key]) == total:
                used.add(key)
                return sorted(copies[key])
        raise ValueError(f"no stream's copies carry {total} bytes (does the trace give copy sizes?)")

    try:
        if isinstance(side, AgShare):
            own_total = sum(c[2] for c in side.own)  # 0 for ag-share-incoming: no own stream to find
            if own_total:
                check_streams_distinct(own_total, [side.incoming_bytes])
            inc = chunk_spans(stream_of(side.incoming_bytes), [side.incoming_bytes])
            own = chunk_spans(stream_of(own_total), [own_total]) if own_total else []
            red = []
        else:
            in_b = [sum(c[2] for c in incoming) for _, incoming, _ in side.plans]
            own_b = [sum(c[2] for c in own) for own, _, _ in side.plans]
            n_in = len(side.s_ins)
            per_stream = [list(range(i, len(in_b), n_in)) for i in range(n_in)]  # stream i: chunks i, i + n_in, ..
            check_streams_distinct(sum(own_b), [sum(in_b[k] for k in ks) for ks in per_stream])
            inc = [None] * len(in_b)
            for ks in per_stream:
                for k, sp in zip(ks, chunk_spans(stream_of(sum(in_b[k] for k in ks)), [in_b[k] for k in ks])):
                    inc[k] = sp
            own = chunk_spans(stream_of(sum(own_b)), own_b)
            ks = sorted((e["ts"] - t0, e["ts"] - t0 + e["dur"], e["ctas"]) for e in ev if e["cat"] == "kernel")
            red = launch_spans(ks, [sh["launches"] for sh in side.shapes])
    except ValueError as e:
        return {"error": str(e), "unit_us": end}
    rows = timeline_rows(inc, own, red, end)
    return {"unit_us": end, "rows": rows,
            "lines": timeline_lines(side.name, rows, end, side.floor_s * 1e6 if side.floor_s else None)}


def _sm_summary(g: _Gpu, kernels, mem, iters):
    ks = [k for k in kernels if not is_gate_kernel(k[0])]
    names: Dict[str, int] = {}
    for k in ks:
        names[k[0][:70]] = names.get(k[0][:70], 0) + 1
    return {
        "kernels_per_unit": len(ks) / iters,
        "kernel_us": sum(k[1] for k in ks) / iters,
        "sm_weighted_us": occupancy_weighted_us([(k[1], k[2]) for k in ks], g.n_sm) / iters,
        "max_ctas": max((k[2] for k in ks), default=0),
        "memcpy_per_unit": len(mem) / iters,
        "memcpy_us": sum(m[0] for m in mem) / iters,
        # copies the trace files as copies although they ran on SMs (their CTA count is not in the trace, so they
        # are not in sm_weighted_us; on one GPU the share's incoming copies are such copies, on a node they are
        # peer copies on copy engines: docs/architecture.md "Copies run on SMs on one GPU")
        "local_copy_us": sum(m[0] for m in mem if m[1]) / iters,
        "kernel_names": dict(sorted(names.items(), key=lambda kv: -kv[1])[:4]),
    }


class Harness:
    """DESIGN.md section 9: GEMM alone; GEMM beside K side units (side busy before it starts and past its end)."""

    def __init__(self, g: _Gpu, runs: int):
        t = g.torch
        self.g, self.runs = g, runs
        m, k, n = GEMM_MKN
        self.a = g.rand(m * k, t.bfloat16, 11).view(m, k)
        self.b = g.rand(k * n, t.bfloat16, 12).view(k, n)
        self.c = t.empty(m, n, dtype=t.bfloat16, device=g.dev)
        self.gs, self.head = g.stream(), g.stream()
        with t.cuda.stream(self.gs):
            for _ in range(5):
                self.gemm()
        t.cuda.synchronize()

    def gemm(self):
        self.g.torch.matmul(self.a, self.b, out=self.c)

    def alone(self) -> List[float]:
        t, out = self.g.torch, []
        for _ in range(self.runs):
            t.cuda.synchronize()
            self.g.sleep_ms(1.0, self.gs)
            a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            a.record(self.gs)
            with t.cuda.stream(self.gs):
                self.gemm()
            b.record(self.gs)
            t.cuda.synchronize()
            out.append(a.elapsed_time(b))
        return out

    def gemm_shape(self) -> dict:
        kernels, _ = _profile(self.g, lambda: self._gemm_on_stream(), iters=1)
        ks = [k for k in kernels if not is_gate_kernel(k[0])]
        if not ks:
            return {}
        name, dur, ctas, args = max(ks, key=lambda k: k[1])
        keep = {k: v for k, v in args.items() if k not in ("External id", "correlation", "queued", "device",
                                                            "context", "stream")}
        return {"kernel": name, "ctas": ctas, "dur_us": dur, "args": keep, "sms": self.g.n_sm,
                "waves": ctas / self.g.n_sm if self.g.n_sm else None}

    def _gemm_on_stream(self):
        with self.g.torch.cuda.stream(self.gs):
            self.gemm()

    def unit_time(self, side: Side, iters=5) -> Tuple[dict, float]:
        """Side unit time alone (ms, events after a sleep) and the host time to enqueue one unit (ms)."""
        t = self.g.torch
        s0 = side.streams[0]
        h0 = time.perf_counter()
        side.unit()  # warm-up; also how long the host takes to enqueue a unit
        first_host = (time.perf_counter() - h0) * 1e3
        t.cuda.synchronize()
        times, host = [], []
        for _ in range(iters):
            self.g.sleep_ms(1.0 + 1.5 * first_host, s0)  # the unit is enqueued before it starts running
            a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            a.record(s0)
            h0 = time.perf_counter()
            side.unit()
            host.append((time.perf_counter() - h0) * 1e3)
            b.record(s0)
            t.cuda.synchronize()
            times.append(a.elapsed_time(b))
        return stats(times), statistics.median(host)

    def beside(self, side: Side, k: int, host_ms: float, order: str = "gemm-after-first") -> dict:
        """GEMM runs beside K side units: per run its time (events around it on its own stream), the margin by
        which the side work outlasted it, and whether the run met the method (run_valid). The GPU is held behind a
        sleep on the head stream while the host enqueues; the GEMM waits for the end of the first unit.

        order "gemm-after-first" (the default): unit 1, the GEMM, then units 2..K. The GEMM is on its stream
        before anything can run, whatever the rest of the side work costs the host. "side-first" (sessions 15-18):
        all K units, then the GEMM. Issue 16: a paced Llama-70B share is ~700 stream operations per unit (354
        pieces of 4 MiB, each a flag wait and a copy batch); K = 3 units exceed what the driver queues on one
        stream, so enqueueing blocks until the GPU has drained enough of it, and the GEMM was enqueued only
        after the GPU had started, at a point the method does not control (gemm_late below)."""
        t = self.g.torch
        sleep = 1.0 + 1.5 * k * host_ms  # the whole side work and the GEMM are enqueued before anything runs
        out = {"times": [], "margins": [], "gemm_late": [], "side_gap": []}
        for _ in range(self.runs):
            t.cuda.synchronize()
            self.g.sleep_ms(sleep, self.head)
            started = t.cuda.Event()  # reached once the GPU is past the gate: nothing may have run before
            started.record(self.head)
            s0 = side.streams[0]
            s0.wait_stream(self.head)
            side.unit()
            first = t.cuda.Event()
            first.record(s0)
            if order == "side-first":
                gap = self._more_units(side, k - 1, first)
                late = started.query()
                a, b = self._timed_gemm(first)
            else:
                a, b = self._timed_gemm(first)
                late = started.query()
                gap = self._more_units(side, k - 1, first)
            last = t.cuda.Event(enable_timing=True)
            last.record(s0)
            t.cuda.synchronize()
            out["times"].append(a.elapsed_time(b))
            out["margins"].append(b.elapsed_time(last))  # > 0: the side work ended after the GEMM
            out["gemm_late"].append(bool(late))
            out["side_gap"].append(bool(gap))
        out["run_valid"] = [m > 0 and not la and not gp
                            for m, la, gp in zip(out["margins"], out["gemm_late"], out["side_gap"])]
        return out

    def _timed_gemm(self, first):
        t = self.g.torch
        self.gs.wait_event(first)
        a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        a.record(self.gs)
        with t.cuda.stream(self.gs):
            self.gemm()
        b.record(self.gs)
        return a, b

    def _more_units(self, side: Side, n: int, prev) -> bool:
        """Enqueues n more units on the side; True if the side's stream had run dry before one of them was
        enqueued (the host fell behind the GPU: a gap in the side work, which the method excludes)."""
        t = self.g.torch
        gap = False
        for _ in range(n):
            gap = gap or prev.query()
            side.unit()
            prev = t.cuda.Event()
            prev.record(side.streams[0])
        return gap


def _make_side(name, g, a, lay, shapes, numels, rows, pacer):
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


def _wanted(a) -> List[str]:
    keep = []
    for s in a.sides:
        kind = "ag" if s.startswith("ag") else "rs"
        if a.collective == "all_gather" and kind != "ag":
            continue
        if a.collective == "reduce_scatter" and kind != "rs":
            continue
        keep.append(s)
    return keep


def run(a) -> dict:
    import torch

    from .. import Layout, _bench
    from ..models import model_params, numels_and_rows

    g = _Gpu()
    shapes_named = model_params(a.layout)
    shapes = [tuple(s) for _, s in shapes_named]
    numels, rows = numels_and_rows(shapes_named)
    kw = {"rs_chunk_bytes": a.rs_chunk_bytes} if a.rs_chunk_bytes else {}
    lay = Layout(numels, "bf16", a.ranks, rank=0, row_numels=rows, **kw)
    res = {
        "command": "tide-perf share " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["share"] else sys.argv[1:]),
        "device": torch.cuda.get_device_name(g.dev), "sms": g.n_sm, "torch": torch.__version__,
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "layout": a.layout, "ranks": a.ranks,
        "link_gbps": a.link_gbps, "piece_bytes": a.piece_bytes, "order": a.order,
        "incoming_source": a.incoming_source, "runs": a.runs, "runs_meet_method": a.runs >= MIN_RUNS,
        "rs_chunk_numel": lay.rs_chunk_numel, "rs_num_chunks": lay.rs_num_chunks, "rs_out_numel": lay.rs_out_numel,
        "slot_bytes": lay.slot_bytes, "method": __doc__.split("Measured, per side work, ")[1].split("\n\n")[0],
        "sides": [], "errors": [],
    }
    h = Harness(g, a.runs)
    res["gemm_shape"] = h.gemm_shape()
    alone = h.alone()
    res["gemm_alone_ms"] = stats(alone)
    base = res["gemm_alone_ms"]["median"]
    pacer = _bench.Pacer(a.link_gbps, a.piece_bytes)
    try:
        for name in _wanted(a):
            side = None
            try:
                side = _make_side(name, g, a, lay, shapes, numels, rows, pacer)
                d = {"side": name, "name": side.name, "tide": side.tide}
                if a.check:
                    d["check"] = side.check()
                unit, host_ms = h.unit_time(side)
                d["unit_ms"], d["host_enqueue_ms"] = unit, host_ms
                um = unit["median"]
                d["hbm_bytes_per_unit"] = side.bytes
                d["hbm_GBps"] = side.bytes / (um * 1e6) if um > 0 else None
                if side.floor_s:
                    d["link_floor_ms"] = side.floor_s * 1e3
                    d["e2e_over_floor"] = um / (side.floor_s * 1e3)
                kernels, mem = _profile(g, side.unit, iters=3)
                d["sm"] = _sm_summary(g, kernels, mem, 3)
                if isinstance(side, RsShare):
                    d["reduce_shape"] = side.shapes[0]
                    d["reduce_shapes"] = side.shapes
                if a.timeline:
                    try:  # a diagnostic: its failure must not cost the side its measurement
                        tl = _timeline(g, side, host_ms)
                    except Exception as e:
                        tl = {"error": f"{type(e).__name__}: {e}"}
                    if tl is not None:
                        d["timeline"] = tl
                        print("\n".join(tl.get("lines") or [f"[timeline] {side.name}: {tl.get('error')}"]), flush=True)
                k = side_ops_for(um, base)
                d.update({"k_units": k, "order": a.order})
                d.update(beside_summary(h.beside(side, k, host_ms, a.order), base))
                res["sides"].append(d)
                print(_line(d), flush=True)
            except Exception as e:  # one side failing must not cost the others
                import traceback

                tb = traceback.format_exc()
                print(f"[share] {name} FAILED:\n{tb}", flush=True)
                res["errors"].append({"side": name, "error": f"{type(e).__name__}: {e}", "traceback": tb})
            finally:
                torch.cuda.synchronize()
                if side is not None:
                    try:
                        side.close()
                    except Exception as e:
                        res["errors"].append({"side": name, "error": f"close: {e}"})
                del side
                import gc

                gc.collect()
                torch.cuda.empty_cache()
        res["pacer"] = pacer.stats()
    finally:
        torch.cuda.synchronize()
        pacer.close()
    res["gemm_alone_after_ms"] = stats(h.alone())
    res["summary"] = summarize(res)
    return res


def _line(d) -> str:
    sm = d.get("sm", {})
    fl = f" e2e/floor {d['e2e_over_floor']:.3f}" if d.get("e2e_over_floor") else ""
    return (f"[share] {d['name']}: GEMM x{d['slowdown']:.3f} (IQR {d['slowdown_p25']:.3f}-{d['slowdown_p75']:.3f}, "
            f"valid {d.get('valid_runs', d['covered_runs'])}/{d['margin_ms'].get('n', 0)}, "
            f"covered {d['covered_runs']}, "
            f"GEMM enqueued late {d.get('gemm_late_runs', 0)}), unit {d['unit_ms']['median']:.3f} ms{fl}, "
            f"HBM {d['hbm_GBps'] or 0:.0f} GB/s, SM-weighted {sm.get('sm_weighted_us', 0):.1f} us "
            f"(kernels {sm.get('kernel_us', 0):.1f} us, max {sm.get('max_ctas', 0)} CTAs; same-device copies on SMs "
            f"{sm.get('local_copy_us', 0):.1f} us), check {d.get('check')}")


def summarize(res) -> List[dict]:
    """Target rows (issue 16): slowdowns, SM-time ratio against the 32-CTA baseline, RS e2e over the floor."""
    by = {d["side"]: d for d in res["sides"]}
    rows = []

    def add(metric, value, target, ok):
        rows.append({"metric": metric, "value": value, "target": target, "met": ok})

    if "ag-share" in by:
        v = by["ag-share"]["slowdown"]
        add("GEMM slowdown beside TIDE-AG share", v, "<= 1.03x", v <= 1.03)
    if "rs-share" in by:
        v = by["rs-share"]["slowdown"]
        add("GEMM slowdown beside TIDE-RS share", v, "<= 1.05x", v <= 1.05)
        e = by["rs-share"].get("e2e_over_floor")
        if e:
            add("RS share end to end / link floor", e, "<= 1.10x", e <= 1.10)
        if "nccl-like-32" in by:
            base32 = by["nccl-like-32"]["sm"]["sm_weighted_us"]
            mine = by["rs-share"]["sm"]["sm_weighted_us"]
            ratio = base32 / mine if mine else None
            add("RS SM time (occupancy-weighted): 32-CTA baseline / TIDE share", ratio, ">= 15x",
                ratio is not None and ratio >= 15)
    for s in ("nccl-like-16", "nccl-like-32", "ag-loopback", "rs-loopback", "ag-share-unpaced", "rs-share-unpaced"):
        if s in by:
            add(f"GEMM slowdown beside {by[s]['name']}", by[s]["slowdown"], "info", None)
    return rows


def plot(res, path) -> None:
    """GEMM slowdown against side-work HBM rate, one point per side (perf/plot.py draws it: matplotlib stays there)."""
    from .plot import share_plot

    share_plot(res, path)


def main(argv: Optional[List[str]] = None) -> int:
    a = parser().parse_args(argv)
    msg = validate(a)
    if msg:
        print(f"tide-perf share: {msg}", file=sys.stderr)
        return 2
    if a.runs < MIN_RUNS:
        print(f"# note: --runs {a.runs} is below the method's {MIN_RUNS}", flush=True)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    import torch

    if not torch.cuda.is_available():
        print("tide-perf share: needs a CUDA GPU (it runs one rank's share on this GPU)", file=sys.stderr)
        return 2
    res = run(a)
    print(f"# one rank's share: W={a.ranks} {a.layout}, link {a.link_gbps:g} GB/s, GEMM alone "
          f"{res['gemm_alone_ms']['median']:.4f} ms, GEMM {res['gemm_shape'].get('ctas')} CTAs on {res['sms']} SMs")
    for r in res["summary"]:
        v = r["value"]
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        print(f"#  {r['metric']:<66} {v if v is None else f'{v:.3f}':>8}  target {r['target']:<9} met {met}")
    if a.output_file:
        with open(a.output_file, "w") as f:
            json.dump(res, f, indent=1, default=str)
    if a.plot:
        try:
            plot(res, a.plot)
        except Exception as e:
            print(f"# plot failed: {type(e).__name__}: {e}")
    bad = [d for d in res["sides"] if d.get("check") and not d["check"].get("ok", True)]
    if bad:
        print(f"tide-perf share: wrong results in {', '.join(d['side'] for d in bad)}", file=sys.stderr)
        return 1
    return 1 if res["errors"] else 0
