# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Inter-node all-gather schedule: simulate Layout.schedule() and check the contract of tide.h."""

import math

import pytest
from nccl_tide import Layout


def build(n_nodes, rpn, send_bytes, pace):
    world = n_nodes * rpn
    # One fp8 parameter of send_bytes per rank: shard_numel == send_bytes exactly.
    return Layout([send_bytes * world], "fp8_e4m3", world, rpn, pace_bytes=pace)


def simulate(lay):
    """Runs every rank's steps; returns what each rank holds as {block rank: set of byte ranges}."""
    N, B = lay.n_nodes, lay.send_bytes
    steps = {n: lay.schedule(n) for n in range(N)}
    # Node-level holdings (identical on every rail): node -> block node -> covered byte ranges.
    held = {n: {n: {(0, B)}} for n in range(N)}
    rounds = math.ceil(math.log2(N)) if N > 1 else 0
    for k in range(rounds):
        d, cnt = 1 << k, min(1 << k, N - (1 << k))
        incoming = []
        for n in range(N):
            mine = [s for s in steps[n] if s.round == k]
            assert mine, f"node {n} has no step in round {k}"
            sent = {}
            for s in mine:
                assert s.send_to_node == (n - d) % N and s.recv_from_node == (n + d) % N
                assert (s.send_block_node - n) % N < cnt, s
                assert (s.recv_block_node - n - d) % N < cnt, s
                assert 1 <= s.bytes <= lay.pace_bytes, s
                assert s.offset + s.bytes <= B, s
                # A node only sends what it held before the round started.
                assert any(
                    lo <= s.offset and s.offset + s.bytes <= hi for lo, hi in held[n].get(s.send_block_node, ())
                ), s
                sent.setdefault(s.send_block_node, []).append((s.offset, s.bytes))
                incoming.append((n, s))
            # Per round a node sends exactly cnt whole blocks.
            assert len(sent) == cnt and all(sum(b for _, b in v) == B for v in sent.values())
        # Every receive is matched by the peer's send of the same bytes.
        sends = {
            (n, s.send_to_node, s.send_block_node, s.offset, s.bytes)
            for n in range(N)
            for s in steps[n]
            if s.round == k
        }
        for n, s in incoming:
            assert (s.recv_from_node, n, s.recv_block_node, s.offset, s.bytes) in sends, s
        for n, s in incoming:
            held[n].setdefault(s.recv_block_node, set()).add((s.offset, s.offset + s.bytes))
    assert all(s.round < rounds for n in range(N) for s in steps[n])
    return held


def covered(ranges, B):
    end = 0
    for lo, hi in sorted(ranges):
        if lo > end:
            return False
        end = max(end, hi)
    return end >= B


@pytest.mark.parametrize("n_nodes", list(range(1, 17)))
def test_every_rank_ends_with_every_block(n_nodes):
    for rpn, send_bytes, pace in [(1, 10_000, 4096), (2, 4096, 4096), (4, 20_000, 8192), (8, 1000, None)]:
        with build(n_nodes, rpn, send_bytes, pace) as lay:
            assert lay.n_nodes == n_nodes
            if pace:
                assert lay.pace_bytes == pace
            held = simulate(lay)
            if n_nodes == 1:
                assert lay.schedule(0) == []
            # Rail view: rank (n, l) holds block of rank (m, l) iff node n holds node m's block;
            # the node-local fan-out then gives every local rank every block of its node.
            for n in range(n_nodes):
                for m in range(n_nodes):
                    assert covered(held[n].get(m, ()), lay.send_bytes), (n, m)
            ranks_holding = {
                (n, loc): {
                    (m, j) for m in range(n_nodes) if covered(held[n].get(m, ()), lay.send_bytes) for j in range(rpn)
                }
                for n in range(n_nodes)
                for loc in range(rpn)
            }
            every = {(m, j) for m in range(n_nodes) for j in range(rpn)}
            assert all(v == every for v in ranks_holding.values())


def test_steps_respect_pace_and_are_paced_evenly():
    with build(5, 2, 50_000, 4096) as lay:
        for n in range(5):
            steps = lay.schedule(n)
            # ceil(50000 / 4096) = 13 pieces per block; 5 nodes send 1 + 2 + 1 = 4 blocks over 3 rounds.
            assert len(steps) == 13 * 4
            assert max(s.bytes for s in steps) == 4096
            assert [s.round for s in steps] == sorted(s.round for s in steps)  # rounds in order


def test_schedule_rejects_bad_node():
    from nccl_tide import InvalidArgumentError

    with build(3, 1, 4096, None) as lay:
        for node in (-1, 3):
            with pytest.raises(InvalidArgumentError):
                lay.schedule(node)
