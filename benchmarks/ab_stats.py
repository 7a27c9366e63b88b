# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Paired A/B statistics for benchmarks whose figures drift between processes.

A library parameter is read once per process, so two settings cannot alternate inside one process; and on the
device machines a row's median moves between processes by as much as the differences we look for (on an H100: the
Llama RS took 33.2 and 51.5 us per rank in two runs of the same library). benchmarks/host_ab.py therefore runs each
variant in fresh processes, in rounds whose order alternates, and pairs the variants' figures by round: the
difference of one round cancels whatever drifted between rounds. This module turns those rounds into a verdict per
row and metric, at the interval's level and with no correction for the number of rows: at 90%, up to about one row
in ten without an effect can come out resolved by chance.

Pure Python (no numpy): CI and the tests run it on the CPU.
"""

import math
import statistics
from typing import Dict, List, Optional, Sequence

def round_orders(variants: Sequence[str], rounds: int) -> List[List[str]]:
    """The order of the variants in each round: forward, then reversed, alternately (A B, B A, A B, ...), so that a
    drift over the run (warming, throttling) falls on every variant equally often first and last."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1 (got {rounds})")
    if len(variants) < 2 or len(set(variants)) != len(variants):
        raise ValueError(f"need at least two distinct variants (got {list(variants)})")
    fwd = list(variants)
    return [fwd if r % 2 == 0 else fwd[::-1] for r in range(rounds)]


def median_interval(values: Sequence[float], level: float = 0.9) -> tuple:
    """Distribution-free interval for the median of `values` (two-sided, at least `level`): the order statistics
    (x_(k), x_(n-k+1)) with the largest k such that P(Binomial(n, 1/2) <= k - 1) <= (1 - level) / 2, the interval the
    sign test inverts. Exact for any continuous distribution, so few rounds give a wide interval instead of a false
    verdict (a percentile bootstrap of the median, used first, called 16% of no-effect cases at 4 pairs "resolved"
    at a nominal 10%). With too few values for any k (n < 5 at 90%) the interval is
    (-inf, inf)."""
    vals = sorted(v for v in values if v == v)  # drop NaN
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1) (got {level})")
    n = len(vals)
    if n == 0:
        return (float("nan"), float("nan"))
    alpha = (1 - level) / 2
    cdf, k = 0.0, 0
    for j in range(n):  # cdf = P(B <= j); k = the largest j + 1 with P(B <= j) <= alpha
        cdf += math.comb(n, j) / 2**n
        if cdf > alpha:
            break
        k = j + 1
    if k == 0:
        return (float("-inf"), float("inf"))
    return (vals[k - 1], vals[n - k])


def compare(base: Sequence[float], other: Sequence[float], level: float = 0.9) -> Dict:
    """`other` against `base`, paired by round (same index = same round). Rounds where either figure is missing
    (NaN) are left out. Returns the medians over rounds of each, the median paired difference (other - base), its
    interval (median_interval), how many rounds had other below / above base, and a verdict: "lower" or "higher"
    when the interval excludes 0, else "unresolved" (always with fewer than 5 pairs at 90%)."""
    if len(base) != len(other):
        raise ValueError(f"paired figures must have one value per round each ({len(base)} vs {len(other)})")
    pairs = [(b, o) for b, o in zip(base, other) if b == b and o == o]
    out = {"pairs": len(pairs), "base_median": float("nan"), "other_median": float("nan"),
           "diff_median": float("nan"), "diff_lo": float("nan"), "diff_hi": float("nan"), "below": 0, "above": 0,
           "verdict": "unresolved"}
    if not pairs:
        return out
    diffs = [o - b for b, o in pairs]
    out["base_median"] = statistics.median(b for b, _ in pairs)
    out["other_median"] = statistics.median(o for _, o in pairs)
    out["diff_median"] = statistics.median(diffs)
    out["below"] = sum(1 for d in diffs if d < 0)
    out["above"] = sum(1 for d in diffs if d > 0)
    lo, hi = median_interval(diffs, level=level)
    out["diff_lo"], out["diff_hi"] = lo, hi
    if hi < 0:
        out["verdict"] = "lower"
    elif lo > 0:
        out["verdict"] = "higher"
    return out


def row_key(row: Dict) -> tuple:
    return (row.get("case"), row.get("W"), row.get("coll"))


def collect(rounds: List[Dict[str, List[Dict]]], metric: str) -> Dict[tuple, Dict[str, List[float]]]:
    """rounds[r][variant] = that process's rows; returns key -> variant -> one figure per round (NaN where a
    round's process lacks the row or the metric)."""
    keys: List[tuple] = []
    for rnd in rounds:
        for rows in rnd.values():
            for row in rows:
                k = row_key(row)
                if k not in keys:
                    keys.append(k)
    out: Dict[tuple, Dict[str, List[float]]] = {}
    for k in keys:
        per: Dict[str, List[float]] = {}
        for rnd in rounds:
            for variant, rows in rnd.items():
                val: Optional[float] = None
                for row in rows:
                    if row_key(row) == k:
                        v = row.get(metric)
                        val = float(v) if isinstance(v, (int, float)) else None
                        break
                per.setdefault(variant, []).append(val if val is not None else float("nan"))
        if any(v == v for vals in per.values() for v in vals):
            out[k] = per
    return out
