# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""CUDA data path from Python: loopback worlds of virtual ranks on one GPU (tests, single-GPU benchmarks).

    import torch, nccl_tide
    from nccl_tide.cuda import LoopbackWorld
    world = LoopbackWorld(4)                       # 4 virtual ranks on cuda:0
    layouts = [nccl_tide.Layout(numels, "bf16", 4, rank=r) for r in range(4)]
    slots = world.alloc_slot(layouts[0].slot_bytes)  # one uint8 tensor per rank (zero-copy view of tideSlotAlloc)
    world.all_gather(layouts, slots, sendbufs=[...])
    world.synchronize()

torch is imported lazily (importing nccl_tide never needs it). Ordering: with the world's own streams
(streams=None), each rank's stream first waits for the current torch stream, so inputs written there are
visible; nothing waits for the collective afterwards: call synchronize() (host) or join() (current stream).
close() waits for the work of the world's calls on its own streams and on the caller streams they used (_fences).
Every virtual rank needs a stream of its own (a shared stream deadlocks on the cross-rank flags; the library
rejects it). With 5 or more ranks, CUDA_DEVICE_MAX_CONNECTIONS should be 32 before CUDA initializes (more busy
streams than hardware queues can alias two ranks onto one queue and deadlock): constructing the first
LoopbackWorld before torch initializes CUDA sets it when unset.
"""

import ctypes
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, List, Optional

from . import _native as N
from ._fences import CallerStreamFences
from ._log import get_logger
from ._lifetime import Lifetime
from ._tensor_args import address, grads_table, rs_out_dtype, shards_table
from .dtypes import dtype as to_dtype
from .dtypes import op_code, scale_arg
from .errors import InvalidArgumentError, TideTimeoutError, describe_pending, first_pending_wait

_log = get_logger("cuda")


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("nccl_tide.cuda needs PyTorch with CUDA: pip install torch") from e
    return torch


def _set_connections_early() -> None:
    torch = _torch()
    if not torch.cuda.is_initialized():
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")


class _DriverStreams:
    """Fresh non-blocking streams straight from the CUDA driver (libcuda.so.1, loaded here by Python only; the
    library itself never links it).

    Why not torch.cuda.Stream(): torch hands out streams of a pool created all at once (32 per priority), so a
    world's streams would share hardware queues with the pool's and with the library's internal streams created at
    other times. Streams created back to back with the world's internal ones land on distinct queues (round robin),
    which the cross-stream flag waits need to be deadlock-free."""

    _lib = None

    @classmethod
    def lib(cls):
        if cls._lib is None:
            lib = ctypes.CDLL("libcuda.so.1")
            lib.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
            lib.cuStreamCreate.restype = ctypes.c_int
            lib.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]
            lib.cuStreamDestroy_v2.restype = ctypes.c_int
            lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            lib.cuCtxGetCurrent.restype = ctypes.c_int
            lib.cuStreamIsCapturing.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
            lib.cuStreamIsCapturing.restype = ctypes.c_int
            cls._lib = lib
        return cls._lib

    @classmethod
    def create(cls, torch, n: int, device: int):
        """n torch.cuda.ExternalStream objects and their raw handles, or None if the driver is not usable."""
        try:
            lib = cls.lib()
        except OSError:
            return None
        with torch.cuda.device(device):
            torch.cuda.synchronize()  # makes the device's primary context current on this thread
            ctx = ctypes.c_void_p()
            if lib.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
                return None
            raw = []
            for _ in range(n):
                h = ctypes.c_void_p()
                if lib.cuStreamCreate(ctypes.byref(h), 1) != 0:  # CU_STREAM_NON_BLOCKING
                    for x in raw:
                        lib.cuStreamDestroy_v2(x)
                    return None
                raw.append(h.value)
            dev = torch.device("cuda", device)
            return [torch.cuda.ExternalStream(h, device=dev) for h in raw], raw

    @classmethod
    def destroy(cls, raw) -> None:
        if raw:
            lib = cls.lib()
            for h in raw:
                lib.cuStreamDestroy_v2(h)

    @classmethod
    def capturing(cls, handle: int) -> bool:
        """Whether the stream is being captured into a CUDA graph, or the driver answers with a capture error (900-908:
        e.g. the legacy stream while another stream is captured, where recording an event would break the capture).
        False when the driver cannot be loaded."""
        try:
            lib = cls.lib()
        except OSError:
            return False
        status = ctypes.c_int(0)
        rc = lib.cuStreamIsCapturing(handle, ctypes.byref(status))
        return status.value != 0 if rc == 0 else 900 <= rc <= 908


class _Events:
    """The CUDA event calls of a LoopbackWorld, in one place (the CPU tests replace them with fakes): torch events,
    which take care of the device and context of the stream they are recorded on."""

    @staticmethod
    def new():
        return _torch().cuda.Event()

    @staticmethod
    def on(stream, handle: int, device):
        """What record() takes for a caller's stream: the torch stream itself, or one wrapping a raw address."""
        return stream if hasattr(stream, "cuda_stream") else _torch().cuda.ExternalStream(handle, device=device)

    @staticmethod
    def record(event, stream) -> None:
        event.record(stream)

    @staticmethod
    def done(event) -> bool:
        return event.query()

    capturing = staticmethod(_DriverStreams.capturing)


