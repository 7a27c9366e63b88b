# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf's default output and JSON as nccl-tests' own tools read them: 13 columns, a column header with as many
words as a row, nccl-tests' trailing lines and device lines, JSON file version 3 with per-iteration records, and
nccl-tests' flags accepted with their meaning."""

import json
import re

import pytest
from nccl_tide.perf.cli import main as perf_main

HOST = ["--backend", "host", "--ranks", "4"]
# nccl-tests' parseRankInfo: "#  Rank %d Group %d Pid %d on %s device %d [%[^]]] %[^\n]"
DEVICE_LINE = re.compile(r"^#  Rank\s+(-?\d+) Group\s+(-?\d+) Pid\s+(\d+) on\s+(\S+) device\s+(-?\d+) \[([^]]+)\] (.+)$")


def run(capsys, *args):
    rc = perf_main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def table(out):
    """(column-name words after '#', data rows as word lists), as parsers that count columns see them."""
    lines = out.splitlines()
    head = next(x for x in lines if x.startswith("#") and " size " in x and "count" in x)
    rows = [x.split() for x in lines if x and not x.startswith("#")]
    return head.lstrip("#").split(), rows


@pytest.mark.parametrize("extra", [[], ["-I", "1"], ["--wide"], ["-I", "1", "--wide"]])
def test_header_and_rows_have_the_same_word_count(capsys, extra):
    rc, out, _ = run(capsys, "reduce_scatter", *HOST, "-b", "4K", "-e", "16K", "-f", "2", "-n", "3", *extra)
    assert rc == 0, out
    head, rows = table(out)
    assert len(rows) == 3 and all(len(r) == len(head) for r in rows), (head, rows)
    want = 13 + (8 if "-I" in extra else 0) + (5 if "--wide" in extra else 0)
    assert len(head) == want
    # counted from the end as from the start, busbw is busbw (a parser that counts from the end reads that column)
    assert head[head.index("busbw") - len(head)] == "busbw"
    for r in rows:
        assert r[head.index("busbw")] == r[head.index("busbw") - len(head)]


def test_several_impls_print_the_first_impls_rows_only_unless_wide(capsys, tmp_path):
    js = tmp_path / "m.json"
    rc, out, _ = run(capsys, "all_gather", *HOST, "-b", "4K", "-e", "16K", "-f", "4", "-n", "1",
                     "--impl", "tide,nccl,fsdp2", "-J", str(js))
    assert rc == 0, out
    head, rows = table(out)
    sizes = [int(r[0]) for r in rows]
    assert sizes == [4096, 16384] and all(len(r) == 13 for r in rows)  # no repeated sizes, no note text in rows
    assert "# note nccl" not in out and "busbw avg nccl" in out  # the other impls: the footer and the JSON
    doc = json.loads(js.read_text())
    assert [r["size"] for r in doc["results"]] == sizes
    assert [r["impl"] for r in doc["extras"]["results"]] == ["tide", "nccl", "fsdp2"] * 2


def test_nccl_tests_first_and_last_lines_and_device_lines(capsys, tmp_path):
    js = tmp_path / "d.json"
    rc, out, _ = run(capsys, "all_gather", *HOST, "-b", "4K", "-e", "4K", "-n", "1", "-J", str(js))
    assert rc == 0
    lines = out.split("\n")
    assert lines[0] == f"# Writing JSON output to {js}"
    # nccl-tests ends: '# Collective test concluded: NAME', '#', then writeErrors' empty line
    assert lines[-4:] == ["# Collective test concluded: all_gather_perf", "#", "", ""]
    devices = [DEVICE_LINE.match(x) for x in lines if x.startswith("#  Rank")]
    assert len(devices) == 4 and all(devices)
    doc = json.loads(js.read_text())
    for m, d in zip(devices, doc["config"]["devices"]):
        rank, group, pid, host, dev, dev_hex, info = m.groups()
        assert (d["rank"], d["group"], d["pid"], d["hostname"], d["device"], d["device_hex"], d["device_info"]) == (
            int(rank), int(group), int(pid), host, int(dev), dev_hex, info)


