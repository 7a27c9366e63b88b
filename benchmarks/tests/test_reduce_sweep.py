# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/reduce_sweep.py on the CPU: its arithmetic (per-chunk rates from a timeline, the rate the staged grid
is sized by, the ratios against the baseline), its argument checks, and a whole run with the host stand-ins of the
share (share_stand_ins), so that the one GPU call it is written for meets no Python error."""

import json
import math
import random
from types import SimpleNamespace

import pytest
import reduce_sweep as S
import share_stand_ins


def test_chunk_rates_take_full_chunks_that_a_next_chunk_follows():
    rng = random.Random(54)
    full, rows, nbytes, numels = 1000, [], [], []
    for k in range(5):
        start = rng.uniform(0, 100)
        dur, ctas = rng.uniform(10, 20), rng.choice([1, 4, 8, 10])
        rows.append({"red_start_us": start, "red_end_us": start + dur, "red_ctas": ctas})
        nbytes.append(rng.randrange(1 << 20, 1 << 24))
        numels.append(full if k != 2 else full // 2)  # chunk 2 is short; chunk 4 is the last (the drain)
    got = S.chunk_rates(rows, nbytes, numels, full)
    want = [nbytes[k] / ((rows[k]["red_end_us"] - rows[k]["red_start_us"]) * 1e3) / rows[k]["red_ctas"]
            for k in (0, 1, 3)]
    assert got == pytest.approx(want)
    # a chunk without a reduce span (nan) or with no CTAs gives no rate
    rows[0]["red_end_us"] = math.nan
    rows[1]["red_ctas"] = 0
    assert S.chunk_rates(rows, nbytes, numels, full) == pytest.approx(want[2:])
    assert S.chunk_rates(rows[:1], nbytes, numels, full) == []


def test_sizing_rate_is_the_staged_kernels_least_rate_at_four_ctas_or_more():
    beside = [{"kernel": "staged", "ctas": 1, "median_GBps_per_cta": 150.0},
              {"kernel": "staged", "ctas": 4, "median_GBps_per_cta": 120.0},
              {"kernel": "staged", "ctas": 10, "median_GBps_per_cta": 104.5},
              {"kernel": "loads", "ctas": 10, "median_GBps_per_cta": 66.0},
              {"kernel": "staged", "ctas": 8, "median_GBps_per_cta": None}]
    assert S.sizing_rate(beside, 0.0) == 104.5
    assert S.sizing_rate(beside, 90.0) == 90.0  # given on the command line
    assert S.sizing_rate(beside[:1], 0.0) == 150.0  # only one CTA measured
    assert S.sizing_rate(beside[3:], 0.0) is None


def _side(link, variant, sm_us, slowdown, ok=True):
    return {"link_gbps": link, "variant": variant, "sm": {"sm_weighted_us": sm_us}, "slowdown": slowdown,
            "slowdown_p25": slowdown - 0.01, "slowdown_p75": slowdown + 0.01, "e2e_over_floor": 1.05,
            "check": {"ok": ok}, "paced_ctas": None if variant == "baseline" else 10}


def test_ratio_rows_divide_each_links_baseline_by_the_variant():
    share = [_side(50.0, "baseline", 900.0, 1.6), _side(50.0, "staged", 15.0, 1.02),
             _side(370.0, "baseline", 250.0, 1.6), _side(370.0, "loads", 57.8, 1.047),
             _side(370.0, "staged@104", 40.0, 1.03, ok=False)]
    rows = S.ratio_rows(share)
    assert [(r["link_gbps"], r["variant"]) for r in rows] == [(370.0, "baseline"), (370.0, "loads"),
                                                             (370.0, "staged@104"), (50.0, "baseline"),
                                                             (50.0, "staged")]
    by = {(r["link_gbps"], r["variant"]): r for r in rows}
    assert by[(370.0, "baseline")]["sm_ratio"] == 1.0
    assert by[(370.0, "loads")]["sm_ratio"] == pytest.approx(250.0 / 57.8)
    assert by[(50.0, "staged")]["sm_ratio"] == pytest.approx(60.0)
    assert not by[(370.0, "staged@104")]["ok"]
    # no baseline at a rate: no ratio
    assert S.ratio_rows([_side(50.0, "loads", 10.0, 1.0)])[0]["sm_ratio"] is None


def test_arguments_are_checked_before_any_gpu(capsys):
    a = S.parser().parse_args([])
    assert S.validate(a) is None
    assert a.ctas == [1, 4, 8, 10] and a.links == [370.0, 50.0] and a.alone_numel == 8 << 20
    for bad, key in ((["--ranks", "9"], "--ranks"), (["--ctas", "0,4"], "--ctas"), (["--links", "370,-1"], "--links"),
                     (["--alone-numel", "12"], "--alone-numel"), (["--staged-cta-gbps", "nan"], "--staged-cta-gbps"),
                     (["--runs", "0"], "--runs")):
        assert key in S.validate(S.parser().parse_args(bad)), bad
    assert S.main(["--ranks", "1"]) == 2
    assert "--ranks" in capsys.readouterr().err


def test_sweep_end_to_end_with_host_stand_ins(monkeypatch, tmp_path, native, capsys):
    """The whole run on the CPU: every step executes, every output is checked bit for bit and right, the table has a
    row per link rate and variant, and the JSON holds what the table shows."""
    torch = pytest.importorskip("torch")
    fake = share_stand_ins.install(monkeypatch, torch)
    monkeypatch.setattr(S, "Gpu", fake.Gpu)
    rc = S.main(["--ranks", "4", "--layout", "tiny-test-layer", "--runs", "3", "--links", "370,50", "--ctas", "1,4",
                 "--alone-numel", "4096", "--rs-chunk-bytes", "4096", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "reduce_sweep.json").read_text())
    assert not res["errors"], res["errors"]
    assert rc == 0
    assert [(d["kernel"], d["ctas"]) for d in res["alone"]] == [("loads", 1), ("loads", 4), ("staged", 1),
                                                                ("staged", 4)]
    assert all(d["bit_exact"] and d["GBps_per_cta"] > 0 for d in res["alone"])
    assert [(d["kernel"], d["ctas"]) for d in res["beside"]] == [(k, c) for k in ("loads", "staged") for c in (1, 4)]
    assert all(d["check"]["ok"] for d in res["beside"])
    assert res["rs_num_chunks"] >= 3  # full chunks whose next chunk arrives while they reduce: rates
    assert all(d["median_GBps_per_cta"] > 0 for d in res["beside"])
    rate = res["staged_cta_gbps"]
    assert rate == min(d["median_GBps_per_cta"] for d in res["beside"] if d["kernel"] == "staged" and d["ctas"] == 4)
    variants = [(d["link_gbps"], d["variant"]) for d in res["share"]]
    assert variants == [(link, v) for link in (370.0, 50.0) for v in ("baseline", "loads", "staged",
                                                                      f"staged@{rate:.0f}")]
    assert all(d["check"]["ok"] for d in res["share"])
    assert len(res["ratios"]) == len(variants) and all(r["sm_ratio"] > 0 for r in res["ratios"])
    for link, variant in variants:
        assert any(line.startswith(f"| {link:g} | {variant} |") for line in out.splitlines()), (link, variant)
    assert "| staged / loads |" in out


def test_a_reduce_that_never_ends_is_reported_not_waited_for():
    """synchronize_within gives up after its limit (a stuck ring would otherwise hold the GPU call to its end)."""
    import threading
    import time

    release = threading.Event()
    stuck = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: release.wait(10)))
    t0 = time.perf_counter()
    with pytest.raises(S.GpuHang, match="staged on 4 CTAs: still running after 0.2 s"):
        S.synchronize_within(stuck, 0.2, "staged on 4 CTAs")
    assert time.perf_counter() - t0 < 5
    release.set()
    S.synchronize_within(SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None)), 5.0, "quick")
