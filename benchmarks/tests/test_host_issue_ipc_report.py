# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/host_issue_ipc.py's report: the ranks' reports merged per row (max over ranks, NaN if a
rank has no figure), the JSON written before anything is printed, the RS rows' slot and replay columns and census.
CPU only: synthetic rank reports with random figures."""

import json
import math
import random
import types

import host_issue_ipc


def _reports(rng, ranks):
    census = {"nodes": 17, "by_type": {"kernel": 6, "memcpy": 8, "memop": 3}, "memop_ops": 9, "edges": 20}
    reps = []
    for r in range(ranks):
        ag = {"case": "llama8b layer", "W": ranks, "P": 9, "coll": "ag", "chunks": 0, "calls": 6,
              "host_us": rng.uniform(10, 30), "valid_samples": rng.randint(5, 9), "replay_host_us": rng.uniform(5, 15)}
        rs = {"case": "llama8b layer", "W": ranks, "P": 9, "coll": "rs", "chunks": 4, "calls": 6,
              "host_us": rng.uniform(30, 60), "valid_samples": rng.randint(5, 9),
              "slot_host_us": rng.uniform(30, 60), "replay_host_us": rng.uniform(10, 30), "replay_census": census}
        reps.append({"rank": r, "error": None, "rows": [ag, rs],
                     "meta": {"torch": "t", "device": "d", "floor_us": rng.uniform(1.5, 4.0)}})
    return reps, census


def test_report_merges_ranks_and_writes_json_first(tmp_path, capsys):
    rng = random.Random(31)
    reps, census = _reports(rng, 3)
    del reps[2]["rows"][1]["slot_host_us"]  # one rank without a slot figure: the row's max is NaN, not a smaller max
    out = tmp_path / "ipc.json"
    assert host_issue_ipc.report(reps, types.SimpleNamespace(ranks=3, json=str(out), device_per_rank=False), rc=0) == 0
    rows = json.loads(out.read_text())["rows"]
    ag, rs = rows
    assert ag["host_us_max"] == max(r["rows"][0]["host_us"] for r in reps)
    assert ag["valid_min"] == min(r["rows"][0]["valid_samples"] for r in reps)
    assert rs["replay_host_us_max"] == max(r["rows"][1]["replay_host_us"] for r in reps)
    assert math.isnan(rs["slot_host_us_max"])
    assert rs["floor_us_per_rank"] == [r["meta"]["floor_us"] for r in reps]
    text = capsys.readouterr().out
    assert "rank 0's replay graph: 17 nodes: kernel 6, memcpy 8, memop 3 (9 ops); 20 edges" in text
    assert f"{ag['host_us_max']:.1f}" in text


def test_report_without_json_prints_and_keeps_rc(capsys):
    reps, _ = _reports(random.Random(5), 2)
    assert host_issue_ipc.report(reps, types.SimpleNamespace(ranks=2, json=None, device_per_rank=False), rc=1) == 1
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("llama8b layer")]
    assert len(lines) == 2 and lines[1].split()[4] == "rs"
