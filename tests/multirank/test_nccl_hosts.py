# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""W ranks share one GPU in a real NCCL world (torch's NCCL): every rank its own NCCL host (NCCL_HOSTID), the ranks
talking through NCCL's network transport over loopback sockets. Marker gpu: one card.

* Declared one TIDE node (NCCL_TIDE_RANKS_PER_NODE=W; they share the machine): TIDE's AG and RS through
  tideCommCreate on torch's ncclComm_t, bit for bit against the host executor on random layouts (odd sizes, mixed
  dtypes, sum / avg, one node and virtual nodes).
* Not declared: TIDE's nodes follow NCCL's hosts; across them TIDE runs through NCCL (test_nccl_transport.py), and a
  comm on a caller's bootstrap, which has no NCCL communicator, is refused with what to do.
* FSDP2, stock and with nccl_tide.fsdp.enable: bit-identical losses, gradients and parameters; peak memory reported.
* The NCCL_TIDE_ENABLE interposer under plain torch.distributed: eligible all-gathers taken by TIDE, results equal.
* With NCCL >= 2.30 (NCCL_MULTI_RANK_GPU_ENABLE=1): two NCCL hosts of two ranks refuse a comm on a caller's
  bootstrap alike. The collectives on one NCCL host of two ranks and on two hosts of two, declared one node or not,
  are test_nccl_windows.py's, which checks the provider NCCL gives them too.

