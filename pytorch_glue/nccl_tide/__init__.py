"""nccl-tide: zero-copy, SM-free all-gather and reduce-scatter for FSDP, on top of NCCL.

Importing needs neither torch nor a GPU; the native library loads on first use.
"""

from pathlib import Path as _Path

from . import errors
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


def _find_version() -> str:
    # Installed: the distribution's metadata. Source checkout: the repo's VERSION file.
    try:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as _dist_version

        return _dist_version("nccl-tide")
    except (ImportError, PackageNotFoundError):
        repo_version = _Path(__file__).resolve().parents[2] / "VERSION"
        return repo_version.read_text().strip() if repo_version.is_file() else "0+unknown"


__version__ = _find_version()
version = __version__


def __getattr__(name: str):
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
    "library_path",
    "library_version",
    "version",
]
