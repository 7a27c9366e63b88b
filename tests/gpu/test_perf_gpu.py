# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf on one GPU (marker gpu; skipped without CUDA): the loopback backend with every impl, -c 1 with zero
wrong elements, JSON; a model layout; torchrun at world size 1. --interfere gemm, which measures speed, is
test_perf_interference_gpu.py's.
Each case is a subprocess with a timeout (a hung collective fails the test instead of the job). The SM column
(torch.profiler, a session per row) is measured where a test checks it: the other runs pass --sm-time 0. The row
formats, options and JSON of every backend are the CPU tests' (tests/unit/test_perf_*.py, host backend)."""

import json
import os
import re
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

# A data row with --wide: nccl-tests' 13 columns in nccl-tests' places (size count type redop root, 4 out-of-place,
# 4 in-place), then tide-perf's: impl, SM, GEMM, host, gpu. A row's note is a `# note IMPL SIZES: text` line.
ROW = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)"
    + r"\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)" * 2
    + r"\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$"
)
NOTE = re.compile(r"^# note (\S+) (\S+): (.*)$", flags=re.MULTILINE)


def by_name(g):
    """A ROW match's groups as (size, count, type, redop, root, impl, 4 oop, 4 ip, SM, GEMM, host, gpu): the impl
    first, which is how these tests index rows (the table itself puts impl after nccl-tests' columns)."""
    return g[:5] + (g[13],) + g[5:13] + g[14:18]
ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "CUDA_DEVICE_MAX_CONNECTIONS": "32",
    "PYTHONUNBUFFERED": "1",
}


