# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Which libnccl this process loaded, the CUDA major it was built for, and a warning when that differs from torch's.

nccl-tide never loads NCCL itself: it uses the libnccl.so.2 that the process (normally torch) already loaded. With
torch, that is the NCCL of torch's own dependency (the nvidia-nccl-cuXX wheel that matches torch's CUDA, or the
copy inside a torch build). A second nvidia-nccl wheel for another CUDA major installs the same file
(nvidia/nccl/lib/libnccl.so.2) and silently replaces torch's; this module notices that case and warns once.

NCCL embeds its build line ("NCCL version 2.28.9+cuda12.9") in the library; the CUDA major is read from there.
"""

import re
from typing import Optional, Tuple

from ._log import get_logger

_log = get_logger("nccl")
_BUILD = re.compile(rb"NCCL version (\d+\.\d+\.\d+)[^+\x00]{0,16}\+cuda(\d+)\.(\d+)")
_warned = False


def loaded_libnccl_path(maps: str = "/proc/self/maps") -> Optional[str]:
    """Path of the libnccl.so* mapped into this process (None if none)."""
    try:
        with open(maps) as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                if re.search(r"/libnccl\.so[.\d]*$", path):
                    return path
    except OSError:
        return None
    return None


def libnccl_build(path: str) -> Optional[Tuple[str, int, int]]:
    """(NCCL version, CUDA major, CUDA minor) from the library's embedded build line; None if it has none."""
    hit, tail = None, b""
    try:
        with open(path, "rb") as f:
            while hit is None:  # 16 MiB at a time (the library is hundreds of MiB), overlapping by one line
                chunk = f.read(16 << 20)
                if not chunk:
                    break
                buf = tail + chunk
                hit = _BUILD.search(buf)
                tail = buf[-128:]
    except OSError:
        return None
    if hit is None:
        return None
    return hit.group(1).decode(), int(hit.group(2)), int(hit.group(3))


def torch_cuda_major() -> Optional[int]:
    """CUDA major torch was built for, if torch is already imported (this module never imports it)."""
    import sys

    torch = sys.modules.get("torch")
    cuda = getattr(getattr(torch, "version", None), "cuda", None) if torch is not None else None
    try:
        return int(str(cuda).split(".")[0]) if cuda else None
    except ValueError:
        return None


def check_cuda_major(path: Optional[str] = None, torch_major: Optional[int] = None) -> Optional[str]:
    """Warns once (logger nccl_tide.nccl) when the loaded libnccl was built for another CUDA major than torch.
    Returns the warning text (also when already said), or None when they agree or either is unknown."""
    global _warned
    path = path or loaded_libnccl_path()
    torch_major = torch_major if torch_major is not None else torch_cuda_major()
    if not path or torch_major is None:
        return None
    build = libnccl_build(path)
    if build is None:
        return None
    version, major, minor = build
    if major == torch_major:
        return None
    text = (
        f"the loaded libnccl ({path}, NCCL {version} built for CUDA {major}.{minor}) does not match torch's CUDA "
        f"{torch_major}: another nvidia-nccl-cu{major} wheel has probably replaced torch's NCCL. Reinstall the "
        f"one torch depends on (pip install --force-reinstall nvidia-nccl-cu{torch_major}) or remove the stray "
        f"wheel; nccl-tide uses whatever NCCL the process loaded"
    )
    if not _warned:
        _warned = True
        _log.warning("%s", text)
    return text


def _reset_for_tests() -> None:
    global _warned
    _warned = False


__all__ = ["check_cuda_major", "libnccl_build", "loaded_libnccl_path", "torch_cuda_major"]
