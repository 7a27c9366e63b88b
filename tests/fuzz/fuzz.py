#!/usr/bin/env python3
# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Seeded random fuzzer of the layout/config/plan C API and the host executors.

    python tests/fuzz/fuzz.py [--seconds S] [--seed N] [--corpus DIR] [--out DIR] [--replay-only]

Cases are layouts (model.py), handle lifetimes across threads and Python integer edge values (lifetimes.py).
First replays every case in tests/fuzz/corpus (regressions and edge seeds), then generates random cases until the
time budget is spent (TIDE_FUZZ_SECONDS, default 60). Each case is checked by harness.check_case against the
independent model (model.py) and, when small, the numpy reference. On a failure it prints the case as JSON and the
seed, writes it to --out (default $TIDE_FUZZ_OUT or _build/fuzz) as failure-<seed>-<n>.json, and exits 1; the case
being run is always saved first to current_case.json, so a crash (or a sanitizer report) leaves its reproducer.
Replay one file with --replay-only --corpus path/to/case.json. Exit 0 when every case passed.

Why our own generator rather than atheris or hypothesis: there is no clang here, so atheris could not instrument
the C++ side and would only mutate Python-level inputs blindly; the input space is a handful of integers whose
interesting values are known (limits, powers of two, 2^64 edges), which a weighted generator hits directly, and a
fixed wall-clock budget is trivial to keep. No new dependency.
"""

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests/tide_ref.py

import harness as H  # noqa: E402
import lifetimes as L  # noqa: E402
import model as M  # noqa: E402

U64 = M.U64
INT_EDGES = [0, 1, 2, 3, -1, (1 << 31) - 1, -(1 << 31), 1 << 16, (1 << 16) - 1, (1 << 16) + 1, 63, 64, 65, 128]
U64_EDGES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 255, 256, 4095, 4096, 4097, 1 << 20, (1 << 31) - 1, 1 << 31,
             1 << 32, (1 << 40) - 1, 1 << 40, (1 << 40) + 1, 1 << 62, 1 << 63, U64 - 2, U64 - 1]  # fmt: skip


def _divisors(n, cap=64):
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def _world_rpn(r: random.Random, big: bool):
    if not big:
        W = r.choice([1, 1, 2, 2, 3, 4, 4, 5, 6, 8, 8, 12, 16, 24, 13])
        return W, r.choice(_divisors(W))
    W = r.choice([2, 8, 64, 512, 1000, 4096, 65535, 65536, 65536, 1 << 15, r.randint(1, 65536)])
    if r.random() < 0.08:
        W = r.choice(INT_EDGES + [65537, 70000])
    rpn = r.choice(_divisors(W) if W >= 1 else [1]) if r.random() < 0.85 else r.choice(INT_EDGES + [W, W + 1])
    return W, rpn


def _numel_row(r: random.Random, big: bool):
    if not big:
        rows, c = r.randint(1, 60), r.choice([1, 1, 1, 2, 3, 4, 5, 7, 8])
        n = rows * c
        if r.random() < 0.03:
            c = r.choice([0, n + 1, 3 if n % 3 else 7])
        return n, c
    n = r.choice([1 << 40, (1 << 40) - 1, 1 << 39, 3 << 38, r.randint(1, 1 << 40), 1 << 20, 65536 * 65536,
                  r.randint(1, 1 << 16)])  # fmt: skip
    if r.random() < 0.05:
        n = r.choice(U64_EDGES + [(1 << 40) + 1])
    c = r.choice([1, n, n, n // 2 if n % 2 == 0 else 1, 1 << 16 if n % 65536 == 0 else 1, max(1, n >> 20)])
    if n >= 1 and c >= 1 and n % c:
        c = 1
    if r.random() < 0.04:
        c = r.choice([0, n + 1, 3, U64 - 1])
    return n, c


def _dtype(r: random.Random):
    if r.random() < 0.02:
        return r.choice([-1, 7, 8, 99, (1 << 31) - 1, -(1 << 31)])
    return r.choice([0, 0, 1, 2, 2, 3, 4, 5, 6])


def _cfg_value(r: random.Random, small: bool):
    if r.random() < 0.25:
        return 0
    if small and r.random() < 0.6:
        return r.choice([1, 2, 3, 7, 8, 31, 32, 33, 64, 100, 257, 4096, r.randint(1, 5000)])
    return r.choice(U64_EDGES + [r.getrandbits(64), r.getrandbits(r.randint(1, 63))])


def gen_case(r: random.Random) -> dict:
    kind = r.choices(["layout", "lifetime", "pyint"], [0.88, 0.03, 0.09])[0]
    if kind == "lifetime":
        return L.gen_lifetime(r)
    if kind == "pyint":
        return L.gen_pyint(r)
    mode = r.choices(["small", "edge", "many", "struct"], [0.55, 0.25, 0.08, 0.12])[0]
    big = mode in ("edge", "many")
    W, rpn = _world_rpn(r, big)
    if mode == "many":
        n_params = r.choice([64, 100, 1000, 4096, 1 << 16, 1 << 20])
        if r.random() < 0.2:
            n_params = r.choice([(1 << 20) + 1, 1 << 21]) if r.random() < 0.5 else n_params
        n, c = _numel_row(r, True)
        runs = [[n, n_params]] if r.random() < 0.7 else [[n, n_params - 1], [r.randint(1, 1 << 40), 1]]
        rows_runs = [[c, n_params]] if runs[0][0] == n and len(runs) == 1 else None
        case = {"numels": {"runs": runs}, "rows": {"fill": c, "n": n_params} if rows_runs else None,
                "dtypes": {"fill": r.choice([0, 2, 3, 6]), "n": n_params}}  # fmt: skip
        if n_params > M.MAX_PARAMS:
            case["numels"] = {"fill": 1, "n": 1}  # never read: nParams is rejected first
            case["rows"], case["dtypes"] = None, {"fill": 2, "n": 1}
        case["n_params"] = n_params
    else:
        n_params = r.choice([1, 1, 2, 3, 4, 5, 6]) if not big else r.choice([1, 2, 3, 8, 64])
        pairs = [_numel_row(r, big) for _ in range(n_params)]
        case = {"numels": [p[0] for p in pairs], "dtypes": [_dtype(r) for _ in range(n_params)]}
        case["rows"] = [p[1] for p in pairs] if r.random() < 0.7 else None
        if mode == "small" and r.random() < 0.5:
            case["dtypes"] = [r.choice([0, 1, 2]) for _ in range(n_params)]  # reduce-scatter runs too
    case.update(world=W, rpn=rpn, rank=r.randrange(W) if W >= 1 and r.random() < 0.97 else r.choice(INT_EDGES))
    if r.random() < 0.8:
        case["config"] = {"size": M.CONFIG_SIZE, "version": 1, "chunk": _cfg_value(r, mode == "small"),
                          "pace": _cfg_value(r, mode == "small")}  # fmt: skip
    else:
        case["config"] = None
    if mode == "struct":
        what = r.choice(["desc_size", "desc_version", "cfg_size", "cfg_version", "n_params", "null", "bigger"])
        if what == "desc_size":
            case["desc_size"] = r.choice([0, 1, 8, M.DESC_SIZE - 8, M.DESC_SIZE - 1, U64 - 1])
        elif what == "desc_version":
            case["desc_version"] = r.choice([0, 2, 3, (1 << 32) - 1])
        elif what == "cfg_size":
            case["config"] = dict(case["config"] or {"version": 1, "chunk": 0, "pace": 0},
                                  size=r.choice([0, 8, M.CONFIG_SIZE - 1]))  # fmt: skip
        elif what == "cfg_version":
            case["config"] = dict(case["config"] or {"size": M.CONFIG_SIZE, "chunk": 0, "pace": 0},
                                  version=r.choice([0, 2, (1 << 32) - 1]))  # fmt: skip
        elif what == "n_params":
            case["n_params"] = r.choice([0, -1, -(1 << 31), (1 << 20) + 1, (1 << 31) - 1])
        elif what == "null":
            case[r.choice(["numels", "dtypes"])] = None
        else:  # a newer caller's bigger structs are accepted
            case["desc_size"] = M.DESC_SIZE + r.choice([8, 64, 4096])
            if case["config"] is not None:
                case["config"]["size"] = M.CONFIG_SIZE + 8
    case["data_seed"] = r.getrandbits(32)
    return case


def load_corpus(path: Path):
    files = [path] if path.is_file() else sorted(path.glob("*.json"))
    for f in files:
        data = json.loads(f.read_text())
        for k, case in enumerate(data if isinstance(data, list) else [data]):
            yield f"{f.name}#{k}", case


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("TIDE_FUZZ_SECONDS", "60")))
    ap.add_argument("--seed", type=int, default=None, help="default: $TIDE_FUZZ_SEED, else time-based (printed)")
    ap.add_argument("--corpus", type=Path, default=HERE / "corpus")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("TIDE_FUZZ_OUT", "_build/fuzz")))
    ap.add_argument("--replay-only", action="store_true")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else int(os.environ.get("TIDE_FUZZ_SEED", "0") or 0)
    if not seed:
        seed = int.from_bytes(os.urandom(4), "little")
    args.out.mkdir(parents=True, exist_ok=True)
    current = args.out / "current_case.json"
    H.check_sizes()
    env_chunk, env_pace = H.env_defaults()
    stats = {"ok": 0, "error": 0, "exec": 0}

    def run(name, case):
        current.write_text(json.dumps(case))
        try:
            stats[H.check_case(case, env_chunk, env_pace)] += 1
            return True
        except H.CaseFailure as exc:
            bad = args.out / f"failure-{seed}-{sum(stats.values())}.json"
            bad.write_text(json.dumps(case, indent=1))
            print(f"FUZZ FAILURE ({name}, seed {seed}): {exc}\n  case: {json.dumps(case)}\n  saved: {bad}",
                  file=sys.stderr)  # fmt: skip
            return False

    t0 = time.monotonic()
    n_corpus = 0
    for name, case in load_corpus(args.corpus):
        n_corpus += 1
        if not run(name, case):
            return 1
    if not args.replay_only:
        r = random.Random(seed)
        deadline = t0 + args.seconds
        i = 0
        while time.monotonic() < deadline:
            if not run(f"seed {seed} case {i}", gen_case(r)):
                return 1
            i += 1
    dt = time.monotonic() - t0
    total = sum(stats.values())
    print(f"fuzz: seed {seed}, {total} cases in {dt:.1f} s ({n_corpus} from the corpus): {stats['exec']} ran the "
          f"host executors, {stats['ok']} valid (queries only), {stats['error']} rejected as documented")  # fmt: skip
    current.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
