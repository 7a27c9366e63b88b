"""nccl-tests output format (src/util.cu of nccl-tests 2.19): preamble, table, footer, JSON."""

import json
from typing import List, NamedTuple, Optional, TextIO


class Variant(NamedTuple):
    """One measured variant (out-of-place or in-place) of one row; None fields print N/A."""

    time_us: Optional[float]
    algbw: Optional[float]
    busbw: Optional[float]
    wrong: Optional[int]  # None: not checked (-c 0) or variant not available


class Row(NamedTuple):
    size: int
    count: int
    type: str
    redop: str
    root: int
    oop: Variant
    ip: Variant


NA = Variant(None, None, None, None)


def fit_float(v: Optional[float], width: int) -> str:
    """%.2f, dropping decimals until it fits `width` (what nccl-tests' getFloatStr does)."""
    if v is None:
        return "N/A".rjust(width)
    for prec in (2, 1, 0):
        s = f"{v:.{prec}f}"
        if len(s) <= width:
            return s.rjust(width)
    return f"{v:.0f}"


def header(out: TextIO) -> None:
    out.write(
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n"
        % ("", "", "", "", "")
    )
    cols = ("time", "algbw", "busbw", "#wrong")
    out.write(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n"
        % (("size", "count", "type", "redop", "root") + cols + cols)
    )
    units = ("(us)", "(GB/s)", "(GB/s)", "")
    out.write(
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n"
        % (("(B)", "(elements)", "", "", "") + units + units)
    )


def _variant(v: Variant) -> str:
    wrong = "N/A" if v.wrong is None else "%g" % v.wrong
    return "  %7s  %6s  %6s  %6s" % (fit_float(v.time_us, 7), fit_float(v.algbw, 6), fit_float(v.busbw, 6), wrong)


def row_line(r: Row) -> str:
    return "%12li  %12li  %8s  %6s  %6i" % (r.size, r.count, r.type, r.redop, r.root) + _variant(r.oop) + _variant(r.ip)


def avg_busbw(rows: List[Row]) -> float:
    vals = [v.busbw for r in rows for v in (r.oop, r.ip) if v.busbw is not None]
    return sum(vals) / len(vals) if vals else 0.0


def total_wrong(rows: List[Row]) -> int:
    return sum(v.wrong or 0 for r in rows for v in (r.oop, r.ip))


def footer(out: TextIO, rows: List[Row], name: str) -> None:
    wrong = total_wrong(rows)
    out.write("# %-20s : %d %s\n" % ("Out of bounds values", wrong, "OK" if wrong == 0 else "FAILED"))
    out.write("# %-20s : %g %s\n" % ("Avg bus bandwidth", avg_busbw(rows), ""))
    out.write("#\n")
    out.write(f"# Collective test concluded: {name}\n")


def _variant_json(v: Variant) -> dict:
    return {"time": v.time_us, "alg_bw": v.algbw, "bus_bw": v.busbw, "nwrong": v.wrong}


def write_json(path: str, config: dict, devices: list, rows: List[Row]) -> None:
    doc = dict(config)
    doc.update(
        {
            "devices": devices,
            "results": [
                {
                    "size": r.size,
                    "count": r.count,
                    "type": r.type,
                    "redop": r.redop,
                    "root": r.root,
                    "out_of_place": _variant_json(r.oop),
                    "in_place": _variant_json(r.ip),
                }
                for r in rows
            ],
            "out_of_bounds": {"count": total_wrong(rows), "ok": total_wrong(rows) == 0},
            "average_bus_bandwidth": avg_busbw(rows),
        }
    )
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
