# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/fsdp_step.py on one GPU (marker gpu; skipped without CUDA): the layout-cost mode, and the step mode
under torchrun at world size 1. Each case is a subprocess with a timeout (a hung collective fails the test instead
of the job)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

BENCHMARKS = Path(__file__).resolve().parents[1]
ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "CUDA_DEVICE_MAX_CONNECTIONS": "32",
    "PYTHONUNBUFFERED": "1",
}


def run(args, timeout=180, torchrun=False):
    env = dict(os.environ)
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(ENV)
    cmd = [sys.executable]
    if torchrun:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd += ["-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(port)]
    return subprocess.run(cmd + args, capture_output=True, text=True, env=env, timeout=timeout)


def test_fsdp_step_layout_cost(tmp_path):
    js = tmp_path / "lc.json"
    args = "--mode layout-cost --models llama3-8b-layer,llama3-70b-layer --worlds 8 --iters 5 -J".split()
    r = run([str(BENCHMARKS / "fsdp_step.py"), *args, str(js)], timeout=180)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    doc = json.loads(js.read_text())
    assert [x["model"] for x in doc["results"]] == ["llama3-8b-layer", "llama3-70b-layer"]
    for x in doc["results"]:
        assert x["wrong_params"] == 0 and x["copy_out_ms"]["median"] > 0 and x["copy_in_ms"]["median"] > 0
        assert x["copy_out_sm_us"] > 0 and x["tide_ms"] == 0.0
    big = doc["results"][1]
    assert big["copy_in_ms"]["median"] > big["copy_out_ms"]["median"]  # fp32 write > bf16 copy
    assert "llama3-70b-layer" in r.stdout and "0 (none)" in r.stdout


def test_fsdp_step_torchrun_world_size_1(tmp_path):
    js = tmp_path / "step.json"
    args = (
        "--layers 2 --hidden 512 --heads 8 --kv-heads 4 --ffn 1024 --vocab 1000 --seq 256 --tokens 1024 "
        "--warmup 1 --steps 3 --variant-timeout 60 -J"
    ).split()
    r = run([str(BENCHMARKS / "fsdp_step.py"), *args, str(js)], torchrun=True, timeout=180)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    doc = json.loads(js.read_text())
    by = {x["variant"]: x for x in doc["results"]}
    assert set(by) == {"stock", "symm", "tide"}
    stock = by["stock"]
    assert stock["ran"] and stock["step_ms"]["median"] > 0 and stock["peak_mem_GiB"] > 0
    assert stock["step_ms"]["min"] <= stock["step_ms"]["median"] <= stock["step_ms"]["max"]
    for v in ("symm", "tide"):
        assert by[v]["ran"] or by[v]["reason"].startswith(("unavailable", "failed")), by[v]
    assert "| stock" in r.stdout and "step ms" in r.stdout
