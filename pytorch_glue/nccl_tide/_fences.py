# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Caller-stream fences of a LoopbackWorld: what close() waits for on streams the world does not own.

A collective issued with streams= / stream= runs on the caller's streams; close() synchronizes only the world's own,
so without this it could free the slots and destroy the comms under work still queued on a caller's stream. Every
call that used a caller stream records an event there before it leaves its in-flight span; close() waits for those
events (after the calls in flight returned, so no new one is recorded) before it destroys anything.

Cost: one event per caller stream, re-recorded by every later call on that stream. Work on one stream completes in
order, so the latest event covers every earlier call: nothing is allocated per call and nothing grows with the
number of calls. Entries whose event completed are dropped (their events kept for reuse) when the table reaches
`prune_at` streams, i.e. only for a caller that keeps bringing new streams; the table is emptied at teardown.

Not recorded: a stream being captured into a CUDA graph (its captured work runs when the caller launches the graph,
and an event last recorded in a capture cannot be queried). A caller that destroys one of its streams with the
world's work still queued (new_streams: synchronize first) may see the address come back for a new stream, whose
event then replaces the old one's.

`events` is the backend (nccl_tide.cuda._Events; the CPU tests pass fakes): new(), on(stream, handle, device) (the
object record() takes for the caller's stream or raw address), record(event, stream), done(event),
capturing(handle).
"""

import threading


class CallerStreamFences:
    def __init__(self, events, device=None, prune_at: int = 64):
        self._events = events
        self._device = device
        self._lock = threading.Lock()  # rank calls of several threads record concurrently
        self._by_handle = {}  # stream address -> [event, stream object record() takes]
        self._spare = []  # events of dropped entries, completed: reused for new streams
        self._prune_at = prune_at

    def __len__(self) -> int:
        return len(self._by_handle)

    def record(self, streams, handles, skip) -> None:
        """After a call queued work on streams[i] (address handles[i]): records the stream's event, except on the
        streams whose address is in skip (the world's own: close() synchronizes them) and those being captured."""
        ev = self._events
        with self._lock:
            for s, h in zip(streams, handles):
                if h in skip or ev.capturing(h):
                    continue
                entry = self._by_handle.get(h)
                if entry is None:
                    if len(self._by_handle) >= self._prune_at:
                        self._prune()
                    entry = [self._spare.pop() if self._spare else ev.new(), ev.on(s, h, self._device)]
                    self._by_handle[h] = entry
                ev.record(entry[0], entry[1])

    def _drop_done(self) -> None:
        done = self._events.done
        for h in [h for h, (e, _) in self._by_handle.items() if done(e)]:
            self._spare.append(self._by_handle.pop(h)[0])
        del self._spare[self._prune_at :]

    def _prune(self) -> None:
        self._drop_done()
        if len(self._by_handle) * 2 >= self._prune_at:  # mostly pending: grow, so pruning stays rare
            self._prune_at *= 2

    def pending(self) -> list:
        """The events close() waits for: those not completed yet (the completed ones are dropped here)."""
        with self._lock:
            self._drop_done()
            return [e for e, _ in self._by_handle.values()]

    def clear(self) -> None:
        with self._lock:
            self._by_handle.clear()
            self._spare.clear()
