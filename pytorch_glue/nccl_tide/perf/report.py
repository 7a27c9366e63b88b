# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""nccl-tests' table and footer (src/util.cu of nccl-tests), as tide-perf prints them.

By default a row is exactly nccl-tests' 13 columns (size count type redop root, then time algbw busbw #wrong out of
place and in place), one row per size of the first implementation of --impl, and the column header has as many
words as a row: parsers that count columns, from either end, read tide-perf as they read nccl-tests. -I 1 adds
nccl-tests' i_min i_max i_p99 i_cv% after each variant, -S 1 its timestamp. --wide appends tide-perf's own columns
(impl, SM time per call, the slowdown of a concurrent single-wave GEMM, host issue time, GPU latency) and prints one
row per implementation. A row's free-text note (the stand-in measured, or why it did not run) is a comment line
after the table, never a column.
"""

from typing import Dict, List, NamedTuple, Optional, TextIO, Tuple


class Variant(NamedTuple):
    """One measured variant (out-of-place or in-place) of one row; None fields print N/A."""

    time_us: Optional[float]
    algbw: Optional[float]
    busbw: Optional[float]
    wrong: Optional[int]  # None: not checked (-c 0) or variant not available
    iter_us: Optional[List[float]] = None  # -I 1: each timed iteration (us), the max over processes
    proc_iter_us: Optional[List[List[float]]] = None  # -I 1 on several processes: each process's iterations


NA = Variant(None, None, None, None)


class Row(NamedTuple):
    size: int
    count: int
    type: str
    redop: str
    root: int
    oop: Variant
    ip: Variant
    impl: str = "tide"
    sm_us: Optional[float] = None  # SM time per call (kernels + same-device copies: perf/gpu.py), out-of-place
    gemm_x: Optional[float] = None  # concurrent single-wave GEMM time / GEMM alone (--interfere gemm)
    note: str = ""  # the stand-in measured, or why the row did not run
    ok: bool = True  # False: the impl could not run (all figures N/A, note says why)
    # Issue cost (perf/issue_cost.py; TIDE rows on GPU backends): host time per rank per call with the GPU held
    # behind a gate, and the device time of one call issued entirely behind the gate.
    host_us: Optional[float] = None
    gpu_us: Optional[float] = None
    stamp: Optional[str] = None  # -S 1: when the row was measured


class Table(NamedTuple):
    """Which columns the table has."""

    per_iter: bool = False
    wide: bool = False
    cputime: bool = False
    timestamps: bool = False


def fit_float(v: Optional[float], width: int) -> str:
    """nccl-tests' getFloatStr: %.2f, dropping decimals until it fits `width`, then exponent notation."""
    if v is None:
        return "N/A".rjust(width)
    for prec in (2, 1, 0):
        s = f"{v:{width}.{prec}f}"
        if len(s) <= width:
            return s
    return f"{v:{width}.1e}" if width >= 7 else f"{v:{width}.0e}"


WIDE_COLS = ("impl", "SM", "GEMM", "host", "gpu")
WIDE_UNITS = ("", "(us)", "(x)", "(us)", "(us)")
_WIDE_FMT = "  %8s  %7s  %6s  %7s  %7s"
_HEAD = "# %10s  %12s  %8s  %6s  %6s"


def header(out: TextIO, t: Table = Table()) -> None:
    """nccl-tests' writeResultHeader: '#', the variant titles, the column names and their units."""
    time_name = "cputime" if t.cputime else "time"
    ts_label, ts_fmt, ts_pad = ("timestamp", "%Y-%m-%d %H:%M:%S", 19) if t.timestamps else ("", "", 0)
    wide_fmt = _WIDE_FMT if t.wide else ""
    if t.per_iter:
        title = "              out-of-place (+ per-iteration)                                in-place (+ per-iteration)"
        fmt = _HEAD + ("  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s" * 2) + wide_fmt + " %*s\n"
        cols = (time_name, "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%")
        units = ("(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)")
    else:
        title = "           out-of-place                       in-place          "
        fmt = _HEAD + ("  %7s  %6s  %6s  %6s" * 2) + wide_fmt + " %*s\n"
        cols = (time_name, "algbw", "busbw", "#wrong")
        units = ("(us)", "(GB/s)", "(GB/s)", "")
    out.write("#\n")
    out.write((_HEAD % ("", "", "", "", "")) + title + "\n")
    wide_cols, wide_units = (WIDE_COLS, WIDE_UNITS) if t.wide else ((), ())
    out.write(fmt % (("size", "count", "type", "redop", "root") + cols + cols + wide_cols + (ts_pad, ts_label)))
    out.write(fmt % (("(B)", "(elements)", "", "", "") + units + units + wide_units + (ts_pad, ts_fmt)))


