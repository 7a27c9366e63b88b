# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Layout properties against the independent model in tide_ref.py (include/tide.h math)."""

import math

import pytest
from nccl_tide import Layout
from nccl_tide.layout import default_ranks_per_node
from tide_ref import ALL_DTYPES, SLOT_ALIGN, divisors_upto, ref_layout

WORLDS = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64]


def random_group(rng, world, n_params=None):
    """Random parameters covering numel 1, numel < world, non-divisible and large shapes."""
    n_params = n_params or int(rng.integers(1, 12))
    numels, rows, dtypes = [], [], []
    for _ in range(n_params):
        kind = rng.integers(0, 6)
        if kind == 0:
            numel, row = 1, 1
        elif kind == 1:
            numel, row = int(rng.integers(1, world + 1)), 1  # at most one element per rank
        elif kind == 2:  # 2-D, rows not divisible by world in general
            row = int(rng.integers(1, 300))
            numel = row * int(rng.integers(1, 5 * world + 3))
        elif kind == 3:  # large (layouts allocate nothing)
            row = int(rng.choice([1, 4096, 14336]))
            numel = row * int(rng.integers(1, 1 << 18))
        elif kind == 4:  # 3-D (e.g. stacked experts): row = product of trailing dims
            a, b, c = (int(x) for x in rng.integers(1, 40, size=3))
            numel, row = a * b * c, b * c
        else:
            numel, row = int(rng.integers(1, 100_000)), 1
        numels.append(numel)
        rows.append(row)
        dtypes.append(str(rng.choice(ALL_DTYPES)))
    return numels, rows, dtypes


