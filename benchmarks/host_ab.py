# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""A/B of library settings or builds in host_issue's rows, paired by round so that a few us can be told from noise.

    python benchmarks/host_ab.py --variant pairs --variant nopairs:NCCL_TIDE_TEST_SWITCHES=1,NCCL_TIDE_PAIR_TOKENS=0 \
        [--rounds 6] [--only "64 params"] [--samples 15] [--json FILE] [-- CHILD ARGS]

Why: a parameter is read once per process, so two settings cannot alternate inside one; and
on the device machines a row's median moves between processes about as much as the differences in question
(on an H100: the Llama RS 33.2 and 51.5 us per rank in two runs of one library, within-run IQR up to 22 us).
Here every variant runs in a fresh process per round, the rounds alternate the order (A B, B A, ...), and each
variant is compared with the first (the base) by its per-round differences: the median difference, a 90%
distribution-free interval of it (the sign test's: it needs 5 rounds or more to exclude 0), how many rounds it was
below / above, the fewest valid samples behind any of the row's figures, and a verdict ("lower", "higher",
"unresolved") from whether the interval excludes 0 (benchmarks/ab_stats.py), per row and metric, with no
correction for the number of rows. Pairing cancels what drifts between rounds (the
machine, its clocks, its neighbours); what scatters process by process on its own only more rounds shrink, and the
interval shows how far they got. Rounds cost about one process start each (CUDA,
the loopback worlds, warm-up): --only keeps them short.

