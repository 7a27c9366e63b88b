# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Bad arguments of the Python host API raise InvalidArgumentError (not a bare TypeError/ValueError from inside),
an unused scale is not refused, and a Layout can be copied and pickled (each copy owning its own handle)."""

import copy
import pickle

import numpy as np
import pytest

from nccl_tide import InvalidArgumentError, Layout, host_all_gather, host_reduce_scatter

W = 2


@pytest.fixture
def layout():
    with Layout([8, 6], "fp32", W) as lay:
        yield lay


def grads_for(layout, rng):
    def values(n, dt):
        x = rng.standard_normal(n).astype(np.float32)
        return (x.view(np.uint32) >> 16).astype(np.uint16) if dt.name == "bf16" else x.astype(dt.storage)

    return [[values(p.numel, dt) for p, dt in zip(layout.params, layout.dtypes)] for _ in range(W)]


@pytest.mark.parametrize("numels", [5, None, "12", 2.5])
def test_numels_that_are_not_a_sequence(numels):
    with pytest.raises(InvalidArgumentError, match=r"numels is .*; expected a sequence"):
        Layout(numels, "fp32", W)


@pytest.mark.parametrize("rows", [5, "8"])
def test_row_numels_that_are_not_a_sequence(rows):
    with pytest.raises(InvalidArgumentError, match=r"row_numels is .*; expected a sequence"):
        Layout([8], "fp32", W, row_numels=rows)


# None outs / params is the default (allocated by the call), so not among their bad values.
@pytest.mark.parametrize("what, bad", [("grads", None), ("grads", 3), ("grads", [None, None]), ("outs", 3),
                                       ("outs", [None, None]), ("outs", "ab")])
def test_reduce_scatter_tables_that_are_not_sequences(layout, rng, what, bad):
    kw = {"grads": grads_for(layout, rng), "outs": None, what: bad}
    with pytest.raises(InvalidArgumentError, match=rf"{what}"):
        host_reduce_scatter(layout, kw["grads"], outs=kw["outs"])


@pytest.mark.parametrize("what, bad", [("shards", None), ("shards", 3), ("shards", [None, None]), ("params", 3),
                                       ("params", [None, None]), ("params", "ab")])
def test_all_gather_tables_that_are_not_sequences(layout, what, bad):
    kw = {"shards": [[np.ones(p.shard_numel, np.float32) for p in layout.params] for _ in range(W)], "params": None,
          what: bad}
    with pytest.raises(InvalidArgumentError, match=rf"{what}"):
        host_all_gather(layout, kw["shards"], kw["params"])


@pytest.mark.parametrize("op", ["sum", "premul"])
@pytest.mark.parametrize("scale", ["abc", None, "2.0", [1.0]])
def test_scale_that_is_not_a_number(layout, rng, op, scale):
    with pytest.raises(InvalidArgumentError, match="scale"):
        host_reduce_scatter(layout, grads_for(layout, rng), op=op, scale=scale)


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_scale_unused_by_the_op_is_not_refused(layout, rng, op):
    grads = grads_for(layout, rng)
    want = host_reduce_scatter(layout, grads, op=op)
    got = host_reduce_scatter(layout, grads, op=op, scale=1e39)
    for a, b in zip(want, got):
        assert np.array_equal(a, b)


def test_premul_scale_outside_fp32_is_refused_with_its_value(layout, rng):
    with pytest.raises(InvalidArgumentError, match=r"scale=1e\+39 .*fp32"):
        host_reduce_scatter(layout, grads_for(layout, rng), op="premul", scale=1e39)


def check_independent(a, b, rng):
    """a and b describe the same layout, and closing one leaves the other usable (each its own handle)."""
    assert a is not b and a.hash == b.hash and a.params == b.params and a.dtypes == b.dtypes
    grads = grads_for(a, rng)
    want = host_reduce_scatter(a, grads)
    a.close()
    for x, y in zip(want, host_reduce_scatter(b, grads)):
        assert np.array_equal(x, y)
    b.close()  # its own handle: no "destroyed" error
    b.close()  # idempotent


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_copies_own_their_handle(rng, how):
    make = {"copy": copy.copy, "deepcopy": copy.deepcopy, "pickle": lambda x: pickle.loads(pickle.dumps(x))}[how]
    a = Layout([8, 6, 5], ["fp32", "bf16", "fp16"], W, row_numels=[2, 3, 5], pace_bytes=1 << 20)
    b = make(a)
    assert b.pace_bytes == 1 << 20 and [p.row_numel for p in b.params] == [2, 3, 5]
    check_independent(a, b, rng)


def test_a_layout_reaches_a_spawn_worker_by_value(rng):
    import multiprocessing
    import operator

    facts = operator.attrgetter("hash", "slot_bytes", "params")  # read in the worker, from its own handle
    numels = [int(x) for x in rng.integers(1, 500, int(rng.integers(1, 6)))]
    with Layout(numels, "bf16", 4, rank=1) as L:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            assert pool.apply(facts, (L,)) == facts(L)


def test_process_local_objects_refuse_pickling_in_one_line():
    from nccl_tide._lifetime import Lifetime
    from nccl_tide.comm import Comm
    from nccl_tide.cuda import LoopbackWorld

    comm = Comm.__new__(Comm)  # a Comm's state without a library comm: pickling never reaches the handle
    comm._life, comm._handle, comm._keep, comm._slots = Lifetime("Comm"), 0x1234, [], []
    with pytest.raises(TypeError, match=r"a Comm cannot be pickled: .*create one in the other process"):
        pickle.dumps(comm)
    world = LoopbackWorld.__new__(LoopbackWorld)
    with pytest.raises(TypeError, match=r"a LoopbackWorld cannot be pickled"):
        pickle.dumps(world)
