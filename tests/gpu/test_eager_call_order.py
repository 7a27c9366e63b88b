# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Call order on the eager graph route on loopback (NCCL_TIDE_EAGER_GRAPHS=1; docs/architecture.md "Issue rounds").

A virtual rank's token call enqueues only its announce at the call; its rounds wait on the host until every rank has
announced. A rank's next collective made before then would put its operations on the rank's stream ahead of the held
rounds (a second announce merges with the first unconsumed token: the peers' next waits then never pass), so the
library refuses it (tideInvalidUsage, nothing enqueued, the world stays usable) and a call that races the issue of
its held rounds on another thread waits for that issue. LoopbackWorld.close() drops a held collective (it can never
complete) and frees everything; synchronize(ranks=) counts the held collectives of those ranks. Each case runs in a
subprocess with the route on (the parameter is read once), whatever the suite's environment says.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

SCRIPT = textwrap.dedent(
    r"""
    import logging, sys, threading, time
    import numpy as np, torch, nccl_tide
    from nccl_tide.cuda import LoopbackWorld
    from nccl_tide.errors import InvalidUsageError, TideTimeoutError

    W = int(sys.argv[1])
    rng = np.random.default_rng(11 + W)
    INT = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32}  # the bit types TIDE accepts for bf16 and fp32

    class AG:
        def __init__(self, w):
            self.w = w
            self.Ls = [nccl_tide.Layout([4099, 64 * 3, 17], ["bf16", "fp32", "bf16"], W, rank=r,
                                        row_numels=[1, 64, 1]) for r in range(W)]
            self.L = self.Ls[0]
            self.slots = w.alloc_slot(self.L.slot_bytes)
            self.sends = [torch.empty(self.L.send_bytes, dtype=torch.uint8, device="cuda") for _ in range(W)]

        def new_inputs(self):
            L = self.L
            cpu = [torch.from_numpy(rng.integers(0, 256, L.send_bytes, dtype=np.uint8)) for _ in range(W)]
            shards = [[cpu[r][p.send_offset:p.send_offset + p.shard_numel * p.elem_size].view(INT[p.elem_size])
                       for p in L.params] for r in range(W)]
            self.exp = nccl_tide.host_all_gather(L, shards)
            for r in range(W):
                self.sends[r].copy_(cpu[r])
            for s in self.slots:
                s.fill_(0xFF)
            torch.cuda.synchronize()

        def rank(self, r):
            self.w.rank_all_gather(r, self.Ls[r], self.slots[r], sendbuf=self.sends[r])

        def check(self, what):
            self.w.synchronize(timeout=60)
            for r in range(W):
                got = self.slots[r].cpu().numpy()
                for i, p in enumerate(self.L.params):
                    n = p.shard_numel * W * p.elem_size
                    exp = np.ascontiguousarray(self.exp[r][i]).view(np.uint8)
                    assert np.array_equal(got[p.slot_offset:p.slot_offset + n], exp), (what, r, i)

    class RS:
        def __init__(self, w):
            self.w = w
            self.Ls = [nccl_tide.Layout([3000, 77], "bf16", W, rank=r) for r in range(W)]
            self.L = self.Ls[0]
            assert self.L.rs_num_chunks <= 2
            self.outs = [torch.empty(self.L.rs_out_numel, dtype=torch.float32, device="cuda") for _ in range(W)]
            self.grads = [[torch.empty(p.numel, dtype=torch.bfloat16, device="cuda") for p in self.L.params]
                          for _ in range(W)]

        def new_inputs(self):
            gc = [[torch.from_numpy((rng.standard_normal(p.numel) + 3).astype(np.float32)).to(torch.bfloat16)
                   for p in self.L.params] for _ in range(W)]
            self.exp = nccl_tide.host_reduce_scatter(self.L, gc, out_dtype="fp32", op="sum")
            for r in range(W):
                for g, c in zip(self.grads[r], gc[r]):
                    g.copy_(c)
                self.outs[r].fill_(float("nan"))
            torch.cuda.synchronize()

        def rank(self, r):
            self.w.rank_reduce_scatter(r, self.Ls[r], self.grads[r], self.outs[r], op="sum")

        def check(self, what):
            self.w.synchronize(timeout=60)
            for r in range(W):
                assert np.array_equal(self.outs[r].cpu().numpy().view(np.uint8),
                                      np.ascontiguousarray(self.exp[r]).view(np.uint8)), (what, r)

    def refused(fn, what):
        try:
            fn()
        except InvalidUsageError as e:
            msg = str(e)
            assert "still held on the host" in msg and "virtual rank(s) 1" in msg, msg
            return
        raise AssertionError(what + ": a rank's next collective before its peers' previous one was not refused")

    w = LoopbackWorld(W)
    ag, rs = AG(w), RS(w)
    # 1. Rank 0 runs ahead: its next AG and its next RS are refused, the held AG then completes exactly, and the
    # ranks' epochs stay in step (later calls direct, captured, replayed: all exact).
    for it in range(4):
        ag.new_inputs()
        ag.rank(0)
        refused(lambda: ag.rank(0), "AG after AG")
        rs.new_inputs()
        refused(lambda: rs.rank(0), "RS after AG")
        for r in range(1, W):
            ag.rank(r)
        ag.check("AG %d after a refused call" % it)
        for r in range(W):
            rs.rank(r)
        rs.check("RS %d" % it)
    # An RS held: the next AG is refused too.
    rs.new_inputs()
    rs.rank(0)
    ag.new_inputs()
    refused(lambda: ag.rank(0), "AG after RS")
    for r in range(1, W):
        rs.rank(r)
    rs.check("RS after a refused AG")
    print("ORDER OK", flush=True)

    # 2. synchronize(ranks=): a held collective of those ranks is not done; other ranks' syncs return.
    ag.new_inputs()
    ag.rank(0)
    t0 = time.monotonic()
    try:
        w.synchronize(ranks=[0], timeout=0.5)
        raise AssertionError("synchronize(ranks=[0]) returned with rank 0's collective held")
    except TideTimeoutError as e:
        assert "collectives of ranks [0]" in str(e), str(e)[:500]
    assert time.monotonic() - t0 < 20
    w.synchronize(ranks=list(range(1, W)), timeout=30)
    for r in range(1, W):
        ag.rank(r)
    w.synchronize(ranks=[0], timeout=60)
    ag.check("AG after synchronize(ranks=)")
    print("SYNC OK", flush=True)

    # 3. One thread per rank, each making its calls as fast as it can: a call refused because a peer is behind is
    # retried; a call racing the issue of its held rounds on another thread waits for it. No hang, exact.
    ag.new_inputs()
    errors = []

    def run(r):
        try:
            for _ in range(30):
                while True:
                    try:
                        ag.rank(r)
                        break
                    except InvalidUsageError as e:
                        assert "still held on the host" in str(e), str(e)
                        time.sleep(0.0002)
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(W)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "threads hung"
    assert not errors, errors
    ag.check("AG from one thread per rank")
    print("THREADS OK", flush=True)

    # 4. close() with a held collective: no 60 s wait, a warning, everything freed; a new world works.
    records = []
    h = logging.Handler()
    h.emit = lambda rec: records.append(rec.getMessage())
    logging.getLogger("nccl_tide").addHandler(h)
    ag.new_inputs()
    ag.rank(0)
    t0 = time.monotonic()
    w.close()
    took = time.monotonic() - t0
    assert took < 20, took
    assert any("dropping the collectives of ranks [0]" in m for m in records), records
    w2 = LoopbackWorld(W)
    ag2 = AG(w2)
    for it in range(3):
        ag2.new_inputs()
        for r in range(W):
            ag2.rank(r)
        ag2.check("AG on a new world %d" % it)
    w2.close()
    print("CLOSE OK %.2f" % took, flush=True)
    """
)


@pytest.mark.parametrize("W", [2, 4, 8])
def test_eager_call_order(torch_cuda, cuda_lib, W):
    env = dict(os.environ, NCCL_TIDE_EAGER_GRAPHS="1", CUDA_DEVICE_MAX_CONNECTIONS="32", NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", ""), *sys.path] if p)
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(W)], capture_output=True, text=True, env=env, timeout=500)
    out = p.stdout[-4000:] + p.stderr[-4000:]
    assert p.returncode == 0, out
    for tag in ("ORDER OK", "SYNC OK", "THREADS OK", "CLOSE OK"):
        assert tag in p.stdout, out
