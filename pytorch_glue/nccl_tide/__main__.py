# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""`python -m nccl_tide`: what this installation is (version, tide.h, library, CUDA or host-only build, the NCCL it
finds).

Needs neither a GPU nor torch. NCCL is looked for as a real job would have it: the libnccl.so.2 that torch loads
(when torch is installed), else the one the dynamic linker finds (LD_LIBRARY_PATH, system paths).
Exit status 1 when libnccl-tide.so cannot be loaded, 141 (128 + SIGPIPE) when the reader of its output left, else 0.
"""

import ctypes
import sys
from pathlib import Path

from . import __version__, _distribution, include_dir
from . import _native as N
from ._header import HEADER
from ._pipes import closed_pipe_exit
from .errors import LibraryNotFoundError, TideError


def cuda_build() -> bool:
    """The loaded library has the CUDA data path. A host-only build refuses a loopback world "without CUDA"; a CUDA
    build refuses device 999 (or has no GPU) for another reason."""
    comms = (N.tideComm_t * 2)()
    rc = N.lib().tideLoopbackCreate(2, 999, comms)
    return not (rc == N.tideUnsupported and "without CUDA" in N.last_error())


def torch_problem() -> str:
    """Imports torch (a CUDA build of torch loads its own libnccl): "" when it imports or is not installed, else
    why it did not (a torch whose CUDA runtime is missing raises OSError, not ImportError)."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name == "torch":
            return ""
        return f"{type(e).__name__}: {e}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return ""


def load_nccl() -> str:
    """Loads libnccl.so.2 the way a job would; "" on success, else why not."""
    from .nccl_cuda import loaded_libnccl_path

    if loaded_libnccl_path():
        return ""
    try:
        ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        return f"no libnccl.so.2 loaded by torch or on the library path ({e})"
    return ""


def nccl_lines() -> list:
    broken = torch_problem()
    lines = [f"torch: installed but cannot be imported ({broken}): TIDE's torch API will fail"] if broken else []
    missing = load_nccl()
    if missing:
        return lines + [f"NCCL: not found: {missing}", "provider: none (the CUDA data path needs NCCL at run time)"]
    from .comm import nccl_info
    from .nccl_cuda import loaded_libnccl_path

    try:
        info = nccl_info()
    except TideError as e:
        return lines + [f"NCCL: {loaded_libnccl_path()} is not usable: {e}", "provider: none"]
    return lines + [
        f"NCCL: {info['runtime']} at {loaded_libnccl_path()} (headers at build time: {info['header']})",
        f"provider: {info['provider']} (transport {info['transport']})",
    ]


def header_line() -> str:
    """Where tide.h is (the C API contract that error hints point to), or why it is not found."""
    try:
        return f"header: {Path(include_dir()) / HEADER}"
    except FileNotFoundError as e:
        return f"header: not found: {e}"


def main() -> int:
    try:
        return _main()
    except BrokenPipeError:  # `python -m nccl_tide | head -1`: the reader left; quietly, as other commands
        return closed_pipe_exit()


def _main() -> int:
    print(f"nccl-tide {__version__} ({'distribution ' + _distribution if _distribution else 'source checkout'})")
    print(header_line())
    try:
        path = N.library_path()
        N.lib()
    except LibraryNotFoundError as e:
        print(f"library: {e}", file=sys.stderr)
        return 1
    print(f"library: {path} ({N.version_string()})")
    if cuda_build():
        print("CUDA build: yes (copy-engine all-gather and reduce-scatter on NVIDIA GPUs)")
    else:
        print("CUDA build: no (host-only: host executor and C API; GPU calls answer tideUnsupported)")
    for line in nccl_lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
