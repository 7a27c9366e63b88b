"""Python-side status lines under the `nccl_tide.*` loggers, governed like the library's lines (docs/env.md, Logging).

The glue reports status (timeouts, failed bootstrap exchanges, NCCL/torch mismatches, env values it ignores) with
`logging` under `nccl_tide.<module>`. Without any logging configuration, Python's last-resort handler shows
WARNING and above on stderr, which keeps real faults visible as the library's default does. When NCCL_TIDE_DEBUG
(or, if that is unset or NCCL, NCCL_DEBUG) asks for INFO or TRACE, and the application has not configured the
`nccl_tide` logger itself, a stderr handler is added at that level with NCCL's line shape
(`host:pid:tid [-] NCCL TIDE INFO nccl_tide.comm: ...`); NONE silences the `nccl_tide` loggers.

The FSDP2 fallback notices ("keeping stock FSDP2 ...") stay `warnings.warn(..., TideFSDPWarning)`, once each: the
docs promise them visible whatever the logging set-up, and `warnings` filters let a user silence or escalate them.
"""

import logging
import os
import socket
import threading

_ROOT = "nccl_tide"
_configured = False
_lock = threading.Lock()


def _level_word() -> str:
    own = os.environ.get("NCCL_TIDE_DEBUG", "").strip().upper()
    if own and own != "NCCL":
        return own
    return os.environ.get("NCCL_DEBUG", "").strip().upper()


class _NcclFormatter(logging.Formatter):
    _host = socket.gethostname().split(".")[0]

    def format(self, record: logging.LogRecord) -> str:
        level = {"WARNING": "WARN", "DEBUG": "TRACE", "ERROR": "WARN", "CRITICAL": "WARN"}.get(
            record.levelname, record.levelname
        )
        return (
            f"{self._host}:{os.getpid()}:{threading.get_native_id()} [-] NCCL TIDE {level} {record.name}: "
            f"{record.getMessage()}"
        )


def configure() -> None:
    """Applies NCCL_TIDE_DEBUG / NCCL_DEBUG to the `nccl_tide` logger once (no-op if the application set it up)."""
    global _configured
    with _lock:
        if _configured:
            return
        _configured = True
        root = logging.getLogger(_ROOT)
        if root.handlers or root.level != logging.NOTSET:
            return  # the application decided
        word = _level_word()
        if word == "NONE":
            root.setLevel(logging.CRITICAL + 1)
        elif word in ("INFO", "ABORT", "TRACE"):
            handler = logging.StreamHandler()
            handler.setFormatter(_NcclFormatter())
            root.addHandler(handler)
            root.setLevel(logging.DEBUG if word == "TRACE" else logging.INFO)
            root.propagate = False  # one line per record, not one more through the root logger


def get_logger(module: str) -> logging.Logger:
    """The logger `nccl_tide.<module>`, with the environment applied."""
    configure()
    return logging.getLogger(f"{_ROOT}.{module}" if module else _ROOT)
