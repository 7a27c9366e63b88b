# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Where one side unit's time goes, per pipeline chunk: when its incoming copies, own copies and reduce ran, the
link's idle time between chunks and the tail after the last incoming byte."""

import math
from typing import Dict, List, Optional, Sequence, Tuple

from .gpu import Gpu
from .profile import is_gate_kernel, trace
from .sides import AgShare, RsShare


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


def unit_timeline(g: Gpu, side, host_ms: float) -> Optional[dict]:
    """Where one unit's time goes (e.g. the link's idle time between RS chunks): per chunk, when its incoming copies ran, its own copies,
    its reduce; the link's idle time between chunks and the tail after the last incoming byte. One unit after the
    side's warm-up, enqueued behind a sleep as unit_time's are (without it the host's enqueueing, slowed by the
    profiler, paces the unit). None for sides without chunks (NCCL-like, loopback)."""
    if not isinstance(side, (AgShare, RsShare)):
        return None

    def gated():
        g.sleep_ms(1.0 + 1.5 * host_ms, side.streams[0])
        side.unit()

    ev = [e for e in trace(g, gated, iters=1) if not is_gate_kernel(e["name"])]
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
