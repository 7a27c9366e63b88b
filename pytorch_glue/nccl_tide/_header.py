# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Where tide.h, the C API contract, is for the running package.

An installed wheel ships it as package data, nccl_tide/include/tide.h (setup.py copies the repository's
include/tide.h there at build time; the repository's copy is the only one tracked). A source checkout used without
installing (PYTHONPATH=pytorch_glue, or an editable install) has no such copy: there the repository's include/ is it.
"""

from pathlib import Path
from typing import List

HEADER = "tide.h"
_PACKAGE = Path(__file__).resolve().parent


def _candidates() -> List[Path]:
    found = [_PACKAGE / "include"]
    if _PACKAGE.parent.name == "pytorch_glue":  # the package inside a source checkout: <repo>/pytorch_glue/nccl_tide
        found.append(_PACKAGE.parent.parent / "include")
    return found


def include_dir() -> str:
    """The folder that holds tide.h, for C and C++ users of libnccl-tide.so:
    `cc -I"$(python -c 'import nccl_tide; print(nccl_tide.include_dir())')" ...`.
    Raises FileNotFoundError naming the folders it looked in when none holds it."""
    places = _candidates()
    for folder in places:
        if (folder / HEADER).is_file():
            return str(folder)
    raise FileNotFoundError(
        f"{HEADER} not found in {' or '.join(str(p) for p in places)}: an installed nccl-tide ships it in "
        "nccl_tide/include (reinstall it), a source checkout in include/"
    )
