# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/host_ab.py and benchmarks/ab_stats.py: variants in fresh processes, rounds in alternating
order, paired per-round differences with a distribution-free interval for their median. CPU only: the child is a stand-in script whose figures
depend on its variant's environment."""

import json
import random

import pytest

import ab_stats
import host_ab


def test_round_orders_alternate_and_reject_bad_input():
    assert ab_stats.round_orders(["a", "b"], 4) == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    assert ab_stats.round_orders(["a", "b", "c"], 2) == [["a", "b", "c"], ["c", "b", "a"]]
    with pytest.raises(ValueError):
        ab_stats.round_orders(["a"], 3)
    with pytest.raises(ValueError):
        ab_stats.round_orders(["a", "a"], 3)
    with pytest.raises(ValueError):
        ab_stats.round_orders(["a", "b"], 0)


@pytest.mark.parametrize("seed", range(5))
def test_pairing_resolves_a_shift_that_drift_between_rounds_hides(seed):
    """Each round's process drifts by up to +-20 us (as rows did between processes on an H100); the variant is a
    fixed 5 us lower plus 1 us of noise. Unpaired, the two sets of figures overlap; paired, the shift resolves."""
    rng = random.Random(seed)
    shift = -5.0
    drift = [rng.uniform(-20, 20) for _ in range(8)]
    base = [50 + d + rng.uniform(-1, 1) for d in drift]
    other = [50 + d + shift + rng.uniform(-1, 1) for d in drift]
    assert min(base) < max(other) and min(other) < max(base)  # unpaired: the ranges overlap
    c = ab_stats.compare(base, other)
    assert c["verdict"] == "lower"
    assert c["diff_lo"] <= shift + 1 and c["diff_hi"] >= shift - 1  # the interval holds the true shift
    assert c["diff_hi"] < 0 and c["below"] == 8 and c["above"] == 0


def test_median_interval_is_the_sign_test_order_statistics():
    rng = random.Random(7)
    vals = [rng.uniform(-3, 9) for _ in range(8)]
    srt = sorted(vals)
    # n = 8 at 90%: P(B <= 1) = 9/256 <= 0.05 < P(B <= 2) = 37/256, so k = 2: (x_(2), x_(7))
    assert ab_stats.median_interval(vals, 0.9) == (srt[1], srt[6])
    # n = 4 at 90%: P(B <= 0) = 1/16 > 0.05: no interval excludes anything
    assert ab_stats.median_interval(vals[:4], 0.9) == (float("-inf"), float("inf"))
    # n = 5: P(B <= 0) = 1/32: the extremes
    five = sorted(vals[:5])
    assert ab_stats.median_interval(vals[:5], 0.9) == (five[0], five[4])
    with pytest.raises(ValueError):
        ab_stats.median_interval(vals, 1.0)


@pytest.mark.parametrize("pairs", [3, 4, 6])
def test_no_effect_rarely_resolves_at_few_pairs(pairs):
    """The false-verdict rate without an effect stays at or below the nominal 10% (a percentile bootstrap gave 16-26%
    at 3-4 pairs): 2000 simulated comparisons of two equal noisy variants."""
    rng = random.Random(100 + pairs)
    wrong = 0
    for _ in range(2000):
        base = [rng.gauss(50, 5) for _ in range(pairs)]
        other = [rng.gauss(50, 5) for _ in range(pairs)]
        wrong += ab_stats.compare(base, other)["verdict"] != "unresolved"
    assert wrong / 2000 <= 0.11, wrong


@pytest.mark.parametrize("seed", range(5))
def test_no_shift_is_unresolved_and_higher_is_higher(seed):
    rng = random.Random(40 + seed)
    drift = [rng.uniform(-20, 20) for _ in range(8)]
    base = [60 + d + rng.uniform(-2, 2) for d in drift]
    same = [60 + d + rng.uniform(-2, 2) for d in drift]
    c = ab_stats.compare(base, same)
    assert c["diff_lo"] <= 0 <= c["diff_hi"], c
    assert c["verdict"] == "unresolved"
    higher = [60 + d + 8 + rng.uniform(-2, 2) for d in drift]
    h = ab_stats.compare(base, higher)
    assert h["verdict"] == "higher" and h["diff_lo"] > 0


def test_missing_rounds_are_left_out_and_few_pairs_stay_unresolved():
    nan = float("nan")
    c = ab_stats.compare([10.0, nan, 12.0, 11.0], [5.0, 6.0, nan, 4.0])
    assert c["pairs"] == 2 and c["verdict"] == "unresolved"  # two pairs cannot settle anything
    assert c["diff_lo"] == float("-inf") and c["diff_hi"] == float("inf")
    assert c["diff_median"] == pytest.approx(-6.0)
    with pytest.raises(ValueError):
        ab_stats.compare([1.0, 2.0], [1.0])


def test_collect_pairs_rows_by_round_and_marks_missing_rows():
    rounds = [
        {"a": [{"case": "x", "W": 8, "coll": "rs", "host_us": 40.0}], "b": [{"case": "x", "W": 8, "coll": "rs",
                                                                           "host_us": 35.0}]},
        {"a": [{"case": "x", "W": 8, "coll": "rs", "host_us": 44.0}], "b": []},
    ]
    got = ab_stats.collect(rounds, "host_us")
    assert list(got) == [("x", 8, "rs")]
    assert got[("x", 8, "rs")]["a"] == [40.0, 44.0]
    b = got[("x", 8, "rs")]["b"]
    assert b[0] == 35.0 and b[1] != b[1]  # NaN where round 1's process had no row


