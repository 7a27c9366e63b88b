# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""issue_graphs.py without a GPU: the replay graph's census (census_summary / format_census, what host_issue.py
prints under each AG row, so that a replay's host time can be read against what its graph holds) and the copies of
a flat AG's copy-engine floor."""

import random
from types import SimpleNamespace

import issue_graphs as ic
import pytest


def test_census_counts_nodes_by_kind_and_memop_operations():
    # two memop nodes (23 and 22 operations), 16 memcpy nodes, one kernel node, an unknown kind
    types = [12, 1, 1, 12] + [1] * 14 + [0, 99]
    c = ic.census_summary(types, [23, 22], 19)
    assert c["nodes"] == 20 and c["edges"] == 19 and c["memop_ops"] == 45
    assert c["by_type"] == {"kernel": 1, "memcpy": 16, "memop": 2, "type99": 1}
    text = ic.format_census(c)
    assert text == "20 nodes: kernel 1, memcpy 16, memop 2 (45 ops), type99 1; 19 edges"


def test_census_of_an_empty_graph_and_an_error():
    assert ic.census_summary([], [], 0) == {"nodes": 0, "by_type": {}, "memop_ops": 0, "edges": 0}
    assert ic.format_census({"error": "cuGraphGetNodes"}) == "census failed (cuGraphGetNodes)"


def test_node_kinds_follow_cuda_h():
    """The table against cuda.h's CUgraphNodeType where the toolkit is installed (a wrong value would mislabel every
    memop node); its anchors otherwise."""
    import os
    import re

    assert ic.GRAPH_NODE_TYPES[0] == "kernel" and ic.GRAPH_NODE_TYPES[12] == "memop"
    header = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include", "cuda.h")
    if not os.path.exists(header):
        return
    with open(header) as f:
        found = dict(re.findall(r"CU_GRAPH_NODE_TYPE_([A-Z_]+)\s*=\s*(\d+)", f.read()))
    rename = {"EXT_SEMAS_SIGNAL": "ext_sem_signal", "EXT_SEMAS_WAIT": "ext_sem_wait", "BATCH_MEM_OP": "memop"}
    for name, value in found.items():
        if int(value) in ic.GRAPH_NODE_TYPES:
            assert ic.GRAPH_NODE_TYPES[int(value)] == rename.get(name, name.lower()), (name, value)
    assert len([v for v in found.values() if int(v) in ic.GRAPH_NODE_TYPES]) == len(ic.GRAPH_NODE_TYPES)


# -- the copy floor: every rank's row of every slot, once, whole shards -------------------------------------------


class _Buf:
    def __init__(self, ptr):
        self._ptr = ptr

    def data_ptr(self):
        return self._ptr


def _layout(numel, world, elem=2, slot_offset=0, send_offset=0):
    shard = -(-numel // world)
    p = SimpleNamespace(numel=numel, shard_numel=shard, elem_size=elem, slot_offset=slot_offset,
                        send_offset=send_offset)
    return SimpleNamespace(params=[p])


@pytest.mark.parametrize("world", [2, 3, 8])
def test_every_rank_row_of_every_slot_once_whole_shards(world):
    rng = random.Random(world)
    numel = rng.randrange(world * 3, 10_000) | 1  # odd: the last row is padding in part
    lay = _layout(numel, world, slot_offset=rng.randrange(0, 4096, 16), send_offset=rng.randrange(0, 512, 16))
    slots = [_Buf(rng.randrange(1 << 30, 1 << 40, 256)) for _ in range(world)]
    sends = [_Buf(rng.randrange(1 << 30, 1 << 40, 256)) for _ in range(world)]
    copies = ic.flat_all_gather_copies(lay, slots, sends)
    p = lay.params[0]
    shard = p.shard_numel * 2
    assert len(copies) == world * world and all(n == shard for _, _, n in copies)  # the library copies whole shards
    for d in range(world):
        base = slots[d].data_ptr() + p.slot_offset
        mine = sorted((dst - base, src) for dst, src, _ in copies if base <= dst < base + world * shard)
        assert [off for off, _ in mine] == [s * shard for s in range(world)]  # row s at s * shardBytes
        assert [src for _, src in mine] == [sends[s].data_ptr() + p.send_offset for s in range(world)]
