# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf's torchrun backend on a real NCCL world of 2 ranks sharing ONE GPU (marker gpu): every rank its own
NCCL host (NCCL_HOSTID), declared one TIDE node (NCCL_TIDE_RANKS_PER_NODE=2), --ranks-per-gpu 2.

The processes are started here with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_*),
since torchrun gives every rank the same environment and NCCL_HOSTID must differ per rank. Checked: exit status 0,
no wrong element in any row, a measured row of each implementation in the JSON (extras.results), the shared-GPU
caveat in the header and in the JSON's notes, one device entry per rank with its PCI bus id. Without NCCL_HOSTID,
NCCL refuses two ranks of one host on one GPU and tide-perf says what to set.
"""

import json
import sys

import pytest
from multirank.harness import free_port, run_processes

from nccl_tide.devices import SHARED_GPU_CAVEAT

pytestmark = [pytest.mark.gpu]
WORLD = 2
NCCL_WORLD_ENV = {
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_IB_DISABLE": "1",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONUNBUFFERED": "1",
}


@pytest.fixture(autouse=True)
def _gpu(torch_cuda, cuda_lib):
    pass


def run_perf(tmp_path, args, host_per_rank=True, timeout=300):
    """`python -m nccl_tide.perf ARGS` on WORLD processes of one GPU; rank r is NCCL host tide-perf-host-r when
    host_per_rank. Returns every rank's output."""
    port = free_port()

    def argv(r):
        env = [f"RANK={r}", f"WORLD_SIZE={WORLD}", f"LOCAL_RANK={r}", f"LOCAL_WORLD_SIZE={WORLD}",
               "MASTER_ADDR=127.0.0.1", f"MASTER_PORT={port}"]
        if host_per_rank:
            env.append(f"NCCL_HOSTID=tide-perf-host-{r}")
        return ["env", *env, sys.executable, "-m", "nccl_tide.perf", *args]

    env = {**NCCL_WORLD_ENV, "NCCL_TIDE_RANKS_PER_NODE": str(WORLD), "NCCL_TIDE_RANKS_PER_GPU": ""}
    return run_processes(argv, WORLD, timeout, env=env)


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_perf_rows_on_ranks_sharing_one_gpu(tmp_path, coll):
    js = tmp_path / f"{coll}.json"
    impl = "tide,nccl,fsdp2" + (",nccl-dtype" if coll == "reduce_scatter" else "")
    # --sm-time 0: no profiler session per row (the SM column is test_perf_gpu.py's)
    args = [coll, "--backend", "torchrun", "--ranks-per-gpu", str(WORLD), "--impl", impl, "-c", "1", "-b", "1M",
            "-e", "4M", "-f", "4", "-n", "3", "-d", "bf16", "--sm-time", "0", "--wide", "-J", str(js)]
    outs = run_perf(tmp_path, args)
    shown = "\n".join(f"--- rank {o.rank} (exit {o.returncode}) ---\n{o.stdout[-5000:]}" for o in outs)
    assert all(o.returncode == 0 for o in outs), shown
    head = outs[0].stdout
    assert f"# {SHARED_GPU_CAVEAT}" in head, head
    assert "GPU(s) shared by 2 ranks" in head, head

    doc = json.loads(js.read_text())
    extras = doc["extras"]
    assert SHARED_GPU_CAVEAT in extras["notes"]
    assert extras["backend"] == "torchrun" and extras["config"]["nranks"] == WORLD
    assert doc["out_of_bounds"]["count"] == 0, shown
    devs = doc["config"]["devices"]
    assert len(devs) == WORLD and len({d["device_hex"] for d in devs}) == 1, devs
    assert all(d["device_hex"] not in ("", "unknown") for d in devs), devs
    assert "NCCL_TIDE_RANKS_PER_GPU=2" in doc["env"]

    rows = extras["results"]
    for name in impl.split(","):
        mine = [r for r in rows if r["impl"] == name]
        assert len(mine) == 2, (name, rows)  # 1M, 4M
        for r in mine:
            assert r["out_of_place"]["time"] and r["out_of_place"]["nwrong"] == 0, (name, r)
    notes = {r["impl"]: r.get("note") or "" for r in rows}
    assert "stand-in" not in json.dumps(extras["impls"]) and not any("stand-in" in n for n in notes.values())
    if coll == "all_gather":
        assert "all_gather_copy_in" in notes["fsdp2"] and "split_with_sizes_copy" in notes["fsdp2"], notes
    else:
        assert "reduce type fp32" in notes["nccl"] and "reduce type bf16" in notes["nccl-dtype"], notes
        assert "chunk_cat" in notes["fsdp2"], notes


def test_nccl_refusal_of_a_shared_gpu_is_explained(tmp_path):
    """No NCCL_HOSTID: both ranks are one NCCL host on one GPU, which NCCL (without NCCL_MULTI_RANK_GPU_ENABLE)
    refuses; tide-perf ends with exit status 2 and the settings that allow it, not a traceback."""
    args = ["all_gather", "--backend", "torchrun", "--ranks-per-gpu", str(WORLD), "-b", "1M", "-e", "1M", "-n", "1"]
    outs = run_perf(tmp_path, args, host_per_rank=False, timeout=240)
    shown = "\n".join(f"--- rank {o.rank} (exit {o.returncode}) ---\n{o.stdout[-4000:]}" for o in outs)
    assert all(o.returncode == 2 for o in outs), shown
    for o in outs:
        assert "tide-perf: error:" in o.stdout and "NCCL_HOSTID" in o.stdout, shown
        assert "NCCL_MULTI_RANK_GPU_ENABLE" in o.stdout and "Traceback" not in o.stdout, shown
