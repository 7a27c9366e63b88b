"""Layout-aware calls through the NCCL_TIDE_ENABLE interposer (docs/usage.md, include/tide.h tideAttachLayout).

With libnccl-tide.so preloaded and NCCL_TIDE_ENABLE=1, attach a layout to a buffer of an NCCL communicator and the
interposed ncclAllGather into it / ncclReduceScatter from it use the layout instead of NCCL's flat rank-major
blocks. The library this module loads must be the preloaded one (nccl_tide.library_path()), else the attachment is
recorded in a second copy of the library that the interposer never sees.
"""

from typing import Any

from . import _native


def _comm_ptr(comm: Any) -> int:
    """An ncclComm_t as an int: an int as is, or a torch.distributed process group's NCCL communicator."""
    if isinstance(comm, int):
        return comm
    import torch

    backend = comm._get_backend(torch.device("cuda"))
    return int(backend._comm_ptr())


def _buffer_ptr(buffer: Any) -> int:
    return buffer if isinstance(buffer, int) else int(buffer.data_ptr())


def attach_layout(comm: Any, buffer: Any, layout) -> None:
    """Attaches `layout` (an nccl_tide.Layout of this rank) to `buffer` (a tensor or a device address) on `comm` (a
    process group with the NCCL backend, or an ncclComm_t address). Keep `layout` alive until detach_layout or the
    communicator's destruction."""
    lib = _native.lib()
    _native.check(lib.tideAttachLayout(_comm_ptr(comm), _buffer_ptr(buffer), layout.handle), "tideAttachLayout")


def detach_layout(comm: Any, buffer: Any) -> None:
    """Removes the attachment of `buffer` on `comm`."""
    lib = _native.lib()
    _native.check(lib.tideDetachLayout(_comm_ptr(comm), _buffer_ptr(buffer)), "tideDetachLayout")