def test_parse_variant():
    assert host_ab.parse_variant("pairs:NCCL_TIDE_PAIR_TOKENS=1") == ("pairs", {"NCCL_TIDE_PAIR_TOKENS": "1"})
    assert host_ab.parse_variant("base") == ("base", {})
    assert host_ab.parse_variant("old:NCCL_TIDE_LIBRARY_PATH=/x/lib.so,TIDE_BENCH_OLD_LIBRARY=1")[1] == {
        "NCCL_TIDE_LIBRARY_PATH": "/x/lib.so", "TIDE_BENCH_OLD_LIBRARY": "1"}
    assert host_ab.parse_variant("a:NCCL_NVLS_ENABLE=0") == ("a", {"NCCL_NVLS_ENABLE": "0"})  # the allowed value
    for bad in ("", ":A=1", "a b:X=1", "v:NOEQUALS", "v:=1", "v:NCCL_NVLS_ENABLE=1", "NCCL_TIDE_X=1"):
        with pytest.raises(ValueError):
            host_ab.parse_variant(bad)


CHILD = r'''
import argparse, json, os, random, sys
ap = argparse.ArgumentParser()
ap.add_argument("--json")
ap.add_argument("--route")
ap.add_argument("--samples", type=int)
ap.add_argument("--only")
a = ap.parse_args()
if os.environ.get("NCCL_NVLS_ENABLE") != "0" or os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST") != "1":
    sys.exit(3)
if os.environ.get("STANDIN_FAIL") == "1":
    print("stand-in failure", file=sys.stderr)
    sys.exit(5)
# The machine drifts between rounds (every process of one round shares an offset: two processes per round, the
# counter file numbers them), each process scatters a little on its own, and the variant shifts it by STANDIN_SHIFT.
counter = os.environ["STANDIN_COUNTER"]
n = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(n + 1))
drift = random.Random(n // 2).uniform(-15, 15)
rng = random.Random(os.getpid())
shift = float(os.environ.get("STANDIN_SHIFT", "0"))
# The machine's launch floor drifts with it (host_floors = host_us / floor takes the drift out).
floor = 2.5 * (1 + drift / 50)
host = (50 + shift + rng.uniform(-0.5, 0.5)) * (1 + drift / 50)
rows = [{"case": "64 params", "W": 8, "coll": "rs", "host_us": host, "host_floors": host / floor,
         "gpu_us": 900 + rng.uniform(-1, 1), "samples": a.samples, "only": a.only,
         "valid_samples": a.samples, "gpu_valid_samples": a.samples}]
with open(a.json, "w") as f:
    json.dump(rows, f)
'''


@pytest.fixture
def run_stand_in(tmp_path, monkeypatch):
    """host_ab.main with the stand-in child and a JSON output: returns (exit status, the JSON)."""
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    out = tmp_path / "ab.json"
    monkeypatch.setenv("STANDIN_COUNTER", str(tmp_path / "counter"))

    def run(args):
        rc = host_ab.main(args + ["--child", str(child), "--json", str(out)])
        return rc, json.loads(out.read_text())

    return run


def test_main_runs_rounds_with_each_variants_environment(run_stand_in, capsys):
    rc, res = run_stand_in(["--variant", "base", "--variant", "faster:STANDIN_SHIFT=-6,NCCL_NVLS_ENABLE=0",
                            "--rounds", "6", "--samples", "9", "--only", "64 params"])
    assert rc == 0
    assert res["orders"][0] == ["base", "faster"] and res["orders"][1] == ["faster", "base"]
    assert all(r["base"][0]["samples"] == 9 and r["base"][0]["only"] == "64 params" for r in res["rounds"])
    host = [s for s in res["summary"] if s["metric"] == "host_us"]
    assert len(host) == 1 and host[0]["verdict"] == "lower" and host[0]["pairs"] == 6
    assert -7.5 < host[0]["diff_median"] < -4.5
    gpu = [s for s in res["summary"] if s["metric"] == "gpu_us"]
    assert abs(gpu[0]["diff_median"]) < 2.5  # the variant does not shift the GPU figure
    assert host[0]["fewest_valid_samples"] == 9  # the stand-in reports its --samples as valid
    floors = [s for s in res["summary"] if s["metric"] == "host_floors"]
    assert len(floors) == 1 and floors[0]["verdict"] == "lower"
    assert -2.8 < floors[0]["diff_median"] < -2.0  # -6 us over a 2.5 us floor, the drift divided out
    assert "lower (6 pairs)" in capsys.readouterr().out


def test_main_reports_a_failing_variant_and_exits_1(run_stand_in, capsys):
    rc, res = run_stand_in(["--variant", "base", "--variant", "broken:STANDIN_FAIL=1", "--rounds", "3"])
    assert rc == 1
    assert len(res["failures"]) == 3 and all(f["variant"] == "broken" for f in res["failures"])
    assert "rc 5" in res["failures"][0]["why"] and "stand-in failure" in res["failures"][0]["why"]
    assert all(s["pairs"] == 0 and s["verdict"] == "unresolved" for s in res["summary"])
    assert "FAILED" in capsys.readouterr().out


def test_main_refuses_multicast_and_single_variants(capsys):
    assert host_ab.main(["--variant", "a:NCCL_NVLS_ENABLE=1", "--variant", "b"]) == 2
    assert host_ab.main(["--variant", "a", "--rounds", "2"]) == 2
