# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf on the CPU: backend auto-selection (GPU check mocked), --impl rows with reasons, JSON schema, the
--min-busbw gate, plots from JSON, and the loopback/torchrun benches' own logic (their checks and stand-ins) run
on CPU tensors through a torch model of the loopback world and a one-rank gloo group."""

import json
import subprocess
import sys

import pytest
from nccl_tide.perf import impls, report
from nccl_tide.perf.cli import main as perf_main
from test_perf_cli import parse, parse_full, tide_perf

# ------------------------------------------------------------------------------------------------
# Backend selection and impl rows (no GPU needed)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "requested,gpu,env,want",
    [
        ("auto", False, {}, "host"),
        ("auto", False, {"WORLD_SIZE": "8"}, "host"),  # torchrun without GPUs: still the host backend
        ("auto", True, {}, "loopback"),
        ("auto", True, {"WORLD_SIZE": "1"}, "torchrun"),
        ("auto", True, {"WORLD_SIZE": ""}, "loopback"),
        ("host", True, {"WORLD_SIZE": "2"}, "host"),
        ("loopback", False, {}, "loopback"),
        ("torchrun", False, {}, "torchrun"),
    ],
)
def test_choose_backend(requested, gpu, env, want):
    calls = []

    def probe():
        calls.append(1)
        return gpu

    got = impls.choose_backend(requested, env=env, gpu=probe)
    assert got["backend"] == want
    assert (requested == "auto") == bool(calls)  # the GPU is only probed for auto
    assert got["why"].startswith("auto" if requested == "auto" else "--backend")


def test_choose_backend_rejects_unknown():
    with pytest.raises(ValueError, match="unknown --backend"):
        impls.choose_backend("nccl", env={}, gpu=False)


def test_cli_auto_uses_the_mocked_gpu_check(monkeypatch, capsys):
    """main() asks cli._gpu_present; without a GPU auto runs the host backend and says why in the preamble."""
    from nccl_tide.perf import cli

    monkeypatch.setattr(cli, "_gpu_present", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert perf_main(["all_gather", "--ranks", "2", "-b", "1K", "-e", "1K", "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "(backend host)" in out and "backend chosen by auto: no usable CUDA GPU" in out

    seen = {}

    def fake_make(ranks, device, **kw):
        seen["loopback"] = (ranks, device)
        seen["kw"] = kw
        raise SystemExit(42)  # stop before touching CUDA

    from nccl_tide.perf import loopback_backend

    monkeypatch.setattr(cli, "_gpu_present", lambda: True)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setattr(cli, "check_gpu_backend", lambda backend: None)  # CPU torch here
    monkeypatch.setattr(loopback_backend, "make", fake_make)
    with pytest.raises(SystemExit) as e:
        perf_main(["all_gather", "--ranks", "4", "-b", "1K", "-e", "1K"])
    assert e.value.code == 42 and seen["loopback"] == (4, 0)
    assert seen["kw"] == {"ranks_per_node": 4, "pace_bytes": None}  # loopback default: one node


@pytest.mark.parametrize(
    "extra,want",
    [
        (["--ranks", "4", "--ranks-per-node", "2"], {"ranks_per_node": 2, "pace_bytes": None}),
        (["--ranks", "8", "--ranks-per-node", "1", "--pace-bytes", "64K"], {"ranks_per_node": 1, "pace_bytes": 65536}),
        (["--ranks", "6", "--ranks-per-node", "3"], {"ranks_per_node": 3, "pace_bytes": None}),
        (["--ranks", "6", "--ranks-per-node", "6"], {"ranks_per_node": 6, "pace_bytes": None}),
    ],
)
def test_cli_loopback_accepts_virtual_nodes(monkeypatch, extra, want):
    """--backend loopback with --ranks-per-node R dividing --ranks (R < --ranks: virtual nodes) passes validation and
    reaches the backend with R and the pacing cap."""
    from nccl_tide.perf import cli, loopback_backend

    seen = {}

    def fake_make(ranks, device, **kw):
        seen.update(kw, ranks=ranks)
        raise SystemExit(42)

    monkeypatch.setattr(cli, "check_gpu_backend", lambda backend: None)  # CPU torch here
    monkeypatch.setattr(loopback_backend, "make", fake_make)
    with pytest.raises(SystemExit) as e:
        perf_main(["reduce_scatter", "--backend", "loopback", "-b", "1K", "-e", "1K", *extra])
    assert e.value.code == 42
    assert seen == dict(want, ranks=int(extra[1]))


def test_loopback_layouts_are_multi_node():
    """The loopback backend's layouts (what LoopbackWorld runs) carry R and the pacing cap: N x R virtual nodes.
    Only the C library is needed (no torch, no GPU)."""
    from nccl_tide.dtypes import dtype as to_dtype
    from nccl_tide.perf import collectives, loopback_backend, runner

    b = loopback_backend.LoopbackBackend.__new__(loopback_backend.LoopbackBackend)
    b._topology(8, 2, 512)
    assert (b.W, b.R, b.nodes, b.pace) == (8, 2, 4, 512)
    assert "4 virtual nodes of 2 ranks" in b.describe()
    bf16, fp32 = to_dtype("bf16"), to_dtype("fp32")
    ag = collectives.ALL_GATHER
    case = runner.CaseSpec(ag, [5000, 64 * 9], [1, 64], [(5000,), (9, 64)], bf16, fp32, "sum", 1.0, 1)
    lays = b.layouts(case, case.numels, case.rows)
    try:
        assert [x.rank for x in lays] == list(range(8))
        for x in lays:
            assert (x.world_size, x.ranks_per_node, x.n_nodes, x.pace_bytes) == (8, 2, 4, 512)
        pieces = -(-lays[0].send_bytes // 512)
        assert pieces > 1 and len(lays[0].schedule(1)) == 3 * pieces  # N - 1 blocks, each in several paced steps
    finally:
        for x in lays:
            x.close()
    one = loopback_backend.LoopbackBackend.__new__(loopback_backend.LoopbackBackend)
    one._topology(4, None, None)
    assert (one.R, one.nodes) == (4, 1) and "virtual nodes" not in one.describe()
    with pytest.raises(ValueError, match="must divide"):
        one._topology(6, 4, None)


class _FakeLoopback:
    """Stands for the loopback backend in the CLI (no torch, no GPU): describe/devices/close only; rows come from a
    patched runner.measure."""

    def __init__(self, W, R):
        self.W, self.R = W, R

    def describe(self):
        return f"fake loopback: {self.W} virtual ranks, {self.W // self.R} virtual nodes of {self.R} ranks"

    def devices(self):
        return [{"rank": r, "group": 0, "pid": 1, "hostname": "h", "device": 0, "name": "fake"} for r in range(self.W)]

    def close(self):
        pass


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_cli_loopback_virtual_nodes_header_rows_and_json(coll, monkeypatch, tmp_path, capsys):
    """The CLI around a multi-node loopback run: the topology and busbw lines, the rows that cannot mean anything on
    virtual nodes (RS stand-ins, nccl-ce) printed as not run with their reason, ranks_per_node / nodes in the JSON."""
    from nccl_tide.perf import cli, gpu, loopback_backend, runner

    measured = []

    def fake_measure(backend, impl, spec, size, count, type_name, redop, world, o, extras):
        measured.append(impl)
        alg, bus = spec.collective.bandwidth(size, world, 10.0)
        return report.Row(
            size, count, type_name, redop, -1, report.Variant(10.0, alg, bus, 0), report.NA, impl=impl, sm_us=0.0
        )

    monkeypatch.setattr(cli, "check_gpu_backend", lambda backend: None)  # CPU torch here
    monkeypatch.setattr(loopback_backend, "make", lambda w, d, ranks_per_node, pace_bytes: _FakeLoopback(w, 2))
    monkeypatch.setattr(gpu, "versions", lambda: {})
    monkeypatch.setattr(runner, "measure", fake_measure)
    js = tmp_path / "vn.json"
    args = [coll, "--backend", "loopback", "--ranks", "4", "--ranks-per-node", "2", "--pace-bytes", "1M"]
    rc = perf_main(args + ["-b", "64K", "-e", "64K", "-n", "1", "-d", "bf16", "--impl", "all", "-J", str(js),
                             "--wide"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "# topology: 4 ranks, 2 ranks per node, 2 virtual nodes, pacing cap 1048576 bytes per schedule step" in out
    assert "# busbw = algbw * (W-1)/W" in out and "does not depend on the node topology" in out
    rows = parse_full(out)
    assert [x[5] for x in rows] == ["tide", "nccl", "fsdp2", "nccl-ce"]
    skipped = {"nccl-ce"} | ({"nccl", "fsdp2"} if coll == "reduce_scatter" else set())
    assert measured == [i for i in ("tide", "nccl", "fsdp2") if i not in skipped]
    for x in rows:
        if x[5] in skipped:
            assert x[6:14] == ("N/A",) * 8 and x[16].startswith("not run"), x
        else:
            assert x[9] == "0" and abs(float(x[8]) - float(x[7]) * 3 / 4) <= 0.011
    if coll == "reduce_scatter":
        assert "no node structure" in [x for x in rows if x[5] == "nccl"][0][16]
    else:
        assert "over the same virtual nodes" in out  # what the AG stand-ins measure here
    doc = json.loads(js.read_text())["extras"]
    c = doc["config"]
    assert (c["nranks"], c["ranks_per_node"], c["nodes"], c["virtual_nodes"]) == (4, 2, 2, True)
    assert c["pace_bytes"] == 1 << 20
    assert doc["busbw_formula"].startswith("busbw = algbw * (W-1)/W")
    if coll == "reduce_scatter":
        assert doc["impls"]["fsdp2"]["not_run_reason"] == impls.MULTI_NODE_RS_REASON
        assert doc["impls"]["fsdp2"]["measured_as"] is None
    else:
        assert "over the same virtual nodes" in doc["impls"]["nccl"]["measured_as"]


def test_parse_impls():
    assert impls.parse_impls("tide") == ["tide"]
    assert impls.parse_impls("nccl, tide,nccl") == ["nccl", "tide"]
    assert impls.parse_impls("all") == list(impls.IMPLS)
    for bad in ("", "tide,mpi", "NCCL"):
        with pytest.raises(ValueError):
            impls.parse_impls(bad)


def test_static_reasons():
    assert impls.static_reason("host", "tide", "all_gather") is None
    for impl in ("nccl", "fsdp2", "nccl-ce"):
        assert "host backend" in impls.static_reason("host", impl, "all_gather")
    assert impls.static_reason("loopback", "nccl", "all_gather") is None  # measured as a named stand-in
    assert "torchrun" in impls.static_reason("loopback", "nccl-ce", "all_gather")
    assert impls.static_reason("torchrun", "nccl-ce", "all_gather") is None
    assert "no reduce-scatter" in impls.static_reason("torchrun", "nccl-ce", "reduce_scatter")
    t = impls.impl_table("loopback", ["tide", "nccl", "fsdp2"], "reduce_scatter", copy_op="chunk_cat", out="fp32")
    assert t["tide"]["measured_as"] is None
    assert "stand-in" in t["nccl"]["measured_as"] and "fp32" in t["nccl"]["measured_as"]
    assert "chunk_cat" in t["fsdp2"]["measured_as"] and "{" not in t["fsdp2"]["measured_as"]
    # Several (virtual) nodes on loopback: the RS stand-ins have no node structure and are not run; the AG stand-ins
    # run over the same virtual nodes and say so; the host backend's reasons do not change.
    for impl in ("nccl", "fsdp2"):
        assert "no node structure" in impls.static_reason("loopback", impl, "reduce_scatter", nodes=2)
        assert impls.static_reason("loopback", impl, "all_gather", nodes=2) is None
        assert impls.static_reason("loopback", impl, "reduce_scatter", nodes=1) is None
        assert "host backend" in impls.static_reason("host", impl, "reduce_scatter", nodes=2)
    t = impls.impl_table("loopback", ["tide", "nccl", "fsdp2"], "all_gather", nodes=4, copy_op="split_with_sizes_copy")
    assert "over the same virtual nodes" in t["nccl"]["measured_as"] and t["nccl"]["not_run_reason"] is None
    assert "split_with_sizes_copy" in t["fsdp2"]["measured_as"]


def test_host_rows_for_every_impl_with_reasons(tmp_path):
    js = tmp_path / "r.json"
    r = tide_perf(
        "all_gather",
        "--backend",
        "host",
        "--ranks",
        "4",
        "-b",
        "4K",
        "-e",
        "16K",
        "-f",
        "4",
        "-n",
        "2",
        "-d",
        "bf16",
        "--impl",
        "all",
        "-J",
        str(js),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = parse_full(r.stdout)
    assert [x[5] for x in rows] == ["tide", "nccl", "fsdp2", "nccl-ce"] * 2  # side by side, per size, in order
    for x in rows:
        if x[5] == "tide":
            assert x[9] == "0" and x[16] is None and float(x[6]) > 0
        else:
            assert x[6:14] == ("N/A",) * 8 and "not run: host backend" in x[16]
    full = json.loads(js.read_text())
    assert [x["size"] for x in full["results"]] == [4096, 16384]  # nccl-tests' results: the first impl's rows
    doc = full["extras"]
    assert doc["config"]["impls"] == ["tide", "nccl", "fsdp2", "nccl-ce"]
    assert [x["impl"] for x in doc["results"]] == ["tide", "nccl", "fsdp2", "nccl-ce"] * 2
    assert all(x["ran"] == (x["impl"] == "tide") for x in doc["results"])
    assert doc["impls"]["nccl"]["not_run_reason"].startswith("not run")
    assert doc["average_bus_bandwidth_impl"] == "tide"
    assert doc["average_bus_bandwidth_by_impl"]["nccl"] == 0.0
    assert "N/A (did not run)" in r.stdout


def test_json_schema(tmp_path):
    """nccl-tests' JSON file version 3 key for key, tide-perf's own keys under `extras` only."""
    js = tmp_path / "ag.json"
    args = ["all_gather", "--ranks", "2", "-b", "1K", "-e", "2K", "-f", "2", "-n", "1", "-J", str(js)]
    r = tide_perf(*args, wide=False)
    assert r.returncode == 0, r.stderr
    full = json.loads(js.read_text())
    assert list(full) == ["version", "start_time", "args", "env", "nccl_version", "config", "results",
                          "out_of_bounds", "average_bus_bandwidth", "errors", "end_time", "extras"]
    assert full["version"] == 3
    assert list(full["config"]) == ["nthreads", "ngpus", "minimum_bytes", "maximum_bytes", "step_factor",
                                    "warmup_iters", "iterations", "aggregated_iterations", "validation", "graph",
                                    "blocking_collectives", "per_iter_timing", "per_iter_skip", "parallel_init",
                                    "devices"]
    dev = full["config"]["devices"][0]
    assert list(dev) == ["rank", "group", "pid", "hostname", "device", "device_hex", "device_info"]
    assert isinstance(dev["device"], int) and len(full["config"]["devices"]) == 2  # one per (simulated) rank
    assert full["average_bus_bandwidth"]["okay"] == "unchecked"
    res = full["results"][0]
    assert list(res) == ["size", "count", "type", "redop", "root", "out_of_place", "in_place", "actual_iterations",
                         "experiment_name"]
    assert set(res["out_of_place"]) == {"time", "alg_bw", "bus_bw", "nwrong"}
    doc = full["extras"]
    for key in ("collective", "command_line", "argv", "versions", "backend", "backend_choice", "date_utc", "config",
                "impls", "results", "min_busbw", "notes"):
        assert key in doc, key
    assert doc["command_line"] == "tide-perf " + " ".join(args)
    assert doc["backend"] == "host" and doc["min_busbw"] is None
    assert {"nccl_tide", "library", "python"} <= set(doc["versions"])
    res = doc["results"][0]
    assert set(res) == {
        "impl",
        "size",
        "count",
        "type",
        "redop",
        "out_of_place",
        "in_place",
        "sm_time_us",
        "gemm_slowdown",
        "host_issue_us_per_rank",
        "gpu_latency_us",
        "ran",
        "note",
    }
    assert set(res["out_of_place"]) == {"time", "alg_bw", "bus_bw", "nwrong"}
    assert res["sm_time_us"] is None and res["gemm_slowdown"] is None  # host backend: no GPU figures
    assert res["host_issue_us_per_rank"] is None and res["gpu_latency_us"] is None
    assert doc["config"]["sm_time"] is False and doc["config"]["interfere"] == "none"
    # no key of nccl-tests' config is repeated in tide-perf's
    assert not set(doc["config"]) & set(full["config"]) and "devices" not in doc


# ------------------------------------------------------------------------------------------------
# --min-busbw (nccl-tests: fail when the average bus bandwidth < 0.9 x the minimum)
# ------------------------------------------------------------------------------------------------


def test_min_busbw_gate(tmp_path):
    base = ["all_gather", "--ranks", "4", "-b", "64K", "-e", "64K", "-n", "2", "-d", "bf16"]
    js = tmp_path / "a.json"
    r = tide_perf(*base, "-J", str(js))
    assert r.returncode == 0
    avg = json.loads(js.read_text())["average_bus_bandwidth"]
    assert avg["bandwidth"] > 0 and avg["okay"] == "unchecked"  # nccl-tests' word when no minimum is set
    high = tide_perf(*base, "--min-busbw", "1e6")
    assert high.returncode == 7  # nccl-tests' testNumResults
    assert parse(high.stdout)[1]["Out of bounds values"] == "0"  # failed on bandwidth, not on data
    assert high.stdout.split("Avg bus bandwidth")[1].split("\n")[0].endswith("FAILED")
    low = tide_perf(*base, "--min-busbw", "1e-6", "-J", str(js), "--overwrite")
    assert low.returncode == 0 and "OK" in low.stdout.split("Avg bus bandwidth")[1].split("\n")[0]
    assert json.loads(js.read_text())["average_bus_bandwidth"]["okay"] == "true"
    # nccl-tests' environment variable works too
    env = tide_perf(*base, env={"NCCL_TESTS_MIN_BW": "1e6"})
    assert env.returncode == 7


def test_busbw_gate_rule():
    assert report.busbw_gate_failed(89.0, 100.0) and not report.busbw_gate_failed(90.0, 100.0)
    assert not report.busbw_gate_failed(0.0, None)


def test_unavailable_rows_do_not_count_in_the_average():
    ok = report.Row(1024, 8, "float", "none", -1, report.Variant(1.0, 2.0, 1.5, 0), report.NA, impl="tide")
    na = report.Row(1024, 8, "float", "none", -1, report.NA, report.NA, impl="nccl", note="not run: x", ok=False)
    assert report.avg_busbw([ok, na]) == 1.5 and report.avg_busbw([ok, na], "nccl") == 0.0
    assert report.row_line(na).split()[13] == "nccl" and "not run" not in report.row_line(na)
    assert report.note_lines([ok, na]) == ["# note nccl all: not run: x"]  # the note is a comment line


# ------------------------------------------------------------------------------------------------
# Plots
# ------------------------------------------------------------------------------------------------


def test_plot_from_json(tmp_path):
    pytest.importorskip("matplotlib")
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    r = tide_perf(
        "all_gather",
        "--ranks",
        "4",
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "4",
        "-n",
        "1",
        "--impl",
        "tide,nccl",
        "-J",
        str(js),
    )
    assert r.returncode == 0
    p = subprocess.run(
        [sys.executable, "-m", "nccl_tide.perf", "plot", str(js), str(png)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "tide" in p.stdout and "nccl" not in p.stdout.split("(")[1]  # nccl did not run: nothing drawn
    png2 = tmp_path / "direct.png"
    r = tide_perf("all_gather", "--ranks", "2", "-b", "1K", "-e", "4K", "-f", "2", "-n", "1", "--plot", str(png2))
    assert r.returncode == 0 and png2.stat().st_size > 5000


def test_plot_series_uses_only_rows_that_ran():
    from nccl_tide.perf.plot import series

    doc = {
        "results": [
            {"impl": "tide", "size": 1024, "ran": True, "out_of_place": {"bus_bw": 2.0}, "sm_time_us": 0.0},
            {"impl": "nccl", "size": 1024, "ran": False, "out_of_place": {"bus_bw": None}, "sm_time_us": None},
            {"impl": "tide", "size": 4096, "ran": True, "out_of_place": {"bus_bw": 3.0}, "sm_time_us": None},
        ]
    }
    assert series(doc) == {"tide": [(1024, 2.0, 0.0), (4096, 3.0, None)], "nccl": []}


def test_plot_without_matplotlib_names_the_pip_command(tmp_path, monkeypatch, capsys):
    from nccl_tide.perf import plot

    js = tmp_path / "r.json"
    js.write_text(json.dumps({"results": []}))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert plot.main([str(js), str(tmp_path / "x.png")]) == 3
    assert "pip install matplotlib" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        perf_main(["all_gather", "--ranks", "2", "-b", "1K", "-e", "1K", "--plot", str(tmp_path / "y.png")])
    assert e.value.code == 2 and "pip install matplotlib" in capsys.readouterr().err


def test_plot_rejects_other_json(tmp_path):
    from nccl_tide.perf import plot

    js = tmp_path / "x.json"
    js.write_text("[1, 2]")
    assert plot.main([str(js), str(tmp_path / "x.png")]) == 2


# ------------------------------------------------------------------------------------------------
# GPU measurement helpers that are plain Python
# ------------------------------------------------------------------------------------------------


def test_parse_kernel_time():
    from nccl_tide.perf.gpu import parse_kernel_time

    ev = [
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "dur": 10.0},
        {"ph": "X", "cat": "Kernel", "name": "split_with_sizes_copy_kernel", "dur": 6.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "dur": 8.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "dur": 100.0},
        {"ph": "i", "cat": "kernel", "name": "marker"},
    ]
    r = parse_kernel_time(ev, iters=2)
    assert r["n_kernels"] == 1.0 and r["kernel_us"] == 8.0 and r["memcpy_us"] == 4.0 and r["n_memcpy"] == 0.5
    # the same-device copy ran on SMs (perf/gpu.py): it is SM time, and counted once
    assert r["local_copy_us"] == 4.0 and r["sm_us"] == 12.0


def test_sm_time_counts_same_device_copies_and_memsets_not_peer_or_host_copies():
    from nccl_tide.perf.gpu import parse_kernel_time, runs_on_sms

    ev = [
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "dur": 3.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy PtoP (Device -> Device)", "dur": 50.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "dur": 70.0},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "dur": 2.0},
        {"ph": "X", "cat": "kernel", "name": "memcpy32_post", "dur": 5.0},  # a graph memcpy node run as a kernel
    ]
    r = parse_kernel_time(ev, iters=1)
    assert r["memcpy_us"] == 125.0 and r["local_copy_us"] == 5.0 and r["kernel_us"] == 5.0 and r["sm_us"] == 10.0
    assert runs_on_sms("gpu_memset", "Memset (Device)") and not runs_on_sms("gpu_memcpy", "Memcpy PtoP (x)")


def test_side_ops_rule():
    from nccl_tide.perf.gpu import side_ops_for

    assert side_ops_for(unit_ms=0.1, gemm_ms=0.17) == 1 + 16  # ceil((0.51 + 1) / 0.1) = 16
    assert side_ops_for(unit_ms=100.0, gemm_ms=0.17) == 3  # at least 2 after the first
    assert side_ops_for(unit_ms=1e-6, gemm_ms=0.17) == 200


def test_gemm_slowdown_holds_the_gpu_until_everything_is_enqueued(monkeypatch):
    """Gemm.slowdown's hold: untimed first runs measure the host's enqueue time (sizing the sleep) and the side
    work's GPU time per call (re-deriving K, without a barrier only); a timed run whose hold ended before the GEMM
    was enqueued counts as late and doubles the hold; no run is repeated. A fake torch.cuda records the calls."""
    import contextlib
    import types

    from nccl_tide.perf import gpu

    log = {"sleeps": [], "queries": 0}

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def query(self):
            log["queries"] += 1
            return log["queries"] - 1 in log["late"]

        def elapsed_time(self, other):
            return 0.5  # a->b (the GEMM): 0.5 ms; start->last (the side work): 0.5 ms; b->last > 0: covered

    cuda = types.SimpleNamespace(
        synchronize=lambda: None,
        stream=lambda s: contextlib.nullcontext(),
        Event=Event,
        _sleep=lambda cycles: log["sleeps"].append(cycles / gpu.SLEEP_CYCLES),
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(gpu.Gemm, "__call__", lambda self: None)

    def gemm():
        g = object.__new__(gpu.Gemm)
        g.runs, g.alone = 5, {"median_ms": 0.25}
        g.head = g.side = g.stream = types.SimpleNamespace(wait_stream=lambda s: None, wait_event=lambda e: None)
        return g

    # one process: runs 0-1 untimed (K re-derived from 0.5 ms of side work over K calls), queries 3 and 4 late
    log.update(sleeps=[], queries=0, late={3, 4})
    calls = []
    r = gemm().slowdown(lambda: calls.append(1), unit_ms=0.5)
    k0 = gpu.side_ops_for(0.5, 0.25)
    k = gpu.side_ops_for(0.5 / k0, 0.25)
    assert k > k0 and r["side_calls"] == k and r["side_call_gpu_ms"] == pytest.approx(0.5 / k0)
    assert len(calls) == 2 * k0 + 5 * k  # two untimed runs + 5 timed runs, none repeated
    assert r["runs"] == 5 and r["covered_runs"] == 5 and r["late_runs"] == 2 and r["slowdown"] == 2.0
    hold = log["sleeps"]
    assert hold[0] == 1.0 and hold[1] >= 1.0 and hold[2] >= hold[1]  # 1 ms, then 1 ms + 1.5x the enqueue time
    h = hold[3]
    assert hold[3:] == [pytest.approx(x, rel=1e-6) for x in (h, 2 * h, 4 * h, 4 * h)]
    assert r["hold_ms"] == pytest.approx(4 * h, rel=1e-6)
    # with a barrier (several processes): K stays as the caller's time gives it, one untimed run
    log.update(sleeps=[], queries=0, late=set())
    calls = []
    r = gemm().slowdown(lambda: calls.append(1), unit_ms=0.5, barrier=lambda: None)
    assert r["side_calls"] == k0 and len(calls) == 6 * k0 and r["late_runs"] == 0 and r["side_call_gpu_ms"] is None


def test_matplotlib_is_an_optional_extra(repo):
    tomllib = pytest.importorskip("tomllib")

    proj = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    assert proj["optional-dependencies"]["plot"] == ["matplotlib"]
    assert not any("matplotlib" in d for d in proj["dependencies"])
    # and nothing outside nccl_tide/perf/plot.py imports it
    for path in (repo / "pytorch_glue" / "nccl_tide").rglob("*.py"):
        if path.name != "plot.py":
            assert "import matplotlib" not in path.read_text(), path