Each rank is one process (multirank.harness); every rank derives every rank's inputs from seeds, so each checks its
own result against the host executor without exchanging data. Starting a world (W processes importing torch, NCCL's
initialization over sockets) costs more than most checks: where several checks need the same world they run in turn
on one ("in_turn"), each with its own report.
"""

import json
import os
import zlib

import numpy as np
import pytest
from multirank.harness import run_ranks

pytestmark = [pytest.mark.gpu]
NCCL_WORLD_ENV = {
    "NCCL_SOCKET_IFNAME": "lo",
    "NCCL_IB_DISABLE": "1",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "CUDA_DEVICE_MAX_CONNECTIONS": "32",
}
POISON = 0xFF


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _cases(world):
    """(kind, numels, rows, dtypes, extra), the same on every rank."""
    rng = _rng("nccl-hosts", world)
    cases = []
    for dts in (["bf16"], ["fp32"], ["bf16", "fp32"]):
        n = int(rng.integers(1, 5))
        rows = [int(rng.choice([1, 3, 64])) for _ in range(n)]
        numels = [int(rng.integers(1, 3000)) * r for r in rows]
        cases.append(("ag", numels, rows, [dts[int(rng.integers(0, len(dts)))] for _ in range(n)], {}))
    for gdt, op, chunk in (("bf16", "sum", 4096), ("fp32", "avg", None), ("bf16", "avg", 32)):
        n = int(rng.integers(1, 5))
        rows = [int(rng.choice([1, 8])) for _ in range(n)]
        numels = [int(rng.integers(1, 1500)) * r for r in rows]
        cases.append(("rs", numels, rows, [gdt] * n, {"op": op, "chunk": chunk}))
    return cases


def _grads(torch, L, case, r):
    rng = _rng("grads", case, r)
    out = []
    for p in L.params:
        x = rng.standard_normal(p.numel).astype(np.float32) * np.float32(2.0) ** rng.integers(-4, 5, p.numel)
        t = torch.from_numpy(x.astype(np.float32))
        out.append(t.to(torch.bfloat16) if p.dtype == "bf16" else t)
    return out


def _collectives(rank, world, report, rpns=None):
    """AG and RS of _cases(world) on layouts of each ranks-per-node in rpns (default: one node and two)."""
    import nccl_tide
    import torch
    from nccl_tide.comm import Comm, nccl_info

    comm = Comm.from_process_group()
    report["provider"] = comm.provider
    report["comm_ranks_per_node"] = comm.ranks_per_node
    report["nccl"] = nccl_info()["runtime"]
    for rpn in rpns or sorted({world, max(1, world // 2)}):
        for ci, (kind, numels, rows, dts, extra) in enumerate(_cases(world)):
            L = nccl_tide.Layout(numels, dts, world, ranks_per_node=rpn, rank=rank, row_numels=rows,
                                 rs_chunk_bytes=extra.get("chunk"), pace_bytes=1024 if rpn < world else None)
            if kind == "ag":
                sends = [torch.from_numpy(_rng("send", ci, r).integers(0, 256, L.send_bytes, dtype=np.uint8))
                         for r in range(world)]
                slot = comm.alloc_slot(L.slot_bytes)
                slot.fill_(POISON)
                torch.cuda.synchronize()
                comm.all_gather(L, slot, sendbuf=sends[rank].cuda())
                comm.synchronize(timeout=60)
                got = slot.cpu().numpy()
                comm.free_slot(slot)
                dt = {1: np.uint8, 2: np.uint16, 4: np.uint32}
                shards = [[sends[r][p.send_offset: p.send_offset + p.shard_numel * p.elem_size].numpy()
                           .view(dt[p.elem_size]) for p in L.params] for r in range(world)]
                expected = nccl_tide.host_all_gather(L, shards)[rank]
                touched = np.zeros(got.size, dtype=bool)
                for i, (p, e) in enumerate(zip(L.params, expected)):
                    e = np.ascontiguousarray(e).view(np.uint8)
                    if not np.array_equal(got[p.slot_offset: p.slot_offset + e.size], e):
                        report["errors"].append(f"AG rpn {rpn} case {ci} param {i} ({p.dtype}) differs")
                    touched[p.slot_offset: p.slot_offset + e.size] = True
                if not np.all(got[~touched] == POISON):
                    report["errors"].append(f"AG rpn {rpn} case {ci}: bytes written outside the parameters")
            else:
                every = [_grads(torch, L, ci, r) for r in range(world)]
                out = torch.full((L.rs_out_numel,), float("nan"), dtype=torch.float32, device="cuda")
                torch.cuda.synchronize()
                comm.reduce_scatter(L, [g.cuda() for g in every[rank]], out, op=extra["op"])
                comm.synchronize(timeout=60)
                expected = nccl_tide.host_reduce_scatter(L, every, out_dtype="fp32", op=extra["op"])[rank]
                if not np.array_equal(out.cpu().numpy().view(np.uint32),
                                      np.ascontiguousarray(expected).view(np.uint32)):
                    report["errors"].append(f"RS rpn {rpn} case {ci} ({dts[0]} {extra['op']}) differs")
            report["checked"] += 1
    comm.close()


def _refusal(rank, world, report, bootstrap=True):
    """The comm creation must fail with UnsupportedError: on a gloo bootstrap (bootstrap), else on torch's NCCL."""
    import torch.distributed as dist
    from nccl_tide.comm import Comm
    from nccl_tide.errors import UnsupportedError

    try:
        if bootstrap:
            Comm.from_bootstrap(rank, world, 0, group=dist.new_group(backend="gloo")).close()
        else:
            Comm.from_process_group().close()
        report["errors"].append("the comm was created")
    except UnsupportedError as e:
        report["message"] = str(e)
        report["checked"] += 1


