# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""nccl_tide.fsdp's layouts take the comm's TIDE node size into account (a layout must not span the comm's nodes)."""

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
from nccl_tide.fsdp._group import GroupState  # noqa: E402
from nccl_tide.layout import default_ranks_per_node  # noqa: E402


def _default(world, comm_nodes):
    ex = SimpleNamespace(comm=SimpleNamespace(ranks_per_node=comm_nodes)) if comm_nodes else SimpleNamespace()
    return GroupState._default_ranks_per_node(SimpleNamespace(world=world), ex)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6, 8, 12, 16, 64])
def test_default_divides_the_comm_nodes_and_the_world(world):
    assert _default(world, None) == default_ranks_per_node(world)  # no comm (reference executor)
    for comm_nodes in [d for d in range(1, world + 1) if world % d == 0]:
        r = _default(world, comm_nodes)
        assert comm_nodes % r == 0 and world % r == 0 and 1 <= r <= 8
        # the largest such divisor up to the world's default
        assert all(comm_nodes % d or d > default_ranks_per_node(world) for d in range(r + 1, comm_nodes + 1))
