# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Comm.reduce_scatter / Comm.all_gather check every tensor on every call, also once the fast tiers of
nccl_tide._tensor_args answer: a wrong dtype, size, device, a non-contiguous tensor, a missing tensor or something
that is no tensor is refused with the full check's own message, and nothing reaches the library. Repeated calls
reuse the pointer table and skip the per-tensor check; the library receives exactly the tensors' addresses.

No GPU: the library calls are recorded (the real library makes the layouts), and the tensors are CPU tensors that
report CUDA (is_cuda, device). torch's guard compares the real device (CPU for these), so here the wrong-device case
is a meta tensor; that the guard tells devices apart is _guards_work's own check.
"""

import pytest
import torch

import nccl_tide
import nccl_tide.comm as comm_mod
from nccl_tide import _native as N
from nccl_tide import _tensor_args as TA
from nccl_tide._lifetime import Lifetime
from nccl_tide.comm import Comm
from nccl_tide.errors import InvalidArgumentError


class _Dev:
    type = "cuda"
    index = 0

    def __str__(self):
        return "cuda:0"


class FakeCuda(torch.Tensor):
    is_cuda = True
    device = _Dev()
    __torch_function__ = torch._C._disabled_torch_function_impl


def fake(t):
    return t.as_subclass(FakeCuda)


class _Recorder:
    """tideReduceScatter / tideAllGather recorded with the addresses their tables held; the rest is the library."""

    def __init__(self, real):
        self._real = real
        self.calls = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def tideReduceScatter(self, comm, layout, table, out, out_code, op, scale, staging, stream):
        self.calls.append(("rs", list(table), out, out_code, op, staging, stream))
        return 0

    def tideAllGather(self, comm, layout, send, table, slot, stream):
        self.calls.append(("ag", None if table is None else list(table), send, slot, stream))
        return 0


@pytest.fixture(params=["guard", "facts"])
def tier(request, monkeypatch):
    """The fast tier in use: torch's TensorGuards (where this torch has a working one) or the attribute sweep."""
    if request.param == "guard" and not TA._guards_work():
        pytest.skip("this torch has no working TensorGuards: the 'facts' tier covers it")
    if request.param == "facts":
        monkeypatch.setattr(TA, "_guards_state", False)
    return request.param


@pytest.fixture
def rec(monkeypatch):
    r = _Recorder(N.lib())
    monkeypatch.setattr(N, "lib", lambda: r)
    return r


@pytest.fixture
def comm():
    c = Comm.__new__(Comm)
    c._life, c._handle, c.rank, c.world_size, c.device, c._slots = Lifetime("Comm"), 0x1000, 0, 2, 0, []
    return c


@pytest.fixture
def case(rng):
    """A random layout of bf16 parameters at W = 2, its gradients, output and shards (fake CUDA tensors)."""
    numels = [int(x) for x in rng.integers(1, 3000, int(rng.integers(3, 12)))]
    with nccl_tide.Layout(numels, "bf16", 2, rank=0) as L:
        grads = [fake(torch.randn(n).to(torch.bfloat16)) for n in numels]
        out = fake(torch.empty(L.rs_out_numel, dtype=torch.float32))
        shards = [fake(torch.randn(p.shard_numel).to(torch.bfloat16)) for p in L.params]
        slot = fake(torch.empty(L.slot_bytes, dtype=torch.uint8))
        yield L, grads, out, shards, slot


STREAM = 0x5000


def test_the_library_gets_the_tensors_addresses_and_repeats_build_nothing(tier, rec, comm, case):
    L, grads, out, shards, slot = case
    comm.reduce_scatter(L, grads, out, op="avg", stream=STREAM)
    table = TA.grads_table(L)
    checks, built = table.full_checks, table.tables_built
    for _ in range(3):
        comm.reduce_scatter(L, grads, out, op="avg", stream=STREAM)
    assert (table.full_checks, table.tables_built) == (checks, built)  # no per-tensor check, no new table
    want = ("rs", [g.data_ptr() for g in grads], out.data_ptr(), N.tideFloat32, N.tideAvg, None, STREAM)
    assert rec.calls == [want] * 4
    comm.all_gather(L, slot, shards=shards, stream=STREAM)
    comm.all_gather(L, slot, shards=shards, stream=STREAM)
    assert rec.calls[-1] == ("ag", [s.data_ptr() for s in shards], None, slot.data_ptr(), STREAM)
    assert TA.shards_table(L).tables_built == 1


