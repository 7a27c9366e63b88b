# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The interference method's rules: how many side units outlast the GEMM, the statistics over runs, which runs count,
and SM time weighted by occupancy. Pure logic: tests run it on the CPU."""

import math
import statistics
from typing import Sequence, Tuple


MIN_RUNS = 31  # the method's median and IQR are over at least 31 runs
ORDERS = ("gemm-after-first", "side-first")  # Harness.beside: where the GEMM is enqueued


def side_ops_for(unit_ms: float, gemm_ms: float) -> int:
    """K side units so the side work outlasts 3x the GEMM + 1 ms (interference.py's rule), at least 3, at most 200."""
    return int(min(200, 1 + max(2, math.ceil((3 * gemm_ms + 1.0) / max(unit_ms, 1e-3)))))


def stats(xs: Sequence[float]) -> dict:
    xs = sorted(float(x) for x in xs)
    if not xs:
        return {"n": 0}
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return {"n": len(xs), "median": statistics.median(xs), "p25": q[0], "p75": q[2], "min": xs[0], "max": xs[-1]}


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


def occupancy_weighted_us(kernels: Sequence[Tuple[float, int]], n_sm: int) -> float:
    """Sum of duration x min(1, CTAs / SMs) over (duration_us, ctas) pairs: the SM time of kernels that hold only
    part of the GPU, weighted by the share of SMs their grid can occupy."""
    if n_sm <= 0:
        raise ValueError("n_sm must be > 0")
    return sum(float(d) * min(1.0, max(0, int(c)) / n_sm) for d, c in kernels)
