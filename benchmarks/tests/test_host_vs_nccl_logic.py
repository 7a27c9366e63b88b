# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/host_vs_nccl.py without a GPU: the sampling loop (rows interleaved in a rotating order, a sample whose
gate opened during the loop dropped and the gate lengthened) with torch.cuda's sleep, events and synchronize
replaced by fakes; the table's ratios (per rank, the maximum over ranks, NaN for a missing figure) and verdicts from
synthetic rank reports."""

import math
import random

import pytest
import torch

import host_vs_nccl as hv


class _FakeCuda:
    """torch.cuda's calls _measure makes: the gate 'opens' (query() True) for the samples listed in `open_at`."""

    def __init__(self, open_at):
        self.open_at = set(open_at)
        self.sleeps = []
        self.samples = 0
        fake = self

        class Event:
            def record(self):
                self.n = fake.samples
                fake.samples += 1

            def query(self):
                return self.n in fake.open_at

        self.Event = Event

    def _sleep(self, cycles):
        self.sleeps.append(cycles)

    def synchronize(self):
        pass


def test_samples_are_interleaved_and_an_opened_gate_drops_its_sample(monkeypatch):
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    fake = _FakeCuda(open_at=[4])  # the 5th sample (sample 1, its 2nd row in rotation: "c")
    for attr in ("Event", "_sleep", "synchronize"):
        monkeypatch.setattr(torch.cuda, attr, getattr(fake, attr))
    got = hv._measure(fns, samples=3, calls=2)
    assert order == ["a"] * 2 + ["b"] * 2 + ["c"] * 2 + ["b"] * 2 + ["c"] * 2 + ["a"] * 2 + ["c"] * 2 + ["a"] * 2 + \
        ["b"] * 2
    assert [len(got[k]) for k in "abc"] == [3, 3, 2]  # "c"'s second sample dropped
    assert all(v > 0 for vs in got.values() for v in vs)
    assert fake.sleeps[:5] == [hv.GATE_CYCLES] * 5 and fake.sleeps[5:] == [2 * hv.GATE_CYCLES] * 4


def _report(rank, rng, case="64 x 256K"):
    row = {"case": case, "W": 2, "P": 64, "calls": 4}
    for k in hv.ROWS:
        row[k] = rng.uniform(5, 120)
        row[k + " valid"] = rng.randint(10, 15)
    return {"rank": rank, "error": None, "rows": [row], "meta": {"provider": "ipc", "torch": "t", "device": "d"}}


def test_ratios_and_the_worst_rank_decide_the_verdict(capsys):
    rng = random.Random(7)
    reps = [_report(r, rng) for r in range(3)]
    worst = hv.print_table(3, reps)["64 x 256K"]
    for coll in ("rs", "ag"):
        want = max(r["rows"][0][f"tide {coll}"] / r["rows"][0][f"nccl {coll}"] for r in reps)
        assert worst[coll] == pytest.approx(want)
    text = capsys.readouterr().out
    verdict = "met" if worst["rs"] <= 1.0 and worst["ag"] <= 1.0 else "NOT met"
    assert f"rs {worst['rs']:.2f}x, ag {worst['ag']:.2f}x (target <= 1.0: {verdict})" in text
    for r in reps:  # every rank's row printed with its ratios
        ratio = r["rows"][0]["tide rs"] / r["rows"][0]["nccl rs"]
        assert any(line.startswith("64 x 256K") and f"{ratio:.2f}" in line for line in text.splitlines())


def test_a_missing_figure_makes_the_ratio_nan_not_a_pass(capsys):
    rng = random.Random(3)
    reps = [_report(0, rng), _report(1, rng), None]  # rank 2 wrote no report
    for k in ("tide rs", "nccl rs"):
        reps[0]["rows"][0][k], reps[1]["rows"][0][k] = 10.0, 20.0
    reps[1]["rows"][0]["nccl rs"] = float("nan")  # no valid sample
    worst = hv.print_table(3, reps)["64 x 256K"]
    assert math.isnan(worst["rs"])
    assert "NOT met" in capsys.readouterr().out
    assert hv.ratios({"tide ag": 5.0, "nccl ag": 10.0})["ag"] == 0.5