def test_new_tensors_of_the_same_kind_take_the_fast_tier_and_a_new_table(tier, rec, comm, case):
    L, grads, out, _, _ = case
    comm.reduce_scatter(L, grads, out, stream=STREAM)
    table = TA.grads_table(L)
    checks, built = table.full_checks, table.tables_built
    fresh = [fake(torch.randn(g.numel()).to(torch.bfloat16)) for g in grads]
    comm.reduce_scatter(L, fresh, out, stream=STREAM)
    assert table.full_checks == checks and table.tables_built == built + 1
    assert rec.calls[-1][1] == [g.data_ptr() for g in fresh]


def _faults(L, rng):
    """(name, function making a bad gradient list from a good one, the index it spoils)."""
    k = int(rng.integers(0, L.n_params))
    n = L.params[k].numel

    def put(bad):
        return lambda gs: gs[:k] + [bad] + gs[k + 1:]

    return k, {
        "float16": put(fake(torch.zeros(n, dtype=torch.float16))),
        "int16": put(fake(torch.zeros(n, dtype=torch.int16))),
        "wrong size": put(fake(torch.zeros(n - 1 if n > 1 else 2, dtype=torch.bfloat16))),
        "non-contiguous": put(fake(torch.zeros(2 * n, dtype=torch.bfloat16)[::2])),
        "2-d with a gap": put(fake(torch.zeros(n, 2, dtype=torch.bfloat16)[:, 0])),
        "on meta": put(torch.zeros(n, dtype=torch.bfloat16, device="meta")),
        "not a tensor": put("grad"),
        "negative bit": put(fake(torch._neg_view(torch.randn(n).to(torch.bfloat16)))),
        "storage shorter than the tensor": put(_short(n)),
        "raw address past 64 bits": put(2**64 + 5),
        "negative raw address": put(-5),
        "bool as an address": put(True),
    }


def _short(n):
    t = fake(torch.zeros(n, dtype=torch.bfloat16))
    t.untyped_storage().resize_(2 * (n - 1))  # one element less behind it; the tensor's metadata unchanged
    return t


@pytest.mark.parametrize("warm", [False, True], ids=["first call", "after good calls"])
def test_every_fault_is_refused_with_the_full_checks_message(tier, rec, comm, case, rng, warm):
    L, grads, out, _, _ = case
    k, faults = _faults(L, rng)
    for name, spoil in faults.items():
        if warm:
            comm.reduce_scatter(L, grads, out, stream=STREAM)
            comm.reduce_scatter(L, grads, out, stream=STREAM)
        before = len(rec.calls)
        bad = spoil(list(grads))
        with pytest.raises(InvalidArgumentError) as got:
            comm.reduce_scatter(L, bad, out, stream=STREAM)
        with pytest.raises(InvalidArgumentError) as direct:
            TA.check(bad[k], f"grads[{k}]", L.params[k].numel * 2, dtype="bf16")
        assert str(got.value) == str(direct.value), name
        assert len(rec.calls) == before, f"{name}: the library was called"


def test_a_tensor_changed_in_place_after_good_calls_is_refused(tier, rec, comm, case):
    L, grads, out, _, _ = case
    for _ in range(2):
        comm.reduce_scatter(L, grads, out, stream=STREAM)
    n = grads[0].numel()
    grads[0].resize_(n + 1)  # the same tensor object, one element more
    with pytest.raises(InvalidArgumentError, match=rf"grads\[0\]: {2 * (n + 1)} bytes, layout needs {2 * n}"):
        comm.reduce_scatter(L, grads, out, stream=STREAM)
    big = fake(torch.zeros(2 * n, dtype=torch.bfloat16))
    grads[0].set_(big.untyped_storage(), 0, (n,), (2,))  # same object, now every second element
    with pytest.raises(InvalidArgumentError, match=r"grads\[0\]: tensor must be contiguous"):
        comm.reduce_scatter(L, grads, out, stream=STREAM)
    assert len(rec.calls) == 2