def new_streams(n: int, device: int = 0):
    """n fresh streams for caller-provided-stream use with a loopback world (create them right after the world).
    Returns (streams, release) where release() destroys them (synchronize first)."""
    torch = _torch()
    made = _DriverStreams.create(torch, n, device)
    if made is None:
        return [torch.cuda.Stream(device=torch.device("cuda", device)) for _ in range(n)], (lambda: None)
    streams, raw = made
    return streams, (lambda: _DriverStreams.destroy(raw))


class _SlotMemory:
    """__cuda_array_interface__ holder so torch can wrap tideSlotAlloc memory without copying."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


class LoopbackWorld:
    """n_ranks (2..8) virtual ranks of one process on one CUDA device (tideLoopbackCreate)."""

    def __init__(self, n_ranks: int, device: int = 0):
        # close() and abort() take _teardown, so that one of them (not both) destroys each comm and stream; close()
        # releases it while it waits (_closing), so that an abort() on another thread can unblock that wait.
        self._teardown = threading.Lock()
        self._closing = False
        self._life = Lifetime("LoopbackWorld")
        self._aborted = set()  # ranks whose tideCommAbort succeeded (abort() retries the others)
        self._comms: List[int] = []
        self._slots: List[List[int]] = []  # per allocation: one pointer per rank
        self._streams, self._raw_streams, self._own_handles = [], [], frozenset()
        self._last_streams = {}  # rank -> (stream, address) of its last collective (synchronize(ranks=), held calls)
        self._events = _Events
        _set_connections_early()
        torch = _torch()
        n_ranks, device = N.int_arg(n_ranks, "n_ranks"), N.int_arg(device, "device")
        self._fences = CallerStreamFences(_Events, device)  # what close() waits for on the callers' streams
        lib = N.lib()
        arr = (N.tideComm_t * max(n_ranks, 1))()
        N.check(lib.tideLoopbackCreate(n_ranks, device, arr), "tideLoopbackCreate")
        self._comms = [arr[r] for r in range(n_ranks)]
        self.n_ranks = n_ranks
        self.device = device
        self._torch_device = torch.device("cuda", device)
        # Created right after the library's internal streams (see _DriverStreams); torch's pool as a fallback.
        made = _DriverStreams.create(torch, n_ranks, device)
        if made is not None:
            self._streams, self._raw_streams = made
        else:
            self._streams = [torch.cuda.Stream(device=self._torch_device) for _ in range(n_ranks)]
        self._own_handles = frozenset(self._stream_handle(s) for s in self._streams)
        # With the eager graph route a virtual rank's token call is held on the host until every rank has called
        # (docs/architecture.md "Issue rounds"): its stream goes idle with the collective not done, so synchronize()
        # also asks the ranks for pending waits once their streams are idle (read once, as the library does).
        try:
            self._held_calls = N.param_value("NCCL_TIDE_EAGER_GRAPHS") == "1"
        except Exception:
            self._held_calls = False

    # -- handles -----------------------------------------------------------------------------
    @property
    def comms(self) -> List[int]:
        # For callers outside the world. Inside a call (an in-flight span of _life) use self._comms: once close()
        # has begun, this property refuses, and a collective already in flight must still reach every rank.
        if not self._comms or self._life.closed:
            raise InvalidArgumentError("LoopbackWorld is closed")
        return list(self._comms)

    @property
    def streams(self):
        """The world's own streams, one per virtual rank (torch.cuda.Stream)."""
        return list(self._streams)  # valid until close(); join()/synchronize() refuse after it

    # -- slots ---------------------------------------------------------------------------------
    def alloc_slot(self, nbytes: int) -> List[Any]:
        """tideSlotAlloc on every rank; returns one uint8 CUDA tensor per rank (zero-copy views, valid until
        free_slot() or close())."""
        with self._life.use():
            torch = _torch()
            nbytes = N.u64_arg(nbytes, "nbytes", 0, N.SIZE_MAX)
            lib = N.lib()
            ptrs: List[int] = []
            try:
                for c in self.comms:
                    p = ctypes.c_void_p()
                    N.check(lib.tideSlotAlloc(c, nbytes, ctypes.byref(p)), "tideSlotAlloc")
                    ptrs.append(p.value)
            except Exception:
                for c, p in zip(self._comms, ptrs):
                    lib.tideSlotFree(c, p)
                raise
            self._slots.append(ptrs)
            with torch.cuda.device(self.device):
                return [torch.as_tensor(_SlotMemory(p, nbytes), device=self._torch_device) for p in ptrs]

    def free_slot(self, tensors: Sequence[Any]) -> None:
        """Frees a slot returned by alloc_slot (synchronize first; the tensors must not be used afterwards)."""
        with self._life.use():
            ptrs = [int(t.data_ptr()) if hasattr(t, "data_ptr") else int(t) for t in tensors]
            for entry in list(self._slots):
                if entry == ptrs:
                    for c, p in zip(self._comms, entry):
                        N.check(N.lib().tideSlotFree(c, p), "tideSlotFree")
                    self._slots.remove(entry)
                    return
            raise InvalidArgumentError("free_slot: not a slot of this world (pass the list alloc_slot returned)")

    # -- collectives -------------------------------------------------------------------------
    def _rank_streams(self, streams):
        torch = _torch()
        if streams is None:
            cur = torch.cuda.current_stream(self._torch_device)
            for s in self._streams:
                s.wait_stream(cur)
            return self._streams
        if len(streams) != self.n_ranks:
            raise InvalidArgumentError(f"streams: {len(streams)} given, world has {self.n_ranks} ranks")
        return list(streams)

    def _check_layouts(self, layouts) -> None:
        if len(layouts) != self.n_ranks:
            raise InvalidArgumentError(f"layouts: {len(layouts)} given, world has {self.n_ranks} ranks")

    @staticmethod
    def _stream_handle(s) -> int:
        return int(s.cuda_stream) if hasattr(s, "cuda_stream") else N.u64_arg(s, "stream (cudaStream_t address)")

    def all_gather(self, layouts, slots, sendbufs=None, shards=None, streams=None) -> None:
        """TIDE-AG on every virtual rank. layouts[r]: rank r's Layout; slots[r]: its slot region (tensor or address,
        at least slot_bytes, same offset on every rank); sendbufs[r]: packed send buffer (send_bytes), or
        shards[r][i]: rank r's shard of parameter i. Asynchronous on the ranks' streams."""
        self._check_layouts(layouts)
        if (sendbufs is None) == (shards is None):
            raise InvalidArgumentError("all_gather: pass exactly one of sendbufs and shards")
        # One in-flight span for all ranks: a close() on another thread never splits the collective between ranks,
        # and never destroys the world's streams while this call orders them after the current stream.
        with self._life.use():
            rank_streams = self._rank_streams(streams)
            self._all_gather_ranks(layouts, slots, sendbufs, shards, rank_streams, caller=streams is not None)

    def _all_gather_ranks(self, layouts, slots, sendbufs, shards, rank_streams, caller=False) -> None:
        # Every rank's arguments are checked before the first rank's call is issued: a bad argument of rank k found
        # after ranks < k had queued their part would leave those streams waiting forever.
        calls = [
            self._all_gather_call(
                r,
                layouts[r],
                slots[r],
                sendbuf=None if sendbufs is None else sendbufs[r],
                shards=None if shards is None else shards[r],
                stream=rank_streams[r],
            )
            for r in range(self.n_ranks)
        ]
        self._issue(calls, rank_streams if caller else None)

    def _issue(self, calls, caller_streams) -> None:
        """Issues the checked calls in order; then, still inside the call's in-flight span, records on every caller
        stream (caller_streams, or None) the event close() waits for, also when an issue raised (the ranks before it
        queued their work). The world's own streams are skipped: close() synchronizes them."""
        try:
            for issue in calls:
                issue()
        finally:
            if caller_streams is not None:
                handles = [self._stream_handle(s) for s in caller_streams]
                self._fences.record(caller_streams, handles, self._own_handles)

    def rank_all_gather(self, rank, layout, slot, sendbuf=None, shards=None, stream=None) -> None:
        """tideAllGather for one virtual rank (every rank must make its matching call)."""
        with self._life.use():
            call = self._all_gather_call(rank, layout, slot, sendbuf=sendbuf, shards=shards, stream=stream)
            self._issue((call,), None if stream is None else (stream,))

    def _all_gather_call(self, rank, layout, slot, sendbuf=None, shards=None, stream=None):
        """Checks rank `rank`'s arguments and returns its tideAllGather as a call without arguments (issued by the
        caller, inside its in-flight span)."""
        rank = N.int_arg(rank, "rank", 0, max(len(self._comms) - 1, 0))
        lib = N.lib()
        slot_ptr = address(slot, f"slots[{rank}]", layout.slot_bytes, at_least=True)
        if sendbuf is not None:
            send_ptr = address(sendbuf, f"sendbufs[{rank}]", layout.send_bytes, at_least=True)
            table = None
        else:
            n = len(layout._params)
            if len(shards) != n:
                raise InvalidArgumentError(f"shards[{rank}]: {len(shards)} tensors, layout has {n} params")
            table = shards_table(layout).table(shards, f"shards[{rank}]")
            send_ptr = None
        stream_obj = self._streams[rank] if stream is None else stream
        stream_handle = self._stream_handle(stream_obj)

        def issue():
            self._last_streams[rank] = (stream_obj, stream_handle)  # before the call: a failed one may have queued
            with layout._use() as lh:  # safe against a concurrent layout.close()
                rc = lib.tideAllGather(self._comms[rank], lh, send_ptr, table, slot_ptr, stream_handle)
            if rc != N.tideSuccess:
                N.check(rc, f"tideAllGather(rank {rank})")

        return issue

    def reduce_scatter(
        self, layouts, grads, outs, op="sum", scale: float = 1.0, staging=None, streams=None, out_dtype=None
    ) -> None:
        """TIDE-RS on every virtual rank. grads[r][i]: rank r's gradient of parameter i (numel_i elements);
        outs[r]: rank r's packed output (rs_out_numel elements; its torch dtype, or out_dtype for raw buffers, picks
        fp32/bf16/fp16); op 'sum' | 'avg' | 'premul' (times scale); staging[r]: a slot region of at least
        rs_staging_bytes (Slot-Reuse) or None for the world's own staging."""
        self._check_layouts(layouts)
        with self._life.use():  # as all_gather: never split by a close() on another thread
            rank_streams = self._rank_streams(streams)
            self._reduce_scatter_ranks(
                layouts, grads, outs, op, scale, staging, rank_streams, out_dtype, caller=streams is not None
            )

    def _reduce_scatter_ranks(
        self, layouts, grads, outs, op, scale, staging, rank_streams, out_dtype, caller=False
    ) -> None:
        # As _all_gather_ranks: every rank's arguments checked before any rank's call is issued.
        calls = [
            self._reduce_scatter_call(
                r,
                layouts[r],
                grads[r],
                outs[r],
                op=op,
                scale=scale,
                staging=None if staging is None else staging[r],
                stream=rank_streams[r],
                out_dtype=out_dtype,
            )
            for r in range(self.n_ranks)
        ]
        self._issue(calls, rank_streams if caller else None)

    def rank_reduce_scatter(
        self, rank, layout, grads, out, op="sum", scale: float = 1.0, staging=None, stream=None, out_dtype=None
    ) -> None:
        """tideReduceScatter for one virtual rank (every rank must make its matching call)."""
        with self._life.use():
            call = self._reduce_scatter_call(
                rank, layout, grads, out, op=op, scale=scale, staging=staging, stream=stream, out_dtype=out_dtype
            )
            self._issue((call,), None if stream is None else (stream,))

    def _reduce_scatter_call(
        self, rank, layout, grads, out, op="sum", scale: float = 1.0, staging=None, stream=None, out_dtype=None
    ):
        """Checks rank `rank`'s arguments and returns its tideReduceScatter as a call without arguments."""
        rank = N.int_arg(rank, "rank", 0, max(len(self._comms) - 1, 0))
        lib = N.lib()
        if out_dtype is None:
            out_dtype = rs_out_dtype(out)
            if out_dtype is None:
                name = str(getattr(out, "dtype", "")).replace("torch.", "")
                raise InvalidArgumentError(
                    f"outs[{rank}]: dtype {name or type(out).__name__} is not float32/bfloat16/float16; "
                    "pass out_dtype"
                )
        odt = to_dtype(out_dtype)
        n = len(layout._params)
        if len(grads) != n:
            raise InvalidArgumentError(f"grads[{rank}]: {len(grads)} tensors, layout has {n} params")
        table = grads_table(layout).table(grads, f"grads[{rank}]")
        out_ptr = address(out, f"outs[{rank}]", layout.rs_out_numel * odt.size, dtype=odt)
        stag = None if staging is None else address(staging, f"staging[{rank}]", layout.rs_staging_bytes, at_least=True)
        op_c = op_code(op)
        scale_f = scale_arg(scale, op_c)
        stream_obj = self._streams[rank] if stream is None else stream
        stream_handle = self._stream_handle(stream_obj)

        def issue():
            self._last_streams[rank] = (stream_obj, stream_handle)  # before the call: a failed one may have queued
            with layout._use() as lh:  # safe against a concurrent layout.close()
                rc = lib.tideReduceScatter(
                    self._comms[rank], lh, table, out_ptr, odt.code, op_c, scale_f, stag, stream_handle
                )
            if rc != N.tideSuccess:
                N.check(rc, f"tideReduceScatter(rank {rank})")

        return issue

    # -- completion --------------------------------------------------------------------------
    def join(self, stream=None) -> None:
        """Makes `stream` (default: the current torch stream) wait for every rank's stream."""
        with self._life.use():  # the streams are destroyed by close(): never order after them once it began
            torch = _torch()
            target = stream if stream is not None else torch.cuda.current_stream(self._torch_device)
            for s in self._streams:
                target.wait_stream(s)

    def synchronize(self, streams=None, timeout: Optional[float] = None, ranks=None) -> None:
        """Waits on the host for every rank's stream, polling so that a cross-rank deadlock becomes a
        TideTimeoutError instead of a hang. timeout (seconds) defaults to NCCL_TIDE_TIMEOUT_MS when that is set
        (nonzero), else 120 s. The error names, for the first rank whose stream is not done, the peer and the step
        (flag) of its first pending wait (from tideCommDebugDump), and carries every such rank's dump; its `pending`
        attribute is that wait, parsed ({"rank", "peer", "step", "owner", "want", "have", "where"}).

        What is waited for: streams=None: the world's own streams; streams=[...]: those streams (the world's or a
        caller's); ranks=[...] (not with streams): the stream each of those ranks used for its last collective (its
        own stream if it has made none). With the eager graph route a rank's collective may be held on the host
        until every rank has called (its stream idle, the collective not done): that counts as not done for every
        rank whose last collective ran on a waited stream."""
        with self._life.use():  # the streams are destroyed by close(): never wait on them after that
            if ranks is not None:
                if streams is not None:
                    raise InvalidArgumentError("synchronize: pass streams or ranks, not both")
                ranks = sorted({N.int_arg(r, "ranks[i]", 0, max(self.n_ranks - 1, 0)) for r in ranks})
                streams = []
                for r in ranks:
                    s = self._last_stream(r)
                    if all(self._stream_handle(x) != self._stream_handle(s) for x in streams):
                        streams.append(s)
            return self._synchronize(streams, timeout, ranks=ranks)

    def _last_stream(self, rank: int):
        """The stream of rank `rank`'s last collective (its own stream if it made none)."""
        last = self._last_streams.get(rank)
        return last[0] if last is not None else self._streams[rank]

    def _ranks_on(self, handles) -> List[int]:
        """The ranks whose last collective ran on one of the streams `handles` (a rank that made none: on its own)."""
        out = []
        for r in range(self.n_ranks):
            last = self._last_streams.get(r)
            h = last[1] if last is not None else self._stream_handle(self._streams[r])
            if h in handles:
                out.append(r)
        return out

    def _synchronize(self, streams=None, timeout: Optional[float] = None, also=(), stop=None, held=True, ranks=None):
        """Waits for the streams (default: the world's own) and for the events `also`; returns early once stop()
        is true (close(): every rank aborted on another thread). held: collectives held on the host (eager graph
        route) of the ranks whose last collective ran on a waited stream (or of `ranks`) count as not done; close()
        passes False (no rank can call any more, so a held collective never completes: it drops them)."""
        if timeout is None:
            timeout = N.timeout_seconds(120.0)
        ev = self._events
        device = getattr(self, "device", None)
        waited = list(streams) if streams is not None else list(self._streams)
        handles = [self._stream_handle(s) for s in waited]
        events = []
        for s, h in zip(waited, handles):
            e = ev.new()
            ev.record(e, ev.on(s, h, device))
            events.append(e)
        events.extend(also)
        # Which rank each waited stream stands for: its index when they are the world's own in rank order.
        by_index = streams is None or handles == [self._stream_handle(s) for s in self._streams]
        candidates = list(ranks) if ranks is not None else self._ranks_on(set(handles))
        deadline = time.monotonic() + timeout
        while True:
            busy = [i for i, e in enumerate(events) if not ev.done(e)]
            pending = self._held_ranks(candidates) if held and not busy and self._held_calls else []
            if not busy and not pending:
                return
            if stop is not None and stop():
                return
            if time.monotonic() > deadline:
                if pending:
                    raise self._timeout_error(timeout, pending, held=True)
                busy_handles = {handles[i] for i in busy if i < len(handles)}
                stuck = [i for i in busy if i < len(handles)] if by_index else self._ranks_on(busy_handles)
                raise self._timeout_error(timeout, stuck, n_busy=len(busy), n_waited=len(events))
            time.sleep(0.0005 if busy else 0.005)

    def _held_ranks(self, ranks=None) -> List[int]:
        """Ranks (of `ranks`, default all) whose last collective has a pending wait although their stream is idle: a
        token call held on the host for a rank that has not called yet (the eager graph route on loopback)."""
        held = []
        for r in range(len(self._comms)) if ranks is None else ranks:
            try:
                if N.pending_waits(self._comms[r]):
                    held.append(r)
            except Exception:  # a readback that did not finish, a call in progress: not evidence of a held call
                pass
        return held

    def _timeout_error(
        self, timeout: float, stuck: List[int], n_busy: int = 0, n_waited: int = 0, held: bool = False
    ) -> TideTimeoutError:
        """TideTimeoutError for synchronize. stuck: the ranks whose streams are not done (empty when the busy streams
        stand for no known rank: n_busy of the n_waited streams and events; every rank is dumped then). held: the
        streams are idle, but ranks `stuck` hold a collective on the host for a rank that has not called."""
        first = None
        dumps = []
        for r in stuck if stuck else range(self.n_ranks):
            for _attempt in range(2):
                buf = ctypes.create_string_buffer(64 * 1024)
                rc = N.lib().tideCommDebugDump(self._comms[r], buf, len(buf))
                dump = buf.value.decode(errors="replace")
                if rc != N.tideSuccess:
                    dump += f"(tideCommDebugDump failed: {N.last_error()})\n"
                # The dump reads the flags on a fresh stream; if that stream landed on the hardware queue of a stuck
                # stream the readback times out: once more, on another new stream.
                if "readback did not finish" not in dump:
                    break
            dumps.append(dump)
            try:  # structured (tideCommGetPendingWaits); the dump's text is the fallback
                waits = N.pending_waits(self._comms[r])
                p = waits[0] if waits else None
            except Exception:
                p = first_pending_wait(dump)
            if first is None and p is not None:
                first = dict(p, rank=r)
        if first is not None:
            head = describe_pending(first["rank"], first)
        else:
            head = "no pending TIDE wait was found in the debug dumps"
        where = f"the streams of ranks {stuck}" if stuck else f"{n_busy} of {n_waited} streams"
        if held:
            where = f"the collectives of ranks {stuck} (held on the host until every rank has called)"
        err = TideTimeoutError(
            f"loopback world: {where} not done after {timeout:g} s; {head} (a rank that has not made its matching "
            "call? every virtual rank needs its own stream and CUDA_DEVICE_MAX_CONNECTIONS=32)\n" + "".join(dumps)
        )
        err.pending = first
        return err

    def close(self) -> None:
        """Frees every slot and destroys the comms, after the work of this world's calls is done: the world's
        streams and every caller stream a call used (streams= / stream=). Waits for calls of other threads on this
        world to return; calls made afterwards fail with "LoopbackWorld is closed". A no-op once close() or abort()
        began (on any thread); an abort() on another thread while close() waits ends the wait, and the comms are
        then released by the abort, not destroyed a second time.

        A collective held on the host (eager graph route: some ranks called, the others not) can never complete once
        close() began (no rank can call any more): close() does not wait for it, drops it with a warning naming the
        ranks that held it (their outputs were never written) and frees everything as usual."""
        with self._teardown:
            if not self._comms or self._life.closed:
                return
            self._life.close(wait=False)  # new calls fail from here
            self._closing = True  # abort() meanwhile leaves the streams (waited on here) to this close()
        waited = False
        try:
            self._life.wait_others()  # no call records a caller-stream event after this
            waited = True
            every_rank = len(self._comms)

            def stop():
                return len(self._aborted) == every_rank

            self._synchronize(timeout=60.0, also=self._fences.pending(), stop=stop, held=False)
            held = self._held_ranks() if self._held_calls and not stop() else []
            if held:
                _log.warning(
                    "LoopbackWorld.close(): dropping the collectives of ranks %s, held on the host for ranks that "
                    "never made their matching call (eager graph route); their outputs were not written",
                    held,
                )
        finally:
            with self._teardown:
                self._closing = False
                if not self._aborted:
                    if waited:  # (interrupted while calls were in flight: left, as before, to process exit)
                        lib = N.lib()
                        for entry in self._slots:
                            for c, p in zip(self._comms, entry):
                                lib.tideSlotFree(c, p)
                        for c in self._comms:
                            lib.tideCommDestroy(c)
                        self._release()
                elif len(self._aborted) == len(self._comms):
                    self._release()  # abort() released the handles and left the streams to this close()
                # else: an abort() that failed on some rank; abort() again retries those and releases the rest

    def abort(self) -> None:
        """tideCommAbort on every virtual rank: no stream synchronize, each wait bounded by NCCL_TIDE_TIMEOUT_MS (2 s
        when 0). Slots go with the world (freed if the device went idle, else left to process exit); the slot
        tensors must not be used afterwards. Idempotent; a no-op after close() finished (on any thread); while a
        close() of another thread waits, aborts the comms (that close() then ends its wait and destroys nothing)."""
        with self._teardown:
            if not self._comms:
                return
            self._life.close(wait=False)
            lib = N.lib()
            aborted = self._aborted
            try:
                for i, c in enumerate(self._comms):
                    if i not in aborted:
                        N.check(lib.tideCommAbort(c), f"tideCommAbort(virtual rank {i})")
                        aborted.add(i)
            finally:
                # A call of another thread may still be inside this world (abort does not wait for it): it must find
                # the handles where they were (the library refuses aborted ones by name) and the streams alive, so the
                # teardown of the Python side happens only when no such call is left; else the streams go with the
                # process. The handle list keeps its positions until every rank is aborted (abort() again retries).
                # A close() waiting on another thread does that teardown itself when its wait ends.
                if len(aborted) == len(self._comms) and not self._closing and not self._life.others_in_flight():
                    self._release()

    def _release(self) -> None:
        """The Python side's teardown, once (under _teardown; the comms are destroyed or aborted): the handle lists,
        the world's own streams and the caller-stream events."""
        self._comms = []
        self._slots = []
        _DriverStreams.destroy(self._raw_streams)
        self._raw_streams = []
        self._fences.clear()

    def __reduce__(self):
        # Its comms and streams live in this process only: a copy elsewhere would name nothing.
        raise TypeError("a LoopbackWorld cannot be pickled: its virtual ranks live in this process; create one in "
                        "the other process and pass it the Layouts")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def multicast_allowed() -> bool:
    """tideMulticastAllowed: the NVLink multicast gate (host only)."""
    v = ctypes.c_int(-1)
    N.check(N.lib().tideMulticastAllowed(ctypes.byref(v)), "tideMulticastAllowed")
    return bool(v.value)


__all__ = ["LoopbackWorld", "multicast_allowed", "new_streams"]
