# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The NCCL_TIDE_ENABLE interposer from Python (docs/usage.md): what it took (counters) and layout-aware calls.

counters() says how many all-gather and reduce-scatter calls and bytes TIDE took and which went to NCCL, and why,
per NCCL communicator or for the whole process (include/tide.h tideInterposerGetCounters).

With libnccl-tide.so preloaded and NCCL_TIDE_ENABLE=1, attach a layout to a buffer of an NCCL communicator and the
interposed ncclAllGather into it / ncclReduceScatter from it use the layout instead of NCCL's flat rank-major
blocks. The library this module loads must be the preloaded one (nccl_tide.library_path()), else the attachment is
recorded in a second copy of the library that the interposer never sees.
"""

import ctypes
import threading
from typing import Any, Dict, Optional, Tuple

from . import _native
from .errors import InvalidArgumentError


# Layouts attached through this module, keyed by (ncclComm_t, buffer address): the Layout object stays alive (and
# its handle valid) while attached, whatever the caller does with its own reference. (The library also keeps its own
# reference to the layout while attached, include/tide.h tideAttachLayout.)
_attached: Dict[Tuple[int, int], Any] = {}
_attached_lock = threading.Lock()


def _comm_ptr(comm: Any) -> int:
    """An ncclComm_t as an int: an int as is, or a torch.distributed process group's NCCL communicator."""
    if isinstance(comm, bool) or (not isinstance(comm, int) and not hasattr(comm, "_get_backend")):
        raise InvalidArgumentError(
            f"comm is a {type(comm).__name__}; pass a torch.distributed process group with the NCCL backend or an "
            "ncclComm_t address (int)"
        )
    if isinstance(comm, int):
        return _native.u64_arg(comm, "comm (ncclComm_t address)", 1)
    import torch

    try:
        backend = comm._get_backend(torch.device("cuda"))
        get_ptr = backend._comm_ptr
    except (AttributeError, RuntimeError, ValueError) as e:
        name = getattr(comm, "name", lambda: "?")
        try:
            name = name()
        except Exception:
            name = "?"
        raise InvalidArgumentError(
            f"this call needs an NCCL process group (a group with the 'nccl' backend on a CUDA build of torch); "
            f"this group's backend is {name!r} ({type(e).__name__}: {e})"
        ) from None
    return int(get_ptr())


def _buffer_ptr(buffer: Any) -> int:
    if isinstance(buffer, int) and not isinstance(buffer, bool):
        return _native.u64_arg(buffer, "buffer (address)", 1)
    if not hasattr(buffer, "data_ptr"):
        raise InvalidArgumentError(f"buffer is a {type(buffer).__name__}; pass a tensor or a device address (int)")
    return int(buffer.data_ptr())


def attach_layout(comm: Any, buffer: Any, layout) -> None:
    """Attaches `layout` (an nccl_tide.Layout of this rank) to `buffer` (a tensor or a device address) on `comm` (a
    process group with the NCCL backend, or an ncclComm_t address). This module keeps a reference to `layout` until
    detach_layout (a communicator's destruction drops the library's attachment; detach_layout then releases it here)."""
    lib = _native.lib()
    key = (_comm_ptr(comm), _buffer_ptr(buffer))
    with layout._use() as h:
        _native.check(lib.tideAttachLayout(key[0], key[1], h), "tideAttachLayout")
    with _attached_lock:
        _attached[key] = layout  # replaces an earlier attachment of the buffer, as the library does


def detach_layout(comm: Any, buffer: Any) -> None:
    """Removes the attachment of `buffer` on `comm`."""
    lib = _native.lib()
    key = (_comm_ptr(comm), _buffer_ptr(buffer))
    try:
        _native.check(lib.tideDetachLayout(key[0], key[1]), "tideDetachLayout")
    finally:  # also when the library had dropped it already (the communicator was destroyed)
        with _attached_lock:
            _attached.pop(key, None)


_COLLECTIVES = ("all_gather", "reduce_scatter")


def counters(comm: Optional[Any] = None) -> Dict[str, Dict[str, Any]]:
    """What the interposer did with the all-gathers and reduce-scatters of `comm` (a process group with the NCCL
    backend, or an ncclComm_t address) since it was first seen, or of every communicator of the process (None).
    Bytes are per rank (count times the element size). Returns, per collective ("all_gather", "reduce_scatter"):
    {"taken": {"calls": n, "bytes": b}, "to_nccl": {reason: {"calls": n, "bytes": b}, ...}}, only reasons seen;
    "all_gather" also has "copy_out": {"calls": n, "bytes": b}, the taken all-gathers that went through TIDE's
    bounce slot and a copy-out to the receive buffer (on SMs; the others were gathered straight into a buffer of a
    symmetric NCCL window). Counts only in a process where NCCL_TIDE_ENABLE=1 and this library is the preloaded one."""
    lib = _native.lib()
    out = _native.tideInterposerCounters_t(size=ctypes.sizeof(_native.tideInterposerCounters_t),
                                           version=_native.TIDE_INTERPOSER_COUNTERS_VERSION)
    _native.check(lib.tideInterposerGetCounters(None if comm is None else _comm_ptr(comm), ctypes.byref(out)),
                  "tideInterposerGetCounters")
    result: Dict[str, Dict[str, Any]] = {}
    for i, name in enumerate(_COLLECTIVES):
        to_nccl = {}
        for r in range(1, _native.TIDE_INTERPOSER_MAX_REASONS):
            if out.forwardedCalls[i][r]:
                text = lib.tideInterposerReasonString(r)
                to_nccl[text.decode() if text else f"reason {r}"] = {
                    "calls": int(out.forwardedCalls[i][r]), "bytes": int(out.forwardedBytes[i][r])}
        result[name] = {"taken": {"calls": int(out.takenCalls[i]), "bytes": int(out.takenBytes[i])},
                        "to_nccl": to_nccl}
    result["all_gather"]["copy_out"] = {"calls": int(out.allGatherCopyOutCalls),
                                        "bytes": int(out.allGatherCopyOutBytes)}
    return result


def taken_share(comm: Optional[Any] = None) -> Dict[str, float]:
    """Per collective, the share of bytes TIDE took (0.0 .. 1.0; 0.0 when none was seen)."""
    share = {}
    for name, c in counters(comm).items():
        total = c["taken"]["bytes"] + sum(v["bytes"] for v in c["to_nccl"].values())
        share[name] = c["taken"]["bytes"] / total if total else 0.0
    return share
