# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Random-interleaving model of the captured (CUDA graph) token protocol (the kCaptured programs of plugin/core/program_ag.cc / program_rs.cc; CPU only).

It models the protocol as docs/architecture.md "CUDA graphs" states it, not the code: every rank runs a program of
flag writes, flag waits (GEQ) and data writes into peers' slot/staging, for several captured collectives (AG, RS of
1 or 2 chunks) in a row, like successive replays. A random scheduler interleaves the ranks. Checked:

* no deadlock;
* no wait passes on a stale token (token values carry the instance that wrote them);
* a data write into rank d for instance n happens while d is inside instance n (after it announced the instance,
  before it finished it): no overwrite of data d still reads, no write after d moved on;
* the loopback shared copy-engine queue (one FIFO of every rank's copies in launch order): one TIDE collective per
  graph, graphs launched rank by rank each round, never deadlocks; two per graph does (why the loopback provider
  refuses a second collective in one graph);
* removing a reset makes the model fail (the check is sensitive).
"""

import random

import pytest


def program(me, W, kinds, skip_reset=None):
    ops = []
    for n, kind in enumerate(kinds):
        peers = [d for d in range(W) if d != me]
        ops.append(("enter", n))
        if kind == "ag":
            ready, done, last = "agReady", "agDone", [1]
        else:
            ready, done, last = "rsEnter", "rsFull", list(range(1, int(kind[2:]) + 1))
        ops += [("write", d, (ready, me), 1, n) for d in peers]
        ops += [("wait", (ready, d), 1, n) for d in peers]
        if skip_reset != ready:
            ops += [("write", me, (ready, d), 0, n) for d in peers]
        for v in last:  # per chunk: data into every peer, then the token
            ops += [("data", d, n) for d in peers]
            ops += [("write", d, (done, me), v, n) for d in peers]
        for v in last:
            ops += [("wait", (done, s), v, n) for s in peers]
        if skip_reset != done:
            ops += [("write", me, (done, s), 0, n) for s in peers]
        ops.append(("leave", n))
    return ops


def geq(x, y):
    return ((x - y) & 0xFFFFFFFF) < 0x80000000  # CU_STREAM_WAIT_VALUE_GEQ, cyclic


def run(W, kinds, seed, per_graph=None, skip_reset=None):
    """Returns None if every rank finished, else a string saying what went wrong."""
    rng = random.Random(seed)
    progs = [program(r, W, kinds, skip_reset) for r in range(W)]
    fifo = None
    if per_graph is not None:
        fifo = []
        for g0 in range(0, len(kinds), per_graph):
            for r in range(W):
                fifo += [(r, i) for i, op in enumerate(progs[r]) if op[0] == "data" and g0 <= op[2] < g0 + per_graph]
    head = 0
    pc = [0] * W
    mem = [dict() for _ in range(W)]
    inside = [None] * W
    while True:
        runnable = []
        for r in range(W):
            if pc[r] >= len(progs[r]):
                continue
            op = progs[r][pc[r]]
            if op[0] == "wait" and not geq(mem[r].get(op[1], (0, None))[0], op[2]):
                continue
            if op[0] == "data" and fifo is not None and fifo[head] != (r, pc[r]):
                continue
            runnable.append(r)
        if not runnable:
            return None if all(pc[r] >= len(progs[r]) for r in range(W)) else f"deadlock at {pc}"
        r = rng.choice(runnable)
        op = progs[r][pc[r]]
        pc[r] += 1
        if op[0] == "enter":
            inside[r] = op[1]
        elif op[0] == "leave":
            inside[r] = None
        elif op[0] == "write":
            mem[op[1]][op[2]] = (op[3], op[4])
        elif op[0] == "wait":
            tag = mem[r].get(op[1], (0, None))[1]
            if tag != op[3]:
                return f"stale token: rank {r} {op} passed on instance {tag}'s value"
        elif op[0] == "data":
            if inside[op[1]] != op[2]:
                return f"race: rank {r} writes into rank {op[1]} for instance {op[2]} while it is in {inside[op[1]]}"
            if fifo is not None:
                head += 1


KINDS = [["ag"] * 5, ["rs1"] * 4, ["rs2"] * 4, ["ag", "rs2", "ag", "rs1", "rs2", "ag"]]


@pytest.mark.parametrize("W", [2, 3, 4, 5])
def test_protocol_is_safe(W):
    for kinds in KINDS:
        for seed in range(400):
            assert run(W, kinds, seed) is None, (W, kinds, seed, run(W, kinds, seed))


@pytest.mark.parametrize("W", [2, 3, 4])
def test_shared_copy_queue(W):
    for kinds in KINDS:
        for seed in range(100):
            assert run(W, kinds, seed, per_graph=1) is None
    assert all(run(W, ["ag", "rs2", "ag", "rs1"], seed, per_graph=2) is not None for seed in range(20))


@pytest.mark.parametrize("word", ["agReady", "agDone", "rsEnter", "rsFull"])
def test_model_catches_a_missing_reset(word):
    kinds = ["ag"] * 4 if word.startswith("ag") else ["rs2"] * 4
    assert any(run(3, kinds, seed, skip_reset=word) is not None for seed in range(50))