def test_counts_outputs_and_staging_are_checked(tier, rec, comm, case):
    L, grads, out, shards, slot = case
    comm.reduce_scatter(L, grads, out, stream=STREAM)
    P = L.n_params
    with pytest.raises(InvalidArgumentError, match=rf"grads: {P - 1} tensors, layout has {P} params"):
        comm.reduce_scatter(L, grads[:-1], out, stream=STREAM)
    with pytest.raises(InvalidArgumentError, match="out: dtype float64 is not float32/bfloat16/float16"):
        comm.reduce_scatter(L, grads, fake(torch.empty(L.rs_out_numel, dtype=torch.float64)), stream=STREAM)
    short = fake(torch.empty(L.rs_out_numel - 1, dtype=torch.float32))
    with pytest.raises(InvalidArgumentError, match=rf"out: {4 * (L.rs_out_numel - 1)} bytes"):
        comm.reduce_scatter(L, grads, short, stream=STREAM)
    with pytest.raises(InvalidArgumentError, match=r"out: float32 elements, but bf16 needs"):
        comm.reduce_scatter(L, grads, out, out_dtype="bf16", stream=STREAM)
    strided = fake(torch.empty(2 * L.rs_out_numel, dtype=torch.float32)[::2])
    with pytest.raises(InvalidArgumentError, match="out: tensor must be contiguous"):
        comm.reduce_scatter(L, grads, strided, stream=STREAM)
    small = fake(torch.empty(L.rs_staging_bytes - 1, dtype=torch.uint8))
    with pytest.raises(InvalidArgumentError, match=rf"staging: {L.rs_staging_bytes - 1} bytes, layout needs at least"):
        comm.reduce_scatter(L, grads, out, staging=small, stream=STREAM)
    with pytest.raises(InvalidArgumentError, match=rf"shards: {P + 1} tensors, layout has {P} params"):
        comm.all_gather(L, slot, shards=shards + shards[:1], stream=STREAM)
    with pytest.raises(InvalidArgumentError, match=r"shards\[1\]: float16 elements"):
        comm.all_gather(L, slot, shards=[shards[0], fake(torch.zeros(shards[1].numel(), dtype=torch.float16))]
                        + shards[2:], stream=STREAM)
    tiny = fake(torch.empty(L.slot_bytes - 1, dtype=torch.uint8))
    with pytest.raises(InvalidArgumentError, match="slot: .* bytes, layout needs at least"):
        comm.all_gather(L, tiny, shards=shards, stream=STREAM)
    assert len(rec.calls) == 1


def test_outputs_slots_and_staging_refuse_bad_memory_and_addresses(tier, rec, comm, case, rng):
    L, grads, out, shards, slot = case
    comm.reduce_scatter(L, grads, out, stream=STREAM)
    comm.all_gather(L, slot, shards=shards, stream=STREAM)
    with pytest.raises(InvalidArgumentError, match=r"out: .*negative bit.*resolve_neg"):
        comm.reduce_scatter(L, grads, fake(torch._neg_view(torch.zeros(L.rs_out_numel))), stream=STREAM)
    short_out = fake(torch.zeros(L.rs_out_numel))
    short_out.untyped_storage().resize_(4 * int(rng.integers(0, L.rs_out_numel)))
    with pytest.raises(InvalidArgumentError, match=r"out: its storage holds"):
        comm.reduce_scatter(L, grads, short_out, stream=STREAM)
    short_slot = fake(torch.empty(L.slot_bytes, dtype=torch.uint8))
    short_slot.untyped_storage().resize_(L.slot_bytes - 1)
    with pytest.raises(InvalidArgumentError, match=r"slot: its storage holds"):
        comm.all_gather(L, short_slot, shards=shards, stream=STREAM)
    for bad in (2**64 + 5, -5, True):
        with pytest.raises(InvalidArgumentError, match=r"out \(address\) is"):
            comm.reduce_scatter(L, grads, bad, out_dtype="fp32", stream=STREAM)
        with pytest.raises(InvalidArgumentError, match=r"sendbuf \(address\) is"):
            comm.all_gather(L, slot, sendbuf=bad, stream=STREAM)
    assert len(rec.calls) == 2


def test_bit_storage_and_raw_addresses_are_still_accepted(tier, rec, comm, case):
    L, grads, out, _, _ = case
    bits = [fake(g.view(torch.uint16)) for g in grads]  # bf16 held as its uint16 bits
    comm.reduce_scatter(L, bits, out, stream=STREAM)
    comm.reduce_scatter(L, bits, out, stream=STREAM)
    raw = [0x10000 * (i + 1) for i in range(L.n_params - 1)] + [2**64 - 2]  # the top of the range as well
    comm.reduce_scatter(L, raw, out.data_ptr(), out_dtype="fp32", stream=STREAM)
    assert [c[1] for c in rec.calls] == [[b.data_ptr() for b in bits]] * 2 + [raw]
    assert rec.calls[-1][2] == out.data_ptr()


