# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The torchrun backend's fsdp2 all-gather row for several ranks on the CPU: every rank's own bench (its shards, FSDP2's
copy-in, the all-gather, the copy-out, the check) runs in a thread, the all-gather done by concatenating the ranks'
blocks. The copy-in runs as the CPU's foreach copy (bit for bit) and as the CUDA kernel computes it (bf16/fp16 loaded
into fp32 and stored back, which turns every NaN into one canonical NaN), on random layouts."""

import random
import threading

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.fsdp")

import torch.distributed as dist  # noqa: E402

from nccl_tide import _dist  # noqa: E402
from nccl_tide.perf import collectives, fsdp2_ops, torchrun_backend  # noqa: E402
from test_perf_bench_logic import no_cuda_sync, spec  # noqa: E402,F401


class ThreadAllGather:
    """_dist.all_gather_flat for W ranks that are threads of this process (each thread sets .rank first)."""

    def __init__(self, world: int):
        self.world = world
        self.local = threading.local()
        self.inputs = [None] * world
        self.barrier = threading.Barrier(world, timeout=60)

    def __call__(self, output, input, group=None, async_op=False):
        self.inputs[self.local.rank] = input.clone()  # the copy-in's block, as this rank sends it
        self.barrier.wait()
        torch.cat(self.inputs, out=output.view(-1))
        self.barrier.wait()  # nobody overwrites its input before every rank has read it

    def run(self, benches):
        """bench.check() on every rank at once; the wrong counts by rank."""
        wrong, errors = [None] * self.world, []

        def rank_main(r):
            self.local.rank = r
            try:
                wrong[r] = benches[r].check()
            except BaseException as e:  # a failed rank must not leave the others waiting at the barrier
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return wrong


def cuda_foreach_copy_(dsts, srcs, non_blocking=False):
    """torch._foreach_copy_ as its CUDA kernel computes it for tensors of one type: each element loaded as the type's
    opmath type (fp32 for bf16/fp16) and stored back as the destination's type."""
    for d, s in zip(dsts, srcs):
        d.copy_(s.float() if s.dtype in (torch.bfloat16, torch.float16) else s)


def rank_benches(world, case, monkeypatch):
    gather = ThreadAllGather(world)
    monkeypatch.setattr(_dist, "all_gather_flat", gather)
    benches = []
    for r in range(world):
        b = torchrun_backend.TorchrunBackend.__new__(torchrun_backend.TorchrunBackend)
        b.dist, b.rank, b.W, b.device, b.average = dist, r, world, torch.device("cpu"), 1
        b._comm, b._comm_error = None, None
        benches.append(b.bench("fsdp2", case))
    return gather, benches


def random_shapes(rng):
    """A few parameters of random shapes: vectors, matrices with fewer rows than ranks, odd sizes."""
    shapes = []
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.3:
            shapes.append((rng.randint(1, 3000),))
        else:
            shapes.append((rng.randint(1, 60), rng.randint(1, 70)))
    return shapes


def cases():
    """(world, shapes) pairs: the flat one-tensor case tide-perf runs for -b 64K at W=2, then random layouts."""
    rng = random.Random(20240611)
    out = [(2, [(collectives.per_rank_count(64 * 1024, 2, 2) * 2,)])]
    for _ in range(4):
        out.append((rng.choice([2, 3, 4]), random_shapes(rng)))
    return out


@pytest.mark.usefixtures("no_cuda_sync")
@pytest.mark.parametrize("copy_in", ["cpu", "cuda"])
@pytest.mark.parametrize("dt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("world,shapes", cases())
def test_fsdp2_all_gather_row_has_no_wrong_elements(monkeypatch, copy_in, dt, world, shapes):
    if copy_in == "cuda":
        monkeypatch.setattr(torch, "_foreach_copy_", cuda_foreach_copy_)
    gather, benches = rank_benches(world, spec("all_gather", shapes, dt), monkeypatch)
    assert "all_gather_copy_in" in benches[0].note
    assert gather.run(benches) == [0] * world


@pytest.mark.usefixtures("no_cuda_sync")
def test_fsdp2_all_gather_row_counts_what_the_copies_miss(monkeypatch):
    """The check is not blind: one element flipped in rank 1's copied-in block is wrong on every rank, and a copy-out
    that writes nothing leaves every checked element wrong (no expected value is the fill pattern)."""
    world, shapes = 3, [(7, 5), (11,), (2, 9)]
    case = spec("all_gather", shapes, "bf16")
    name, copy_in = fsdp2_ops.all_gather_copy_in_impl()

    def corrupt(shards, out, sizes, n, rank):
        block = copy_in(shards, out, sizes, n, rank)
        if rank == 1:
            block[:1].view(torch.int16).bitwise_xor_(1)  # the lowest bit: a different pattern whatever the value
        return block

    monkeypatch.setattr(fsdp2_ops, "all_gather_copy_in_impl", lambda: (name, corrupt))
    gather, benches = rank_benches(world, case, monkeypatch)
    assert gather.run(benches) == [1] * world

    monkeypatch.setattr(fsdp2_ops, "all_gather_copy_in_impl", lambda: (name, copy_in))
    monkeypatch.setattr(fsdp2_ops, "copy_out_impl", lambda: ("nothing", lambda flat, sizes, outs: None))
    gather, benches = rank_benches(world, case, monkeypatch)
    checked = collectives.rank_count(case.numels, case.rows, world) * world  # every parameter's W padded shards
    assert gather.run(benches) == [checked] * world
