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
def test_every_row_of_every_slot_once(world):
    rng = random.Random(world)
    numel = rng.randrange(world * 3, 10_000)
    lay = _layout(numel, world, slot_offset=rng.randrange(0, 4096, 16), send_offset=rng.randrange(0, 512, 16))
    slots = [_Buf(rng.randrange(1 << 30, 1 << 40, 256)) for _ in range(world)]
    sends = [_Buf(rng.randrange(1 << 30, 1 << 40, 256)) for _ in range(world)]
    copies = ic.flat_all_gather_copies(lay, slots, sends)
    p = lay.params[0]
    shard = p.shard_numel * 2
    # W x W copies (unless a trailing row is empty), and they cover each slot's numel * elem bytes exactly once.
    for d in range(world):
        base = slots[d].data_ptr() + p.slot_offset
        mine = sorted((dst - base, src, n) for dst, src, n in copies if base <= dst < base + numel * 2)
        covered = 0
        for s, (off, src, n) in enumerate(mine):
            assert off == s * shard == covered
            assert src == sends[s].data_ptr() + p.send_offset
            covered += n
        assert covered == numel * 2
    assert sum(n for _, _, n in copies) == world * numel * 2


def test_an_empty_trailing_row_is_left_out():
    # numel 9 over 8 ranks: shards of 2, rows 0..3 hold 2, 2, 2, 2, row 4 holds 1, rows 5..7 hold nothing.
    lay = _layout(9, 8)
    copies = ic.flat_all_gather_copies(lay, [_Buf(1 << 20)] * 8, [_Buf((s + 1) << 24) for s in range(8)])
    assert len(copies) == 8 * 5
    assert sorted({n for _, _, n in copies}) == [2, 4]


# -- calls per host sample: the P x W cap only off the graph route (session 30) ------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_graph_route_rule(seed):
    rng = random.Random(seed)
    limit = rng.choice([2, 4, 64])
    params = {"NCCL_TIDE_EAGER_GRAPHS": "1", "NCCL_TIDE_TOKEN_RS_CHUNKS": str(limit)}
    chunks = rng.randrange(1, 100)
    one_node = SimpleNamespace(n_nodes=1, rs_num_chunks=chunks)
    assert ic.takes_graph_route(one_node, "ag", params)
    assert ic.takes_graph_route(one_node, "rs", params) == (chunks <= limit)
    two_nodes = SimpleNamespace(n_nodes=2, rs_num_chunks=1)
    assert not ic.takes_graph_route(two_nodes, "ag", params) and not ic.takes_graph_route(two_nodes, "rs", params)
    off = dict(params, NCCL_TIDE_EAGER_GRAPHS="0")
    assert not ic.takes_graph_route(one_node, "ag", off) and not ic.takes_graph_route(one_node, "rs", off)


def test_calls_per_sample_caps_only_eager_calls():
    assert ic.calls_per_sample(512, True) == 6  # 64 parameters at W = 8 on the graph route
    assert ic.calls_per_sample(512, False) == 1  # the same eager: one call per sample (queue bound)
    assert ic.calls_per_sample(72, False) == 6 and ic.calls_per_sample(150, False) == 4
    assert ic.calls_per_sample(10_000, False, calls=9) == 1 and ic.calls_per_sample(3, True, calls=9) == 9