def test_a_guard_that_misses_is_rebuilt_a_bounded_number_of_times(rec, comm, case, monkeypatch):
    if not TA._guards_work():
        pytest.skip("this torch has no working TensorGuards")
    L, grads, out, _, _ = case
    table = TA.grads_table(L)
    sweeps = []
    real = TA.TensorTable._facts_match
    monkeypatch.setattr(TA.TensorTable, "_facts_match", lambda self, ts: sweeps.append(1) or real(self, ts))
    bits = [fake(g.view(torch.uint16)) for g in grads]
    comm.reduce_scatter(L, bits, out, stream=STREAM)  # full check; the guard is built from uint16 tensors
    comm.reduce_scatter(L, grads, out, stream=STREAM)  # the guard misses, the sweep passes: rebuilt for bf16
    n = len(sweeps)
    comm.reduce_scatter(L, grads, out, stream=STREAM)
    assert len(sweeps) == n and table._guards_built == 2  # answered by the rebuilt guard
    for i in range(3 * TA.TensorTable.MAX_GUARDS):  # lists alternating in kind: at most MAX_GUARDS guards
        comm.reduce_scatter(L, bits if i % 2 else grads, out, stream=STREAM)
    assert table._guards_built == TA.TensorTable.MAX_GUARDS
    want = [g.data_ptr() for g in grads]  # the uint16 views share the bf16 tensors' memory
    assert len(rec.calls) == 3 + 3 * TA.TensorTable.MAX_GUARDS and all(c[1] == want for c in rec.calls)


def test_a_guard_that_raises_turns_the_guard_tier_off(rec, comm, case):
    # A torch release whose guard raises (not a miss): the call still goes through the exact checks, the table
    # builds no more guards, and a wrong tensor is still refused.
    L, grads, out, _, _ = case
    table = TA.grads_table(L)

    class Raising:
        def check(self, *tensors):
            raise RuntimeError("guard of another torch")

    table._guard = Raising()
    comm.reduce_scatter(L, grads, out, stream=STREAM)
    assert table._guard is None and table._guards_built == TA.TensorTable.MAX_GUARDS
    assert rec.calls[-1][1] == [g.data_ptr() for g in grads]
    bad = list(grads)
    bad[len(bad) // 2] = fake(torch.zeros(bad[len(bad) // 2].numel(), dtype=torch.float16))
    with pytest.raises(InvalidArgumentError, match=r"grads\[\d+\]"):
        comm.reduce_scatter(L, bad, out, stream=STREAM)
    assert len(rec.calls) == 1


def test_the_tables_keep_no_tensor_alive(tier, rec, comm, case):
    import gc
    import weakref

    L, grads, out, _, _ = case
    fresh = [fake(torch.randn(g.numel()).to(torch.bfloat16)) for g in grads]
    for _ in range(3):
        comm.reduce_scatter(L, fresh, out, stream=STREAM)
    refs = [weakref.ref(t) for t in fresh]
    del fresh
    gc.collect()
    assert all(r() is None for r in refs)  # a layout's checker holds addresses and metadata, never the gradients


def test_the_guard_refuses_what_the_fast_tier_relies_on():
    """Where this torch has TensorGuards, _guards_work found it refusing another dtype, size, shape, stride and
    device; here: the same for a guard over several tensors, with the fault in the middle."""
    if not TA._guards_work():
        assert TA._guard_class() is None or TA._guards_state is False  # off, and then never used
        return
    ref = [torch.zeros(5, dtype=torch.bfloat16) for _ in range(3)]
    g = TA._build_guard(TA._guard_class(), ref)
    assert g.check(*[torch.ones(5, dtype=torch.bfloat16) for _ in range(3)])
    for bad in (torch.zeros(5, dtype=torch.float16), torch.zeros(6, dtype=torch.bfloat16),
                torch.zeros(10, dtype=torch.bfloat16)[::2], torch.zeros(5, dtype=torch.bfloat16, device="meta")):
        assert not g.check(ref[0], bad, ref[2])


def test_the_current_stream_query_is_switched_only_when_it_agrees(monkeypatch):
    asked = []

    class _Stream:
        cuda_stream = 0x77

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: asked.append(device) or _Stream())
    for answer, switched in ((0x77, True), (0x78, False)):
        c = Comm.__new__(Comm)
        c.device = 0
        raw_calls = []

        def query(raw_calls=raw_calls, answer=answer):
            return lambda d: raw_calls.append(d) or answer

        monkeypatch.setattr(comm_mod, "_raw_stream_query", query)
        asked.clear()
        assert [c._stream(None) for _ in range(3)] == [0x77] * 3
        # torch.cuda.current_stream once, then the raw query (after one call that compared them); or always torch's
        assert (len(asked), len(raw_calls)) == ((1, 3) if switched else (3, 1))
