# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Plots of a tide-perf JSON: bus bandwidth vs size per impl, and SM time per call vs size per impl.

    tide-perf plot run.json run.png        # any machine with matplotlib, e.g. from a GPU run's JSON
    tide-perf all_gather ... --plot run.png

matplotlib is imported here only, lazily; it is an optional extra: pip install "nccl-tide[plot]" (or matplotlib).
"""

import io
import json
import sys
from typing import List, Optional

from .options import EXIT_OUTPUT
from .output import figure_format, output_problem, write_whole

MISSING = "tide-perf: --plot / tide-perf plot need matplotlib, which is not installed: pip install matplotlib"


class PlotUnavailable(RuntimeError):
    pass


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(MISSING) from None
    return plt


def require_matplotlib() -> None:
    """Raises PlotUnavailable (naming the pip command) when matplotlib cannot be imported."""
    _pyplot()


def series(doc) -> dict:
    """{impl: [(size, busbw, sm_us)]} of the rows that ran, size 0 left out (out-of-place figures): tide-perf's
    every-impl rows (extras.results), or the results of a JSON without them (nccl-tests', labelled by its
    experiment). Raises ValueError naming the first thing that is not as these files have it."""
    if not isinstance(doc, dict):
        raise ValueError("the top level is not an object")
    _check_header(doc)
    extras = doc.get("extras")
    if isinstance(extras, dict) and "results" in extras:
        rows, where, default_impl = extras["results"], "extras.results", "tide"
    elif "results" in doc:
        rows, where, default_impl = doc["results"], "results", "results"
    else:
        raise ValueError("it has no 'results'")
    if not isinstance(rows, list):
        raise ValueError(f"'{where}' is not a list")
    out: dict = {}
    for k, r in enumerate(rows):
        what = f"{where}[{k}]"
        if not isinstance(r, dict):
            raise ValueError(f"{what} is not an object")
        impl = r.get("impl", default_impl)
        size, oop, sm = r.get("size"), r.get("out_of_place"), r.get("sm_time_us")
        if not isinstance(impl, str):
            raise ValueError(f"{what}.impl is not a string")
        if not _number(size) or not 0 <= size <= MAX_SIZE:
            raise ValueError(f"{what}.size is not a size in bytes (0 to 2**64 - 1)")
        if oop is not None and not isinstance(oop, dict):
            raise ValueError(f"{what}.out_of_place is not an object")
        bus = (oop or {}).get("bus_bw")
        if bus is not None and not (_number(bus) and 0 <= bus <= MAX_FIGURE):
            raise ValueError(f"{what}.out_of_place.bus_bw is not a bandwidth in GB/s (0 to {MAX_FIGURE:g})")
        if sm is not None and not (_number(sm) and 0 <= sm <= MAX_FIGURE):
            raise ValueError(f"{what}.sm_time_us is not a time in us (0 to {MAX_FIGURE:g})")
        out.setdefault(impl, [])
        if r.get("ran", True) and bus is not None and size > 0:  # a size of 0 has no place on the log size axis
            out[impl].append((size, bus, sm))
    return out


# Beyond these no run measures anything, and matplotlib's log axes overflow (a size of 10**400, a bus_bw of 1e308).
MAX_SIZE = 2**64 - 1
MAX_FIGURE = 1e15


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _check_header(doc: dict) -> None:
    """The keys the title and the reader rely on, where the document has them, of the type these files give them:
    a JSON that has them otherwise is some other program's."""
    for key, kind in (("extras", dict), ("config", dict)):
        if key in doc and not isinstance(doc[key], kind):
            raise ValueError(f"'{key}' is not an object")
    for key in ("versions", "devices"):
        if key in doc:  # tide-perf and nccl-tests keep these under extras / config, never at the top
            raise ValueError(f"'{key}' at the top level (tide-perf writes extras.versions and config.devices)")
    extras, config = doc.get("extras") or {}, doc.get("config") or {}
    if "versions" in extras and not isinstance(extras["versions"], dict):
        raise ValueError("'extras.versions' is not an object")
    devices = config.get("devices", [])
    if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
        raise ValueError("'config.devices' is not a list of objects")


