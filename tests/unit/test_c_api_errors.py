# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Bad input through the C API (ctypes) and through Python: documented error, nothing written."""

import ctypes
import math
import os
import subprocess
import sys

import nccl_tide
import numpy as np
import pytest
from nccl_tide import InvalidArgumentError, Layout, UnsupportedError, host_all_gather, host_reduce_scatter
from nccl_tide import _native as N
from nccl_tide.data import random_values
from nccl_tide.host import poisoned

U64 = ctypes.c_uint64


def desc(numels, dtypes, world, rpn, rank=0, rows=None, size=None, version=None):
    n = len(numels)
    keep = [(U64 * max(n, 1))(*numels), (N.tideDataType_t * max(n, 1))(*dtypes)]
    if rows is not None:
        keep.append((U64 * n)(*rows))
    d = N.tideLayoutDesc_t(
        ctypes.sizeof(N.tideLayoutDesc_t) if size is None else size,
        N.TIDE_LAYOUT_DESC_VERSION if version is None else version,
        n,
        keep[0],
        keep[2] if rows is not None else None,
        keep[1],
        world,
        rpn,
        rank,
    )
    d._keep = keep  # keep the arrays alive as long as the struct
    return d


def create(d, config=None):
    lib = N.lib()
    out = N.tideLayout_t(0xDEAD)  # garbage: must come back NULL on failure
    rc = lib.tideLayoutCreate(ctypes.byref(d) if d is not None else None, config, ctypes.byref(out))
    return rc, out


BAD_DESCS = {
    "nParams 0": lambda: desc([], [], 4, 1),
    "numel 0": lambda: desc([10, 0], [N.tideFloat32] * 2, 4, 1),
    "numel too large": lambda: desc([N.TIDE_MAX_PARAM_NUMEL + 1], [N.tideFloat32], 4, 1),
    "unknown dtype": lambda: desc([10], [N.tideNumDataTypes], 4, 1),
    "negative dtype": lambda: desc([10], [-1], 4, 1),
    "world 0": lambda: desc([10], [N.tideFloat32], 0, 1),
    "world too large": lambda: desc([10], [N.tideFloat32], N.TIDE_MAX_WORLD_SIZE + 1, 1),
    "rank = world": lambda: desc([10], [N.tideFloat32], 4, 1, rank=4),
    "rank negative": lambda: desc([10], [N.tideFloat32], 4, 1, rank=-1),
    "rpn not dividing": lambda: desc([10], [N.tideFloat32], 6, 4),
    "rpn 0": lambda: desc([10], [N.tideFloat32], 4, 0),
    "rpn > world": lambda: desc([10], [N.tideFloat32], 4, 8),
    "rpn > max": lambda: desc([10], [N.tideFloat32], 128, 128),
    "row not dividing": lambda: desc([10], [N.tideFloat32], 4, 1, rows=[3]),
    "row 0": lambda: desc([10], [N.tideFloat32], 4, 1, rows=[0]),
    "bad size": lambda: desc([10], [N.tideFloat32], 4, 1, size=8),
    "bad version": lambda: desc([10], [N.tideFloat32], 4, 1, version=99),
}


@pytest.mark.parametrize("case", sorted(BAD_DESCS))
def test_layout_create_rejects(native, case):
    rc, out = create(BAD_DESCS[case]())
    assert rc == N.tideInvalidArgument, (case, rc, N.last_error())
    assert not out.value, "layout must be set to NULL on failure"
    assert N.last_error(), "a failing call leaves a message"


def test_layout_create_null_pointers(native):
    lib = N.lib()
    assert create(None)[0] == N.tideInvalidArgument
    d = desc([10], [N.tideFloat32], 4, 1)
    assert lib.tideLayoutCreate(ctypes.byref(d), None, None) == N.tideInvalidArgument
    d.numels = None
    assert create(d)[0] == N.tideInvalidArgument
    d = desc([10], [N.tideFloat32], 4, 1)
    d.dtypes = None
    assert create(d)[0] == N.tideInvalidArgument
    bad_cfg = N.make_config()
    bad_cfg.size = 4
    assert create(desc([10], [N.tideFloat32], 4, 1), ctypes.byref(bad_cfg))[0] == N.tideInvalidArgument


