# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""nccl-tide: zero-copy, SM-free all-gather and reduce-scatter for FSDP, on top of NCCL.

Importing needs neither torch nor a GPU; the native library loads on first use.
"""

from pathlib import Path as _Path
from typing import Any as _Any
from typing import Optional as _Optional
from typing import Tuple as _Tuple

from . import errors
from ._header import include_dir
from ._native import library_path
from .dtypes import DTYPES
from .errors import (
    CudaError,
    InternalError,
    InvalidArgumentError,
    InvalidUsageError,
    LibraryNotFoundError,
    MismatchError,
    NcclError,
    TideError,
    TideOutOfMemoryError,
    TideSystemError,
    TideTimeoutError,
    UnsupportedError,
)
from .host import host_all_gather, host_reduce_scatter
from .layout import Layout, ParamInfo, Step


# The source package and its builds for one CUDA major or host-only (setup.py, TIDE_CUDA) hold this same module.
_DISTRIBUTIONS = ("nccl-tide", "nccl-tide-cu13", "nccl-tide-cu12", "nccl-tide-cpu")


def _find_distribution() -> _Tuple[_Optional[str], str]:
    """(distribution name, version) of the installed package; (None, the repo's VERSION) in a source checkout."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _dist_version

    for name in _DISTRIBUTIONS:
        try:
            return name, _dist_version(name)
        except PackageNotFoundError:
            pass
    repo_version = _Path(__file__).resolve().parents[2] / "VERSION"
    return None, (repo_version.read_text().strip() if repo_version.is_file() else "0+unknown")


_distribution, __version__ = _find_distribution()
version = __version__


def __getattr__(name: str) -> _Any:
    # Submodules that need torch load on first use, so `import nccl_tide` never imports torch.
    if name in ("fsdp", "reference_executor"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'nccl_tide' has no attribute {name!r}")


def library_version() -> str:
    """Version of the loaded libnccl-tide.so ("major.minor.patch")."""
    from ._native import version_string

    return version_string()


__all__ = [
    "DTYPES",
    "CudaError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidUsageError",
    "Layout",
    "LibraryNotFoundError",
    "MismatchError",
    "NcclError",
    "ParamInfo",
    "Step",
    "TideError",
    "TideOutOfMemoryError",
    "TideSystemError",
    "TideTimeoutError",
    "UnsupportedError",
    "errors",
    "host_all_gather",
    "host_reduce_scatter",
    "include_dir",
    "library_path",
    "library_version",
    "version",
]
