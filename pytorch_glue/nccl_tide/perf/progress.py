# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""A one-line status on stderr while a run is long enough to look stuck: which row is being measured and for how
long. Only on a terminal (a log file or a pipe gets nothing), only after the run has gone on for a few seconds, and
erased before every table line so that the table reads as nccl-tests'."""

import contextlib
import sys
import threading
import time
from typing import Optional, TextIO

ERASE = "\r\033[K"


class Progress:
    def __init__(self, stream: Optional[TextIO] = None, delay_s: float = 3.0, interval_s: float = 1.0,
                 enabled: Optional[bool] = None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _isatty(self.stream) if enabled is None else enabled
        self.delay_s, self.interval_s = delay_s, interval_s
        self._start = time.monotonic()
        self._text, self._since = "", self._start
        self._shown = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def stage(self, text: str) -> None:
        """What the run is doing now (the line shows it with the time spent on it)."""
        with self._lock:
            self._text, self._since = text, time.monotonic()
        if self.enabled and self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._loop, name="tide-perf-progress", daemon=True)
            self._thread.start()

    def clear(self) -> None:
        with self._lock:
            if self._shown:
                self.stream.write(ERASE)
                self.stream.flush()
                self._shown = False

    @contextlib.contextmanager
    def paused(self):
        """Erases the line and keeps the ticker from drawing it again while the caller writes (a table line)."""
        with self._lock:
            if self._shown:
                self.stream.write(ERASE)
                self.stream.flush()
                self._shown = False
            yield

    def close(self) -> None:
        """Stops the ticker and erases its line: nothing is drawn after this (the footer follows)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.clear()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            if now - self._start < self.delay_s:
                continue
            with self._lock:
                if self._stop.is_set():  # closed while this tick waited for the lock
                    return
                self.stream.write(f"{ERASE}tide-perf: {self._text} ({now - self._since:.0f} s)")
                self.stream.flush()
                self._shown = True


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
