# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Device addresses of the CUDA tensors a collective is given (Comm, LoopbackWorld), checked on every call.

Every tensor a collective reads or writes is checked on every call: its element type (float16 read as bf16 is a
silently wrong result), its device (CUDA), contiguity, and byte size (too few bytes are read past their end).
check() does that per tensor, with an error that names the tensor and the fault; in Python that costs 1-2 us a
tensor, for 64 gradients about 80 us on an H100 host: more than the library call. So a list of tensors (the
gradients of a reduce-scatter, the shards of an all-gather) goes through a TensorTable, whose tiers are each exact:

1. a guard: torch's C++ check of tensor metadata (TensorGuards, where this torch has one that behaves as relied on
   here, see _guards_work), built from the last list that passed a lower tier. It passes only tensors whose dtype,
   device, sizes, strides and dispatch keys equal that list's, so they pass the full check too. One C++ call for
   the whole list: about 9 us for 64 tensors on that host.
2. else the four facts read in one sweep each (map over the list, compared as tuples): the canonical torch dtype,
   the byte size, is_cuda, contiguity (about 25 us for 64).
3. else check() per tensor: it accepts what the faster tiers do not know (raw addresses, bit-storage dtypes such as
   uint16 for bf16) and raises the error that names the tensor.

Neither tier sees a storage resized under its tensor (same metadata, fewer bytes behind it), so both also read each
tensor's storage size and offset (one sweep, about 0.3 us a tensor on a CPU host). Tier 1 refuses torch's negative bit (a
dispatch key), tier 2 reads it; a conjugate bit comes only with complex dtypes, which both refuse.

