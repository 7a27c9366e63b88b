"""Paired A/B statistics for benchmarks whose figures drift between processes (issue 15, session 29).

A library parameter is read once per process, so two settings cannot alternate inside one process; and on the
device machines a row's median moves between processes by as much as the differences we look for (session 28: the
Llama RS took 33.2 and 51.5 us per rank in two runs of the same library). benchmarks/host_ab.py therefore runs each
variant in fresh processes, in rounds whose order alternates, and pairs the variants' figures by round: the
difference of one round cancels whatever drifted between rounds. This module turns those rounds into a verdict.

Pure Python (no numpy): CI and the tests run it on the CPU.
"""

import random
import statistics
from typing import Dict, List, Optional, Sequence

# Resamples of the bootstrap interval: enough that the interval's ends move by less than the figures' last digit.
BOOTSTRAP_RESAMPLES = 4000


def round_orders(variants: Sequence[str], rounds: int) -> List[List[str]]:
    """The order of the variants in each round: forward, then reversed, alternately (A B, B A, A B, ...), so that a
    drift over the run (warming, throttling) falls on every variant equally often first and last."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1 (got {rounds})")
    if len(variants) < 2 or len(set(variants)) != len(variants):
        raise ValueError(f"need at least two distinct variants (got {list(variants)})")
    fwd = list(variants)
    return [fwd if r % 2 == 0 else fwd[::-1] for r in range(rounds)]


def bootstrap_median_interval(values: Sequence[float], level: float = 0.9, seed: int = 0,
                              resamples: int = BOOTSTRAP_RESAMPLES) -> tuple:
    """Percentile bootstrap interval of the median of `values` (two-sided, `level`), with a fixed seed so that the
    same rounds always give the same verdict."""
    vals = [v for v in values if v == v]  # drop NaN
    if not vals:
        return (float("nan"), float("nan"))
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1) (got {level})")
    rng = random.Random(seed)
    n = len(vals)
    meds = sorted(statistics.median(rng.choice(vals) for _ in range(n)) for _ in range(resamples))
    lo_i = int((1 - level) / 2 * resamples)
    hi_i = min(resamples - 1, int((1 + level) / 2 * resamples))
    return (meds[lo_i], meds[hi_i])


def compare(base: Sequence[float], other: Sequence[float], level: float = 0.9, seed: int = 0) -> Dict:
    """`other` against `base`, paired by round (same index = same round). Rounds where either figure is missing
    (NaN) are left out. Returns the medians over rounds of each, the median paired difference (other - base), its
    bootstrap interval, how many rounds had other below / above base, and a verdict: "lower" or "higher" when the
    interval excludes 0, else "unresolved" (also with fewer than 3 pairs, which no interval can settle)."""
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
    if len(pairs) >= 3:
        lo, hi = bootstrap_median_interval(diffs, level=level, seed=seed)
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
