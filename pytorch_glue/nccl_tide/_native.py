# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""ctypes binding of include/tide.h: every struct and every function, nothing more.

The library is loaded lazily (first call of lib()), so `import nccl_tide` works
without it. Lookup order: $NCCL_TIDE_LIBRARY_PATH (a dev build), then the copy
shipped in the wheel at nccl_tide/lib/libnccl-tide.so. benchmarks/bench_lib.py loads
libnccl-tide-bench.so the same way (LazyLibrary, named_error).
"""

import ctypes
import operator
import os
import re
import threading
from ctypes import POINTER, c_char_p, c_float, c_int, c_size_t, c_uint, c_uint64, c_void_p
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .errors import InvalidArgumentError, LibraryNotFoundError, TideError, error_for

LIB_NAME = "libnccl-tide.so"
ENV_LIBRARY_PATH = "NCCL_TIDE_LIBRARY_PATH"

# Mirrors of the #defines in tide.h.
TIDE_SLOT_ALIGN = 256
TIDE_MAX_PARAMS = 1 << 20
TIDE_MAX_WORLD_SIZE = 65536
TIDE_MAX_RANKS_PER_NODE = 64
TIDE_MAX_PARAM_NUMEL = 1 << 40
TIDE_CONFIG_VERSION = 1
TIDE_LAYOUT_DESC_VERSION = 1
TIDE_LAYOUT_INFO_VERSION = 1
TIDE_PARAM_INFO_VERSION = 1
TIDE_SCHEDULE_STEP_VERSION = 1
TIDE_NCCL_INFO_VERSION = 1
TIDE_BOOTSTRAP_VERSION = 1

# TIDE_NCCL_FEATURE_* bits of tideNcclInfo_t.features
NCCL_FEATURES = {
    "mem_alloc": 1 << 0,
    "window_register": 1 << 1,
    "win_get_user_ptr": 1 << 2,
    "lsa_pointers": 1 << 3,
    "lsa_multimem": 1 << 4,
    "put_signal": 1 << 5,
    "query_properties": 1 << 6,
    "coll_config": 1 << 7,
}

# tideResult_t
tideSuccess = 0
tideInvalidArgument = 1
tideInvalidUsage = 2
tideUnsupported = 3
tideOutOfMemory = 4
tideCudaError = 5
tideNcclError = 6
tideSystemError = 7
tideMismatch = 8
tideTimeout = 9
tideInternalError = 10
tideNumResults = 11

# tideDataType_t
tideBfloat16, tideFloat16, tideFloat32, tideFloat8e4m3, tideFloat8e5m2, tideInt8, tideInt32 = range(7)
tideNumDataTypes = 7

# tideRedOp_t
tideSum, tideAvg, tidePremulSum = range(3)
tideNumRedOps = 3

tideResult_t = c_int
tideDataType_t = c_int
tideRedOp_t = c_int
tideLayout_t = c_void_p
tideComm_t = c_void_p


class tideConfig_t(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("version", c_uint),
        ("rsChunkBytes", c_uint64),
        ("paceBytes", c_uint64),
    ]


class tideLayoutDesc_t(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("version", c_uint),
        ("nParams", c_int),
        ("numels", POINTER(c_uint64)),
        ("rowNumels", POINTER(c_uint64)),
        ("dtypes", POINTER(tideDataType_t)),
        ("worldSize", c_int),
        ("ranksPerNode", c_int),
        ("rank", c_int),
    ]


class tideLayoutInfo_t(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("version", c_uint),
        ("nParams", c_int),
        ("worldSize", c_int),
        ("ranksPerNode", c_int),
        ("nNodes", c_int),
        ("rank", c_int),
        ("hash", c_uint64),
        ("sendBytes", c_uint64),
        ("slotBytes", c_uint64),
        ("rsOutNumel", c_uint64),
        ("rsChunkNumel", c_uint64),
        ("rsNumChunks", c_int),
        ("rsStagingBytes", c_uint64),
        ("slotReuseFits", c_int),
        ("paceBytes", c_uint64),
    ]


class tideParamInfo_t(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("version", c_uint),
        ("numel", c_uint64),
        ("rowNumel", c_uint64),
        ("shardNumel", c_uint64),
        ("dtype", tideDataType_t),
        ("elemSize", c_size_t),
        ("sendOffset", c_uint64),
        ("slotOffset", c_uint64),
        ("rsOutOffset", c_uint64),
    ]


class tideScheduleStep_t(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("version", c_uint),
        ("round", c_int),
        ("sendToNode", c_int),
        ("recvFromNode", c_int),
        ("sendBlockNode", c_int),
        ("recvBlockNode", c_int),
        ("offset", c_uint64),
        ("bytes", c_uint64),
    ]


class tideNcclInfo_t(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("version", c_uint),
        ("headerVersion", c_int),
        ("runtimeVersion", c_int),
        ("effectiveVersion", c_int),
        ("features", c_uint64),
        ("provider", c_char_p),
        ("transport", c_char_p),
    ]


# int (*)(const void* mine, void* all, size_t bytes, void* user)
tideAllGatherFn_t = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t, c_void_p)


class tideBootstrap_t(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("version", c_uint),
        ("allgather", tideAllGatherFn_t),
        ("user", c_void_p),
    ]


TIDE_INTERPOSER_COUNTERS_VERSION = 1
TIDE_INTERPOSER_MAX_REASONS = 32


class tideInterposerCounters_t(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("version", c_uint),
        ("takenCalls", ctypes.c_uint64 * 2),
        ("takenBytes", ctypes.c_uint64 * 2),
        ("forwardedCalls", (ctypes.c_uint64 * TIDE_INTERPOSER_MAX_REASONS) * 2),
        ("forwardedBytes", (ctypes.c_uint64 * TIDE_INTERPOSER_MAX_REASONS) * 2),
        ("allGatherCopyOutCalls", ctypes.c_uint64),
        ("allGatherCopyOutBytes", ctypes.c_uint64),
    ]


TIDE_PENDING_WAIT_VERSION = 1


class tidePendingWait_t(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("version", c_uint),
        ("collective", c_int),
        ("stream", c_int),
        ("step", c_int),
        ("owner", c_int),
        ("word", c_int),
        ("writer", c_int),
        ("expected", ctypes.c_uint32),
        ("seen", ctypes.c_uint32),
        ("name", ctypes.c_char * 24),
    ]


_P = POINTER
_PPV = _P(c_void_p)  # const void* const* and void* const* tables
_PCS = _P(c_char_p)

# name: (restype, argtypes). Every function of tide.h, including the CUDA data path.
SIGNATURES = {
    "tideGetErrorString": (c_char_p, [tideResult_t]),
    "tideGetLastError": (c_char_p, []),
    "tideGetVersion": (tideResult_t, [_P(c_int)]),
    "tideDataTypeSize": (tideResult_t, [tideDataType_t, _P(c_size_t)]),
    "tideLayoutCreate": (tideResult_t, [_P(tideLayoutDesc_t), _P(tideConfig_t), _P(tideLayout_t)]),
    "tideLayoutDestroy": (tideResult_t, [tideLayout_t]),
    "tideLayoutGetInfo": (tideResult_t, [tideLayout_t, _P(tideLayoutInfo_t)]),
    "tideLayoutGetParam": (tideResult_t, [tideLayout_t, c_int, _P(tideParamInfo_t)]),
    "tideLayoutGetScheduleLength": (tideResult_t, [tideLayout_t, c_int, _P(c_int)]),
    "tideLayoutGetScheduleStep": (tideResult_t, [tideLayout_t, c_int, c_int, _P(tideScheduleStep_t)]),
    "tideHostAllGather": (tideResult_t, [tideLayout_t, _PPV, _PPV]),
    "tideHostReduceScatter": (tideResult_t, [tideLayout_t, _PPV, _PPV, tideDataType_t, tideRedOp_t, c_float]),
    "tideParamCount": (tideResult_t, [_P(c_int)]),
    "tideParamDescribe": (tideResult_t, [c_int, _PCS, _PCS, _PCS, _PCS, _PCS]),
    "tideLoopbackCreate": (tideResult_t, [c_int, c_int, _P(tideComm_t)]),
    "tideCommDestroy": (tideResult_t, [tideComm_t]),
    "tideCommAbort": (tideResult_t, [tideComm_t]),
    "tideCommGetRank": (tideResult_t, [tideComm_t, _P(c_int), _P(c_int)]),
    "tideCommGetRanksPerNode": (tideResult_t, [tideComm_t, _P(c_int)]),
    "tideSlotAlloc": (tideResult_t, [tideComm_t, c_size_t, _P(c_void_p)]),
    "tideSlotFree": (tideResult_t, [tideComm_t, c_void_p]),
    "tideAllGather": (tideResult_t, [tideComm_t, tideLayout_t, c_void_p, _PPV, c_void_p, c_void_p]),
    "tideReduceScatter": (
        tideResult_t,
        [tideComm_t, tideLayout_t, _PPV, c_void_p, tideDataType_t, tideRedOp_t, c_float, c_void_p, c_void_p],
    ),
    "tideMulticastAllowed": (tideResult_t, [_P(c_int)]),
    "tideNcclGetInfo": (tideResult_t, [_P(tideNcclInfo_t)]),
    "tideCommCreate": (tideResult_t, [c_void_p, _P(tideConfig_t), _P(tideComm_t)]),
    "tideCommCreateWithBootstrap": (
        tideResult_t,
        [c_int, c_int, c_int, _P(tideBootstrap_t), _P(tideConfig_t), _P(tideComm_t)],
    ),
    "tideCommGetProvider": (tideResult_t, [tideComm_t, _PCS]),
    "tideCommDebugDump": (tideResult_t, [tideComm_t, c_char_p, c_size_t]),
    "tideCommGetPendingWaits": (tideResult_t, [tideComm_t, _P(tidePendingWait_t), c_int, _P(c_int)]),
    "tideAttachLayout": (tideResult_t, [c_void_p, c_void_p, tideLayout_t]),
    "tideDetachLayout": (tideResult_t, [c_void_p, c_void_p]),
    "tideInterposerGetCounters": (tideResult_t, [c_void_p, _P(tideInterposerCounters_t)]),
    "tideInterposerReasonString": (c_char_p, [c_int]),
}


def packaged_library_path() -> Path:
    return Path(__file__).resolve().parent / "lib" / LIB_NAME


def library_path() -> str:
    """Absolute path of the libnccl-tide.so this package uses (env override first)."""
    override = os.environ.get(ENV_LIBRARY_PATH)
    path = Path(override) if override else packaged_library_path()
    if not path.is_file():
        where = f"${ENV_LIBRARY_PATH}={override}" if override else str(path)
        raise LibraryNotFoundError(f"{LIB_NAME} not found at {where}")
    return str(path.resolve())


def load(path: str, signatures: dict) -> ctypes.CDLL:
    """dlopen `path` (RTLD_LOCAL) and set the restype and argtypes of every function in `signatures` ({name:
    (restype, argtypes)}); LibraryNotFoundError if it does not load or lacks one of them."""
    try:
        handle = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    except OSError as e:
        raise LibraryNotFoundError(f"cannot load {path}: {e}") from e
    for name, (restype, argtypes) in signatures.items():
        try:
            fn = getattr(handle, name)
        except AttributeError as e:
            raise LibraryNotFoundError(f"{path} does not export {name}: stale or foreign library") from e
        fn.restype = restype
        fn.argtypes = argtypes
    return handle


class LazyLibrary:
    """A library loaded on first use: find_path() then load(path, signatures), once, thread-safe. A failure is
    raised to the caller and retried on the next call."""

    def __init__(self, find_path: Callable[[], str], signatures: dict) -> None:
        self._find_path, self._signatures = find_path, signatures
        self._lock = threading.Lock()
        self._handle: Optional[ctypes.CDLL] = None

    def __call__(self) -> ctypes.CDLL:
        handle = self._handle
        if handle is None:
            with self._lock:
                handle = self._handle
                if handle is None:
                    handle = self._handle = load(self._find_path(), self._signatures)
        return handle


_library = LazyLibrary(library_path, SIGNATURES)


def lib() -> ctypes.CDLL:
    """The loaded library with argtypes/restype set for every tide.h function."""
    return _library()


def last_error() -> str:
    msg = lib().tideGetLastError()
    return msg.decode(errors="replace") if msg else ""


def check(result: int, what: str = "") -> None:
    """Raise the typed TideError for a non-success tideResult_t."""
    if result == tideSuccess:
        return
    raise named_error(result, last_error() or lib().tideGetErrorString(result).decode(errors="replace"), what)


def named_error(result: int, msg: str, what: str = "") -> TideError:
    """The typed TideError for `result`, its message prefixed with `what` (the call) unless it starts with it
    already: the libraries' messages usually name their function."""
    if what and not (msg.startswith(what + ":") or msg.startswith(what + " ")):
        msg = f"{what}: {msg}"
    return error_for(result, msg)


