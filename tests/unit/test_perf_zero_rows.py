# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""A size whose per-rank count rounds to 0 (below 16 bytes per rank) is a row, as in nccl-tests' size loop, which
prints `0 0 float ...` for it: size 0, count 0, zero time and bandwidth, on every backend, in the table and in the
-J file alike, counted in the average bus bandwidth as nccl-tests counts it. No backend is called for it."""

import json
import random

import pytest
from nccl_tide.perf import report
from nccl_tide.perf.cli import main as perf_main
from nccl_tide.perf.plot import series
from test_perf_cli import parse, parse_full


def run(capsys, *args):
    try:
        rc = perf_main(list(args))
    except SystemExit as e:
        rc = e.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_host_backend_prints_the_zero_rows(capsys, tmp_path, coll):
    rng = random.Random()
    ranks = rng.choice([2, 3, 4])
    step = 16 * ranks * rng.randint(8, 64)  # every size after the first reaches 16 bytes per rank
    sizes = [0, step, 2 * step]
    js = tmp_path / "r.json"
    rc, out, err = run(capsys, coll, "--backend", "host", "--ranks", str(ranks), "-b", "0", "-e", str(2 * step),
                       "-i", str(step), "-n", "1", "-w", "0", "-J", str(js), "--wide")
    assert rc == 0, out + err
    assert "skipped" not in out
    rows, foot = parse(out)
    assert len(rows) == len(sizes)
    redop = "sum" if coll == "reduce_scatter" else "none"
    assert rows[0] == ("0", "0", "float", redop, "-1", "0.00", "0.00", "0.00", "0", "0.00", "0.00", "0.00", "0")
    assert all(int(r[0]) > 0 and r[8] == "0" for r in rows[1:])
    doc = json.loads(js.read_text())
    assert [r["size"] for r in doc["results"]] == [int(r[0]) for r in rows]
    zero = doc["results"][0]
    assert (zero["size"], zero["count"], zero["type"], zero["redop"]) == (0, 0, "float", redop)
    for key in ("out_of_place", "in_place"):
        assert zero[key] == {"time": 0.0, "alg_bw": 0.0, "bus_bw": 0.0, "nwrong": 0}
    measured = [v["bus_bw"] for r in doc["results"] for v in (r["out_of_place"], r["in_place"])]
    assert doc["average_bus_bandwidth"]["bandwidth"] == pytest.approx(sum(measured) / len(measured))
    assert doc["extras"]["results"][0]["ran"] is True and "count of 0" in doc["extras"]["results"][0]["note"]


def test_every_size_below_16_bytes_per_rank_is_a_zero_row(capsys):
    # 1..16 bytes at 2 ranks of float: 5 sizes of count 0, then 32 bytes of count 4 (nccl-tests prints the same)
    rc, out, err = run(capsys, "all_gather", "--backend", "host", "--ranks", "2", "-b", "1", "-e", "32", "-f", "2",
                       "-n", "1", "-w", "0", "-c", "0", "--wide")
    assert rc == 0, out + err
    rows, _ = parse(out)
    assert [(r[0], r[1]) for r in rows] == [("0", "0")] * 5 + [("32", "4")]
    assert all(r[5:9] == ("0.00", "0.00", "0.00", "N/A") for r in rows[:5])  # -c 0: no #wrong, as every row
    assert [line for line in out.splitlines() if line.startswith("# note tide 0:")]  # one note, size 0 once


def test_zero_rows_on_a_gpu_backend_make_no_call(capsys, monkeypatch, tmp_path):
    pytest.importorskip("torch")
    from nccl_tide.perf import cli, gpu, loopback_backend
    from test_perf_bench_logic import CpuLoopback

    timed = []
    monkeypatch.setattr(gpu, "time_call_us", lambda call, iters, warmup: call() or timed.append(1) or 50.0)
    monkeypatch.setattr(gpu, "sm_time", lambda call, iters=3: call() or {"sm_us": 1.0, "kernel_us": 1.0})
    monkeypatch.setattr(cli, "check_gpu_backend", lambda backend: None)
    monkeypatch.setattr(loopback_backend, "make", lambda w, d, **kw: CpuLoopback(w))
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    js = tmp_path / "lb.json"
    rc, out, err = run(capsys, "reduce_scatter", "--backend", "loopback", "--ranks", "4", "-b", "0", "-e", "4K",
                       "-i", "4K", "-n", "1", "-d", "bf16", "--impl", "tide", "--sm-time", "0", "-J", str(js),
                       "--wide")
    assert rc == 0, out + err
    rows = parse_full(out)
    assert [r[0] for r in rows] == ["0", "4096"]
    assert rows[0][6:10] == ("0.00", "0.00", "0.00", "0") and rows[0][10:14] == ("N/A",) * 4  # no in-place on GPUs
    assert len(timed) == 1  # the 4096-byte row's call alone
    doc = json.loads(js.read_text())
    assert doc["results"][0]["size"] == 0 and doc["results"][0]["out_of_place"]["bus_bw"] == 0.0
    assert doc["results"][0]["in_place"]["bus_bw"] is None


def test_zero_rows_are_left_off_the_log_size_axis_and_noted_once():
    doc = {"version": 3, "results": [], "extras": {"results": [
        {"impl": "tide", "size": 0, "out_of_place": {"bus_bw": 0.0}},
        {"impl": "tide", "size": 1024, "out_of_place": {"bus_bw": 2.0}},
    ]}}
    assert series(doc) == {"tide": [(1024, 2.0, None)]}
    zero = report.Row(0, 0, "float", "none", -1, report.NA, report.NA, note="n")
    other = report.Row(64, 8, "float", "none", -1, report.NA, report.NA)
    assert report.note_lines([zero, zero, other]) == ["# note tide 0: n"]
    assert report.note_lines([zero, zero]) == ["# note tide all: n"]
