# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf: nccl-tests table and footer, JSON, exit status on wrong results, flag handling."""

import json
import os
import re
import subprocess
import sys

import pytest
from nccl_tide.perf.options import parse_size

# A data row with --wide: nccl-tests' 13 columns in nccl-tests' places (size count type redop root, 4 out-of-place,
# 4 in-place), then tide-perf's: impl, SM, GEMM, host, gpu. A row's note is a `# note IMPL SIZES: text` line.
ROW = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)"
    + r"\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)" * 2
    + r"\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$"
)
NOTE = re.compile(r"^# note (\S+) (\S+): (.*)$", flags=re.MULTILINE)


def tide_perf(*args, env=None, timeout=300, wide=True):
    e = dict(os.environ)
    e.pop("TIDE_PERF_TEST_CORRUPT", None)
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "nccl_tide.perf", *args, *(["--wide"] if wide else [])], capture_output=True,
        text=True, env=e, timeout=timeout
    )


def notes(stdout):
    """{(impl, size): note} of the `# note` lines (SIZES `all` is every size of that impl)."""
    out = {}
    for impl, where, text in NOTE.findall(stdout):
        for size in (["all"] if where == "all" else where.split(",")):
            out[(impl, size)] = text
    return out


def parse_full(stdout):
    """Every --wide table row as a tuple: size, count, type, redop, root, impl, 4 oop, 4 ip, SM, GEMM, note (None
    without one), host, gpu: the impl first, which is how these tests index rows."""
    by_row = notes(stdout)
    rows = []
    for line in stdout.splitlines():
        if line and not line.startswith("#"):
            g = ROW.match(line).groups()
            note = by_row.get((g[13], g[0]), by_row.get((g[13], "all")))
            rows.append(g[:5] + (g[13],) + g[5:13] + g[14:16] + (note,) + g[16:18])
    return rows


def parse(stdout, impl="tide"):
    """nccl-tests' 13 columns (size .. in-place #wrong) of the rows of one impl, and the footer."""
    rows = [g[:5] + g[6:14] for g in parse_full(stdout) if g[5] == impl]
    foot = dict(re.findall(r"^# (Out of bounds values|Avg bus bandwidth)\s*: (\S+)", stdout, flags=re.MULTILINE))
    return rows, foot


