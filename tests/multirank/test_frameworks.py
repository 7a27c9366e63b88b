# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""DeepSpeed, Megatron-Core and torchtitan training with TIDE on ONE GPU: the examples of examples/frameworks on 2
ranks that share the card as 2 NCCL hosts (NCCL_HOSTID per rank, sockets over loopback), declared one TIDE node
(NCCL_TIDE_RANKS_PER_NODE=2). Marker gpu; each test skips where its framework is not installed
(bash ci/framework_wheels.sh install DIR).

Every job runs stock and with TIDE, and the per-step losses of every rank must be equal bit for bit: the
all-gathers TIDE takes are byte copies, and at 2 ranks TIDE's fp32 reduce-scatter fold (docs/architecture.md
"Accumulation order") is one addition per element, as NCCL's. Should they differ, the stock job runs once more: a
stock job that does not repeat itself is reported as such, not blamed on TIDE. A job's stock run goes once per file,
beside its first TIDE run (processes of their own on the same card, which changes what neither computes): starting
the ranks and importing the framework take most of a run's time, and the two runs spend it together.

With the interposer (LD_PRELOAD=libnccl-tide.so NCCL_TIDE_ENABLE=1, NCCL_TIDE_RS_ACCUM=FP32, the size threshold at
0 so the small model's calls count, every call logged at TRACE into one file per rank), each job must give TIDE at
least 99% of its all-gather and reduce-scatter bytes (docs/usage.md "DeepSpeed, Megatron-Core and torchtitan"): the
share is read from the TRACE lines, every call's classification (count, type) against the calls taken.
"""

import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
from framework_examples import missing, run

pytestmark = [pytest.mark.gpu]
STEPS = 5
WORLD = 2
SHARED_GPU_ENV = {
    # every rank is its own NCCL host, so each is local rank 0 of a one-rank host, as torchrun --nnodes=2
    # --nproc-per-node=1 would say (DeepSpeed takes LOCAL_RANK as the device index): all on cuda:0
    "LOCAL_WORLD_SIZE": "1",
    "NCCL_TIDE_RANKS_PER_NODE": str(WORLD),  # one TIDE node: the ranks map each other's memory (CUDA IPC)
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_IB_DISABLE": "1",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
# "<name> comm <ptr> count <n> dtype <d> op <o>: <reason>" for every call; "<name> on <ptr> (<b> bytes per rank)
# taken by TIDE" for each call TIDE ran.
CALL = re.compile(r"TRACE Interposer: (ncclAllGather|ncclReduceScatter) comm \S+ count (\d+) dtype (\d+) op")
TAKEN = re.compile(r"TRACE Interposer: (ncclAllGather|ncclReduceScatter) on \S+ \((\d+) bytes per rank\) taken by TIDE")
NCCL_SIZE = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}  # ncclDataType_t sizes


@dataclass
class Job:
    framework: str
    args: list
    reduce_scatters: bool  # the job reduce-scatters its gradients (ZeRO-2 all-reduces them)
    env: dict = field(default_factory=dict)  # for the TIDE run only


JOBS = {
    # ZeRO-3: parameter all-gathers are flat calls; the bf16 gradient reduce-scatter is in place (DeepSpeed's
    # reduce_scatter_coalesced scatters into a chunk of its own input)
    "deepspeed-zero3": Job("deepspeed", ["--zero", 3], True),
    # ZeRO-2: gradients go through ncclAllReduce (never the interposer's); parameter all-gathers after each step
    "deepspeed-zero2": Job("deepspeed", ["--zero", 2], False),
    # distributed optimizer: fp32 reduce-scatters and bf16 all-gathers, in place, inside torch's coalescing manager
    # (ncclGroupStart / ncclGroupEnd), one bucket per group
    "megatron-distopt": Job("megatron", [], True),
    # Megatron asks for one hardware queue per device on Hopper: TIDE's stream waits must not hang it
    "megatron-distopt-1-connection": Job("megatron", [], True, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
    # FSDP2: bf16 parameter all-gathers; the fp32 gradient reduce-scatter with PREMUL_SUM(1.0), which torchtitan's
    # divide factor of 1 makes FSDP2 send: a sum for TIDE
    "torchtitan-fsdp2": Job("torchtitan", [], True),
}


def shares(log: str) -> dict:
    """Per collective: (bytes TIDE took, bytes of every call), per rank, from one rank's TRACE log."""
    total = {"ncclAllGather": 0, "ncclReduceScatter": 0}
    taken = dict(total)
    for line in log.splitlines():
        m = CALL.search(line)
        if m:
            total[m.group(1)] += int(m.group(2)) * NCCL_SIZE.get(int(m.group(3)), 0)
        m = TAKEN.search(line)
        if m:
            taken[m.group(1)] += int(m.group(2))
    return {k: (taken[k], total[k]) for k in total}


@pytest.fixture(autouse=True)
def _gpu(torch_cuda, cuda_lib, monkeypatch):
    for k in list(os.environ):  # only what each test sets reaches the ranks
        if (k.startswith("NCCL_TIDE_") and k != "NCCL_TIDE_LIBRARY_PATH") or k == "LD_PRELOAD":
            monkeypatch.delenv(k)


def _run(framework, args, tmp_path, tag, env=None):
    def rank_env(r):
        return {"LOCAL_RANK": "0", "NCCL_HOSTID": f"tide-fw-host-{r}",
                "NCCL_TIDE_DEBUG_FILE": str(tmp_path / f"{tag}-rank{r}.log")}

    return run(framework, [*args, "--steps", STEPS], world=WORLD, env={**SHARED_GPU_ENV, **(env or {})},
               rank_env=rank_env, timeout=420)


_STOCK = {}  # (framework, args) -> the losses of its stock run (a Future), shared by the tests of this file
_BESIDE = ThreadPoolExecutor(max_workers=1)


def _stock(framework, args, tmp_path) -> Future:
    """The job's stock run, started in the background on first use: the caller runs its TIDE job meanwhile, then
    takes the losses with .result()."""
    key = (framework, tuple(args))
    if key not in _STOCK:
        _STOCK[key] = _BESIDE.submit(lambda: _run(framework, [*args, "--tide", "off"], tmp_path, "stock")[1])
    return _STOCK[key]


def _assert_same_losses(framework, args, tmp_path, stock, tide, what):
    if tide == stock:
        return
    _, again = _run(framework, [*args, "--tide", "off"], tmp_path, "stock-again")
    assert again == stock, f"the stock job does not repeat itself on this machine:\n{stock}\n{again}"
    pytest.fail(f"{what} changed the losses:\nstock {stock}\nTIDE  {tide}")


@pytest.mark.parametrize("name", list(JOBS))
def test_interposer_matches_stock_and_takes_the_data_parallel_bytes(tmp_path, name):
    from nccl_tide import _native

    job = JOBS[name]
    why = missing(job.framework)
    if why:
        pytest.skip(why)
    stock = _stock(job.framework, job.args, tmp_path)
    env = {"LD_PRELOAD": _native.library_path(), "NCCL_TIDE_ENABLE": "1", "NCCL_TIDE_DEBUG": "TRACE",
           "NCCL_TIDE_ENABLE_MIN_BYTES": "0", "NCCL_TIDE_RS_ACCUM": "FP32", **job.env}
    _, tide = _run(job.framework, [*job.args, "--tide", "interposer"], tmp_path, "tide", env)
    _assert_same_losses(job.framework, job.args, tmp_path, stock.result(), tide, "the interposer")
    for r in range(WORLD):
        log = (tmp_path / f"tide-rank{r}.log").read_text()
        s = shares(log)
        print(f"{name} rank {r}: TIDE took " + ", ".join(f"{k} {t} of {n} bytes" for k, (t, n) in s.items()))
        ag_taken, ag_total = s["ncclAllGather"]
        assert ag_total > 0 and ag_taken >= 0.99 * ag_total, f"rank {r}: {s}\n{log[-4000:]}"
        rs_taken, rs_total = s["ncclReduceScatter"]
        if job.reduce_scatters:
            assert rs_total > 0 and rs_taken >= 0.99 * rs_total, f"rank {r}: {s}\n{log[-4000:]}"
        else:
            assert rs_total == 0, f"rank {r}: {s}"


def test_torchtitan_with_nccl_tide_fsdp_matches_stock(tmp_path):
    why = missing("torchtitan")
    if why:
        pytest.skip(why)
    stock = _stock("torchtitan", [], tmp_path)
    outs, tide = _run("torchtitan", ["--tide", "fsdp"], tmp_path, "fsdp")
    _assert_same_losses("torchtitan", [], tmp_path, stock.result(), tide, "nccl_tide.fsdp")
    for o in outs:
        line = [x for x in o.stdout.splitlines() if x.startswith("TIDE_FSDP ")]
        assert len(line) == 1, o.stdout[-3000:]
        stats = line[0]
        assert '"executor": "native"' in stats and '"stock_groups": 0' in stats, stats
        assert not re.search(r'"(ag|rs)_calls": 0\b', stats), stats