def iter_stats(times_us: List[float], skip: int = 0) -> dict:
    """nccl-tests' computeIterStats of the iterations after the first `skip` (us): min, max, avg, nearest-rank
    p50/p95/p99, population stdev and its ratio to the mean in percent."""
    s = sorted(times_us[skip:])
    n = len(s)
    pct = lambda p: s[min(n - 1, (n * p + 99) // 100 - 1)]  # noqa: E731
    avg = sum(s) / n
    stdev = (sum((x - avg) ** 2 for x in s) / n) ** 0.5
    return {"min_us": s[0], "max_us": s[-1], "avg_us": avg, "p50_us": s[n // 2], "p95_us": pct(95),
            "p99_us": pct(99), "stdev_us": stdev, "cv_pct": stdev / avg * 100.0 if avg > 0 else 0.0}


def _variant(v: Variant, t: Table, skip: int) -> str:
    text = "  %7s  %6s  %6s" % (fit_float(v.time_us, 7), fit_float(v.algbw, 6), fit_float(v.busbw, 6))
    text += "    N/A" if v.wrong is None else "  %6g" % v.wrong
    if t.per_iter:
        st = iter_stats(v.iter_us, skip) if v.iter_us else {}
        text += "  %7s  %7s  %7s  %7s" % tuple(fit_float(st.get(k), 7) for k in ("min_us", "max_us", "p99_us", "cv_pct"))
    return text


def row_line(r: Row, t: Table = Table(wide=True), skip: int = 0) -> str:
    line = "%12li  %12li  %8s  %6s  %6s" % (r.size, r.count, r.type, r.redop, "%6i" % r.root)
    line += _variant(r.oop, t, skip) + _variant(r.ip, t, skip)
    if t.wide:
        line += _WIDE_FMT % (r.impl, fit_float(r.sm_us, 7), fit_float(r.gemm_x, 6), fit_float(r.host_us, 7),
                             fit_float(r.gpu_us, 7))
    if t.timestamps:
        line += "%21s" % (r.stamp or "")
    return line


def note_lines(rows: List[Row]) -> List[str]:
    """The rows' notes as comment lines, one per (impl, note): `# note IMPL SIZES: text`, SIZES `all` when the note
    is every row's of that impl, else the sizes joined by commas, each once (every size below 16 bytes per rank is
    a row of size 0)."""
    by_note: Dict[Tuple[str, str], List[int]] = {}
    per_impl: Dict[str, int] = {}
    for r in rows:
        per_impl[r.impl] = per_impl.get(r.impl, 0) + 1
        if r.note:
            sizes = by_note.setdefault((r.impl, r.note), [])
            if r.size not in sizes:
                sizes.append(r.size)
    lines = []
    for (impl, note), sizes in by_note.items():
        every = sum(1 for r in rows if r.impl == impl and r.note == note) == per_impl[impl]
        where = "all" if every else ",".join(str(s) for s in sizes)
        lines.append(f"# note {impl} {where}: {note}")
    return lines


def _busbws(rows: List[Row]) -> List[float]:
    return [v.busbw for r in rows for v in (r.oop, r.ip) if v.busbw is not None]


def avg_busbw(rows: List[Row], impl: Optional[str] = None) -> float:
    vals = _busbws([r for r in rows if impl is None or r.impl == impl])
    return sum(vals) / len(vals) if vals else 0.0


def total_wrong(rows: List[Row]) -> int:
    return sum(v.wrong or 0 for r in rows for v in (r.oop, r.ip))


def impl_order(rows: List[Row]) -> List[str]:
    seen: List[str] = []
    for r in rows:
        if r.impl not in seen:
            seen.append(r.impl)
    return seen


def busbw_gate_failed(avg: float, min_busbw: Optional[float]) -> bool:
    """nccl-tests' NCCL_TESTS_MIN_BW rule: the run fails when the average bus bandwidth is below 0.9 x the minimum."""
    return min_busbw is not None and avg < 0.9 * min_busbw


def footer(out: TextIO, rows: List[Row], name: str, subject: Optional[str] = None, min_busbw=None) -> None:
    """nccl-tests' writeResultFooter. 'Avg bus bandwidth' is the subject impl's (the first of --impl); with
    --min-busbw it ends in OK or FAILED as in nccl-tests. One comment line per impl follows when several were
    measured. The out-of-bounds count is every measured row's."""
    wrong = total_wrong(rows)
    impls = impl_order(rows)
    subject = subject or (impls[0] if impls else None)
    avg = avg_busbw(rows, subject)
    out.write("# %-20s : %d %s\n" % ("Out of bounds values", wrong, "OK" if wrong == 0 else "FAILED"))
    gate = "" if min_busbw is None else ("FAILED" if busbw_gate_failed(avg, min_busbw) else "OK")
    out.write("# %-20s : %g %s\n" % ("Avg bus bandwidth", avg, gate))
    if len(impls) > 1 or (impls and impls[0] != "tide"):
        for impl in impls:
            ran = [r for r in rows if r.impl == impl and r.ok]
            shown = "%g GB/s" % avg_busbw(rows, impl) if ran else "N/A (did not run)"
            out.write("#   %-18s : %s%s\n" % (f"busbw avg {impl}", shown, " (gated)" if impl == subject else ""))
    out.write("#\n")
    out.write(f"# Collective test concluded: {name}\n")


def finish(out: TextIO) -> None:
    """nccl-tests' finalizeFooter and writeErrors: a '#' line, then an empty one (NCCL's last error would go there;
    tide-perf reports a row's failure in the row's note)."""
    out.write("#\n\n")
