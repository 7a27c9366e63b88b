"""issue_cost rules checked without a GPU: the copies a flat AG makes (copy floor) and the calls per host sample."""

import random
from types import SimpleNamespace

import pytest

from nccl_tide.perf import issue_cost as ic


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


# -- calls per host sample: the P x W cap only off the graph route (session 30) ------------------------------------

@pytest.mark.parametrize("limit", [2, 4, 64])
def test_graph_route_rule(limit):
    params = {"NCCL_TIDE_EAGER_GRAPHS": "1", "NCCL_TIDE_TOKEN_RS_CHUNKS": str(limit)}
    for chunks, graph in ((1, True), (limit, True), (limit + 1, False)):
        one_node = SimpleNamespace(n_nodes=1, rs_num_chunks=chunks)
        assert ic.takes_graph_route(one_node, "ag", params)
        assert ic.takes_graph_route(one_node, "rs", params) is graph
        off = dict(params, NCCL_TIDE_EAGER_GRAPHS="0")
        assert not ic.takes_graph_route(one_node, "ag", off) and not ic.takes_graph_route(one_node, "rs", off)
    two_nodes = SimpleNamespace(n_nodes=2, rs_num_chunks=1)
    assert not ic.takes_graph_route(two_nodes, "ag", params) and not ic.takes_graph_route(two_nodes, "rs", params)


def test_calls_per_sample_caps_only_eager_calls():
    assert ic.calls_per_sample(512, True) == 6  # 64 parameters at W = 8 on the graph route
    assert ic.calls_per_sample(512, False) == 1  # the same eager: one call per sample (queue bound)
    assert ic.calls_per_sample(72, False) == 6 and ic.calls_per_sample(150, False) == 4
    assert ic.calls_per_sample(300, False) == 2 and ic.calls_per_sample(301, False) == 1  # ~600 entries a sample
    assert ic.calls_per_sample(100, False) == 6 and ic.calls_per_sample(101, False) == 5
    assert ic.calls_per_sample(10_000, False, calls=9) == 1 and ic.calls_per_sample(3, True, calls=9) == 9
