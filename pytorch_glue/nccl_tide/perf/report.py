"""nccl-tests output format (src/util.cu of nccl-tests): preamble, table, footer, JSON.

The row keeps nccl-tests' columns in their places (size count type redop root, then time algbw busbw #wrong
out-of-place and in-place), so a parser that reads nccl-tests by field position reads tide-perf too. tide-perf's
own columns follow them: the implementation measured (`impl`), SM time per call (kernel durations plus same-device
copies and memsets, which run on SMs, from torch.profiler, us: perf/gpu.py), the slowdown of a concurrent single-wave GEMM (`--interfere gemm`) and a free-text note (the
stand-in measured, or why the row could not run). One table holds every implementation side by side.

The JSON has nccl-tests' keys (file version 2: version, start_time, args, env, nccl_version, config with devices,
results with out_of_place/in_place {time, alg_bw, bus_bw, nwrong}, out_of_bounds {count, okay},
average_bus_bandwidth {bandwidth, okay}, errors, end_time; booleans as the strings "true"/"false" as nccl-tests
writes them) plus tide-perf's keys, which never reuse one of those names.
"""

import json
from typing import Dict, List, NamedTuple, Optional, TextIO


class Variant(NamedTuple):
    """One measured variant (out-of-place or in-place) of one row; None fields print N/A."""

    time_us: Optional[float]
    algbw: Optional[float]
    busbw: Optional[float]
    wrong: Optional[int]  # None: not checked (-c 0) or variant not available


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


def fit_float(v: Optional[float], width: int) -> str:
    """%.2f, dropping decimals until it fits `width` (what nccl-tests' getFloatStr does)."""
    if v is None:
        return "N/A".rjust(width)
    for prec in (2, 1, 0):
        s = f"{v:.{prec}f}"
        if len(s) <= width:
            return s.rjust(width)
    return f"{v:.0f}"


_COLS = "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s  %8s  %7s  %6s  %7s  %7s  %s\n"
# 0-based whitespace-separated fields of a data row (nccl-tests' positions first, then tide-perf's).
FIELDS = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
          "ip_time", "ip_algbw", "ip_busbw", "ip_#wrong", "impl", "SM", "GEMM", "host", "gpu")


def header(out: TextIO) -> None:
    out.write(
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n"
        % ("", "", "", "", "")
    )
    cols = ("time", "algbw", "busbw", "#wrong")
    out.write(
        _COLS % (("size", "count", "type", "redop", "root") + cols + cols + ("impl", "SM", "GEMM", "host", "gpu", "note"))
    )
    units = ("(us)", "(GB/s)", "(GB/s)", "")
    out.write(_COLS % (("(B)", "(elements)", "", "", "") + units + units + ("", "(us)", "(x)", "(us)", "(us)", "")))


def _variant(v: Variant) -> str:
    wrong = "N/A" if v.wrong is None else "%g" % v.wrong
    return "  %7s  %6s  %6s  %6s" % (fit_float(v.time_us, 7), fit_float(v.algbw, 6), fit_float(v.busbw, 6), wrong)


def row_line(r: Row) -> str:
    line = (
        "%12li  %12li  %8s  %6s  %6i" % (r.size, r.count, r.type, r.redop, r.root)
        + _variant(r.oop)
        + _variant(r.ip)
        + "  %8s  %7s  %6s" % (r.impl, fit_float(r.sm_us, 7), fit_float(r.gemm_x, 6))
        + "  %7s  %7s" % (fit_float(r.host_us, 7), fit_float(r.gpu_us, 7))
    )
    return line + ("  " + r.note if r.note else "")


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
    """nccl-tests' footer. 'Avg bus bandwidth' is the subject impl's (the first of --impl); with --min-busbw it ends
    in OK or FAILED as in nccl-tests. One extra line per impl follows when several were measured."""
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


def _variant_json(v: Variant) -> dict:
    return {"time": v.time_us, "alg_bw": v.algbw, "bus_bw": v.busbw, "nwrong": v.wrong}


def row_json(r: Row, iters: Optional[int] = None, name: str = "") -> dict:
    return {
        "size": r.size,
        "count": r.count,
        "type": r.type,
        "redop": r.redop,
        "root": "%6i" % r.root,  # nccl-tests writes root as its padded text
        "out_of_place": _variant_json(r.oop),
        "in_place": _variant_json(r.ip),
        "actual_iterations": iters,
        "experiment_name": name,
        "impl": r.impl,
        "sm_time_us": r.sm_us,
        "gemm_slowdown": r.gemm_x,
        "host_issue_us_per_rank": r.host_us,
        "gpu_latency_us": r.gpu_us,
        "ran": r.ok,
        "note": r.note,
    }


JSON_FILE_VERSION = 2  # nccl-tests' JSON_FILE_VERSION whose keys these are


def _tf(b: bool) -> str:
    return "true" if b else "false"


def build_json(
    config: dict,
    devices: list,
    rows: List[Row],
    impls: Dict[str, dict],
    subject: str,
    min_busbw,
    head: Optional[dict] = None,
    nccl_config: Optional[dict] = None,
    iters: Optional[int] = None,
    name: str = "",
) -> dict:
    """head: nccl-tests' leading keys (version, start_time, args, env, nccl_version); nccl_config: nccl-tests' config
    keys, merged into config together with devices."""
    doc = dict(head or {})
    doc.update(config)
    cfg = dict(nccl_config or {})
    cfg.update(doc.get("config", {}))
    cfg["devices"] = devices
    doc["config"] = cfg
    avg = avg_busbw(rows, subject)
    wrong = total_wrong(rows)
    doc.update(
        {
            "devices": devices,
            "impls": impls,
            "results": [row_json(r, iters, name) for r in rows],
            "out_of_bounds": {"count": wrong, "okay": _tf(wrong == 0)},
            "average_bus_bandwidth": {
                "bandwidth": avg,
                "okay": "unchecked" if min_busbw is None else _tf(not busbw_gate_failed(avg, min_busbw)),
            },
            "average_bus_bandwidth_impl": subject,
            "average_bus_bandwidth_by_impl": {i: avg_busbw(rows, i) for i in impl_order(rows)},
            "min_busbw": min_busbw,
            "min_busbw_ok": None if min_busbw is None else not busbw_gate_failed(avg, min_busbw),
            "errors": [],
        }
    )
    return doc


def write_json(path: str, doc: dict) -> None:
    import time

    doc.setdefault("end_time", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime()))
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
