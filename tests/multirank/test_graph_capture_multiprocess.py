# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""TIDE-AG and TIDE-RS captured into CUDA graphs across processes: W processes, each one TIDE rank on
cuda:0 over CUDA IPC (gloo bootstrap, as tests/multirank/test_multiprocess.py; started by multirank.harness).

Each rank captures one graph with torch.cuda.graph (global capture mode, PyTorch's default) holding two all-gathers
(mixed sizes; and 8 parameters of one size from a packed send buffer, which the library copies as strided 2D runs
into each peer's IPC-mapped slot: docs/architecture.md "Strided copies") and two reduce-scatters (1 and 2 pipeline chunks, Slot-Reuse staging): on the IPC provider a graph may hold several
TIDE collectives. Every replay gets fresh random inputs (written into the captured buffers) and is checked bit for bit
against the host executor (every rank's inputs gathered over gloo); eager calls of the same collectives run between
replays, and replays also run back to back without host synchronization. Refused at capture time, with the capture
still valid: a layout no eager call has agreed on yet (its agreement exchanges), and a reduce-scatter with the comm's
own staging. With NCCL_TIDE_TOKEN_RS_CHUNKS raised (the third case) the graph also holds an RS of 4 chunks over 2
staging buffers, whose pushes the library forks onto a second branch of the user's graph (docs/architecture.md "More
chunks than buffers"); its eager calls between replays take the same program as the library's own graphs.
"""

import os

import numpy as np
import pytest
import test_multiprocess as mpt  # _rng, _float_data, _gather_bytes
from multirank.harness import init_gloo, run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]

REPLAYS = 12


def _rs_layout(nccl_tide, numels, rows, world, rank, chunks):
    """A bf16 RS layout with exactly `chunks` pipeline chunks (what a capture takes: 1 or 2, more with
    NCCL_TIDE_TOKEN_RS_CHUNKS raised)."""
    for cb in [1 << 24] + [int(x) for x in np.geomspace(1 << 20, 64, 60)]:
        L = nccl_tide.Layout(numels, "bf16", world, rank=rank, row_numels=rows, rs_chunk_bytes=cb)
        if L.rs_num_chunks == chunks:
            return L
        L.close()
    raise AssertionError(f"no chunk size gives {chunks} chunks")


class Round:
    """The captured buffers of one rank and the host executor's expected results for their current contents."""

    def __init__(self, torch, dist, nccl_tide, comm, rank, world):
        self.torch, self.dist, self.nccl_tide, self.comm = torch, dist, nccl_tide, comm
        self.rank, self.world = rank, world
        rng = mpt._rng("cap-mp-layout", world)  # the same layouts on every rank
        rows = [1, 64, 1, 3]
        numels = [int(rng.integers(1, 3000)), 64 * int(rng.integers(1, 40)), int(rng.integers(1, 50)), 3 * 333]
        self.ag = nccl_tide.Layout(numels, ["bf16", "fp32", "bf16", "fp16"], world, rank=rank, row_numels=rows)
        self.rs = [
            _rs_layout(nccl_tide, [4999, 37, 64 * 48, 700 + world], [1, 1, 64, 1], world, rank, 1),
            _rs_layout(nccl_tide, [2999, 64 * 20, 1, 500], [1, 64, 1, 1], world, rank, 2),
        ]
        self.ops = [("sum", 1.0), ("avg", 1.0)]
        from nccl_tide import _native

        self.token_rs_chunks = int(_native.param_value("NCCL_TIDE_TOKEN_RS_CHUNKS"))  # the library's, default included
        if self.token_rs_chunks >= 4:  # the two-lane token RS (more chunks than buffers)
            self.rs.append(_rs_layout(nccl_tide, [3999, 64 * 33, 5, 901], [1, 64, 1, 1], world, rank, 4))
            self.ops.append(("premul", 0.375))
        self.ag_u = nccl_tide.Layout([world * 1024] * 8, "bf16", world, rank=rank)  # strided runs
        self.slot_u = comm.alloc_slot(self.ag_u.slot_bytes)
        self.send_u = torch.empty(self.ag_u.send_bytes, dtype=torch.uint8, device="cuda")
        self.slot = comm.alloc_slot(self.ag.slot_bytes)
        self.staging = [comm.alloc_slot(L.rs_staging_bytes) for L in self.rs]
        self.send = torch.empty(self.ag.send_bytes, dtype=torch.uint8, device="cuda")
        self.grads = [[torch.empty(p.numel, dtype=torch.bfloat16, device="cuda") for p in L.params] for L in self.rs]
        self.outs = [torch.empty(L.rs_out_numel, dtype=torch.float32, device="cuda") for L in self.rs]
        self.rng = mpt._rng("cap-mp-data", world, rank)

    def new_inputs(self):
        """Fresh random inputs in the captured buffers, outputs poisoned; the expected results computed on the host
        from every rank's inputs (gathered over gloo)."""
        torch, nccl_tide = self.torch, self.nccl_tide
        send = torch.from_numpy(self.rng.integers(0, 256, size=self.ag.send_bytes, dtype=np.uint8))
        sends = mpt._gather_bytes(torch, self.dist, send)
        views = {1: np.uint8, 2: np.uint16, 4: np.uint32}
        shards = [
            [
                sends[r][p.send_offset : p.send_offset + p.shard_numel * p.elem_size].numpy().view(views[p.elem_size])
                for p in self.ag.params
            ]
            for r in range(self.world)
        ]
        self.ag_expected = nccl_tide.host_all_gather(self.ag, shards)[self.rank]
        self.send.copy_(send)
        send_u = torch.from_numpy(self.rng.integers(0, 256, size=self.ag_u.send_bytes, dtype=np.uint8))
        sends_u = mpt._gather_bytes(torch, self.dist, send_u)
        shards_u = [[sends_u[r][p.send_offset : p.send_offset + p.shard_numel * 2].numpy().view(np.uint16)
                     for p in self.ag_u.params] for r in range(self.world)]
        self.ag_u_expected = nccl_tide.host_all_gather(self.ag_u, shards_u)[self.rank]
        self.send_u.copy_(send_u)
        self.rs_expected = []
        for L, grads, (op, scale) in zip(self.rs, self.grads, self.ops):
            mine = [mpt._float_data(torch, self.rng, p.numel, "bf16") for p in L.params]
            flat = torch.cat([g.view(torch.uint8) for g in mine])
            flats = mpt._gather_bytes(torch, self.dist, flat)
            all_grads = []
            for r in range(self.world):
                vals, off, theirs = flats[r].view(torch.bfloat16), 0, []
                for p in L.params:
                    theirs.append(vals[off : off + p.numel])
                    off += p.numel
                all_grads.append(theirs)
            exp = nccl_tide.host_reduce_scatter(L, all_grads, out_dtype="fp32", op=op, scale=scale)[self.rank]
            self.rs_expected.append(np.ascontiguousarray(exp).astype(np.float32).view(np.uint32))
            for g, m in zip(grads, mine):
                g.copy_(m)
        self.poison()

    def poison(self):
        self.slot.fill_(0xFF)
        self.slot_u.fill_(0xFF)
        for o in self.outs:
            o.fill_(float("nan"))
        self.torch.cuda.synchronize()

    def collectives(self):
        """The AG and both RSs on the current stream (captured, or eager)."""
        self.comm.all_gather(self.ag, self.slot, sendbuf=self.send)
        self.comm.all_gather(self.ag_u, self.slot_u, sendbuf=self.send_u)
        for L, grads, out, staging, (op, scale) in zip(self.rs, self.grads, self.outs, self.staging, self.ops):
            self.comm.reduce_scatter(L, grads, out, op=op, scale=scale, staging=staging)

    def check(self, what):
        """Error strings (empty when every result is bit-exact)."""
        self.comm.synchronize(timeout=30)
        errors = []
        got = self.slot.cpu().numpy()
        for i, p in enumerate(self.ag.params):
            exp = np.ascontiguousarray(self.ag_expected[i]).view(np.uint8)
            if not np.array_equal(got[p.slot_offset : p.slot_offset + exp.size], exp):
                errors.append(f"{what}: AG param {i} differs from the host executor")
        got_u = self.slot_u.cpu().numpy()
        for i, p in enumerate(self.ag_u.params):
            exp = np.ascontiguousarray(self.ag_u_expected[i]).view(np.uint8)
            if not np.array_equal(got_u[p.slot_offset : p.slot_offset + exp.size], exp):
                errors.append(f"{what}: uniform AG param {i} differs from the host executor")
        for k, (out, exp) in enumerate(zip(self.outs, self.rs_expected)):
            bits = out.cpu().numpy().view(np.uint32)
            if not np.array_equal(bits, exp):
                errors.append(f"{what}: RS {k} ({self.rs[k].rs_num_chunks} chunks): {np.count_nonzero(bits != exp)} differ")
        return errors


def _worker(rank, world, port, report):
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    report["steps"] = {}
    import nccl_tide
    import torch
    from nccl_tide.comm import Comm
    from nccl_tide.errors import UnsupportedError

    dist = init_gloo(rank, world, port)
    torch.cuda.set_device(0)
    comm = Comm.from_bootstrap(rank, world, device=0)
    rd = Round(torch, dist, nccl_tide, comm, rank, world)
    fresh = nccl_tide.Layout([777, 64 * 3], "bf16", world, rank=rank, row_numels=[1, 64])
    fresh_slot = comm.alloc_slot(fresh.slot_bytes)
    fresh_send = torch.empty(fresh.send_bytes, dtype=torch.uint8, device="cuda")

    rd.new_inputs()
    rd.collectives()  # eager: agrees on the layouts
    report["errors"] += rd.check("eager before capture")

    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    refused = []
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=stream):
        try:
            comm.all_gather(fresh, fresh_slot, sendbuf=fresh_send)
        except UnsupportedError as e:
            refused.append("has not been used by an eager collective" in str(e))
        try:
            comm.reduce_scatter(rd.rs[0], rd.grads[0], rd.outs[0], op="sum")  # own staging
        except UnsupportedError as e:
            refused.append("Slot-Reuse" in str(e))
        rd.collectives()
    report["steps"]["refused"] = refused
    report["steps"]["rs_chunks"] = [L.rs_num_chunks for L in rd.rs]
    report["steps"]["token_rs_chunks"] = rd.token_rs_chunks
    if refused != [True, True]:
        report["errors"].append(f"capture-time refusals: {refused} (want [True, True])")

    for it in range(REPLAYS):
        rd.new_inputs()
        graph.replay()
        report["errors"] += rd.check(f"replay {it}")
        if it % 3 == 2:  # eager between replays (eager and captured calls use separate flag words)
            rd.poison()
            rd.collectives()
            report["errors"] += rd.check(f"eager after replay {it}")
    rd.new_inputs()
    for _ in range(4):  # back to back, no host synchronization
        graph.replay()
    report["errors"] += rd.check("back-to-back replays")
    report["steps"]["replays"] = REPLAYS + 4

    rd.poison()
    rd.collectives()
    comm.all_gather(fresh, fresh_slot, sendbuf=fresh_send)  # the refused layout still agrees eagerly
    report["errors"] += rd.check("eager after all replays")
    torch.cuda.synchronize()
    del graph
    comm.close()
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("world,token_rs_chunks", [(2, None), (3, None), (3, "8")])
def test_captured_collectives_replay_across_processes(torch_cuda, cuda_lib, tmp_path, monkeypatch, world,
                                                      token_rs_chunks):
    for k, v in {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
        "NCCL_TIDE_TIMEOUT_MS": "20000",
    }.items():
        monkeypatch.setenv(k, v)  # inherited by the spawned workers
    if token_rs_chunks is None:
        monkeypatch.delenv("NCCL_TIDE_TOKEN_RS_CHUNKS", raising=False)
    else:
        monkeypatch.setenv("NCCL_TIDE_TOKEN_RS_CHUNKS", token_rs_chunks)
    reports = run_ranks(_worker, world, (), tmp_path, 60)  # 3 cases inside the file's limit
    for rep in reports:
        assert rep["steps"]["refused"] == [True, True]
        assert rep["steps"]["replays"] == REPLAYS + 4
        # The limit each worker's library had in force (the variable, or the default when it is unset).
        limit = rep["steps"]["token_rs_chunks"]
        assert token_rs_chunks is None or limit == int(token_rs_chunks), limit
        assert rep["steps"]["rs_chunks"] == ([1, 2, 4] if limit >= 4 else [1, 2])