def plot(doc: dict, path: str) -> List[str]:
    """Writes the figure (whole, through a temporary file: perf/output.py); returns the impls drawn. Raises
    ValueError on a document series() rejects, OSError when the file cannot be written."""
    plt = _pyplot()
    data = series(doc)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    drawn = []
    for impl, pts in data.items():
        if not pts:
            continue
        drawn.append(impl)
        xs = [p[0] for p in pts]
        ax1.plot(xs, [p[1] for p in pts], marker="o", label=impl)
        sm = [(p[0], p[2]) for p in pts if p[2] is not None]
        if sm:
            ax2.plot([s[0] for s in sm], [s[1] for s in sm], marker="o", label=impl)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax2.set_xlim(ax1.get_xlim())
    missing = [i for i, pts in data.items() if not pts]
    if missing:
        ax1.text(
            0.02,
            0.97,
            "not run here: " + ", ".join(missing) + " (reasons in the JSON)",
            transform=ax1.transAxes,
            va="top",
            fontsize=8,
            color="dimgray",
        )
    ax1.set_ylabel("busbw (GB/s)")
    ax1.set_title("bus bandwidth")
    ax2.set_ylabel("SM time per call (us)")
    ax2.set_title("SM time per call (sum of kernel durations)")
    if drawn:
        ax1.legend()
    if ax2.lines:
        ax2.legend()
    else:
        ax2.text(
            0.5,
            0.5,
            "no SM time in this run\n(host backend or --sm-time 0)",
            ha="center",
            va="center",
            transform=ax2.transAxes,
        )
    fig.suptitle(title(doc), fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=110, format=figure_format(path))
    plt.close(fig)
    write_whole(path, buf.getvalue(), overwrite=True)
    return drawn


def title(doc: dict) -> str:
    """collective - backend - device, from whichever of them the document has."""
    extras = doc.get("extras") if isinstance(doc.get("extras"), dict) else {}
    versions = extras.get("versions") if isinstance(extras.get("versions"), dict) else {}
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    devices = config.get("devices") if isinstance(config.get("devices"), list) else []
    first = devices[0] if devices and isinstance(devices[0], dict) else {}
    dev = versions.get("device") or first.get("device_info") or ""
    return f"{extras.get('collective', '')} - backend {extras.get('backend', '?')} - {dev}"


def _same_file(a: str, b: str) -> bool:
    import os

    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="tide-perf plot", description="Plot a tide-perf JSON (-J) as PNG/SVG/PDF.")
    p.add_argument("json_file")
    p.add_argument("out_file")
    a = p.parse_args(argv)
    why = output_problem(a.out_file, "plot")
    if not why and _same_file(a.json_file, a.out_file):
        why = f"is the input {a.json_file}: the figure would replace the data; name another file"
    if why:
        print(f"tide-perf plot: error: {a.out_file or repr(a.out_file)}: {why}", file=sys.stderr)
        return 2
    try:
        with open(a.json_file) as f:
            doc = json.load(f)
        series(doc)
    except (OSError, ValueError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        print(f"tide-perf plot: error: {a.json_file} is not a tide-perf or nccl-tests JSON: {reason}",
              file=sys.stderr)
        return 2
    try:
        drawn = plot(doc, a.out_file)
    except PlotUnavailable as e:
        print(str(e), file=sys.stderr)
        return 3
    except (ValueError, OverflowError) as e:  # matplotlib refusing what series() let through: one line, no traceback
        print(f"tide-perf plot: error: {a.json_file}: its figures cannot be drawn: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"tide-perf plot: error: {a.out_file}: the figure could not be written: {e.strerror or e}",
              file=sys.stderr)
        return EXIT_OUTPUT
    print(f"tide-perf plot: wrote {a.out_file} ({', '.join(drawn) or 'no measured rows'})")
    return 0