def run(args, timeout=180, torchrun=False):
    env = dict(os.environ)
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TIDE_PERF_TEST_CORRUPT"):
        env.pop(k, None)
    env.update(ENV)
    if torchrun:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(port)]
        cmd += args
    else:
        cmd = [sys.executable, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return r


def rows(stdout):
    notes = {}
    for impl, where, text in NOTE.findall(stdout):
        for size in (["all"] if where == "all" else where.split(",")):
            notes[(impl, size)] = text
    out = []
    for line in stdout.splitlines():
        if line and not line.startswith("#"):
            m = ROW.match(line)
            if m:
                g = by_name(m.groups())
                note = notes.get((g[5], g[0]), notes.get((g[5], "all")))
                out.append(
                    {
                        "size": int(g[0]),
                        "impl": g[5],
                        "time": g[6],
                        "busbw": g[8],
                        "wrong": g[9],
                        "sm": g[14],
                        "gemm": g[15],
                        "note": note or "",
                        "host": g[16],
                        "gpu": g[17],
                    }
                )
    return out


def perf(text, *extra):
    """Arguments of `python -m nccl_tide.perf`: a space-separated string plus extra items (paths), with --wide: one
    row per implementation, tide-perf's columns after nccl-tests'."""
    return ["-m", "nccl_tide.perf", *text.split(), *map(str, extra), "--wide"]


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_loopback_all_impls(coll, tmp_path):
    js = tmp_path / "out.json"
    r = run(perf(f"{coll} --ranks 4 -b 1M -e 16M -f 16 -n 3 -w 1 -c 1 -d bf16 --impl all -J", js))
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    assert "(backend loopback)" in r.stdout and "backend chosen by auto: CUDA GPU" in r.stdout
    got = rows(r.stdout)
    assert [x["impl"] for x in got] == ["tide", "nccl", "fsdp2", "nccl-ce"] * 2  # 1M, 16M
    for x in got:
        if x["impl"] == "nccl-ce":
            assert x["time"] == "N/A" and x["note"].startswith("not run")
            continue
        assert x["wrong"] == "0" and float(x["time"]) > 0 and float(x["busbw"]) > 0, x
        assert x["sm"] != "N/A"
        if x["impl"] != "tide":
            assert "stand-in" in x["note"]
    tide = [x for x in got if x["impl"] == "tide"]
    # Issue cost columns: host issue time per rank and device time of one call, TIDE rows only.
    assert all(float(x["host"]) > 0 and float(x["gpu"]) > 0 for x in tide), tide
    assert all(x["host"] == "N/A" for x in got if x["impl"] != "tide")
    if coll == "all_gather":
        # No kernel of the library's own: the only kernels allowed are copies (a replayed graph's memcpy nodes
        # appear as "memcpy32_post" kernels). The SM column is not 0 on loopback: same-device copies run on SMs
        # on the H200, eager or graphed (benchmarks/copy_engine_probe.cu), and the
        # column counts them (perf/gpu.py); a node's peer copies are copy-engine work.
        names = [d.get("profile", {}).get("kernel_names") or {} for d in
                 json.loads(js.read_text()).get("extras", {}).get("detail", []) if d.get("impl") == "tide"]
        assert names and all("memcpy" in n.lower() or "memset" in n.lower() for ns in names for n in ns), names
    else:
        assert all(float(x["sm"]) > 0.0 for x in tide)  # the phase-2 reduce kernel
    full = json.loads(js.read_text())
    doc = full["extras"]
    assert doc["backend"] == "loopback" and full["out_of_bounds"]["count"] == 0
    assert doc["versions"]["torch"] and doc["versions"]["device"] and doc["versions"]["cuda_runtime"]
    assert "nccl_runtime" in doc["versions"] and len(full["config"]["devices"]) == 4
    assert all(re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}$", d["device_hex"]) for d in full["config"]["devices"])
    assert doc["impls"]["nccl"]["measured_as"].startswith("stand-in")
    assert {x["impl"] for x in doc["results"] if x["ran"]} == {"tide", "nccl", "fsdp2"}


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_loopback_virtual_nodes(coll, tmp_path):
    """--ranks 4 --ranks-per-node 2: TIDE over 2 virtual nodes of 2 ranks on one GPU (multi-node layouts; a 64 KiB
    pacing cap, so from 1 MiB on every AG block takes several schedule steps), checked with -c 1; the stand-ins that
    have no node structure are printed as not run; ranks_per_node and the node count in the JSON."""
    js = tmp_path / "vn.json"
    args = f"{coll} --backend loopback --ranks 4 --ranks-per-node 2 --pace-bytes 64K -b 256K -e 4M -f 16 -n 3 -w 1"
    r = run(perf(f"{args} -c 1 -d bf16 --impl all --sm-time 0 -J", js))
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    assert "# topology: 4 ranks, 2 ranks per node, 2 virtual nodes, pacing cap 65536 bytes" in r.stdout
    assert "2 virtual nodes of 2 ranks" in r.stdout and "# busbw = algbw * (W-1)/W" in r.stdout
    got = rows(r.stdout)
    assert [x["impl"] for x in got] == ["tide", "nccl", "fsdp2", "nccl-ce"] * 2  # 256K, 4M
    skipped = {"nccl-ce"} | ({"nccl", "fsdp2"} if coll == "reduce_scatter" else set())
    for x in got:
        if x["impl"] in skipped:
            assert x["time"] == "N/A" and x["note"].startswith("not run"), x
            continue
        assert x["wrong"] == "0" and float(x["time"]) > 0 and float(x["busbw"]) > 0, x
        if x["impl"] != "tide":
            assert "over the same virtual nodes" in x["note"], x
    full = json.loads(js.read_text())
    doc = full["extras"]
    assert doc["backend"] == "loopback" and full["out_of_bounds"]["count"] == 0
    c = doc["config"]
    assert (c["nranks"], c["ranks_per_node"], c["nodes"], c["virtual_nodes"], c["pace_bytes"]) == (4, 2, 2, True, 65536)
    assert doc["busbw_formula"].startswith("busbw = algbw * (W-1)/W")
    ran = {x["impl"] for x in doc["results"] if x["ran"]}
    assert ran == ({"tide", "nccl", "fsdp2"} if coll == "all_gather" else {"tide"})
    assert all(x["out_of_place"]["nwrong"] == 0 for x in doc["results"] if x["ran"])


def test_loopback_model_layout():
    """A Llama-3.1-8B layer's parameters as the layout (--layout), reduce-scattered, with zero wrong elements."""
    r = run(perf("reduce_scatter --ranks 2 --layout llama3-8b-layer -d bf16 -c 1 --impl tide,fsdp2 --sm-time 0"))
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    got = rows(r.stdout)
    assert [x["impl"] for x in got] == ["tide", "fsdp2"] and all(x["wrong"] == "0" for x in got)


def test_min_busbw_gate_fails_the_run():
    """--min-busbw far above anything reachable fails the run (exit 7, nccl-tests') with zero wrong elements."""
    r = run(perf("all_gather --ranks 2 -b 1M -e 1M -n 2 --sm-time 0 --min-busbw 1e9"))
    assert r.returncode == 7, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Out of bounds values : 0 OK" in r.stdout and re.search(r"Avg bus bandwidth\s*: \S+ FAILED", r.stdout)


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_torchrun_world_size_1(coll, tmp_path):
    js = tmp_path / "tr.json"
    r = run(
        perf(f"{coll} -b 1M -e 1M -n 3 -c 1 -d bf16 --impl tide,nccl,fsdp2,nccl-ce --sm-time 0 -J", js),
        torchrun=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    assert "(backend torchrun)" in r.stdout and "WORLD_SIZE=1" in r.stdout
    got = rows(r.stdout)
    assert [x["impl"] for x in got] == ["tide", "nccl", "fsdp2", "nccl-ce"]
    for x in got:
        if x["impl"] in ("nccl", "fsdp2"):
            assert x["wrong"] == "0" and float(x["time"]) > 0, x
        elif x["impl"] == "nccl-ce":
            assert x["time"] == "N/A" and ("world size 1" in x["note"] or "reduce-scatter" in x["note"])
        else:  # tide over the process group's NCCL communicator: runs, or says why
            # (a TIDE failure here belongs to the NCCL binding: the row must say so, the run goes on)
            assert x["wrong"] == "0" or x["note"].startswith(("not run", "failed")), x
    doc = json.loads(js.read_text())["extras"]
    assert doc["backend"] == "torchrun" and doc["config"]["nranks"] == 1


def test_loopback_per_iteration_timing(tmp_path):
    """-I 1: one CUDA event between iterations; nccl-tests' per-iteration records in the JSON."""
    js = tmp_path / "it.json"
    r = run(perf("all_gather --backend loopback --ranks 4 -b 1M -e 1M -n 6 -m 2 -I 1 -K 1 -d bf16 --sm-time 0 -J", js))
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    doc = json.loads(js.read_text())
    for res in doc["results"]:
        p = res["out_of_place_per_iter"]
        assert len(p["times_us"]) == 6 and all(t > 0 for t in p["times_us"]) and p["skipped_iterations"] == 1
        assert p["min_us"] <= p["avg_us"] <= p["max_us"]
        # the mean of the iterations is the row's time per call
        assert res["out_of_place"]["time"] == pytest.approx(sum(p["times_us"]) / 6, rel=1e-6)


