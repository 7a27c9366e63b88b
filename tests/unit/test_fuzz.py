# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The fuzzer's corpus and a short fuzz run, in the CPU suite (tests/fuzz; ci/fuzz.sh runs it longer under
ASan/UBSan), plus readable regression tests for the bugs it found."""

import ctypes
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
sys.path.insert(0, str(FUZZ))

import fuzz as F  # noqa: E402
import harness as H  # noqa: E402

CORPUS = sorted((FUZZ / "corpus").glob("*.json"))


@pytest.fixture(scope="module")
def env_defaults(native):
    H.check_sizes()
    return H.env_defaults()


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_corpus(env_defaults, path):
    cases = json.loads(path.read_text())
    assert cases
    for k, case in enumerate(cases):
        try:
            H.check_case(case, *env_defaults)
        except H.CaseFailure as e:
            pytest.fail(f"{path.name} case {k}: {e}")


def test_short_fuzz_run(env_defaults):
    """A few hundred generated cases with a fixed seed: every generator mode and the model stay in step."""
    r = random.Random(20240610)
    kinds = {"ok": 0, "error": 0, "exec": 0}
    for i in range(300):
        case = F.gen_case(r)
        try:
            kinds[H.check_case(case, *env_defaults)] += 1
        except H.CaseFailure as e:
            pytest.fail(f"generated case {i}: {e}\n{json.dumps(case)}")
    assert all(kinds.values()), kinds  # valid, rejected and executed cases all occur


def test_pacing_cap_near_2_pow_64_keeps_the_schedule(native):
    """Bug: ceil(sendBytes / paceBytes) was (sendBytes + paceBytes - 1) / paceBytes, which wrapped to 0 pieces for a
    cap near 2^64: a 4-node layout got an empty inter-node schedule and tideHostAllGather a tideInternalError."""
    from nccl_tide import reference as ref
    from nccl_tide.host import host_all_gather
    from nccl_tide.layout import Layout

    for pace in (2**64 - 1, 2**64 - 2, 2**63 + 5):
        with Layout([55, 3], "fp32", world_size=24, ranks_per_node=6, pace_bytes=pace) as lay:
            info = H._info(lay.handle)[1]
            assert info.paceBytes == pace
            count = ctypes.c_int(-1)
            assert native.lib().tideLayoutGetScheduleLength(lay.handle, 0, ctypes.byref(count)) == 0
            assert count.value == 3  # 4 nodes: rounds of 1 and 2 blocks, one piece each
            assert [(s.round, s.bytes) for s in lay.schedule(0)] == [(0, lay.send_bytes), (1, lay.send_bytes)] * 1 + [
                (1, lay.send_bytes)
            ]
            rng = np.random.default_rng(pace % 1000)
            shards = [[rng.standard_normal(p.shard_numel).astype(np.float32) for p in lay.params] for _ in range(24)]
            params = host_all_gather(lay, shards)
            for r in range(24):
                for i in range(2):
                    np.testing.assert_array_equal(params[r][i], ref.all_gather_param([s[i] for s in shards]))


# Every int a C caller can pass where tide.h says an enum. Before the fix these were loaded as the C++ enum, which
# is undefined behaviour for values outside the enumerators' range (UBSan stops the sanitizer job on them).
BAD_ENUMS = [-1, -(2**31), 7, 8, 15, 16, 99, 2**31 - 1]


@pytest.mark.parametrize("value", BAD_ENUMS)
def test_out_of_range_enums_are_rejected_without_ub(native, value):
    lib = native.lib()
    size = ctypes.c_size_t(123)
    assert lib.tideDataTypeSize(value, ctypes.byref(size)) == native.tideInvalidArgument
    assert size.value == 123 and native.last_error()
    if not 0 <= value < native.tideNumResults:
        assert lib.tideGetErrorString(value).decode().startswith("tideUnknownResult")
    # desc.dtypes[i]
    case = {"numels": [10, 10], "dtypes": [2, value], "world": 2, "rpn": 1, "rank": 0, "config": None}
    rc, h, _, _ = H.create(case)
    assert rc == native.tideInvalidArgument and not h.value and str(value) in native.last_error()
    # host RS outType and op
    from nccl_tide.layout import Layout

    with Layout([8], "fp32", world_size=2) as lay:
        grads = [np.ones(8, np.float32) for _ in range(2)]
        outs = [np.full(lay.rs_out_numel, 7.0, np.float32) for _ in range(2)]
        g = native.pointer_table([a.ctypes.data for a in grads])
        o = native.pointer_table([a.ctypes.data for a in outs])
        for out_type, op in ((value, native.tideSum), (native.tideFloat32, value)):
            if 0 <= out_type < native.tideNumDataTypes and 0 <= op < native.tideNumRedOps:
                continue
            assert lib.tideHostReduceScatter(lay.handle, g, o, out_type, op, 1.0) == native.tideInvalidArgument
            assert str(value) in native.last_error()
        assert all(np.all(x == 7.0) for x in outs)
