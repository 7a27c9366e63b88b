# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Warn once per distinct message (stock-FSDP2 fallbacks must be visible, but not repeated)."""

import warnings
from typing import Set

_seen: Set[str] = set()


class TideFSDPWarning(UserWarning):
    """nccl_tide.fsdp kept stock FSDP2 for something, or chose a slower executor."""


def warn_once(message: str) -> bool:
    """Warns (category TideFSDPWarning) the first time `message` is seen; True if it warned."""
    if message in _seen:
        return False
    _seen.add(message)
    warnings.warn(message, TideFSDPWarning, stacklevel=3)
    return True


def reset() -> None:
    """Forget the messages already shown (tests)."""
    _seen.clear()