@pytest.mark.parametrize("world", WORLDS)
def test_layout_matches_reference(world, rng):
    for _trial in range(6):
        rpn = int(rng.choice(divisors_upto(world, 8)))
        rank = int(rng.integers(0, world))
        numels, rows, dtypes = random_group(rng, world)
        want = ref_layout(numels, rows, dtypes, world, rpn)
        with Layout(numels, dtypes, world, rpn, rank=rank, row_numels=rows) as lay:
            assert (lay.n_params, lay.world_size, lay.ranks_per_node, lay.rank) == (len(numels), world, rpn, rank)
            assert lay.n_nodes == want.n_nodes
            got = lay.params
            for i, (g, w) in enumerate(zip(got, want.params)):
                ctx = f"param {i} of {list(zip(numels, rows, dtypes))} world {world}"
                assert (g.numel, g.row_numel, g.shard_numel, g.elem_size) == (
                    w.numel,
                    w.row_numel,
                    w.shard_numel,
                    w.elem_size,
                ), ctx
                assert g.dtype == dtypes[i], ctx
                assert g.send_offset == w.send_offset, ctx
                assert g.slot_offset == w.slot_offset and g.slot_offset % SLOT_ALIGN == 0, ctx
                assert g.rs_out_offset == w.rs_out_offset, ctx
                # Padding is at the end of dim 0 and never reaches a whole rank's worth of rows.
                assert (g.shard_numel - g.row_numel) * world < g.numel <= g.shard_numel * world, ctx
            assert lay.send_bytes == want.send_end
            # The header does not say whether the slot's tail is padded: allow the aligned end.
            assert lay.slot_bytes in (want.slot_end, -(-want.slot_end // SLOT_ALIGN) * SLOT_ALIGN)
            assert lay.rs_out_numel == want.rs_out_numel


def test_rows_default_to_flat(rng):
    numels = [int(x) for x in rng.integers(1, 10_000, size=7)]
    with Layout(numels, "bf16", 6, 3) as a, Layout(numels, "bf16", 6, 3, row_numels=[1] * 7) as b:
        assert a.params == b.params and a.hash == b.hash
        assert [p.shard_numel for p in a.params] == [math.ceil(n / 6) for n in numels]


def test_rs_chunking_and_slot_reuse(rng):
    for world, rpn in [(1, 1), (8, 8), (16, 8), (12, 4), (48, 6)]:
        numels, rows, dtypes = random_group(rng, world, n_params=5)
        for chunk in (None, 4096, 1 << 20):
            with Layout(numels, dtypes, world, rpn, row_numels=rows, rs_chunk_bytes=chunk) as lay:
                assert lay.rs_chunk_numel >= 1
                assert lay.rs_num_chunks == -(-lay.rs_out_numel // lay.rs_chunk_numel)
                if chunk:  # chunk is bytes of fp32 output
                    assert lay.rs_chunk_numel * 4 <= chunk or lay.rs_chunk_numel == 1
                assert lay.slot_reuse_fits == (lay.rs_staging_bytes <= lay.slot_bytes)


def test_hash_covers_cross_rank_state(rng):
    numels, rows, dtypes = random_group(rng, 16, n_params=6)
    base = dict(numels=numels, dtypes=dtypes, world_size=16, ranks_per_node=8, row_numels=rows)

    def h(**kw):
        args = dict(base)
        args.update(kw)
        with Layout(**args) as lay:
            return lay.hash

    ref = h()
    assert h() == ref  # stable
    assert h(rank=5) == ref  # the calling rank is not part of the hash
    changed = [
        h(world_size=32),
        h(ranks_per_node=4),
        h(numels=[numels[0] + rows[0]] + numels[1:]),
        h(dtypes=["int32" if d != "int32" else "fp32" for d in dtypes]),
        h(row_numels=[1] * len(rows)) if any(r != 1 for r in rows) else h(rs_chunk_bytes=8192),
        h(rs_chunk_bytes=1 << 16),
        h(pace_bytes=1 << 16),
    ]
    assert all(c != ref for c in changed), changed


def test_default_ranks_per_node():
    assert [default_ranks_per_node(w) for w in (1, 3, 8, 12, 16, 24, 64, 7, 9)] == [1, 3, 8, 6, 8, 8, 8, 7, 3]
    with Layout([100], "fp32", 12) as lay:
        assert (lay.ranks_per_node, lay.n_nodes) == (6, 2)


def test_torch_dtypes_accepted():
    torch = pytest.importorskip("torch")
    with Layout([64, 64, 64], [torch.bfloat16, torch.float32, torch.float8_e4m3fn], 4) as lay:
        assert [p.dtype for p in lay.params] == ["bf16", "fp32", "fp8_e4m3"]
        assert [p.elem_size for p in lay.params] == [2, 4, 1]


def test_staging_independent_of_world_size(rng):
    """RS staging depends on ranks per node and chunk, never on world size (Slot-Reuse)."""
    # 16/64/512 ranks of 8 per node: 2, 8, 64 nodes (all multi-node); same per-rank shard sizes.
    for _trial in range(3):
        shard_rows = [int(x) for x in rng.integers(1, 2000, size=4)]
        rows = [int(x) for x in rng.choice([1, 128, 4096], size=4)]
        chunk = int(rng.choice([4096, 1 << 20, 32 << 20]))
        staging = {}
        for world in (16, 64, 512):
            numels = [s * world * r for s, r in zip(shard_rows, rows)]
            with Layout(numels, "bf16", world, 8, row_numels=rows, rs_chunk_bytes=chunk) as lay:
                assert lay.n_nodes == world // 8 > 1
                assert [p.shard_numel for p in lay.params] == [s * r for s, r in zip(shard_rows, rows)]
                staging[world] = lay.rs_staging_bytes
        assert len(set(staging.values())) == 1, staging
        assert staging[16] > 0


def test_large_numel_is_fine():
    n = 1 << 40  # TIDE_MAX_PARAM_NUMEL
    with Layout([n], "fp32", 64, 8) as lay:
        assert lay.params[0].shard_numel == n // 64
        assert lay.send_bytes == n // 64 * 4
