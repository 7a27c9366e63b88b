# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Layout: one FSDP parameter group as the C library sees it (tideLayout_t).

The math (shard sizes, offsets, schedule) lives in the library; this class only
describes the group, creates the handle and reads the derived values back.
"""

import ctypes
import threading
from collections.abc import Sequence
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

from . import _native as N
from .dtypes import DType
from .dtypes import dtype as to_dtype
from .errors import InvalidArgumentError


class ParamInfo(NamedTuple):
    numel: int
    row_numel: int
    shard_numel: int
    dtype: str
    elem_size: int
    send_offset: int  # bytes in the packed send buffer
    slot_offset: int  # bytes in the slot
    rs_out_offset: int  # elements in the packed RS output


class Step(NamedTuple):
    round: int
    send_to_node: int
    recv_from_node: int
    send_block_node: int
    recv_block_node: int
    offset: int  # bytes into the block
    bytes: int


def sequence_arg(value: Any, what: str, entries: str) -> Sequence:
    """value if it is a sequence (list, tuple, numpy array, ...), else InvalidArgumentError; a str is not one."""
    if isinstance(value, (str, bytes)) or not (hasattr(value, "__len__") and hasattr(value, "__getitem__")):
        raise InvalidArgumentError(f"{what} is {value!r}; expected a sequence of {entries}")
    return value


def _unpickle(args: tuple, pickled_hash: int) -> "Layout":
    layout = Layout(*args)
    if layout.hash != pickled_hash:
        h = layout.hash
        layout.close()
        raise InvalidArgumentError(
            f"unpickled Layout has hash 0x{h:016x}, the pickled one 0x{pickled_hash:016x}: this process's "
            "NCCL_TIDE_RS_CHUNK_BYTES or NCCL_TIDE_PACE_BYTES differs; pass rs_chunk_bytes and pace_bytes explicitly"
        )
    return layout


def default_ranks_per_node(world_size: int) -> int:
    """Largest divisor of world_size that is <= 8 (a DGX-style node).

    So world <= 8 is one node, 16/64/512 ranks are nodes of 8, 12 ranks are 2 nodes of 6.
    """
    for r in range(min(world_size, 8), 0, -1):
        if world_size % r == 0:
            return r
    return 1


class Layout:
    """An immutable FSDP group layout. Use as a context manager or call close()."""

    def __init__(
        self,
        numels: Sequence[int],
        dtypes: Union[str, DType, Sequence[Union[str, DType]]],
        world_size: int,
        ranks_per_node: Optional[int] = None,
        rank: int = 0,
        row_numels: Optional[Sequence[int]] = None,
        rs_chunk_bytes: Optional[int] = None,
        pace_bytes: Optional[int] = None,
    ):
        self._handle = None
        self._lock = threading.Lock()
        self._inflight = 0  # calls of this process using the handle now (see _use)
        self._closing = False
        # Per-call checkers of the CUDA wrappers' tensor arguments, by role (nccl_tide._tensor_args): they depend on
        # the layout's parameters only, and keep what repeated calls can reuse.
        self._arg_tables: Dict[str, Any] = {}
        # Every integer is range-checked here: ctypes would silently wrap an out-of-range one into another value.
        per_param = "integers, one per parameter"
        numels = [N.u64_arg(x, f"numels[{i}]") for i, x in enumerate(sequence_arg(numels, "numels", per_param))]
        n = N.int_arg(len(numels), "number of parameters", 0)
        if isinstance(dtypes, (str, DType)) or not hasattr(dtypes, "__len__"):
            dtypes = [dtypes] * n  # type: ignore[list-item]  # one dtype for the whole group
        dts: List[DType] = [to_dtype(d) for d in dtypes]
        if len(dts) != n:
            raise InvalidArgumentError(f"{n} numels but {len(dts)} dtypes")
        if row_numels is not None and len(sequence_arg(row_numels, "row_numels", per_param)) != n:
            raise InvalidArgumentError(f"{n} numels but {len(row_numels)} row_numels")
        if row_numels is not None:
            row_numels = [N.u64_arg(x, f"row_numels[{i}]") for i, x in enumerate(row_numels)]
        world_size = N.int_arg(world_size, "world_size")
        if ranks_per_node is None:
            ranks_per_node = default_ranks_per_node(world_size) if world_size >= 1 else 1
        ranks_per_node = N.int_arg(ranks_per_node, "ranks_per_node")
        rank = N.int_arg(rank, "rank")
        # None (or 0) takes the NCCL_TIDE_* default; a negative cap is an error, not a huge unsigned one.
        rs_chunk_bytes = 0 if rs_chunk_bytes is None else N.u64_arg(rs_chunk_bytes, "rs_chunk_bytes")
        pace_bytes = 0 if pace_bytes is None else N.u64_arg(pace_bytes, "pace_bytes")

        lib = N.lib()
        c_numels = (ctypes.c_uint64 * max(n, 1))(*numels)
        c_rows = (ctypes.c_uint64 * n)(*row_numels) if row_numels is not None else None
        c_dtypes = (N.tideDataType_t * max(n, 1))(*[d.code for d in dts])
        desc = N.tideLayoutDesc_t(
            ctypes.sizeof(N.tideLayoutDesc_t),
            N.TIDE_LAYOUT_DESC_VERSION,
            n,
            c_numels,
            c_rows,
            c_dtypes,
            world_size,
            ranks_per_node,
            rank,
        )
        # What copies and pickles recreate the layout from (each its own handle).
        self._args = (numels, [d.name for d in dts], world_size, ranks_per_node, rank, row_numels,
                      rs_chunk_bytes or None, pace_bytes or None)
        config = N.make_config(rs_chunk_bytes, pace_bytes)
        handle = N.tideLayout_t()
        N.check(lib.tideLayoutCreate(ctypes.byref(desc), ctypes.byref(config), ctypes.byref(handle)), "Layout")
        self._handle = handle
        self._dtypes = dts

        info = N.tideLayoutInfo_t()
        info.size, info.version = ctypes.sizeof(info), N.TIDE_LAYOUT_INFO_VERSION
        N.check(lib.tideLayoutGetInfo(handle, ctypes.byref(info)), "tideLayoutGetInfo")
        self._info = info
        self._params = [self._param(i) for i in range(n)]

    def _param(self, i: int) -> ParamInfo:
        p = N.tideParamInfo_t()
        p.size, p.version = ctypes.sizeof(p), N.TIDE_PARAM_INFO_VERSION
        with self._use() as h:
            N.check(N.lib().tideLayoutGetParam(h, i, ctypes.byref(p)), "tideLayoutGetParam")
        return ParamInfo(
            p.numel,
            p.rowNumel,
            p.shardNumel,
            to_dtype(p.dtype).name,
            p.elemSize,
            p.sendOffset,
            p.slotOffset,
            p.rsOutOffset,
        )

    # -- handle lifetime -------------------------------------------------------------------
    # Thread safety: a call takes the handle through _use(), which counts it in flight; close() on another thread
    # then only marks the layout closed, and the last call in flight destroys the handle when it returns. So a call
    # either completes or fails with "layout is closed"; the library itself also keeps a layout alive until every
    # C call using it returned (include/tide.h "Handles").
    @property
    def handle(self) -> ctypes.c_void_p:
        """The tideLayout_t. For a call into the library prefer `with layout._use() as h:` (safe against a
        concurrent close()); a bare handle used after close() is refused by the library (tideInvalidArgument)."""
        if self._handle is None or self._closing:
            raise InvalidArgumentError("layout is closed")
        return self._handle

    @property
    def closed(self) -> bool:
        return self._handle is None or self._closing

    def _use(self) -> "_HandleUse":
        """`with layout._use() as h:` the handle, counted in flight until the block ends."""
        return _HandleUse(self)

    def _acquire(self) -> ctypes.c_void_p:
        with self._lock:
            if self._handle is None or self._closing:
                raise InvalidArgumentError("layout is closed")
            self._inflight += 1
            return self._handle

    def _release(self) -> None:
        with self._lock:
            self._inflight -= 1
            last = self._closing and self._inflight == 0 and self._handle is not None
            if last:
                h, self._handle = self._handle, None
        if last:
            self._destroy(h)

    @staticmethod
    def _destroy(h: Optional[ctypes.c_void_p]) -> None:
        if h is not None and h.value:
            N.check(N.lib().tideLayoutDestroy(h), "tideLayoutDestroy")

    def close(self) -> None:
        """Destroys the handle, at once or (a call in flight on another thread) when that call returns.
        Idempotent."""
        lock = getattr(self, "_lock", None)
        if lock is None:  # __init__ failed before the handle existed
            return
        with lock:
            if self._handle is None or self._closing:
                return
            self._closing = True
            if self._inflight:
                return  # the last call in flight destroys it
            h, self._handle = self._handle, None
        self._destroy(h)

    def __enter__(self) -> "Layout":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # A copy is another Layout of the same arguments, with a handle of its own (sharing the handle would make the
    # second close() a double destroy). A pickle holds the arguments and the hash; unpickling recreates the layout
    # and refuses it if the hash differs (another process's NCCL_TIDE_* defaults).
    def __copy__(self) -> "Layout":
        return Layout(*self._args)

    def __deepcopy__(self, memo: Any) -> "Layout":
        return Layout(*self._args)

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return _unpickle, (self._args, self.hash)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass

    # -- derived values ----------------------------------------------------------------------
    n_params = property(lambda self: self._info.nParams)
    world_size = property(lambda self: self._info.worldSize)
    ranks_per_node = property(lambda self: self._info.ranksPerNode)
    n_nodes = property(lambda self: self._info.nNodes)
    rank = property(lambda self: self._info.rank)
    hash = property(lambda self: self._info.hash)
    send_bytes = property(lambda self: self._info.sendBytes)
    slot_bytes = property(lambda self: self._info.slotBytes)
    rs_out_numel = property(lambda self: self._info.rsOutNumel)
    rs_chunk_numel = property(lambda self: self._info.rsChunkNumel)
    rs_num_chunks = property(lambda self: self._info.rsNumChunks)
    rs_staging_bytes = property(lambda self: self._info.rsStagingBytes)
    slot_reuse_fits = property(lambda self: bool(self._info.slotReuseFits))
    pace_bytes = property(lambda self: self._info.paceBytes)

    @property
    def params(self) -> List[ParamInfo]:
        return list(self._params)

    @property
    def dtypes(self) -> List[DType]:
        return list(self._dtypes)

    def schedule(self, node: int) -> List[Step]:
        """Inter-node all-gather steps that node `node` runs, in order (empty for one node)."""
        lib = N.lib()
        node = N.int_arg(node, "node")
        count = ctypes.c_int(-1)
        steps = []
        with self._use() as h:
            N.check(lib.tideLayoutGetScheduleLength(h, node, ctypes.byref(count)), "schedule length")
            s = N.tideScheduleStep_t()
            for k in range(count.value):
                s.size, s.version = ctypes.sizeof(s), N.TIDE_SCHEDULE_STEP_VERSION
                N.check(lib.tideLayoutGetScheduleStep(h, node, k, ctypes.byref(s)), "schedule step")
                steps.append(
                    Step(s.round, s.sendToNode, s.recvFromNode, s.sendBlockNode, s.recvBlockNode, s.offset, s.bytes)
                )
        return steps

    def __repr__(self) -> str:
        return (
            f"Layout(n_params={self.n_params}, world_size={self.world_size}, ranks_per_node={self.ranks_per_node}, "
            f"send_bytes={self.send_bytes}, slot_bytes={self.slot_bytes}, hash=0x{self.hash:016x})"
        )


class _HandleUse:
    """What Layout._use() returns: a context manager over _acquire() / _release() (no generator per call)."""

    __slots__ = ("_layout",)

    def __init__(self, layout: Layout) -> None:
        self._layout = layout

    def __enter__(self) -> ctypes.c_void_p:
        return self._layout._acquire()

    def __exit__(self, *exc: object) -> None:
        self._layout._release()
