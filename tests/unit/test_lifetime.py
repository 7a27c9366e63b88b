# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""nccl_tide._lifetime.Lifetime: close() waits for calls in flight, new calls fail, and a nested entry of a call that
was already in flight when close() began is let in (a world-wide collective enters once per rank inside its outer
entry: refusing those would split the collective between ranks)."""

import threading
import time

import pytest

from nccl_tide._lifetime import Lifetime
from nccl_tide.errors import InvalidArgumentError


def test_close_waits_for_a_call_in_flight_and_its_nested_entries_complete():
    life = Lifetime("thing")
    inside, release = threading.Event(), threading.Event()
    entered = []

    def call():
        with life.use():  # the outer, world-wide entry
            inside.set()
            release.wait(10)
            for r in range(4):  # per-rank entries, after close() began
                with life.use():
                    entered.append(r)

    t = threading.Thread(target=call)
    t.start()
    assert inside.wait(10)
    closer = threading.Thread(target=life.close)
    closer.start()
    time.sleep(0.05)
    assert closer.is_alive(), "close() must wait for the call in flight"
    assert life.closed
    with pytest.raises(InvalidArgumentError, match="thing is closed"):  # a new call from another thread
        with life.use():
            pass
    release.set()
    t.join(10)
    closer.join(10)
    assert not closer.is_alive() and entered == [0, 1, 2, 3]
    with pytest.raises(InvalidArgumentError, match="is closed"):  # after the call returned: refused again
        with life.use():
            pass
    assert life.close() is False  # already closed


def test_close_from_inside_a_call_does_not_wait_for_itself():
    life = Lifetime("w")
    with life.use():
        assert life.close() is True
        with life.use():  # still inside the same call
            pass
    with pytest.raises(InvalidArgumentError):
        with life.use():
            pass
    life.reopen()
    with life.use():
        pass


def test_closed_errors_say_so_instead_of_the_argument_hint():
    e = InvalidArgumentError("layout is closed")
    assert "closed before or during this call" in str(e) and "check sizes" not in str(e)
    assert "check sizes" in str(InvalidArgumentError("n is 3"))
    life = Lifetime("LoopbackWorld")
    life.close()
    with pytest.raises(InvalidArgumentError, match="create a new one"):
        with life.use():
            pass


def test_others_in_flight_sees_only_other_threads():
    life = Lifetime("w")
    inside, release = threading.Event(), threading.Event()

    def call():
        with life.use():
            inside.set()
            release.wait(10)

    with life.use():
        assert not life.others_in_flight()  # this thread's own call does not count
    t = threading.Thread(target=call)
    t.start()
    assert inside.wait(10)
    assert life.others_in_flight()
    life.close(wait=False)  # abort-style: returns at once, the other call still in flight
    assert life.closed and life.others_in_flight()
    release.set()
    t.join(10)
    assert not life.others_in_flight()


def test_wait_others_waits_for_other_threads_calls_only():
    """close(wait=False) then wait_others(): the two halves of close(), for an owner that marks the object closed under
    a lock of its own and waits outside it (LoopbackWorld.close, so that an abort() can still run meanwhile)."""
    life = Lifetime("w")
    inside, release, waited = threading.Event(), threading.Event(), threading.Event()

    def call():
        with life.use():
            inside.set()
            release.wait(10)

    def closer():  # from inside a call of its own, which it must not wait for
        with life.use():
            assert life.close(wait=False)
            life.wait_others()
            waited.set()

    t = threading.Thread(target=call)
    t.start()
    assert inside.wait(10)
    c = threading.Thread(target=closer)
    c.start()
    time.sleep(0.05)
    assert life.closed and not waited.is_set(), "wait_others() returned while another thread's call was in flight"
    release.set()
    t.join(10)
    c.join(10)
    assert waited.is_set()
    life.wait_others()  # nothing in flight: returns at once
