# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tideCommGetPendingWaits and the debug dump read the step programs: on a loopback world where one rank
has not made its matching call, the other rank's first unsatisfied wait names the missing rank and the flag word;
once every rank has called, nothing is pending. Also a multi-node layout (2 virtual nodes of 2), where the pending
wait of a rank whose rail peer has not called is reported. Marker gpu; every wait is bounded."""

import os
import zlib

import nccl_tide
import numpy as np
import pytest
from nccl_tide import _native as N

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


@pytest.fixture
def world(torch_cuda, cuda_lib):
    from nccl_tide.cuda import LoopbackWorld

    w = LoopbackWorld(4)
    yield w
    w.close()


def _random_send(torch, rng, L):
    return torch.from_numpy(rng.integers(0, 256, size=L.send_bytes, dtype=np.uint8)).cuda()


@pytest.mark.parametrize("rpn", [4, 2])
def test_missing_rank_is_named(torch_cuda, world, rpn):
    torch = torch_cuda
    W = 4
    rng = _rng("pending", rpn)
    Ls = [nccl_tide.Layout([3000, 517], "bf16", W, ranks_per_node=rpn, rank=r) for r in range(W)]
    slots = world.alloc_slot(Ls[0].slot_bytes)
    sends = [_random_send(torch, rng, Ls[0]) for _ in range(W)]
    torch.cuda.synchronize()
    for r in range(W - 1):  # rank W-1 does not call (yet)
        world.rank_all_gather(r, Ls[r], slots[r], sendbuf=sends[r])
    pending = N.pending_waits(world.comms[0])
    assert pending, "rank 0 must be waiting"
    # Rank 0's first wait that cannot pass names rank W-1 (one node: its agReady; two nodes: its rail peer, rank 2,
    # waits on rank 3's readiness, so rank 0 waits for the rail signal from rank 2 or rank 3's agReady).
    peers = {p["peer"] for p in pending}
    steps = {p["step"] for p in pending}
    if rpn == W:
        # One node: the epoch protocol waits on rank W-1's agReady; the token protocol (eager graph route,
        # NCCL_TIDE_EAGER_GRAPHS=1) on the ready token rank W-1 writes into rank 0's own array.
        first = pending[0]
        epoch = first["step"] == "agReady" and first["owner"] == W - 1
        token = first["step"] == f"agReadyTok[{W - 1}]" and first["owner"] == 0
        assert (epoch or token) and first["peer"] == W - 1, pending
        assert token == (os.environ.get("NCCL_TIDE_EAGER_GRAPHS", "1") == "1"), pending
    else:
        assert peers & {2, 3}, pending
        assert steps & {"agReady", "agRail[0]", "agFinish", "agDone[1]"}, pending
    for p in pending:
        assert p["have"] != p["want"], p
    buf = __import__("ctypes").create_string_buffer(64 * 1024)
    assert N.lib().tideCommDebugDump(world.comms[0], buf, len(buf)) == N.tideSuccess
    assert "PENDING AG" in buf.value.decode(), buf.value.decode()
    world.rank_all_gather(W - 1, Ls[W - 1], slots[W - 1], sendbuf=sends[W - 1])
    world.synchronize(timeout=30)
    for r in range(W):
        assert N.pending_waits(world.comms[r]) == [], r
    # The result is exact (the late rank's call completed everything).
    for r in range(W):
        got = slots[r].cpu().numpy()
        for i, p in enumerate(Ls[0].params):
            for s in range(W):
                shard = sends[s].cpu().numpy()[p.send_offset : p.send_offset + p.shard_numel * p.elem_size]
                at = p.slot_offset + s * p.shard_numel * p.elem_size
                assert np.array_equal(got[at : at + shard.size], shard), (r, i, s)
    world.free_slot(slots)
