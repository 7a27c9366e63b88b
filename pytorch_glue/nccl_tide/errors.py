"""Typed exceptions for tideResult_t codes.

Each class maps to one tideResult_t value. The message is the library's
tideGetLastError() text followed by what to do about it.
"""

from typing import Dict, Optional, Type


class TideError(Exception):
    """Base of every nccl-tide error. `code` is the tideResult_t value."""

    code: int = -1
    hint: str = ""

    def __init__(self, message: str = "", code: Optional[int] = None):
        if code is not None:
            self.code = code
        text = message or type(self).__name__
        if self.hint:
            text = f"{text} ({self.hint})"
        super().__init__(text)
        self.detail = message


class InvalidArgumentError(TideError, ValueError):
    code = 1
    hint = "check sizes, dtypes, pointers and ranks against include/tide.h"


class InvalidUsageError(TideError, RuntimeError):
    code = 2
    hint = "the call is not allowed in the current state; see include/tide.h for the order of calls"


class UnsupportedError(TideError, RuntimeError):
    code = 3
    hint = (
        "this build or runtime cannot do it: GPU paths need a CUDA build (TIDE_BUILD_CUDA=ON), "
        "a GPU and NCCL >= 2.28 (pip install 'nccl-tide[cu12]' or 'nccl-tide[cu13]')"
    )


class TideOutOfMemoryError(TideError, MemoryError):
    code = 4
    hint = "free host/device memory or use a smaller layout"


class CudaError(TideError, RuntimeError):
    code = 5
    hint = "a CUDA call failed; check the driver, the device and NCCL_TIDE_DEBUG=INFO output"


class NcclError(TideError, RuntimeError):
    code = 6
    hint = "an NCCL call failed; rerun with NCCL_DEBUG=WARN and NCCL_TIDE_DEBUG=INFO"


class TideSystemError(TideError, OSError):
    code = 7
    hint = "an OS call failed (dlopen, ...); check that libnccl.so.2 is loaded and readable"


class MismatchError(TideError, RuntimeError):
    code = 8
    hint = "ranks disagree on the layout or config: every rank must pass the same parameters and NCCL_TIDE_* settings"


class TideTimeoutError(TideError, TimeoutError):
    code = 9
    hint = "a bounded wait expired; a peer rank may be stuck or dead"


class InternalError(TideError, RuntimeError):
    code = 10
    hint = "a bug in nccl-tide; please report it with NCCL_TIDE_DEBUG=INFO output"


class LibraryNotFoundError(TideError, ImportError):
    """libnccl-tide.so could not be found or loaded (not a tideResult_t code)."""

    hint = (
        "reinstall with `pip install nccl-tide` (or `pip install .` in a source checkout), "
        "or point NCCL_TIDE_LIBRARY_PATH at a built libnccl-tide.so"
    )


BY_CODE: Dict[int, Type[TideError]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        InvalidUsageError,
        UnsupportedError,
        TideOutOfMemoryError,
        CudaError,
        NcclError,
        TideSystemError,
        MismatchError,
        TideTimeoutError,
        InternalError,
    )
}


def error_for(code: int, message: str) -> TideError:
    cls = BY_CODE.get(code)
    if cls is None:
        return TideError(f"unknown tideResult_t {code}: {message}", code=code)
    return cls(message)
