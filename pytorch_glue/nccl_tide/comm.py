# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""TIDE communicators of real ranks (one per process): over an NCCL communicator or a torch.distributed bootstrap.

    import torch, torch.distributed as dist, nccl_tide
    from nccl_tide.comm import Comm
    dist.init_process_group("gloo", rank=rank, world_size=world)      # several processes may share one GPU
    comm = Comm.from_bootstrap(rank, world, device=0)                  # CUDA IPC peer memory, gloo exchange
    layout = nccl_tide.Layout(numels, "bf16", world, rank=rank)
    slot = comm.alloc_slot(layout.slot_bytes)                          # collective
    comm.all_gather(layout, slot, sendbuf=send)                        # on the current torch stream
    comm.synchronize()

or, over a torch NCCL process group: Comm.from_process_group(group) (tideCommCreate on its ncclComm_t).
Collectives run on the current torch stream unless a stream is given. Creation, alloc_slot/free_slot, the first
reduce_scatter of a larger layout (own staging growth) and close() are collective: every rank calls them in the
same order. nccl_info() reports the NCCL library TIDE found in this process (host only, no GPU needed).
"""

from __future__ import annotations

import ctypes
import time
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, NoReturn, Optional, Sequence

from . import _native as N
from ._log import get_logger
from .nccl_cuda import check_cuda_major
from .cuda import _SlotMemory
from ._tensor_args import address, grads_table, rs_out_dtype, shards_table
from .dtypes import dtype as to_dtype
from .dtypes import op_code, scale_arg
from ._lifetime import Lifetime
from .errors import InvalidArgumentError, TideTimeoutError, describe_pending, first_pending_wait

if TYPE_CHECKING:
    import torch

    from .layout import Layout

_log = get_logger("comm")

# Built-in bounds (seconds) when NCCL_TIDE_TIMEOUT_MS is unset or 0: these Python-side waits are bounded anyway, so that
# a test or a job never hangs silently; NCCL_TIDE_TIMEOUT_MS, when set, replaces them.
SYNCHRONIZE_TIMEOUT_S = 60.0


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("nccl_tide.comm needs PyTorch: pip install torch") from e
    return torch


_raw_stream: Any = None  # torch._C._cuda_getCurrentRawStream, False where this torch has none (looked up once)


def _raw_stream_query() -> Any:
    global _raw_stream
    if _raw_stream is None:
        _raw_stream = getattr(_torch()._C, "_cuda_getCurrentRawStream", None) or False
    return _raw_stream or None


def _version_text(code: int) -> str:
    if code <= 0:
        return "none"
    if code < 10000:
        return f"{code // 1000}.{(code % 1000) // 100}.{code % 100}"
    return f"{code // 10000}.{(code % 10000) // 100}.{code % 100}"


def nccl_info() -> Dict[str, Any]:
    """tideNcclGetInfo: versions (codes and text), feature names, provider ("window" or "ipc": what tideCommCreate
    tries with this NCCL and NCCL_TIDE_PROVIDER) and transport of the loaded libnccl.
    Raises UnsupportedError when no libnccl is loaded in this process or its version is outside 2.28-2.32, or when
    NCCL_TIDE_PROVIDER=window asks for windows this NCCL does not have; InvalidArgumentError for an invalid
    NCCL_TIDE_PROVIDER."""
    info = N.tideNcclInfo_t(ctypes.sizeof(N.tideNcclInfo_t), N.TIDE_NCCL_INFO_VERSION)
    N.check(N.lib().tideNcclGetInfo(ctypes.byref(info)), "tideNcclGetInfo")
    check_cuda_major()  # warns once if the libnccl found is for another CUDA major than torch's
    return {
        "header_version": info.headerVersion,
        "runtime_version": info.runtimeVersion,
        "effective_version": info.effectiveVersion,
        "header": _version_text(info.headerVersion),
        "runtime": _version_text(info.runtimeVersion),
        "features": sorted(name for name, bit in N.NCCL_FEATURES.items() if info.features & bit),
        "feature_bits": info.features,
        "provider": info.provider.decode(),
        "transport": info.transport.decode(),
    }


def make_gloo_allgather(group: Any = None, world: Optional[int] = None, timeout: Optional[float] = None) -> Any:
    """A tideAllGatherFn_t (ctypes callback) doing an all-gather of host bytes over a torch.distributed group (gloo:
    CPU tensors). Errors inside are reported on stderr and returned as 1 (TIDE then fails the call cleanly).

    Bounded wait: with `timeout` (seconds), or NCCL_TIDE_TIMEOUT_MS set, the all-gather is waited for at most that
    long (work.wait(timeout)); on expiry it returns tideTimeout (9), which TIDE reports as tideTimeout, naming the
    exchange. Without either, the group's own timeout (init_process_group(timeout=...), 30 min by default for gloo)
    is the only bound. After a timeout the group's collective sequence is out of step: the TIDE comm and the group
    are unusable (destroy both)."""
    torch = _torch()
    import datetime

    import torch.distributed as dist

    n = dist.get_world_size(group) if world is None else int(world)
    if timeout is None:
        timeout = N.timeout_seconds(0.0)  # 0: no bound of ours
    bound = datetime.timedelta(seconds=float(timeout)) if timeout and timeout > 0 else None

    def allgather(mine: int, all_out: int, nbytes: int, user: Any) -> int:
        try:
            src = torch.frombuffer(bytearray(ctypes.string_at(mine, nbytes)), dtype=torch.uint8)
            parts = [torch.empty(nbytes, dtype=torch.uint8) for _ in range(n)]
            if bound is None:
                dist.all_gather(parts, src, group=group)
            else:
                work = dist.all_gather(parts, src, group=group, async_op=True)
                try:
                    work.wait(timeout=bound)
                except RuntimeError as e:  # gloo: "Operation timed out!" (or the group's own timeout)
                    _log.error(
                        "bootstrap all-gather of %d bytes not done after %g s (NCCL_TIDE_TIMEOUT_MS / timeout): %s",
                        nbytes,
                        bound.total_seconds(),
                        e,
                    )
                    return N.tideTimeout
            joined = torch.cat(parts).contiguous()
            ctypes.memmove(all_out, joined.data_ptr(), nbytes * n)
            return 0
        except BaseException as e:  # never let an exception cross the C boundary
            _log.error("bootstrap all-gather failed: %r", e)
            return 1

    return N.tideAllGatherFn_t(allgather)


class Comm:
    """One rank's TIDE communicator (tideCommCreate / tideCommCreateWithBootstrap)."""

    _raw_current: Any = None  # _current_stream's fast query once it is known to work (False: it does not)

    def __init__(self, handle: Optional[int], keepalive: Iterable[Any] = ()) -> None:
        self._life = Lifetime("Comm")
        self._handle: Optional[int] = handle
        self._keep = list(keepalive)  # the bootstrap callback must outlive the comm (destroy calls it)
        self._slots: List[int] = []
        r, w = ctypes.c_int(), ctypes.c_int()
        N.check(N.lib().tideCommGetRank(handle, ctypes.byref(r), ctypes.byref(w)), "tideCommGetRank")
        self.rank, self.world_size = r.value, w.value
        n = ctypes.c_int()
        N.check(N.lib().tideCommGetRanksPerNode(handle, ctypes.byref(n)), "tideCommGetRanksPerNode")
        # TIDE's node size (NCCL's hosts, or NCCL_TIDE_RANKS_PER_NODE): a layout's ranks_per_node must divide it.
        self.ranks_per_node = n.value
        self.device: Optional[int] = None  # set by the constructors

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_bootstrap(
        cls,
        rank: int,
        world: int,
        device: int = 0,
        group: Any = None,
        config: Optional[N.tideConfig_t] = None,
        allgather: Any = None,
    ) -> "Comm":
        """tideCommCreateWithBootstrap with an all-gather over `group` (a torch.distributed gloo group; default the
        world group), or the given ctypes tideAllGatherFn_t."""
        cb = allgather if allgather is not None else make_gloo_allgather(group, world)
        boot = N.tideBootstrap_t(ctypes.sizeof(N.tideBootstrap_t), N.TIDE_BOOTSTRAP_VERSION, cb, None)
        out = N.tideComm_t()
        cfg = None if config is None else ctypes.byref(config)
        N.check(
            N.lib().tideCommCreateWithBootstrap(
                N.int_arg(rank, "rank"),
                N.int_arg(world, "world"),
                N.int_arg(device, "device"),
                ctypes.byref(boot),
                cfg,
                ctypes.byref(out),
            ),
            "tideCommCreateWithBootstrap",
        )
        c = cls(out.value, keepalive=[cb, boot])
        c.device = int(device)
        return c

    @classmethod
    def from_nccl(
        cls, nccl_comm_ptr: int, device: int, config: Optional[N.tideConfig_t] = None, keepalive: Iterable[Any] = ()
    ) -> "Comm":
        """tideCommCreate on a raw ncclComm_t (an int address)."""
        if not nccl_comm_ptr:
            raise InvalidArgumentError("from_nccl: the ncclComm_t is NULL (has the process group run a collective?)")
        check_cuda_major()
        out = N.tideComm_t()
        cfg = None if config is None else ctypes.byref(config)
        nccl_comm_ptr = N.u64_arg(nccl_comm_ptr, "nccl_comm_ptr (ncclComm_t address)", 1)
        N.check(N.lib().tideCommCreate(nccl_comm_ptr, cfg, ctypes.byref(out)), "tideCommCreate")
        c = cls(out.value, keepalive=keepalive)
        c.device = int(device)
        return c

    @classmethod
    def from_process_group(cls, group: Any = None, config: Optional[N.tideConfig_t] = None) -> "Comm":
        """tideCommCreate on the ncclComm_t of a torch NCCL process group (its backend's _comm_ptr()). The process
        group's communicator is created lazily by torch: a barrier on the group runs first."""
        torch = _torch()
        import torch.distributed as dist

        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        dev = torch.cuda.current_device()
        dist.barrier(group=group, device_ids=[dev])  # makes torch create the NCCL communicator
        backend = pg._get_backend(torch.device("cuda", dev))
        get_ptr = getattr(backend, "_comm_ptr", None)
        if get_ptr is None:
            raise InvalidArgumentError(f"{type(backend).__name__} has no _comm_ptr(): not a ProcessGroupNCCL")
        return cls.from_nccl(int(get_ptr()), dev, config=config, keepalive=[pg])

    # -- properties ----------------------------------------------------------------------------
    @property
    def handle(self) -> int:
        if not self._handle or self._life.closed:
            raise InvalidArgumentError("Comm is closed")
        return self._handle

    @property
    def provider(self) -> str:
        with self._life.use():
            name = ctypes.c_char_p()
            N.check(N.lib().tideCommGetProvider(self.handle, ctypes.byref(name)), "tideCommGetProvider")
            return (name.value or b"").decode()

    # -- slots ---------------------------------------------------------------------------------
    def alloc_slot(self, nbytes: int) -> "torch.Tensor":
        """tideSlotAlloc (collective); a uint8 CUDA tensor viewing the slot (valid until free_slot/close)."""
        with self._life.use():
            torch = _torch()
            nbytes = N.u64_arg(nbytes, "nbytes", 0, N.SIZE_MAX)
            p = ctypes.c_void_p()
            N.check(N.lib().tideSlotAlloc(self.handle, nbytes, ctypes.byref(p)), "tideSlotAlloc")
            addr = int(p.value or 0)  # a NULL slot is refused by the library
            self._slots.append(addr)
            dev = torch.device("cuda", self.device)
            with torch.cuda.device(self.device):
                return torch.as_tensor(_SlotMemory(addr, int(nbytes)), device=dev)

    def free_slot(self, slot: Any) -> None:
        """tideSlotFree (collective; synchronizes the device first)."""
        with self._life.use():
            p = int(slot.data_ptr()) if hasattr(slot, "data_ptr") else int(slot)
            if p not in self._slots:
                raise InvalidArgumentError("free_slot: not a slot of this comm")
            N.check(N.lib().tideSlotFree(self.handle, p), "tideSlotFree")
            self._slots.remove(p)

    # -- collectives ---------------------------------------------------------------------------
    def _stream(self, stream: Any) -> int:
        if stream is None:
            return self._current_stream()
        if hasattr(stream, "cuda_stream"):
            return int(stream.cuda_stream)
        return N.u64_arg(stream, "stream (cudaStream_t address)")

    def _current_stream(self) -> int:
        """The address of the current torch stream of the comm's device. The first call asks torch.cuda (which
        initializes CUDA in torch if nothing did yet); later calls ask torch's raw-stream query (one C call, what
        torch's generated code uses) where this torch has one and it gave the same answer."""
        raw = self._raw_current
        if raw:
            return raw(self.device)
        torch = _torch()
        s = int(torch.cuda.current_stream(torch.device("cuda", self.device)).cuda_stream)
        if raw is None:
            q = _raw_stream_query()
            self._raw_current = q if q is not None and q(self.device) == s else False
        return s

    def all_gather(
        self,
        layout: Layout,
        slot: Any,
        sendbuf: Any = None,
        shards: Optional[Sequence[Any]] = None,
        stream: Any = None,
    ) -> None:
        """tideAllGather for this rank: sendbuf (packed, send_bytes) or shards[i]; slot (>= slot_bytes)."""
        with self._life.use():
            if (sendbuf is None) == (shards is None):
                raise InvalidArgumentError("all_gather: pass exactly one of sendbuf and shards")
            slot_ptr = address(slot, "slot", layout.slot_bytes, at_least=True)
            table = None
            send_ptr = None
            if sendbuf is not None:
                send_ptr = address(sendbuf, "sendbuf", layout.send_bytes, at_least=True)
            else:
                assert shards is not None
                n = len(layout._params)
                if len(shards) != n:
                    raise InvalidArgumentError(f"shards: {len(shards)} tensors, layout has {n} params")
                table = shards_table(layout).table(shards, "shards")
            s = self._stream(stream)
            with layout._use() as lh:  # safe against a concurrent layout.close()
                rc = N.lib().tideAllGather(self.handle, lh, send_ptr, table, slot_ptr, s)
            if rc != N.tideSuccess:
                N.check(rc, f"tideAllGather(rank {self.rank})")

    def reduce_scatter(
        self,
        layout: Layout,
        grads: Sequence[Any],
        out: Any,
        op: str = "sum",
        scale: float = 1.0,
        staging: Any = None,
        stream: Any = None,
        out_dtype: Any = None,
    ) -> None:
        """tideReduceScatter for this rank: grads[i] (numel_i elements), out (rs_out_numel elements of fp32, bf16 or
        fp16, from its torch dtype or out_dtype), op 'sum' | 'avg' | 'premul'."""
        with self._life.use():
            if out_dtype is None:
                out_dtype = rs_out_dtype(out)
                if out_dtype is None:
                    name = str(getattr(out, "dtype", "")).replace("torch.", "")
                    raise InvalidArgumentError(
                        f"out: dtype {name or type(out).__name__} is not float32/bfloat16/float16"
                    )
            odt = to_dtype(out_dtype)
            n = len(layout._params)
            if len(grads) != n:
                raise InvalidArgumentError(f"grads: {len(grads)} tensors, layout has {n} params")
            table = grads_table(layout).table(grads, "grads")
            out_ptr = address(out, "out", layout.rs_out_numel * odt.size, dtype=odt)
            stag = None if staging is None else address(staging, "staging", layout.rs_staging_bytes, at_least=True)
            code = op_code(op)
            scale_f = scale_arg(scale, code)
            s = self._stream(stream)
            with layout._use() as lh:  # safe against a concurrent layout.close()
                rc = N.lib().tideReduceScatter(self.handle, lh, table, out_ptr, odt.code, code, scale_f, stag, s)
            if rc != N.tideSuccess:
                N.check(rc, f"tideReduceScatter(rank {self.rank})")

    def debug_dump(self) -> str:
        """tideCommDebugDump: where this rank's host thread is, the last epochs, every rank's flag words (read back
        with a bounded wait) and the waits of this rank's last AG/RS that are not satisfied yet. Never blocks on the
        comm's streams; safe to call from another thread while a call on this comm is stuck."""
        buf = ctypes.create_string_buffer(64 * 1024)
        rc = N.lib().tideCommDebugDump(self.handle, buf, len(buf))
        text = buf.value.decode(errors="replace")
        if rc != N.tideSuccess:
            text += f"(tideCommDebugDump failed: {N.last_error()})\n"
        return text

    def synchronize(self, stream: Any = None, timeout: Optional[float] = None) -> None:
        """Waits on the host for `stream` (default: the current torch stream), polling: a cross-process deadlock
        becomes a TideTimeoutError instead of a hang. timeout (seconds) defaults to NCCL_TIDE_TIMEOUT_MS when that is
        set (nonzero), else SYNCHRONIZE_TIMEOUT_S. On timeout the error names the peer and the step (flag) of the
        first pending wait of this rank's last AG/RS; the comm's whole state (debug_dump(): flag words, every pending
        wait) is printed to stderr and included in the error."""
        torch = _torch()
        if timeout is None:
            timeout = N.timeout_seconds(SYNCHRONIZE_TIMEOUT_S)
        s = stream if stream is not None else torch.cuda.current_stream(torch.device("cuda", self.device))
        ev = torch.cuda.Event()
        ev.record(s)
        deadline = time.monotonic() + timeout
        while not ev.query():
            if time.monotonic() > deadline:
                try:
                    dump = self.debug_dump()
                    if "readback did not finish" in dump:  # its fresh stream shared a stuck hardware queue: retry
                        dump = self.debug_dump()
                except Exception as e:  # the dump is best effort; the timeout is the error
                    dump = f"(debug dump failed: {e!r})\n"
                try:  # structured (tideCommGetPendingWaits); the dump's text is the fallback
                    waits = N.pending_waits(self.handle)
                    pending = waits[0] if waits else None
                except Exception:
                    pending = first_pending_wait(dump)
                head = f"rank {self.rank}: stream not done after {timeout:g} s; " + describe_pending(self.rank, pending)
                _log.error("%s\n%s", head, dump)
                err = TideTimeoutError(f"{head} (a peer missing or stuck?)\n{dump}")
                err.pending = pending
                raise err
            time.sleep(0.0005)

    def close(self) -> None:
        """Frees the slots and destroys the comm (collective: every rank calls it). Waits for calls of other threads
        on this comm to return; calls made afterwards fail with "Comm is closed"."""
        if not self._handle or not self._life.close():
            return
        lib = N.lib()
        try:
            for p in list(self._slots):
                lib.tideSlotFree(self._handle, p)
            self._slots = []
        finally:
            lib.tideCommDestroy(self._handle)
            self._handle = None

    def abort(self) -> None:
        """tideCommAbort: local, non-collective teardown for a failing job (a peer died, the parent NCCL communicator
        was or will be aborted, work is queued that waits for a peer that never comes). Exchanges nothing with the
        peers and never touches the NCCL communicator; waits at most NCCL_TIDE_TIMEOUT_MS (2 s when that is 0) for
        this rank's device work. The handle and the slots are released (the slot tensors must not be used
        afterwards); memory the device may still use, or that was exported to peers, is left to process exit.
        Idempotent. Raises TideTimeoutError (the comm stays open) only if another thread stays inside a call on this
        comm past the bound."""
        if not self._handle or not self._life.close(wait=False):
            return
        try:
            N.check(N.lib().tideCommAbort(self._handle), f"tideCommAbort(rank {self.rank})")
        except BaseException:
            self._life.reopen()  # the handle stays valid (tideTimeout)
            raise
        self._handle = None
        self._slots = []

    def __reduce__(self) -> NoReturn:
        # Its handle names memory and peers of this process only: a copy elsewhere (a spawn worker) would name
        # nothing. A Layout, which is a description, pickles by value instead.
        raise TypeError("a Comm cannot be pickled: it is this process's communicator; create one in the other "
                        "process (Comm.from_bootstrap / Comm.from_process_group) and pass it the Layout")

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Comm", "make_gloo_allgather", "nccl_info"]
