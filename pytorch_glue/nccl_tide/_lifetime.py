# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""In-flight accounting for objects that own library handles (Comm, LoopbackWorld), so that close() on one thread and
a call on another never race: close() marks the object closed (new calls fail with "<what> is closed"), waits for
the calls already inside the library to return, and only then releases the handles. The library checks every
handle as well (include/tide.h "Handles"): this layer makes the Python-side outcome a clean, named error.
"""

import threading

from .errors import InvalidArgumentError


class Lifetime:
    def __init__(self, what: str):
        self.what = what
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._inflight = {}  # thread id -> calls of that thread in flight
        self._closed = False
        self._waiting = 0  # threads inside close() / wait_others(): only they need a notify when a call leaves
        self._span = _Span(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def check(self) -> None:
        if self._closed:
            raise InvalidArgumentError(f"{self.what} is closed")

    def use(self) -> "_Span":
        """One call in flight (a context manager). A nested use by a thread that already has a call in flight is part
        of that call and is let in even after close() began (close waits for it): a world-wide collective enters once
        for all ranks and once per rank, and refusing the inner entries would split it between ranks (some ranks' work
        queued, the others' never: their streams would wait forever)."""
        return self._span

    def enter(self) -> None:
        me = threading.get_ident()
        with self._lock:
            n = self._inflight.get(me, 0)
            if self._closed and not n:
                raise InvalidArgumentError(f"{self.what} is closed")
            self._inflight[me] = n + 1

    def leave(self) -> None:
        me = threading.get_ident()
        with self._lock:
            left = self._inflight[me] - 1
            if left:
                self._inflight[me] = left
            else:
                del self._inflight[me]
            if self._waiting:
                self._cv.notify_all()

    def _wait_for_others(self, me: int) -> None:
        """(Under the lock.) Returns once no thread but `me` has a call in flight."""
        self._waiting += 1
        try:
            self._cv.wait_for(lambda: not any(n for t, n in self._inflight.items() if t != me))
        finally:
            self._waiting -= 1

    def close(self, wait: bool = True) -> bool:
        """Marks the object closed; False if it already was. With wait, returns once every other thread's call in
        flight has returned (calls of this thread, e.g. close() from inside a failing call, are not waited for)."""
        me = threading.get_ident()
        with self._cv:
            if self._closed:
                return False
            self._closed = True
            if wait:
                self._wait_for_others(me)
        return True

    def wait_others(self) -> None:
        """Returns once no thread other than the caller has a call in flight (after close(wait=False): the waiting
        half of close(), for an owner that marks the object closed under a lock of its own and waits outside it)."""
        me = threading.get_ident()
        with self._cv:
            self._wait_for_others(me)

    def others_in_flight(self) -> bool:
        """Whether a thread other than the caller has a call in flight (close(wait=False) does not wait for them)."""
        me = threading.get_ident()
        with self._cv:
            return any(n for t, n in self._inflight.items() if t != me)

    def reopen(self) -> None:
        """Undoes close() when the release failed and the handles stay valid (tideCommAbort's timeout)."""
        with self._cv:
            self._closed = False


class _Span:
    """What Lifetime.use() returns: a context manager over enter() / leave(), one per Lifetime (the counts it keeps
    are the Lifetime's, per thread), so that a call pays for no generator and no allocation."""

    __slots__ = ("_life",)

    def __init__(self, life: Lifetime) -> None:
        self._life = life

    def __enter__(self) -> None:
        self._life.enter()

    def __exit__(self, *exc: object) -> None:
        self._life.leave()
