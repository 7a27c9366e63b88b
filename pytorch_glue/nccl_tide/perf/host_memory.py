# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The host backend's memory need, estimated before anything is allocated: it holds every simulated rank's buffers
in this process, so a large size times a large world can exceed the machine, and the out-of-memory killer would end
the run minutes in without a word. Refused up front with both figures instead, and with what lowers the need for
the run's kind. The figure is what the run adds at its peak: the available figure it is compared with already leaves
out what this process holds (the interpreter and the library, some 40 MB of resident set)."""

from typing import List, Tuple

from .._memory import available_host_memory
from ..models import MODELS, model_params, numels_and_rows
from . import collectives
from .options import EXIT_UNSUPPORTED, Options, die

GiB = 1 << 30


def largest_case(o: Options) -> Tuple[List[int], List[int]]:
    """(element counts, row lengths) of the run's largest case: the model layout's parameters, or the one flat tensor
    of the largest size (nothing for a run whose every size is below 16 bytes per rank)."""
    if o.model:
        return numels_and_rows(model_params(o.layout))
    counts = [collectives.per_rank_count(s, o.dtype.size, o.world) for s in o.sizes()]
    base = max(counts, default=0)
    return ([base * o.world], [1]) if base else ([], [])


def largest_case_bytes(o: Options) -> int:
    """Bytes of the run's largest size (the size column of its last row)."""
    numels, rows = largest_case(o)
    return collectives.rank_count(numels, rows, o.world) * o.world * o.dtype.size


def host_bytes(o: Options) -> int:
    """Peak bytes of the run's largest case on the host backend (the collective's host_peak_bytes)."""
    numels, rows = largest_case(o)
    if not numels:
        return 0
    return o.collective.host_peak_bytes(numels, rows, o.world, o.dtype.size, o.out_dtype.size, bool(o.check))


def advice(o: Options) -> str:
    """What lowers the need, for this run's kind: -e sizes a flat run, while a model layout's layer fixes its size
    (-b/-e do not apply to it), so there the layout, the world and the type are what can change."""
    if o.model:
        mine = collectives.model_bytes(o.layout, o.world, o.dtype)
        smaller = [m for m in sorted(MODELS) if collectives.model_bytes(m, o.world, o.dtype) < mine]
        what = ["fewer --ranks"] + ([f"a smaller --layout ({', '.join(smaller)})"] if smaller else [])
        what.append("--layout flat with a smaller -e")
        if o.dtype.size > 2:
            what.append("a narrower -d (bf16)")
    else:
        what = ["a smaller -e", "fewer --ranks"]
    if o.check:
        what.append("-c 0 (no reference copy)")
    text = "use " + ", ".join(what[:-1]) + " or " + what[-1]
    return text + (f"; -b/-e do not size a model layout: --layout {o.layout} fixes the size" if o.model else "")


def check(o: Options) -> None:
    """Refuses a host run whose largest size does not fit (exit 255, as nccl-tests ends on sizes it cannot run)."""
    need = host_bytes(o)
    avail, source = available_host_memory()
    if avail is not None and need > avail:
        die(f"{message(o, need, avail)} ({source}): {advice(o)}", EXIT_UNSUPPORTED)


def message(o: Options, need: int, avail: int) -> str:
    what = f"--layout {o.layout}" if o.model else "its largest size"
    return (f"tide-perf {o.collective.name} --backend host needs about {need / GiB:.1f} GiB of host memory for "
            f"{what} ({largest_case_bytes(o)} bytes at {o.world} ranks, every rank simulated in this process), but "
            f"only {avail / GiB:.1f} GiB are available")
