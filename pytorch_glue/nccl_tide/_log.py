# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Python-side status lines under the `nccl_tide.*` loggers, governed by the library's rule (docs/env.md, Logging).

The glue reports status (timeouts, failed bootstrap exchanges, NCCL/torch mismatches, env values it ignores) with
`logging` under `nccl_tide.<module>`. Without any logging configuration, Python's last-resort handler shows
WARNING and above on stderr, which keeps real faults visible as the library's default does.

If the application has not configured the `nccl_tide` logger itself, the library's variables apply, read the way
plugin/core/log.cc reads them, with the glue counted as one component, `Python` (NCCL subsystem INIT):
* level: NCCL_TIDE_DEBUG, else NCCL_DEBUG. NONE silences the `nccl_tide` loggers; INFO (ABORT) / TRACE show INFO /
  DEBUG records when the `Python` component is selected; WARNING and above always show.
* components: NCCL_TIDE_DEBUG_SUBSYS (TIDE names: `Python`, ALL, leading ^), else NCCL_DEBUG_SUBSYS (NCCL names;
  `Python` counts as INIT), else every component under NCCL_TIDE_DEBUG and NCCL's default INIT,BOOTSTRAP,ENV.
* destination: NCCL_TIDE_DEBUG_FILE, else NCCL_DEBUG_FILE + ".tide" (%h host, %p pid, %% %), the library's own
  file: both sides append whole lines to it. Else stderr.
Lines have the library's shape, the logger name in the component column
(`host:pid:tid [-] NCCL TIDE INFO nccl_tide.comm: ...`), so `NCCL TIDE WARN` greps both sides' warnings.

The FSDP2 fallback notices ("keeping stock FSDP2 ...") stay `warnings.warn(..., TideFSDPWarning)`, once each: the
docs promise them visible whatever the logging set-up, and `warnings` filters let a user silence or escalate them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Optional

_ROOT = "nccl_tide"
COMPONENT = "Python"  # the glue's name in NCCL_TIDE_DEBUG_SUBSYS (and in log.cc's component table)
_NCCL_SUBSYS = ("INIT",)  # the NCCL subsystems the glue's lines count as (log.cc's table row for Python)
_NCCL_DEFAULT_SUBSYS = ("INIT", "BOOTSTRAP", "ENV")
_LEVELS = ("NONE", "VERSION", "WARN", "INFO", "ABORT", "TRACE")
_configured = False
_lock = threading.Lock()


def _level_word() -> tuple[str, bool]:
    """(level word, whether it is NCCL_TIDE_DEBUG's own): an NCCL_TIDE_DEBUG the library rejects follows NCCL_DEBUG."""
    own = os.environ.get("NCCL_TIDE_DEBUG", "").strip().upper()
    if own in _LEVELS and own != "ABORT":
        return own, True
    return os.environ.get("NCCL_DEBUG", "").strip().upper(), False


def _selected(text: str, names: tuple[str, ...]) -> bool:
    """Whether a NCCL_DEBUG_SUBSYS-style list (comma-separated, ALL, leading ^ inverts) selects any of `names`."""
    invert = text.startswith("^")
    listed = set((text[1:] if invert else text).upper().split(","))
    hit = "ALL" in listed or any(n in listed for n in names)
    return hit != invert


def _own_text(name: str) -> Optional[str]:
    """An NCCL_TIDE_DEBUG_* value the library takes as its own (unset, empty and NCCL follow NCCL's variable)."""
    value = os.environ.get(name, "").strip()
    return value if value and value.upper() != "NCCL" else None


def component_selected(own_level: bool) -> bool:
    """Whether INFO/TRACE lines of the `Python` component pass the component mask."""
    own = _own_text("NCCL_TIDE_DEBUG_SUBSYS")
    if own is not None:
        return _selected(own, (COMPONENT.upper(),))
    nccl = os.environ.get("NCCL_DEBUG_SUBSYS")
    if nccl is not None:
        return _selected(nccl.upper(), _NCCL_SUBSYS)
    return own_level or any(s in _NCCL_DEFAULT_SUBSYS for s in _NCCL_SUBSYS)


def _expand(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        pair = pattern[i : i + 2]
        if pair in ("%h", "%p", "%%"):
            out.append({"%h": _NcclFormatter.host, "%p": str(os.getpid()), "%%": "%"}[pair])
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def log_file() -> Optional[str]:
    """The file the library writes its lines to (None: stderr)."""
    own = _own_text("NCCL_TIDE_DEBUG_FILE")
    if own is not None:
        return _expand(own)
    nccl = os.environ.get("NCCL_DEBUG_FILE", "")
    return _expand(nccl) + ".tide" if nccl else None


class _NcclFormatter(logging.Formatter):
    host = socket.gethostname().split(".")[0]

    def format(self, record: logging.LogRecord) -> str:
        level = {"WARNING": "WARN", "DEBUG": "TRACE", "ERROR": "WARN", "CRITICAL": "WARN"}.get(
            record.levelname, record.levelname
        )
        return (
            f"{self.host}:{os.getpid()}:{threading.get_native_id()} [-] NCCL TIDE {level} {record.name}: "
            f"{record.getMessage()}"
        )


def _handler(path: Optional[str]) -> logging.Handler:
    if path is None:
        return logging.StreamHandler()
    try:
        # Append, like the library: neither side truncates the other's lines; the file opens at the first record.
        return logging.FileHandler(path, mode="a", delay=True)
    except OSError:
        return logging.StreamHandler()


def configure() -> None:
    """Applies the library's logging variables to the `nccl_tide` logger once (no-op if the application set it up)."""
    global _configured
    with _lock:
        if _configured:
            return
        _configured = True
        root = logging.getLogger(_ROOT)
        if root.handlers or root.level != logging.NOTSET:
            return  # the application decided
        word, own_level = _level_word()
        if word == "NONE":
            root.setLevel(logging.CRITICAL + 1)
            return
        level = logging.WARNING
        if word in ("INFO", "ABORT", "TRACE") and component_selected(own_level):
            level = logging.DEBUG if word == "TRACE" else logging.INFO
        path = log_file()
        if level == logging.WARNING and path is None:
            return  # Python's last-resort handler prints WARNING and above to stderr
        handler = _handler(path)
        handler.setFormatter(_NcclFormatter())
        root.addHandler(handler)
        root.setLevel(level)
        root.propagate = False  # one line per record, not one more through the root logger


def get_logger(module: str) -> logging.Logger:
    """The logger `nccl_tide.<module>`, with the environment applied."""
    configure()
    return logging.getLogger(f"{_ROOT}.{module}" if module else _ROOT)
