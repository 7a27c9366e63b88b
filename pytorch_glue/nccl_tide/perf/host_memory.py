# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The host backend's memory need, estimated before anything is allocated: it holds every simulated rank's buffers
in this process, so a large size times a large world can exceed the machine, and the out-of-memory killer would end
the run minutes in without a word. Refused up front with both figures instead."""

from .._memory import available_host_memory
from . import collectives
from .options import EXIT_UNSUPPORTED, Options, die

GiB = 1 << 30


def largest_case_bytes(o: Options) -> int:
    """Bytes of the run's largest size (the size column of its last row)."""
    if o.model:
        return collectives.model_bytes(o.layout, o.world, o.dtype)
    runs = [s for s in o.sizes() if collectives.per_rank_count(s, o.dtype.size, o.world)]
    s = max(runs) if runs else 0
    return collectives.per_rank_count(s, o.dtype.size, o.world) * o.world * o.dtype.size


def host_bytes(o: Options) -> int:
    """Every rank's inputs and outputs of the largest size, plus the reference the check compares against.
    all_gather: S bytes of shards, W x S of gathered outputs, S of reference. reduce_scatter: W x S of inputs (each
    rank holds a whole gradient), S x out/in of outputs, the same again for the reference."""
    S, W = largest_case_bytes(o), o.world
    if o.collective.reduces:
        outputs = S * o.out_dtype.size // o.dtype.size
        return W * S + outputs * (2 if o.check else 1)
    return S + W * S + (S if o.check else 0)


def check(o: Options) -> None:
    """Refuses a host run whose largest size does not fit (exit 255, as nccl-tests ends on sizes it cannot run)."""
    need = host_bytes(o)
    avail, source = available_host_memory()
    if avail is not None and need > avail:
        die(f"tide-perf {o.collective.name} --backend host needs about {need / GiB:.1f} GiB of host memory for its "
            f"largest size ({largest_case_bytes(o)} bytes at {o.world} ranks, every rank simulated in this process), "
            f"but only {avail / GiB:.1f} GiB are available ({source}): lower -e or --ranks", EXIT_UNSUPPORTED)
