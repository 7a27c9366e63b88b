# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
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
        hint = self.hint_for(message)
        if hint:
            text = f"{text} ({hint})"
        super().__init__(text)
        self.detail = message

    def hint_for(self, message: str) -> str:
        """What to do, for this message: a bad NCCL_TIDE_* environment value is fixed in the environment, not in
        the call's arguments."""
        env_hint = getattr(self, "env_hint", "")
        if env_hint and "NCCL_TIDE_" in (message or "") and "=" in message:
            return env_hint
        closed_hint = getattr(self, "closed_hint", "")
        if closed_hint and (message or "").endswith(" is closed"):
            return closed_hint
        return self.hint


class InvalidArgumentError(TideError, ValueError):
    code = 1
    # tide.h ships in the wheel (nccl_tide.include_dir()); `python -m nccl_tide` prints where, so the hint holds for
    # an installed package as well as for a source checkout.
    hint = (
        "check sizes, dtypes, pointers and ranks against tide.h, the C API contract; python -m nccl_tide prints "
        "its path"
    )
    env_hint = "fix or unset that environment variable; docs/env.md (in the sources and the sdist) lists the accepted values"
    closed_hint = "closed before or during this call, by this thread or another; create a new one to go on"


class InvalidUsageError(TideError, RuntimeError):
    code = 2
    hint = (
        "the call is not allowed in the current state: tide.h, the C API contract, gives the order of calls; "
        "python -m nccl_tide prints its path"
    )


class UnsupportedError(TideError, RuntimeError):
    code = 3
    hint = (
        "this build or runtime cannot do it: GPU paths need a CUDA build (TIDE_BUILD_CUDA=ON), "
        "a GPU and NCCL >= 2.28 loaded in the process (with PyTorch: torch's own NCCL; README, How NCCL is found)"
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
    pending: Optional[Dict[str, object]] = None  # the first wait still pending, when the stream could be read
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


_PENDING = None


def first_pending_wait(dump: str) -> Optional[Dict[str, object]]:
    """The first "PENDING" line of a tideCommDebugDump text, parsed: {"step": flag name (agReady, agDone[s], rsEnter,
    rsFull[s], rsConsumed, rsPushDone), "owner": the rank whose flag word it is, "peer": the rank that has to write
    it (the "from rank" of the line if given, as for multi-node words, else the source s of agDone[s]/rsFull[s],
    else the owner), "want", "have", "where": which wait of which stream,
    "line": the line}; None if the dump lists no pending wait."""
    global _PENDING
    import re

    if _PENDING is None:
        _PENDING = re.compile(
            r"PENDING (?P<where>.+): (?P<step>\w+(?:\[(?P<src>\d+)\])?) of rank (?P<owner>\d+) >= "
            r"(?P<want>\d+) \(is (?P<have>\d+)\)(?: from rank (?P<writer>\d+))?"
        )
    for line in dump.splitlines():
        m = _PENDING.search(line)
        if m:
            owner = int(m.group("owner"))
            src = m.group("src")
            return {
                "step": m.group("step"),
                "owner": owner,
                "peer": int(m.group("writer"))
                if m.group("writer") is not None
                else (int(src) if src is not None else owner),
                "want": int(m.group("want")),
                "have": int(m.group("have")),
                "where": m.group("where"),
                "line": line.strip(),
            }
    return None


def describe_pending(rank: int, pending: Optional[Dict[str, object]]) -> str:
    """One sentence naming the peer and the step a timed-out rank waits for."""
    if pending is None:
        return f"rank {rank}: no pending TIDE wait was found in the debug dump"
    return (
        f"rank {rank} waits for peer rank {pending['peer']}: step {pending['step']} of rank {pending['owner']} must "
        f"reach {pending['want']} (it is {pending['have']}), in {pending['where']}"
    )


def error_for(code: int, message: str) -> TideError:
    cls = BY_CODE.get(code)
    if cls is None:
        return TideError(f"unknown tideResult_t {code}: {message}", code=code)
    return cls(message)