def test_query_errors(native):
    lib = N.lib()
    with Layout([100, 200], "fp32", 4, 2) as lay:
        info = N.tideLayoutInfo_t()
        assert lib.tideLayoutGetInfo(lay.handle, ctypes.byref(info)) == N.tideInvalidArgument  # size 0
        assert lib.tideLayoutGetInfo(lay.handle, None) == N.tideInvalidArgument
        assert lib.tideLayoutGetInfo(None, ctypes.byref(info)) == N.tideInvalidArgument
        p = N.tideParamInfo_t(ctypes.sizeof(N.tideParamInfo_t), N.TIDE_PARAM_INFO_VERSION)
        for index in (-1, 2):
            assert lib.tideLayoutGetParam(lay.handle, index, ctypes.byref(p)) == N.tideInvalidArgument
        count = ctypes.c_int()
        assert lib.tideLayoutGetScheduleLength(lay.handle, 2, ctypes.byref(count)) == N.tideInvalidArgument
        assert lib.tideLayoutGetScheduleLength(lay.handle, 0, None) == N.tideInvalidArgument
        step = N.tideScheduleStep_t(ctypes.sizeof(N.tideScheduleStep_t), N.TIDE_SCHEDULE_STEP_VERSION)
        assert lib.tideLayoutGetScheduleStep(lay.handle, 0, 10**6, ctypes.byref(step)) == N.tideInvalidArgument
    assert lib.tideLayoutDestroy(None) == N.tideSuccess
    assert lib.tideGetVersion(None) == N.tideInvalidArgument
    size = ctypes.c_size_t()
    assert lib.tideDataTypeSize(N.tideNumDataTypes, ctypes.byref(size)) == N.tideInvalidArgument
    assert lib.tideDataTypeSize(N.tideBfloat16, None) == N.tideInvalidArgument
    sizes = []
    for dt in range(N.tideNumDataTypes):
        assert lib.tideDataTypeSize(dt, ctypes.byref(size)) == N.tideSuccess
        sizes.append(size.value)
    assert sizes == [2, 2, 4, 1, 1, 1, 4]


def test_error_strings(native):
    lib = N.lib()
    names = [
        "tideSuccess",
        "tideInvalidArgument",
        "tideInvalidUsage",
        "tideUnsupported",
        "tideOutOfMemory",
        "tideCudaError",
        "tideNcclError",
        "tideSystemError",
        "tideMismatch",
        "tideTimeout",
        "tideInternalError",
    ]
    for code, name in enumerate(names):
        s = lib.tideGetErrorString(code).decode()
        assert s.startswith(name), s
    assert lib.tideGetErrorString(999)  # never NULL
    assert N.version_code() == 100  # 0.1.0


def _poisoned_tables(lay, world):
    shards = [
        [random_values(np.random.default_rng(r), p.dtype, p.shard_numel) for p in lay.params] for r in range(world)
    ]
    params = [
        [poisoned(p.shard_numel * world, nccl_tide.dtypes.dtype(p.dtype)) for p in lay.params] for _ in range(world)
    ]
    return shards, params


def _all_poisoned(arrays):
    return all((a.view(np.uint8) == 0xFF).all() for a in arrays)


def test_host_all_gather_bad_tables_write_nothing(native):
    lib, world = N.lib(), 4
    with Layout([33, 64], ["bf16", "int32"], world, 2) as lay:
        shards, params = _poisoned_tables(lay, world)
        src = [a.ctypes.data for r in shards for a in r]
        dst = [a.ctypes.data for r in params for a in r]
        flat_params = [a for r in params for a in r]
        cases = {
            "NULL shards": (None, N.pointer_table(dst)),
            "NULL params": (N.pointer_table(src), None),
            "NULL shard entry": (N.pointer_table(src[:-1] + [None]), N.pointer_table(dst)),
            "NULL param entry": (N.pointer_table(src), N.pointer_table([None] + dst[1:])),
            "overlapping outputs": (N.pointer_table(src), N.pointer_table(dst[:2] + dst[:2] + dst[4:])),
        }
        for name, (s, d) in cases.items():
            assert lib.tideHostAllGather(lay.handle, s, d) == N.tideInvalidArgument, name
            assert _all_poisoned(flat_params), f"{name}: output written on error"
        assert lib.tideHostAllGather(None, N.pointer_table(src), N.pointer_table(dst)) == N.tideInvalidArgument
        assert _all_poisoned(flat_params)


def test_host_reduce_scatter_bad_args_write_nothing(native):
    lib, world = N.lib(), 4
    numels = [50, 9]
    with Layout(numels, ["bf16", "fp32"], world, 2) as lay:
        grads = [
            [random_values(np.random.default_rng(r), d, n) for d, n in zip(["bf16", "fp32"], numels)]
            for r in range(world)
        ]
        outs = [poisoned(lay.rs_out_numel, nccl_tide.dtypes.dtype("fp32")) for _ in range(world)]
        src = N.pointer_table([a.ctypes.data for r in grads for a in r])
        dst = N.pointer_table([o.ctypes.data for o in outs])
        bad = {
            "NULL grads": (None, dst, N.tideFloat32, N.tideSum, 1.0),
            "NULL outs": (src, None, N.tideFloat32, N.tideSum, 1.0),
            "NULL out entry": (
                src,
                N.pointer_table([None] + [o.ctypes.data for o in outs[1:]]),
                N.tideFloat32,
                N.tideSum,
                1.0,
            ),
            "out int8": (src, dst, N.tideInt8, N.tideSum, 1.0),
            "out fp8": (src, dst, N.tideFloat8e4m3, N.tideSum, 1.0),
            "out unknown": (src, dst, 99, N.tideSum, 1.0),
            "op unknown": (src, dst, N.tideFloat32, N.tideNumRedOps, 1.0),
            "op negative": (src, dst, N.tideFloat32, -1, 1.0),
            "scale nan": (src, dst, N.tideFloat32, N.tidePremulSum, math.nan),
            "scale inf": (src, dst, N.tideFloat32, N.tidePremulSum, math.inf),
        }
        for name, args in bad.items():
            assert lib.tideHostReduceScatter(lay.handle, *args) == N.tideInvalidArgument, name
            assert _all_poisoned(outs), f"{name}: output written on error"
    # A parameter dtype reduce-scatter does not take.
    with Layout([40], "int8", world, 2) as lay:
        g = [[np.ones(40, np.int8)] for _ in range(world)]
        o = [poisoned(lay.rs_out_numel, nccl_tide.dtypes.dtype("fp32")) for _ in range(world)]
        rc = lib.tideHostReduceScatter(
            lay.handle,
            N.pointer_table([x[0].ctypes.data for x in g]),
            N.pointer_table([x.ctypes.data for x in o]),
            N.tideFloat32,
            N.tideSum,
            1.0,
        )
        assert rc == N.tideInvalidArgument
        assert _all_poisoned(o)