def test_all_gather_table(tmp_path):
    js = tmp_path / "ag.json"
    r = tide_perf(
        "all_gather",
        "--backend",
        "host",
        "--ranks",
        "8",
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "4",
        "-c",
        "1",
        "-n",
        "3",
        "-d",
        "bf16",
        "-J",
        str(js),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# Collective test starting: all_gather_perf" in r.stdout
    assert "# Collective test concluded: all_gather_perf" in r.stdout
    rows, foot = parse(r.stdout)
    assert [int(x[0]) for x in rows] == [1024, 4096, 16384, 65536]
    for size, count, typ, redop, root, *vals in rows:
        assert (typ, redop, root) == ("bfloat16", "none", "-1")
        assert int(count) * 8 * 2 == int(size) and (int(count) * 2) % 16 == 0
        t, alg, bus, wrong = (float(v) for v in vals[:4])
        assert wrong == 0 and t > 0 and abs(bus - alg * 7 / 8) <= 0.011 + alg * 0.01
        assert vals[7] == "0"  # in-place checked too
    assert foot["Out of bounds values"] == "0"
    avg = float(foot["Avg bus bandwidth"])
    assert avg > 0
    doc = json.loads(js.read_text())
    assert len(doc["results"]) == 4 and doc["results"][0]["out_of_place"]["nwrong"] == 0
    assert doc["extras"]["versions"]["nccl_tide"] and "tide-perf all_gather" in doc["extras"]["command_line"]
    assert doc["out_of_bounds"]["count"] == 0
    assert doc["average_bus_bandwidth"]["bandwidth"] == pytest.approx(avg, rel=1e-3)


@pytest.mark.parametrize("op", ["sum", "avg", "premul"])
def test_reduce_scatter_ops_and_in_place(op):
    r = tide_perf(
        "reduce_scatter",
        "--ranks",
        "6",
        "--ranks-per-node",
        "3",
        "-b",
        "4K",
        "-e",
        "16K",
        "-f",
        "2",
        "-d",
        "bf16",
        "--out-type",
        "same",
        "-o",
        op,
        "-n",
        "2",
        "-c",
        "1",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows, foot = parse(r.stdout)
    assert len(rows) == 3 and all(x[3] == op and x[2] == "bfloat16" for x in rows)
    assert all(x[8] == "0" for x in rows)
    # In-place (output inside the input) is checked where the host executor accepts it, else N/A with a reason.
    assert all(x[12] == "0" for x in rows) or (
        all(x[9:] == ("N/A",) * 4 for x in rows)
        and "# in-place reduce-scatter: TIDE's output may not overlap its input" in r.stdout
    )
    assert foot["Out of bounds values"] == "0"


def test_reduce_scatter_fp32_out_in_place_is_na():
    r = tide_perf("reduce_scatter", "--ranks", "4", "-b", "1K", "-e", "1K", "-d", "fp16", "-n", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    rows, _ = parse(r.stdout)
    assert rows[0][8] == "0" and rows[0][9:] == ("N/A",) * 4


def test_check_disabled_prints_na():
    r = tide_perf("all_gather", "--ranks", "2", "-b", "1K", "-e", "1K", "-c", "0", "-n", "1")
    assert r.returncode == 0
    rows, _ = parse(r.stdout)
    assert rows[0][8] == "N/A" and rows[0][12] == "N/A" and rows[0][5] != "N/A"


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_corrupted_result_fails(coll):
    """The test-only hook flips one byte of the checked output: it must be counted and fail the run."""
    args = [coll, "--ranks", "4", "-b", "4K", "-e", "4K", "-d", "bf16", "-n", "1", "-c", "1"]
    r = tide_perf(*args, env={"TIDE_PERF_TEST_CORRUPT": "1"})
    assert r.returncode == 7  # nccl-tests' status for wrong elements
    rows, foot = parse(r.stdout)
    assert int(rows[0][8]) == 1
    assert int(foot["Out of bounds values"]) >= 1 and "FAILED" in r.stdout
    assert tide_perf(*args).returncode == 0  # and the same run without the hook passes


def test_model_layout_is_one_row():
    r = tide_perf("all_gather", "--ranks", "2", "--layout", "llama3-8b-layer", "-d", "fp8_e4m3", "-c", "1", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "llama3-8b-layer" in r.stdout and "the layout fixes the size" in r.stdout
    rows, _ = parse(r.stdout)
    assert len(rows) == 1 and int(rows[0][0]) == 218_112_000 and int(rows[0][1]) == 109_056_000
    assert rows[0][8] == "0" and rows[0][12] == "0"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--backend", "cuda"], "unknown --backend"),
        (["--backend", "nope"], "unknown --backend"),
        (["--impl", "tide,mpi"], "unknown --impl"),
        (["--interfere", "gemm", "--backend", "host"], "needs a GPU backend"),
        (["--backend", "loopback", "--ranks", "9"], "2..8 virtual ranks"),
        (["--backend", "loopback", "--ranks", "6", "--ranks-per-node", "4"], "must divide --ranks 6"),
        (["--backend", "loopback", "--ranks", "4", "--ranks-per-node", "3"], "divisors: 1, 2, 4"),
        (["--backend", "loopback", "--ranks", "4", "--ranks-per-node", "0"], "must divide"),
        (["--backend", "loopback", "--ranks", "4", "--ranks-per-node", "2", "--pace-bytes", "0"], "--pace-bytes must"),
        (["--pace-bytes", "4Q"], "invalid size"),
        (["--backend", "torchrun", "--pace-bytes", "4K"], "NCCL_TIDE_PACE_BYTES"),
        (["--min-busbw", "fast"], "invalid float value"),
        (["-d", "complex"], "-d 'complex': unknown type"),
        (["-o", "max"], "unknown reduction op"),
        (["--ranks", "6", "--ranks-per-node", "4"], "must divide"),
        (["-b", "12X"], "invalid size"),
    ],
)
def test_bad_flags(args, needle):
    r = tide_perf("all_gather", "-b", "1K", "-e", "1K", *args)
    assert r.returncode != 0
    assert needle in r.stderr, r.stderr


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("rpn,pace", [(2, "4K"), (1, "1K"), (4, None)])
def test_host_multi_node_matches_the_reference(coll, rpn, pace, tmp_path):
    """Host backend over several simulated nodes (--ranks-per-node < --ranks), with a pacing cap that cuts every block
    into many schedule steps: bit-exact against the numpy reference; topology and busbw rule in header and JSON."""
    js = tmp_path / "mn.json"
    args = [coll, "--backend", "host", "--ranks", "8", "--ranks-per-node", str(rpn), "-b", "16K", "-e", "64K"]
    args += ["-f", "4", "-n", "1", "-c", "1", "-d", "bf16", "-J", str(js)] + (["--pace-bytes", pace] if pace else [])
    r = tide_perf(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    nodes = 8 // rpn
    assert f"# topology: 8 ranks, {rpn} ranks per node, {nodes} simulated nodes" in r.stdout
    assert "# busbw = algbw * (W-1)/W" in r.stdout
    rows, foot = parse(r.stdout)
    assert len(rows) == 2 and foot["Out of bounds values"] == "0"
    for x in rows:
        assert x[8] == "0"  # out-of-place checked, zero wrong
        alg, bus = float(x[6]), float(x[7])
        assert abs(bus - alg * 7 / 8) <= 0.011 + alg * 0.01  # nccl-tests' factor whatever the topology
    doc = json.loads(js.read_text())
    c = doc["extras"]["config"]
    assert (c["nranks"], c["ranks_per_node"], c["nodes"], c["virtual_nodes"]) == (8, rpn, nodes, False)
    if pace:
        assert c["pace_bytes"] == parse_size(pace)
    else:  # the layout default (NCCL_TIDE_PACE_BYTES or 8 MiB), read the same way in this process
        from nccl_tide import Layout

        with Layout([8], "fp32", 8, rpn) as lay:
            assert c["pace_bytes"] == lay.pace_bytes
    assert doc["extras"]["busbw_formula"].startswith("busbw = algbw * (W-1)/W")


def test_reduce_scatter_rejects_int_types():
    r = tide_perf("reduce_scatter", "-d", "int8", "-b", "1K", "-e", "1K")
    assert r.returncode != 0 and "bf16" in r.stderr


def test_parse_size():
    assert [parse_size(s) for s in ("1", "1K", "4M", "2G", "17")] == [1, 1024, 4 << 20, 2 << 30, 17]
