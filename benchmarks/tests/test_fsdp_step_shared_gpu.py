# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/fsdp_step.py with several ranks per GPU: the loss comparison and the table on the CPU; on one GPU
(marker gpu) the step mode at world size 2 with --ranks-per-gpu 2, each rank its own NCCL host (NCCL_HOSTID) declared
one TIDE node, stock and TIDE bit-identical losses, the shared-GPU caveat in the banner and the JSON."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1]
WORLD = 2


def ran(variant, losses, **kw):
    return {"variant": variant, "ran": True, "losses": losses, "step_ms": {"median": 1.0, "min": 1.0, "max": 1.0},
            "peak_mem_GiB": 1.0, **kw}


def test_losses_compared_with_stock(rng):
    from fsdp_step import compare_losses, loss_cell, step_table

    base = [float(x) for x in rng.standard_normal(5) + 8.0]
    off = list(base)
    k = int(rng.integers(0, len(off)))
    off[k] += 3e-3
    rows = [ran("stock", base), ran("tide", list(base)), ran("symm", off),
            {"variant": "tide-dedicated", "ran": False, "reason": "unavailable: x"}]
    compare_losses(rows)
    assert "loss_vs_stock" not in rows[0] and "loss_vs_stock" not in rows[3]
    assert rows[1]["loss_vs_stock"] == {"equal": True, "max_abs_diff": 0.0}
    assert rows[2]["loss_vs_stock"]["equal"] is False
    assert rows[2]["loss_vs_stock"]["max_abs_diff"] == pytest.approx(3e-3, rel=1e-6)
    assert [loss_cell(r) for r in rows[:3]] == ["-", "=", "max diff 3.00e-03"]
    table = step_table(rows)
    head = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
             for line in table.splitlines()[2:]}
    col = head.index("loss vs stock")
    assert cells["tide"][col] == "=" and cells["symm"][col] == "max diff 3.00e-03" and cells["stock"][col] == "-"
    assert cells["tide-dedicated"][-1] == "unavailable: x" and len(cells["tide-dedicated"]) == len(head)


def test_no_stock_run_means_nothing_to_compare():
    from fsdp_step import compare_losses, loss_cell

    rows = [{"variant": "stock", "ran": False, "reason": "failed: x"}, ran("tide", [1.0, 2.0])]
    compare_losses(rows)
    assert rows[1]["loss_vs_stock"] is None and loss_cell(rows[1]) == "-"
    rows = [ran("stock", [1.0]), ran("tide", [1.0, 2.0])]  # different step counts: not comparable
    compare_losses(rows)
    assert rows[1]["loss_vs_stock"] is None


def test_ranks_per_gpu_and_deterministic_flags():
    from fsdp_step import parser

    a = parser().parse_args(["--ranks-per-gpu", "2", "--deterministic"])
    assert a.ranks_per_gpu == 2 and a.deterministic
    a = parser().parse_args([])
    assert a.ranks_per_gpu is None and not a.deterministic


# ---------------------------------------------------------------------------------------------------------------
# One GPU, two ranks
# ---------------------------------------------------------------------------------------------------------------

SMALL = ("--layers 2 --hidden 512 --heads 8 --kv-heads 4 --ffn 1024 --vocab 1000 --seq 256 --tokens 1024 --warmup 1 "
         "--steps 3 --profile-steps 1 --variant-timeout 120").split()


def run_world(tmp_path, variants, timeout=420):
    """fsdp_step.py on WORLD processes of one GPU (torchrun's variables set here: NCCL_HOSTID differs per rank).
    Returns (exit statuses, outputs, the JSON rank 0 wrote)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    js = tmp_path / "step.json"
    base = dict(os.environ)
    base.update({
        "WORLD_SIZE": str(WORLD), "LOCAL_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1", "NCCL_TIDE_RANKS_PER_NODE": str(WORLD),
        "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "32", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
    })
    base.pop("NCCL_TIDE_RANKS_PER_GPU", None)
    args = [sys.executable, str(BENCHMARKS / "fsdp_step.py"), *SMALL, "--variants", variants, "--ranks-per-gpu",
            str(WORLD), "--deterministic", "-J", str(js)]
    procs = [
        subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(base, RANK=str(r), LOCAL_RANK=str(r), NCCL_HOSTID=f"fsdp-step-host-{r}"))
        for r in range(WORLD)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], outs, json.loads(js.read_text()) if js.exists() else None


@pytest.mark.gpu
def test_fsdp_step_two_ranks_on_one_gpu_stock_and_tide(tmp_path):
    from nccl_tide.devices import SHARED_GPU_CAVEAT

    rcs, outs, doc = run_world(tmp_path, "stock,tide")
    shown = "\n".join(f"--- rank {r} (exit {rc}) ---\n{o[-6000:]}" for r, (rc, o) in enumerate(zip(rcs, outs)))
    assert rcs == [0] * WORLD and doc is not None, shown
    assert f"# {SHARED_GPU_CAVEAT}" in outs[0] and "loss vs stock" in outs[0], shown
    assert doc["world_size"] == WORLD and SHARED_GPU_CAVEAT in doc["notes"] and doc["deterministic"] is True
    by = {r["variant"]: r for r in doc["results"]}
    assert by["stock"]["ran"] and by["tide"]["ran"], by
    assert len(by["stock"]["losses"]) == 1 + 3  # warm-up and timed steps
    assert by["tide"]["loss_vs_stock"]["equal"], (by["stock"]["losses"], by["tide"]["losses"])
    for r in by.values():
        assert r["step_ms"]["median"] > 0 and r["peak_mem_GiB"] > 0 and r["peak_total_GiB"] > 0, r
        assert r["profile"]["comm_sm_us"] >= 0 and "slot_GiB" in r, r
    assert by["tide"]["tide_stats"]["ag_calls"] > 0 and by["tide"]["tide_stats"]["rs_calls"] > 0, by["tide"]


@pytest.mark.gpu
def test_fsdp_step_symm_on_a_shared_gpu_runs_or_says_why(tmp_path):
    """symm (torch symmetric memory) on ranks of distinct NCCL hosts sharing a GPU: it runs, or its row says why;
    it never hangs the benchmark."""
    rcs, outs, doc = run_world(tmp_path, "stock,symm")
    shown = "\n".join(f"--- rank {r} (exit {rc}) ---\n{o[-6000:]}" for r, (rc, o) in enumerate(zip(rcs, outs)))
    assert rcs == [0] * WORLD and doc is not None, shown
    symm = {r["variant"]: r for r in doc["results"]}["symm"]
    assert symm["ran"] or symm["reason"].startswith(("unavailable", "failed")), symm
    if symm["ran"]:
        assert symm["loss_vs_stock"] is not None, symm