# -- range checks of Python integers that cross into C ----------------------------------------------------------------
# ctypes silently wraps an out-of-range int (2**32 + 8 becomes 8 in a c_int, -1 becomes 2**64 - 1 in a c_uint64):
# every integer argument goes through one of these first, and a bad one is refused showing the value given.

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
U64_MAX = 2**64 - 1
SIZE_MAX = 2 ** (8 * ctypes.sizeof(c_size_t)) - 1


def as_int(value: Any, what: str) -> int:
    """value as a Python int: ints, numpy integers, objects with __index__, and integral floats (4.0)."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{what} is {value!r}; expected an integer, not a bool")
    try:
        return operator.index(value)
    except TypeError:
        pass
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise InvalidArgumentError(f"{what} is {value!r}; expected an integer")


def int_arg(value: Any, what: str, lo: int = INT_MIN, hi: int = INT_MAX) -> int:
    """A C int argument, refused unless lo <= value <= hi (defaults: the C int range)."""
    v = as_int(value, what)
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"{what} is {value!r}; expected an integer from {lo} to {hi}")
    return v


def u64_arg(value: Any, what: str, lo: int = 0, hi: int = U64_MAX) -> int:
    """A C uint64_t argument (size_t: pass hi=SIZE_MAX), refused unless lo <= value <= hi."""
    return int_arg(value, what, lo, hi)


def version_code() -> int:
    v = c_int(-1)
    check(lib().tideGetVersion(ctypes.byref(v)), "tideGetVersion")
    return v.value


def version_string() -> str:
    v = version_code()
    return f"{v // 10000}.{(v // 100) % 100}.{v % 100}"


def make_config(rs_chunk_bytes: int = 0, pace_bytes: int = 0) -> tideConfig_t:
    """A tideConfig_t (0 = the NCCL_TIDE_* default); negative or > 2^64 - 1 values are refused, not wrapped."""
    return tideConfig_t(
        ctypes.sizeof(tideConfig_t),
        TIDE_CONFIG_VERSION,
        u64_arg(rs_chunk_bytes, "rs_chunk_bytes"),
        u64_arg(pace_bytes, "pace_bytes"),
    )


def pointer_table(ptrs: Sequence[Any]) -> "ctypes.Array[c_void_p]":
    return (c_void_p * len(ptrs))(*ptrs)


# -- parameters (additions for NCCL_TIDE_TIMEOUT_MS) ------------------------------------------------------------------


def param_value(name: str) -> str:
    """Effective value (as text) of the NCCL_TIDE_* parameter `name`, read through tideParamDescribe, so the
    library's strict parser decides (never os.environ). Raises InvalidArgumentError (naming the variable and the
    accepted form) when the environment value does not parse, KeyError for an unknown name."""
    count = c_int(0)
    check(lib().tideParamCount(ctypes.byref(count)), "tideParamCount")
    failed = []  # every parameter whose environment value does not parse fails its whole description
    for i in range(count.value):
        n, v = c_char_p(), c_char_p()
        rc = lib().tideParamDescribe(i, ctypes.byref(n), None, None, None, ctypes.byref(v))
        if rc != tideSuccess:
            # the error names the variable: kept, in case it is the one asked for (any of them may be)
            failed.append(error_for(rc, f"tideParamDescribe: {last_error()}"))
            continue
        if n.value is not None and n.value.decode() == name:
            return v.value.decode() if v.value is not None else ""
    for e in failed:
        if re.search(rf"\b{re.escape(name)}\b", str(e)):
            raise e
    raise KeyError(f"{name} is not a registered NCCL_TIDE_* parameter")


_timeout_warned = False


def timeout_seconds(builtin: float) -> float:
    """Default bound (seconds) of the Python-side host waits (Comm.synchronize, LoopbackWorld.synchronize, the gloo
    bootstrap all-gather): NCCL_TIDE_TIMEOUT_MS when it is set to a nonzero value, else `builtin`. An invalid value
    is reported once (a warning carrying the library's message) and ignored, as the library ignores it."""
    global _timeout_warned

    try:
        ms = int(param_value("NCCL_TIDE_TIMEOUT_MS"))
    except (TideError, KeyError, ValueError) as e:
        if not _timeout_warned:
            _timeout_warned = True
            from ._log import get_logger

            get_logger("").warning("ignoring NCCL_TIDE_TIMEOUT_MS: %s", e)
        return builtin
    return ms / 1000.0 if ms > 0 else builtin


def pending_waits(comm_handle: Any, capacity: int = 8) -> list:
    """tideCommGetPendingWaits: the first unsatisfied wait on each stream of the comm's last AG and RS, as dicts
    {"step" (the word's short name), "owner", "peer" (the rank that writes it), "want", "have", "word",
    "collective", "stream", "where"}. Raises on failure (readback stuck, a call in progress)."""
    arr = (tidePendingWait_t * capacity)()
    for w in arr:
        w.size, w.version = ctypes.sizeof(tidePendingWait_t), TIDE_PENDING_WAIT_VERSION
    n = c_int(0)
    check(lib().tideCommGetPendingWaits(comm_handle, arr, capacity, ctypes.byref(n)), "tideCommGetPendingWaits")
    out = []
    for w in arr[: min(n.value, capacity)]:
        coll = "AG" if w.collective == 0 else "RS"
        lane = "caller" if w.stream == 0 else "internal"
        out.append(
            {
                "step": w.name.decode(),
                "owner": w.owner,
                "peer": w.writer,
                "want": w.expected,
                "have": w.seen,
                "word": w.word,
                "collective": coll,
                "stream": lane,
                "where": f"{coll} ({lane} stream, step {w.step})",
            }
        )
    return out