def test_per_iteration_timing_as_nccl_tests_writes_it(capsys, tmp_path):
    js = tmp_path / "i.json"
    rc, out, err = run(capsys, "all_gather", *HOST, "-b", "4K", "-e", "16K", "-f", "4", "-n", "5", "-m", "2",
                       "-I", "1", "-K", "2", "-J", str(js))
    assert rc == 0, out + err
    assert "# Per-Iteration Report: host wall-clock timing; i_* uses max over process rows; summary skips first 2" in out
    head, rows = table(out)
    assert head[5:13] == ["time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%"]
    doc = json.loads(js.read_text())
    assert doc["config"]["per_iter_timing"] == "true" and doc["config"]["per_iter_skip"] == 2
    assert doc["config"]["aggregated_iterations"] == 2
    for res, row in zip(doc["results"], rows):
        for key in ("out_of_place_per_iter", "in_place_per_iter"):
            p = res[key]
            assert list(p) == ["skipped_iterations", "min_us", "max_us", "avg_us", "p50_us", "p95_us", "p99_us",
                               "stdev_us", "cv_pct", "times_us"]
            assert p["skipped_iterations"] == 2 and len(p["times_us"]) == 5
            summary = sorted(p["times_us"][2:])
            assert (p["min_us"], p["max_us"]) == (summary[0], summary[-1])
            assert p["avg_us"] == pytest.approx(sum(summary) / 3)
        assert float(row[9]) == pytest.approx(res["out_of_place_per_iter"]["min_us"], abs=0.006)


@pytest.mark.parametrize("args, warning", [
    (["-I", "2"], "per-iteration timing (-I) only supports 0=off or 1=on. Disabling."),
    (["-K", "1"], "per-iteration skip (-K) requires per-iteration timing (-I 1). Disabling."),
    (["-I", "1", "-K", "9"], "per-iteration skip (-K) must be between 0 and 2. Disabling."),
])
def test_per_iteration_values_nccl_tests_turns_off(capsys, args, warning):
    rc, out, err = run(capsys, "all_gather", *HOST, "-b", "4K", "-e", "4K", "-n", "3", *args)
    assert rc == 0 and warning in err


def test_nccl_tests_flags_are_accepted(capsys, tmp_path):
    """-m -N -p -r -V -z -C -S -M with their nccl-tests meaning, or a header line saying why they change nothing."""
    js = tmp_path / "f.json"
    rc, out, err = run(capsys, "all_gather", *HOST, "-b", "4K", "-e", "16K", "-f", "4", "-n", "2", "-m", "3",
                       "-N", "2", "-p", "1", "-r", "1", "-V", "8", "-z", "1", "-C", "1", "-S", "1", "-M", "1",
                       "-o", "avg", "-J", str(js))
    assert rc == 0, out + err
    head, rows = table(out)
    assert "cputime" in head and head[-1] == "timestamp"
    assert [int(r[0]) for r in rows] == [4096, 16384] * 2  # -N 2: the size loop twice
    assert all(re.match(r"\d{4}-\d\d-\d\d$", r[-2]) and re.match(r"\d\d:\d\d:\d\d$", r[-1]) for r in rows)
    for flag in ("-o avg ignored: all_gather does not reduce", "-r 1 ignored", "-p 1 ignored", "-V 8 ignored",
                 "-z 1 ignored"):
        assert f"# {flag}" in out, flag
    assert "agg iters: 3" in out and re.search(r"^# Host memory usage    : Peak resident \d", out, re.MULTILINE)
    doc = json.loads(js.read_text())
    assert set(doc["results"][0]["out_of_place"]) == {"cpu_time", "alg_bw", "bus_bw", "nwrong"}
    assert doc["config"]["aggregated_iterations"] == 3 and doc["config"]["parallel_init"] == "true"
    assert any(n.startswith("-o avg ignored") for n in doc["extras"]["notes"])


def test_dtype_spellings_are_the_same_in_help_and_errors(capsys):
    with pytest.raises(SystemExit):
        perf_main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as e:
        perf_main(["all_gather", *HOST, "-d", "complex"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    listed = err.split("use one of ")[1].strip()
    assert listed.startswith("bfloat16|bf16, half|fp16, float|fp32") and listed in help_text