def test_python_errors_are_typed_and_write_nothing(native):
    world = 4
    with pytest.raises(InvalidArgumentError, match="numel"):
        Layout([10, 0], "fp32", world)
    with pytest.raises(InvalidArgumentError, match="dtype"):
        Layout([10], "complex64", world)
    with pytest.raises(InvalidArgumentError):
        Layout([10], "fp32", 6, ranks_per_node=4)
    with pytest.raises(InvalidArgumentError):
        Layout([10], "fp32", 4, rank=7)
    with Layout([33, 64], ["bf16", "int32"], world, 2) as lay:
        shards, params = _poisoned_tables(lay, world)
        flat = [a for r in params for a in r]
        wrong_size = [list(r) for r in shards]
        wrong_size[2][1] = wrong_size[2][1][:-1]
        wrong_type = [list(r) for r in shards]
        wrong_type[0][0] = wrong_type[0][0].astype(np.uint32)
        strided = [list(r) for r in shards]
        strided[1][1] = np.repeat(strided[1][1], 2)[::2]
        for bad in (wrong_size, wrong_type, strided, shards[:3], [r[:1] for r in shards]):
            with pytest.raises(InvalidArgumentError):
                host_all_gather(lay, bad, params)
            assert _all_poisoned(flat)
        with pytest.raises(InvalidArgumentError):
            host_all_gather(lay, shards, [r[::-1] for r in params])  # sizes swapped
        assert _all_poisoned(flat)
    with Layout([50], "bf16", world) as lay:
        grads = [[random_values(np.random.default_rng(r), "bf16", 50)] for r in range(world)]
        outs = [poisoned(lay.rs_out_numel, nccl_tide.dtypes.dtype("fp32")) for _ in range(world)]
        for kwargs in ({"op": "max"}, {"out_dtype": "int8"}, {"op": "premul", "scale": math.nan}):
            with pytest.raises(InvalidArgumentError):
                host_reduce_scatter(lay, grads, outs=outs, **kwargs)
            assert _all_poisoned(outs)
        with pytest.raises(InvalidArgumentError):
            host_reduce_scatter(lay, grads, "bf16", outs=outs)  # outputs are fp32-sized
        assert _all_poisoned(outs)
    lay = Layout([10], "fp32", 2)
    lay.close()
    lay.close()  # idempotent
    with pytest.raises(InvalidArgumentError, match="closed"):
        host_all_gather(lay, [[np.ones(5, np.float32)]] * 2)


def test_cuda_entry_points_without_gpu(native):
    """No GPU here: the CUDA data path answers tideUnsupported (host-only build or no device)."""
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU is present; tests/gpu covers the CUDA path")
    lib = N.lib()
    comms = (N.tideComm_t * 2)()
    assert lib.tideLoopbackCreate(2, 0, comms) == N.tideUnsupported
    assert not comms[0] and not comms[1]
    assert lib.tideCommDestroy(None) == N.tideSuccess
    with pytest.raises(UnsupportedError, match="CUDA"):
        N.check(lib.tideLoopbackCreate(2, 0, comms), "loopback")


MULTICAST_CASES = [
    ({"NCCL_TIDE_NVLS": "1"}, 1),
    ({}, 0),
    ({"NCCL_TIDE_NVLS": "1", "NCCL_NVLS_ENABLE": "0"}, 0),
    ({"NCCL_TIDE_NVLS": "1", "NCCL_NVLS_ENABLE": "1"}, 1),
    ({"NCCL_TIDE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"}, 0),
    ({"NCCL_TIDE_NVLS": "1", "NVSHMEM_DISABLE_NVLS": "1"}, 0),
]


def test_multicast_gate(native):
    code = (
        "import ctypes; from nccl_tide import _native as N; v = ctypes.c_int(-1); "
        "assert N.lib().tideMulticastAllowed(ctypes.byref(v)) == 0; print(v.value)"
    )
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NCCL_TIDE_NVLS", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
    }
    for extra, want in MULTICAST_CASES:
        out = subprocess.run([sys.executable, "-c", code], env={**base, **extra}, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert int(out.stdout.strip()) == want, extra
