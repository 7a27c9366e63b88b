# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""ctypes binding of libnccl-tide-bench.so (benchmarks/native/tide_bench.h), the benchmark library.

The single-GPU "one rank's share" benchmark drives the library's own reduce kernel on given buffers, its
copy-engine copy path, a link pacer (copies paced to a byte rate by stream waits that a host thread releases: no
SMs) and the NCCL-like persistent reduce baseline through these. Pointers and streams are plain integers
(tensor.data_ptr(), stream.cuda_stream); every call enqueues on the given stream and returns.

The library is found at $NCCL_TIDE_BENCH_LIBRARY_PATH, else next to the libnccl-tide.so the package uses (a CMake
build directory: $NCCL_TIDE_LIBRARY_PATH). CMake builds it with the CUDA data path (TIDE_BUILD_BENCHMARKS, on by
default); the wheel does not ship it.
"""

import ctypes
import os
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_size_t, c_uint64, c_void_p
from pathlib import Path
from typing import Optional, Sequence, Tuple

from nccl_tide import _native as N
from nccl_tide.errors import LibraryNotFoundError

LIB_NAME = "libnccl-tide-bench.so"
ENV_LIBRARY_PATH = "NCCL_TIDE_BENCH_LIBRARY_PATH"
TIDE_BENCH_REDUCE_ARGS_VERSION = 3
_TYPES = {"bf16": N.tideBfloat16, "fp16": N.tideFloat16, "fp32": N.tideFloat32}
_OPS = {"sum": N.tideSum, "avg": N.tideAvg, "premul": N.tidePremulSum}
# The reduce's 16-byte-path kernels (tide_bench.h TIDE_BENCH_KERNEL_*): "library" is the one the executors launch.
KERNELS = {"library": 0, "loads": 1, "staged": 2}


class tideBenchReduceArgs_t(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("version", c_int),
        ("staging", c_void_p),
        ("srcStride", c_size_t),
        ("nSrc", c_int),
        ("n", c_uint64),
        ("out", c_void_p),
        ("inType", N.tideDataType_t),
        ("outType", N.tideDataType_t),
        ("op", N.tideRedOp_t),
        ("scale", c_float),
        ("divisor", c_float),
        ("prev", c_void_p),
        ("maxCtas", c_int),
        ("ctaBytes", c_uint64),
        ("followingBytes", ctypes.c_int64),
        ("kernel", c_int),
        ("ctaGBps", c_double),
    ]


_P = POINTER
_PPV = _P(c_void_p)
_PA = _P(tideBenchReduceArgs_t)

SIGNATURES = {
    "tideBenchReduce": (N.tideResult_t, [_PA, c_void_p]),
    "tideBenchReduceShape": (N.tideResult_t, [_PA, _P(c_int), _P(c_int), _P(c_int), _P(c_int), _P(c_uint64),
                                              _P(c_int)]),
    "tideBenchCopy": (N.tideResult_t, [c_int, _PPV, _PPV, _P(c_size_t), c_void_p]),
    "tideBenchPacerCreate": (N.tideResult_t, [c_double, c_size_t, _P(c_void_p)]),
    "tideBenchPacedCopy": (N.tideResult_t, [c_void_p, c_int, _PPV, _PPV, _P(c_size_t), c_void_p]),
    "tideBenchPacerStats": (N.tideResult_t, [c_void_p, _P(c_double), c_int]),
    "tideBenchPacerDestroy": (N.tideResult_t, [c_void_p]),
    "tideBenchPersistentReduce": (N.tideResult_t, [_PA, c_int, c_double, c_void_p]),
    "tideBenchGetLastError": (c_char_p, []),
}


def library_path() -> str:
    """Absolute path of libnccl-tide-bench.so: $NCCL_TIDE_BENCH_LIBRARY_PATH, else next to libnccl-tide.so."""
    override = os.environ.get(ENV_LIBRARY_PATH)
    if override:
        path, where = Path(override), f"${ENV_LIBRARY_PATH}={override}"
    else:
        try:
            product = N.library_path()
        except LibraryNotFoundError as e:
            raise LibraryNotFoundError(f"{LIB_NAME}: set ${ENV_LIBRARY_PATH} (or ${N.ENV_LIBRARY_PATH} to a "
                                       f"build directory's {N.LIB_NAME}); {e}") from e
        path = Path(product).with_name(LIB_NAME)
        where = f"{path} (next to {product}; set ${ENV_LIBRARY_PATH} to use another)"
    if not path.is_file():
        raise LibraryNotFoundError(
            f"{LIB_NAME} not found at {where}. It is built by CMake with the CUDA data path "
            f"(-DTIDE_BUILD_CUDA=ON, TIDE_BUILD_BENCHMARKS on by default) next to {N.LIB_NAME} in the build "
            f"directory; the wheel does not ship it")
    return str(path.resolve())


_library = N.LazyLibrary(library_path, SIGNATURES)  # loaded as nccl_tide loads libnccl-tide.so


def lib() -> ctypes.CDLL:
    """The benchmark library with the tide_bench.h signatures set (LibraryNotFoundError if it is absent, does not
    load or lacks one of them)."""
    return _library()


def available() -> bool:
    """Whether libnccl-tide-bench.so is found and loads (a host-only build has none)."""
    try:
        lib()
    except LibraryNotFoundError:
        return False
    return True


def check(result: int, what: str) -> None:
    """Raise the typed TideError for a non-success tideResult_t of a tideBench* call (its message is recorded in
    the benchmark library, not in libnccl-tide.so)."""
    if result == N.tideSuccess:
        return
    raw = lib().tideBenchGetLastError()
    raise N.named_error(result, raw.decode(errors="replace") if raw else f"tideResult_t {result}", what)


def reduce_args(staging: int, src_stride: int, n_src: int, n: int, out: int, in_type: str = "bf16",
                out_type: str = "fp32", op: str = "sum", scale: float = 1.0, divisor: float = 1.0,
                prev: Optional[int] = None, max_ctas: int = 0, cta_bytes: int = 0,
                following_bytes: int = -1, kernel: str = "library", cta_gbps: float = 0.0) -> tideBenchReduceArgs_t:
    """following_bytes: what arrives over links while this reduce runs (the next chunk's inputs), its deadline;
    -1: its own incoming bytes stand in; 0: nothing follows (the last reduce of a collective: a drain).
    kernel: the 16-byte path's kernel (KERNELS); cta_gbps: the per-CTA rate the grid rule sizes by (0: the
    library's)."""
    if in_type not in _TYPES or out_type not in _TYPES:
        raise ValueError(f"in_type/out_type must be one of {sorted(_TYPES)}, got {in_type!r}/{out_type!r}")
    if op not in _OPS:
        raise ValueError(f"op must be one of {sorted(_OPS)}, got {op!r}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    return tideBenchReduceArgs_t(
        ctypes.sizeof(tideBenchReduceArgs_t), TIDE_BENCH_REDUCE_ARGS_VERSION, staging, src_stride, n_src, n, out,
        _TYPES[in_type], _TYPES[out_type], _OPS[op], scale, divisor, prev, max_ctas, cta_bytes,
        N.int_arg(following_bytes, "following_bytes", -1, 2**63 - 1), KERNELS[kernel], cta_gbps,
    )


def reduce(args: tideBenchReduceArgs_t, stream: int) -> None:
    check(lib().tideBenchReduce(ctypes.byref(args), stream), "tideBenchReduce")


def reduce_shape(args: tideBenchReduceArgs_t) -> dict:
    """kernel: the 16-byte path's ("loads" or "staged"), None on the element path."""
    ctas, launches, threads, vector, nbytes, kernel = c_int(), c_int(), c_int(), c_int(), c_uint64(), c_int()
    check(lib().tideBenchReduceShape(ctypes.byref(args), ctypes.byref(ctas), ctypes.byref(launches),
                                       ctypes.byref(threads), ctypes.byref(vector), ctypes.byref(nbytes),
                                       ctypes.byref(kernel)),
            "tideBenchReduceShape")
    names = {v: k for k, v in KERNELS.items() if k != "library"}
    return {"ctas": ctas.value, "launches": launches.value, "threads": threads.value, "vector": bool(vector.value),
            "bytes": nbytes.value, "kernel": names.get(kernel.value)}


def _tables(copies: Sequence[Tuple[int, int, int]]):
    n = len(copies)
    dst = (c_void_p * max(n, 1))(*[c[0] for c in copies])
    src = (c_void_p * max(n, 1))(*[c[1] for c in copies])
    nb = (c_size_t * max(n, 1))(*[c[2] for c in copies])
    return n, dst, src, nb


def copy(copies: Sequence[Tuple[int, int, int]], stream: int) -> None:
    """(dst, src, bytes) copies through the library's copy-engine path (one hinted batch)."""
    n, dst, src, nb = _tables(copies)
    check(lib().tideBenchCopy(n, dst, src, nb, stream), "tideBenchCopy")


def persistent_reduce(args: tideBenchReduceArgs_t, ctas: int, seconds: float, stream: int) -> None:
    check(lib().tideBenchPersistentReduce(ctypes.byref(args), ctas, seconds, stream), "tideBenchPersistentReduce")


class Pacer:
    """A link of `gbps` GB/s (1e9 bytes/s) for copy-engine copies, cut into pieces of `piece_bytes`."""

    STATS = ("pieces_released", "transfers", "max_release_lag_us", "link_idle_us", "pieces_enqueued")

    def __init__(self, gbps: float, piece_bytes: int):
        if not gbps > 0 or gbps != gbps or gbps == float("inf"):
            raise ValueError(f"link rate must be a finite number > 0 GB/s, got {gbps}")
        # Pieces of 4 KiB .. 1 GiB: smaller ones would be thousands of host releases per transfer, and a value that
        # ctypes would wrap (negative, >= 2**64) must never reach the C size_t.
        if isinstance(piece_bytes, bool) or not isinstance(piece_bytes, int) or not 4096 <= piece_bytes <= 1 << 30:
            raise ValueError(f"piece_bytes must be an integer from 4096 to {1 << 30}, got {piece_bytes!r}")
        self.gbps, self.piece_bytes = gbps, piece_bytes
        h = c_void_p()
        check(lib().tideBenchPacerCreate(gbps * 1e9, piece_bytes, ctypes.byref(h)), "tideBenchPacerCreate")
        self._h = h

    def paced_copy(self, copies: Sequence[Tuple[int, int, int]], stream: int) -> None:
        """One transfer: its copies land piece by piece, each no earlier than the link could have carried it."""
        n, dst, src, nb = _tables(copies)
        check(lib().tideBenchPacedCopy(self._h, n, dst, src, nb, stream), "tideBenchPacedCopy")

    def stats(self) -> dict:
        out = (c_double * len(self.STATS))()
        check(lib().tideBenchPacerStats(self._h, out, len(self.STATS)), "tideBenchPacerStats")
        return dict(zip(self.STATS, list(out)))

    def close(self) -> None:
        """Call once the streams that used the pacer are idle (torch.cuda.synchronize())."""
        if self._h:
            check(lib().tideBenchPacerDestroy(self._h), "tideBenchPacerDestroy")
            self._h = c_void_p()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
