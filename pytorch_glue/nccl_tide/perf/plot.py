"""Plots of a tide-perf JSON: bus bandwidth vs size per impl, and SM time per call vs size per impl.

    tide-perf plot run.json run.png        # any machine with matplotlib, e.g. from a GPU run's JSON
    tide-perf all_gather ... --plot run.png

matplotlib is imported here only, lazily; it is an optional extra: pip install "nccl-tide[plot]" (or matplotlib).
"""

import json
import sys
from typing import List, Optional

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


# What matplotlib's Agg-based savefig writes (matplotlib.backend_bases: get_supported_filetypes of a default canvas).
FORMATS = ("eps", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg", "svgz", "tif", "tiff", "webp")


def output_problem(path: str) -> Optional[str]:
    """Why the figure cannot be written to `path` (None if it can): checked before any work."""
    import os

    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in FORMATS:
        return f"unsupported figure format {('.' + ext) if ext else '(no extension)'}: use one of " + ", ".join(
            "." + f for f in FORMATS
        )
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "is a directory"
    if not os.path.isdir(parent):
        return f"directory {parent} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"directory {parent} is not writable"
    return None


def require_matplotlib() -> None:
    """Raises PlotUnavailable (naming the pip command) when matplotlib cannot be imported."""
    _pyplot()


def series(doc: dict):
    """{impl: [(size, busbw, sm_us)]} of the rows that ran (out-of-place figures)."""
    out = {}
    for r in doc.get("results", []):
        impl = r.get("impl", "tide")
        out.setdefault(impl, [])
        if r.get("ran", True) and r["out_of_place"].get("bus_bw") is not None:
            out[impl].append((r["size"], r["out_of_place"]["bus_bw"], r.get("sm_time_us")))
    return out


def plot(doc: dict, path: str) -> List[str]:
    """Writes the figure; returns the impls drawn."""
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
    versions = doc.get("versions", {})
    dev = versions.get("device") or (doc.get("devices") or [{}])[0].get("name") or doc.get("backend", "")
    fig.suptitle(f"{doc.get('collective', '')} - backend {doc.get('backend', '?')} - {dev}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="tide-perf plot", description="Plot a tide-perf JSON (-J) as PNG/SVG/PDF.")
    p.add_argument("json_file")
    p.add_argument("out_file")
    a = p.parse_args(argv)
    why = output_problem(a.out_file)
    if why:
        print(f"tide-perf plot: error: {a.out_file}: {why}", file=sys.stderr)
        return 2
    try:
        with open(a.json_file) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"tide-perf plot: cannot read {a.json_file}: {e}", file=sys.stderr)
        return 2
    if not isinstance(doc, dict) or "results" not in doc:
        print(f"tide-perf plot: {a.json_file} is not a tide-perf JSON (no 'results')", file=sys.stderr)
        return 2
    try:
        drawn = plot(doc, a.out_file)
    except PlotUnavailable as e:
        print(str(e), file=sys.stderr)
        return 3
    print(f"tide-perf plot: wrote {a.out_file} ({', '.join(drawn) or 'no measured rows'})")
    return 0