def _fsdp(rank, world, report, ranks_per_node=None):
    import torch
    import torch.nn.functional as F
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import nccl_tide.fsdp as tfsdp
    from fsdp_llama import VOCAB, batch, build_model

    dev = torch.device("cuda", 0)
    torch.use_deterministic_algorithms(True, warn_only=True)

    def run(tide):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        model = build_model(0).to(dev)
        for layer in model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        handle = tfsdp.enable(model, ranks_per_node=ranks_per_node) if tide else None
        opt = torch.optim.AdamW(model.parameters(), lr=2e-2)
        losses = []
        for step in range(6):
            x, y = (t.to(dev) for t in batch(step, rank))
            loss = F.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1))
            loss.backward()
            losses.append(loss.item())
            opt.step()
            opt.zero_grad()
        torch.cuda.synchronize()
        res = {"losses": losses, "peak_bytes": torch.cuda.max_memory_allocated() - base,
               "params": [p.to_local().detach().float().cpu() for p in model.parameters()]}
        if handle is not None:
            res["stats"] = handle.stats()
            tfsdp.disable(model)
        del model, opt
        return res

    stock, tide = run(False), run(True)
    report["losses"] = [stock["losses"], tide["losses"]]
    report["peak_bytes"] = [stock["peak_bytes"], tide["peak_bytes"]]
    groups = tide["stats"]["tide_groups"]
    report["tide_calls"] = {k: sum(g[k] for g in groups) for k in ("ag_calls", "rs_calls")}
    report["stock_groups"] = tide["stats"]["stock_groups"]
    if stock["losses"] != tide["losses"]:
        report["errors"].append(f"losses differ: {stock['losses']} vs {tide['losses']}")
    if not all(torch.equal(a, b) for a, b in zip(stock["params"], tide["params"])):
        report["errors"].append("parameters after 6 steps differ")
    report["checked"] += 1


def _interposed_all_gather(rank, world, report):
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(99)
    for numel, dtype in ((3 << 20, torch.float32), ((1 << 20) + 8, torch.bfloat16)):
        every = [torch.randn(numel, generator=g).to(dtype) for _ in range(world)]
        out = torch.full((world * numel,), 7.0, dtype=dtype, device="cuda")
        dist.all_gather_into_tensor(out, every[rank].cuda())
        torch.cuda.synchronize()
        if not torch.equal(out.cpu(), torch.cat(every)):
            report["errors"].append(f"interposed all_gather {dtype} {numel} differs")
        report["checked"] += 1


def _in_turn(rank, world, report, checks):
    """Several checks on one world (one process start and NCCL initialization for all): each (mode, kwargs) of checks
    in order, each filling its own report, report["checks"][i], whose errors become the rank's, prefixed with the
    check's place and mode. A check that raises ends the world's run: the communicator may be unusable after it."""
    report["checks"] = []
    for i, (mode, kwargs) in enumerate(checks):
        name = f"check {i} ({mode if isinstance(mode, str) else mode.__name__})"
        mine = {"checked": 0, "errors": []}
        report["checks"].append(mine)
        try:
            (MODES[mode] if isinstance(mode, str) else mode)(rank, world, mine, **kwargs)
        finally:
            report["errors"] += [f"{name}: {e}" for e in mine["errors"]]


MODES = {"collectives": _collectives, "refusal": _refusal, "fsdp": _fsdp, "interposer": _interposed_all_gather,
         "in_turn": _in_turn}


def _rank(rank, world, port, report, mode, kwargs):
    import datetime

    import torch
    import torch.distributed as dist

    report["checked"] = 0
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120), device_id=torch.device("cuda", 0))
    (MODES[mode] if isinstance(mode, str) else mode)(rank, world, report, **kwargs)
    dist.destroy_process_group()