A variant is NAME[:VAR=VALUE[,VAR=VALUE...]]; its variables are set in its processes only (another build:
NCCL_TIDE_LIBRARY_PATH=/path/libnccl-tide.so, with TIDE_BENCH_OLD_LIBRARY=1 for one that lacks newer functions). A
test-only switch, as in the example, needs a test build of the library (-DTIDE_TEST_SWITCHES=ON; docs/env.md, "Test
builds") and NCCL_TIDE_TEST_SWITCHES=1 beside it.
The child is benchmarks/host_issue.py --route on (override with --child; it must accept --json FILE and write a list
of rows with "case", "W", "coll" and numeric metrics); arguments after "--" go to it (default: --samples and --only
from here). Compared metrics: host_us, replay_host_us, gpu_us, host_floors and replay_floors (host_us and
replay_host_us over the same process's one launch-floor reading; they take no drift out on one machine, and
they are no common unit across machines either: a reading kept beside the us). Exit status 1 if any child failed (its round's
figures are left out of the pairs and the failure is printed), else 0.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ab_stats  # noqa: E402
from nccl_tide.perf.gpu import NO_MULTICAST_ENV  # noqa: E402  (never NVLink multicast on shared machines)

METRICS = ("host_us", "replay_host_us", "gpu_us", "host_floors", "replay_floors")
VALID = {"host_us": "valid_samples", "replay_host_us": "valid_samples", "gpu_us": "gpu_valid_samples",
         "host_floors": "valid_samples", "replay_floors": "valid_samples"}


def parse_variant(text: str):
    """NAME[:VAR=VALUE[,VAR=VALUE...]] -> (name, {var: value})."""
    name, _, spec = text.partition(":")
    if not name or any(c in name for c in " /="):
        raise ValueError(f"variant {text!r}: a name without spaces, '/' or '=' comes first (NAME:VAR=VALUE)")
    env = {}
    for item in filter(None, spec.split(",")):
        var, eq, val = item.partition("=")
        if not eq or not var:
            raise ValueError(f"variant {text!r}: {item!r} is not VAR=VALUE")
        if var in NO_MULTICAST_ENV and val != NO_MULTICAST_ENV[var]:
            raise ValueError(f"variant {text!r}: {var} must stay {NO_MULTICAST_ENV[var]} (NVLink multicast is off limits)")
        env[var] = val
    return name, env


def run_child(cmd, env, timeout_s):
    """One process of one variant: (rows, None) or ([], why)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd + ["--json", out], env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return [], f"timed out after {timeout_s} s"
        wall = time.monotonic() - t0
        if p.returncode != 0:
            tail = (p.stdout + p.stderr).strip().splitlines()[-5:]
            return [], f"rc {p.returncode} after {wall:.0f} s: " + " | ".join(tail)
        try:
            with open(out) as f:
                rows = json.load(f)
        except (OSError, ValueError) as e:
            return [], f"no rows written ({e})"
        if not isinstance(rows, list):
            return [], "rows file is not a list"
        return rows, None


def write_json(path, variants, orders, cmd, rounds, failures, summary):
    """Everything so far (summary None: rounds still running); rewritten after every round and at the end."""
    if not path:
        return
    with open(path + ".tmp", "w") as f:
        json.dump({"variants": [{"name": n, "env": e} for n, e in variants], "orders": orders, "child": cmd,
                   "rounds": rounds, "failures": failures, "summary": summary}, f, indent=1)
    os.replace(path + ".tmp", path)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    child_args = None
    if "--" in argv:
        i = argv.index("--")
        argv, child_args = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", required=True,
                    help="NAME[:VAR=VALUE,...]; the first is the base (at least two)")
    ap.add_argument("--rounds", type=int, default=6, help="processes per variant, in alternating order")
    ap.add_argument("--only", default=None, help="host_issue's --only (a substring of case names)")
    ap.add_argument("--samples", type=int, default=15, help="host_issue's --samples per process")
    ap.add_argument("--child", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_issue.py"))
    ap.add_argument("--child-timeout", type=float, default=300.0)
    ap.add_argument("--level", type=float, default=0.9, help="two-sided level of the median's interval")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    try:
        variants = [parse_variant(v) for v in args.variant]
        orders = ab_stats.round_orders([n for n, _ in variants], args.rounds)
    except ValueError as e:
        print(f"host_ab: {e}", file=sys.stderr)
        return 2
    envs = dict(variants)
    if args.rounds % 2:
        print(f"# note: {args.rounds} rounds, an odd number: the variants' positions are not balanced", flush=True)
    if child_args is None:
        child_args = ["--route", "on", "--samples", str(args.samples)] + (["--only", args.only] if args.only else [])
    cmd = [sys.executable, args.child] + child_args
    rounds, failures = [], []
    for r, order in enumerate(orders):
        rnd = {}
        for name in order:
            env = {**os.environ, **NO_MULTICAST_ENV, **envs[name]}
            rows, why = run_child(cmd, env, args.child_timeout)
            if why:
                failures.append({"round": r, "variant": name, "why": why})
                print(f"# round {r} {name}: FAILED: {why}", flush=True)
            else:
                got = {m: sum(1 for row in rows if isinstance(row.get(m), (int, float))) for m in METRICS}
                print(f"# round {r} {name}: {len(rows)} rows ({', '.join(f'{m} {n}' for m, n in got.items())})",
                      flush=True)
            rnd[name] = rows
        rounds.append(rnd)
        write_json(args.json, variants, orders, cmd, rounds, failures, None)  # what a killed run leaves
    base = variants[0][0]
    summary = []
    print(f"\n# {len(orders)} rounds, order alternating; each variant against {base}: medians over rounds, the median "
          f"of the per-round differences [{args.level:.0%} interval], rounds below / above {base}")
    print(f"{'case':<18}{'W':>3}{'coll':>5}  {'metric':<15}{'variant':<12}{base:>10}{'it':>10}{'diff':>9}"
          f"{'interval':>18}{'below/above':>13}{'valid':>7}  verdict")
    for metric in METRICS:
        valid = ab_stats.collect(rounds, VALID[metric])
        for key, per in ab_stats.collect(rounds, metric).items():
            counts = [v for vals in valid.get(key, {}).values() for v in vals if v == v]
            fewest = int(min(counts)) if counts else -1
            for name, _ in variants[1:]:
                c = ab_stats.compare(per.get(base, [float("nan")] * len(rounds)),
                                     per.get(name, [float("nan")] * len(rounds)), level=args.level)
                summary.append({"case": key[0], "W": key[1], "coll": key[2], "metric": metric, "base": base,
                                "variant": name, **c, "base_rounds": per.get(base), "variant_rounds": per.get(name),
                                "fewest_valid_samples": fewest})
                d = 2 if metric.endswith("_floors") else 1  # floors are a few units: two decimals
                interval = f"[{c['diff_lo']:.{d}f}, {c['diff_hi']:.{d}f}]"
                print(f"{str(key[0]):<18}{key[1]!s:>3}{str(key[2]):>5}  {metric:<15}{name:<12}{c['base_median']:>10.{d}f}"
                      f"{c['other_median']:>10.{d}f}{c['diff_median']:>+9.{d}f}{interval:>18}"
                      f"{str(c['below']) + '/' + str(c['above']):>13}{fewest:>7}  {c['verdict']} ({c['pairs']} pairs)")
    write_json(args.json, variants, orders, cmd, rounds, failures, summary)
    if failures:
        print(f"# {len(failures)} child process(es) failed; their rounds are left out of the pairs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
