# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Layout-aware calls through the NCCL_TIDE_ENABLE interposer (docs/usage.md, include/tide.h tideAttachLayout).

With libnccl-tide.so preloaded and NCCL_TIDE_ENABLE=1, attach a layout to a buffer of an NCCL communicator and the
interposed ncclAllGather into it / ncclReduceScatter from it use the layout instead of NCCL's flat rank-major
blocks. The library this module loads must be the preloaded one (nccl_tide.library_path()), else the attachment is
recorded in a second copy of the library that the interposer never sees.
"""

import threading
from typing import Any, Dict, Tuple

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
            f"attach_layout needs an NCCL process group (a group with the 'nccl' backend on a CUDA build of torch); "
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