def launch(tmp_path, world, mode, env=None, timeout=300, host_of=lambda r: f"tide-test-host-{r}", **kwargs):
    """Runs `mode` (a name in MODES, or a module-level function of the same signature) with kwargs on `world` ranks
    of one GPU, rank r as NCCL host host_of(r). Returns the reports."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    clean = {k: None for k in os.environ if k.startswith("NCCL_TIDE_") and k != "NCCL_TIDE_LIBRARY_PATH"}
    rank_env = [{"NCCL_HOSTID": host_of(r), "NCCL_TIDE_DEBUG_FILE": str(tmp_path / f"tide-rank{r}.log")}
                for r in range(world)]
    return run_ranks(_rank, world, (mode, kwargs), tmp_path, timeout, env={**clean, **NCCL_WORLD_ENV, **(env or {})},
                     rank_env=rank_env)


@pytest.fixture(autouse=True)
def _gpu(torch_cuda, cuda_lib):
    pass


@pytest.mark.parametrize("world", [2, 4])
def test_declared_one_node_bit_exact_and_fsdp2_matches_stock(tmp_path, world):
    """One world: TIDE's AG and RS on layouts of one node and of virtual nodes, then FSDP2 stock and with TIDE."""
    reports = launch(tmp_path, world, "in_turn", {"NCCL_TIDE_RANKS_PER_NODE": str(world)}, timeout=400,
                     checks=[("collectives", {}), ("fsdp", {})])
    for rep in reports:
        collectives, fsdp = rep["checks"]
        assert collectives["provider"] == "ipc", collectives
        assert collectives["checked"] == len(_cases(world)) * len({world, max(1, world // 2)}), collectives
        assert collectives["comm_ranks_per_node"] == world, collectives
        assert not fsdp["stock_groups"], fsdp["stock_groups"]
        assert fsdp["tide_calls"]["ag_calls"] > 0 and fsdp["tide_calls"]["rs_calls"] > 0, fsdp["tide_calls"]
    print(json.dumps({"world": world, "peak_bytes_stock_tide": [r["checks"][1]["peak_bytes"] for r in reports]}))


def test_bootstrap_across_nccl_hosts_is_refused(tmp_path):
    for rep in launch(tmp_path, 2, "refusal"):
        assert rep["checked"] == 1, rep
        msg = rep["message"]
        assert "2 TIDE nodes (NCCL hosts" in msg and "NCCL communicator (tideCommCreate)" in msg, msg
        assert "NCCL_TIDE_RANKS_PER_NODE=2" in msg, msg


def test_interposer_takes_eligible_all_gathers(tmp_path):
    from nccl_tide import _native

    env = {"NCCL_TIDE_RANKS_PER_NODE": "2", "LD_PRELOAD": _native.library_path(), "NCCL_TIDE_ENABLE": "1",
           "NCCL_TIDE_DEBUG": "TRACE", "NCCL_TIDE_ENABLE_MIN_BYTES": "0"}
    for rep in launch(tmp_path, 2, "interposer", env):
        assert rep["checked"] == 2, rep
        log = (tmp_path / f"tide-rank{rep['rank']}.log").read_text()
        taken = sum(1 for x in log.splitlines() if "TRACE Interposer: ncclAllGather on" in x and "taken by TIDE" in x)
        assert taken == 2, log[-4000:]


# A libnccl.so.2 of NCCL >= 2.30 (ci/gpu.sh's part `nccl` builds 2.30.7 and sets this): ranks of ONE NCCL host
# share the GPU with NCCL_MULTI_RANK_GPU_ENABLE=1.
NCCL_MULTI_RANK = os.environ.get("TIDE_TEST_NCCL_LIBRARY", "")
needs_multi_rank_nccl = pytest.mark.skipif(
    not NCCL_MULTI_RANK, reason="set TIDE_TEST_NCCL_LIBRARY to a libnccl.so.2 of NCCL >= 2.30 (bash ci/gpu.sh nccl)"
)
MULTI_RANK_ENV = {"LD_PRELOAD": NCCL_MULTI_RANK, "NCCL_MULTI_RANK_GPU_ENABLE": "1"}


@needs_multi_rank_nccl
def test_bootstrap_across_two_nccl_hosts_of_two_ranks_is_refused(tmp_path):
    """Undeclared, the same world runs through NCCL (test_nccl_windows.py); declared one TIDE node, it runs bit for bit
    on CUDA IPC (test_nccl_windows.py's fallback test)."""
    for rep in launch(tmp_path, 4, "refusal", MULTI_RANK_ENV, host_of=lambda r: f"tide-host-{r // 2}"):
        assert "2 TIDE nodes (NCCL hosts" in rep["message"], rep