Then the addresses, one map over the list (about 4 us for 64), and the ctypes table: cached by the tuple of
addresses (a call with the addresses of a recent call builds none; building one costs about 12 us for 64). Tables
are never written after they are built, so threads share them. Single tensors (an output, a slot, a send buffer)
take address(): the same facts read inline, check() otherwise.
"""

import ctypes
import operator
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _native as N
from .dtypes import ELEMENT_TYPES, DType, check_element_type
from .dtypes import dtype as to_dtype
from .errors import InvalidArgumentError


def _torch():
    import torch

    return torch


def _storage_short(t: Any) -> Optional[int]:
    """The byte size of a contiguous tensor's storage where that is less than the tensor reaches (its storage was
    resized under it, say), else None. A tensor whose storage cannot be read (a tensor subclass without one) is
    left to the other checks."""
    try:
        have = t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None
    n = t.numel()
    return have if n and (t.storage_offset() + n) * t.element_size() > have else None


def memory_fault(t: Any, what: str) -> None:
    """Refuses a contiguous torch tensor whose memory, read raw, is not its value: a negative or conjugate bit (the
    memory holds the un-negated values; torch applies the bit lazily, a raw read does not) or storage that ends
    before the tensor does (a read past it is a crash or another buffer's bytes)."""
    if t.is_neg() or t.is_conj():
        bit, fix = ("negative", "resolve_neg") if t.is_neg() else ("conjugate", "resolve_conj")
        raise InvalidArgumentError(
            f"{what}: tensor has torch's {bit} bit set, so its memory does not hold its values; pass t.{fix}()"
        )
    have = _storage_short(t)
    if have is not None:
        need = (t.storage_offset() + t.numel()) * t.element_size()
        raise InvalidArgumentError(
            f"{what}: its storage holds {have} bytes but the tensor reaches byte {need}; pass a tensor whose "
            "storage covers it (t.clone())"
        )


def _raw_address(t: Any, what: str) -> int:
    # The C side takes a 64-bit address: an out-of-range or bool value would be wrapped, naming another address.
    return N.u64_arg(t, f"{what} (address)")


def check(t: Any, what: str, nbytes: Optional[int] = None, at_least: bool = False, dtype=None) -> int:
    """Device address of a contiguous CUDA tensor (or a raw int address), checking its byte size and, for a typed
    buffer (dtype: the layout's or out_dtype), its element type. The full check, one tensor at a time."""
    if isinstance(t, int):
        return _raw_address(t, what)
    if not hasattr(t, "data_ptr"):
        if hasattr(type(t), "__index__"):  # a numpy integer or the like: an address as well
            return _raw_address(t, what)
        raise InvalidArgumentError(f"{what}: expected a CUDA tensor, got {type(t).__name__}")
    if dtype is not None:
        check_element_type(t, to_dtype(dtype), what)
    if t.device.type != "cuda":
        raise InvalidArgumentError(f"{what}: tensor is on {t.device}; the CUDA path needs CUDA tensors")
    if not t.is_contiguous():
        raise InvalidArgumentError(f"{what}: tensor must be contiguous")
    if nbytes is not None:
        have = t.numel() * t.element_size()
        if (have < nbytes) if at_least else (have != nbytes):
            raise InvalidArgumentError(f"{what}: {have} bytes, layout needs {'at least ' if at_least else ''}{nbytes}")
    memory_fault(t, what)
    return t.data_ptr()


_torch_dtypes: Dict[str, Any] = {}  # tide dtype name -> the torch dtype of that name (None if torch has none)


def torch_dtype(dt: DType) -> Any:
    """The torch dtype holding elements of dt as themselves (not as bits), or None."""
    try:
        return _torch_dtypes[dt.name]
    except KeyError:
        _torch_dtypes[dt.name] = getattr(_torch(), ELEMENT_TYPES[dt.name][0], None)
        return _torch_dtypes[dt.name]


def address(t: Any, what: str, nbytes: int, at_least: bool = False, dtype: Optional[DType] = None) -> int:
    """check() of one tensor, answered from five attribute reads when the tensor is plainly right (a CUDA tensor of
    dtype's own torch type, contiguous, of the byte size); anything else goes through check()."""
    try:
        if t.is_cuda and (dtype is None or t.dtype is torch_dtype(dtype)) and t.is_contiguous() and not t.is_neg():
            have = t.nbytes
            if ((have >= nbytes) if at_least else (have == nbytes)) and _storage_short(t) is None:
                return t.data_ptr()
    except AttributeError:  # not a tensor (an int address, another array type): check() says what it is
        pass
    return check(t, what, nbytes, at_least, dtype)


_DTYPE = operator.attrgetter("dtype")
_NBYTES = operator.attrgetter("nbytes")
_IS_CUDA = operator.attrgetter("is_cuda")
_CONTIGUOUS = operator.methodcaller("is_contiguous")
_IS_NEG = operator.methodcaller("is_neg")



_guards_state: Optional[bool] = None  # whether _new_guard can be used (decided once per process)


def _guard_class():
    try:
        from torch._C._dynamo.guards import TensorGuards
    except Exception:  # no dynamo in this torch build
        return None
    return TensorGuards


def _build_guard(cls, tensors: Sequence[Any]):
    # Sizes and strides given as numbers make them static: the guard passes only these exact values.
    return cls(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
               dynamic_dims_strides=[list(t.stride()) for t in tensors])


def _guards_work() -> bool:
    """Whether torch's TensorGuards exists and refuses what tier 1 relies on it to refuse: another dtype, size,
    shape, stride (a non-contiguous view) or device than the tensors it was built from. Tried once per process; any
    other answer (an error, a pass) leaves the guard tier off."""
    global _guards_state
    if _guards_state is None:
        _guards_state = False
        cls = _guard_class()
        if cls is not None:
            try:
                torch = _torch()
                ref = torch.zeros(8, dtype=torch.float32)
                g = _build_guard(cls, [ref])
                others = [
                    torch.zeros(8, dtype=torch.float16),
                    torch.zeros(9, dtype=torch.float32),
                    torch.zeros(1, 8, dtype=torch.float32),
                    torch.zeros(16, dtype=torch.float32)[::2],
                    torch.zeros(8, dtype=torch.float32, device="meta"),
                ]
                _guards_state = bool(g.check(torch.ones(8))) and not any(g.check(o) for o in others)
            except Exception:
                _guards_state = False
    return _guards_state


class TensorTable:
    """The checked pointer table of one list argument of one layout: entry i a CUDA tensor of dtypes[i], contiguous,
    of exactly nbytes[i] bytes. table() returns the ctypes array of the addresses (see the module's docstring)."""

    MAX_TABLES = 8  # cached address tuples; more distinct ones in turn empty the cache
    MAX_GUARDS = 8  # guards built per table (each about 40-70 us)

    def __init__(self, dtypes: Sequence[DType], nbytes: Sequence[int]):
        self._dtypes: List[DType] = list(dtypes)
        self._nbytes: Tuple[int, ...] = tuple(int(n) for n in nbytes)
        self._elem_sizes: Tuple[int, ...] = tuple(d.size for d in self._dtypes)
        self._array_type = ctypes.c_void_p * max(len(self._nbytes), 1)
        self._canonical: Optional[Tuple[Any, ...]] = None  # the dtypes as torch dtypes (torch imported lazily)
        self._guard = None
        self._guards_built = 0
        self._tables: Dict[Tuple[int, ...], Any] = {}
        self._data_ptr = _torch().Tensor.data_ptr
        self.full_checks = 0  # lists that took tier 3 (tests, benchmarks)
        self.tables_built = 0  # ctypes arrays built (tests, benchmarks)

    def _facts_match(self, tensors: Sequence[Any]) -> bool:
        if self._canonical is None:
            self._canonical = tuple(torch_dtype(d) for d in self._dtypes)
        return (
            tuple(map(_DTYPE, tensors)) == self._canonical
            and tuple(map(_NBYTES, tensors)) == self._nbytes
            and all(map(_IS_CUDA, tensors))
            and all(map(_CONTIGUOUS, tensors))
            and not any(map(_IS_NEG, tensors))
            and self._storages_cover(tensors)
        )

    def _storages_cover(self, tensors: Sequence[Any]) -> bool:
        """Neither a guard nor the facts see a storage resized under a tensor: read for every list, every call, in
        one sweep that takes each tensor's element size and byte size from the layout (both tiers matched them)."""
        try:
            return all(t.untyped_storage().nbytes() >= t.storage_offset() * e + n
                       for t, e, n in zip(tensors, self._elem_sizes, self._nbytes))
        except (RuntimeError, NotImplementedError, AttributeError):  # no readable storage: the other checks decide
            return all(_storage_short(t) is None for t in tensors)

    def _remember(self, tensors: Sequence[Any]) -> None:
        """A guard over tensors that passed a check (all of them torch tensors), replacing the last one; at most
        MAX_GUARDS per table: lists that keep changing kind are left to tier 2, which needs no rebuilding."""
        if self._guards_built >= self.MAX_GUARDS or not _guards_work():
            return
        torch = _torch()
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            return
        try:
            self._guard = _build_guard(_guard_class(), tensors)
            self._guards_built += 1
        except Exception:
            self._guard = None

    def addresses(self, tensors: Sequence[Any], what: str) -> Tuple[int, ...]:
        """The checked device addresses of tensors (len(tensors) is the layout's; the caller checked it). what names
        the list in errors: entry i is f"{what}[{i}]"."""
        guard = self._guard
        try:
            if guard is not None and guard.check(*tensors) and self._storages_cover(tensors):
                return tuple(map(self._data_ptr, tensors))
            ptrs = tuple(map(self._data_ptr, tensors)) if self._facts_match(tensors) else None
        except (AttributeError, TypeError):  # an entry that is no tensor: the full check names it
            ptrs = None
        except Exception:  # a guard of some torch release that raises otherwise: this table's guards stay off
            self._guard, self._guards_built = None, self.MAX_GUARDS
            ptrs = None
        if ptrs is None:
            self.full_checks += 1
            nb, dts = self._nbytes, self._dtypes
            ptrs = tuple(check(t, f"{what}[{i}]", nb[i], dtype=dts[i]) for i, t in enumerate(tensors))
        self._remember(tensors)  # the guard missed (or there was none): one of this kind answers the next call
        return ptrs

    def table(self, tensors: Sequence[Any], what: str) -> Any:
        """The ctypes array of addresses() (const void* const* in tide.h)."""
        ptrs = self.addresses(tensors, what)
        tab = self._tables.get(ptrs)
        if tab is None:
            if len(self._tables) >= self.MAX_TABLES:
                self._tables.clear()
            tab = self._array_type(*ptrs)
            self._tables[ptrs] = tab
            self.tables_built += 1
        return tab


def grads_table(layout) -> TensorTable:
    """The TensorTable of a reduce-scatter's gradients on `layout` (parameter i: numel_i elements of its dtype)."""
    t = layout._arg_tables.get("grads")
    if t is None:
        ps = layout._params
        t = layout._arg_tables["grads"] = TensorTable([to_dtype(p.dtype) for p in ps],
                                                       [p.numel * p.elem_size for p in ps])
    return t


def shards_table(layout) -> TensorTable:
    """The TensorTable of an all-gather's shards on `layout` (parameter i: shard_numel_i elements of its dtype)."""
    t = layout._arg_tables.get("shards")
    if t is None:
        ps = layout._params
        t = layout._arg_tables["shards"] = TensorTable([to_dtype(p.dtype) for p in ps],
                                                        [p.shard_numel * p.elem_size for p in ps])
    return t


_RS_OUT_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
_rs_out_by_dtype: Dict[Any, str] = {}


def rs_out_dtype(out: Any) -> Optional[str]:
    """The reduce-scatter output type (fp32 / bf16 / fp16) of out's torch dtype, or None if it has none of them."""
    dt = getattr(out, "dtype", None)
    try:
        return _rs_out_by_dtype[dt]
    except (KeyError, TypeError):
        pass
    name = _RS_OUT_NAMES.get(str(dt).replace("torch.", "")) if dt is not None else None
    if name is not None:
        try:
            _rs_out_by_dtype[dt] = name
        except TypeError:  # an unhashable dtype object: answered, not remembered
            pass
    return name
