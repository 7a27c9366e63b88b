# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Runs one (size, impl) measurement on a GPU backend and turns it into a report.Row.

A backend's bench(impl, case) returns a Bench (call, check, note, cleanup) or raises Unavailable (or any error):
then the row is printed with N/A figures and the reason in its note instead of disappearing.
"""

import traceback
from typing import TYPE_CHECKING, Callable, List, NamedTuple, Optional, Tuple

from ..dtypes import DType
from .report import NA, Row, Variant

if TYPE_CHECKING:
    from .collective import Collective

SYNC_TIMEOUT_S = 30.0  # a TIDE call not done by then is a cross-rank deadlock: the row fails instead of hanging


class Unavailable(Exception):
    """An implementation cannot run here; the message is the row's note."""


class CaseSpec(NamedTuple):
    collective: "Collective"  # what to run: its descriptor makes the buffers, the calls and the checks
    numels: List[int]
    rows: List[int]
    shapes: List[Tuple[int, ...]]
    dtype: DType
    out_dtype: DType
    op: str
    scale: float
    seed: int


class Bench(NamedTuple):
    call: Callable[[], None]
    check: Callable[[], int]
    note: str = ""
    cleanup: Optional[Callable[[], None]] = None
    # TIDE rows on GPU backends: builds the call's prebuilt issue (perf/issue_cost.py) for the host us / gpu us
    # columns, or None.
    prepare_issue: Optional[Callable[[], object]] = None


class MeasureOpts(NamedTuple):
    iters: int
    warmup: int
    check: int
    sm_time: bool
    gemm: object  # gpu.Gemm or None
    reduce_time: Callable[[float], float] = lambda t: t  # average over ranks (torchrun)
    reduce_wrong: Callable[[int], int] = lambda n: n  # sum over ranks (torchrun)
    barrier: Optional[Callable[[], None]] = None
    per_iter_agg: int = 0  # -I 1: calls per iteration (-m); 0: time the mean only
    gather_iters: Optional[Callable[[List[float]], List[List[float]]]] = None  # every process's iterations


def unavailable_row(size: int, count: int, type_name: str, redop: str, impl: str, reason: str) -> Row:
    return Row(size, count, type_name, redop, -1, NA, NA, impl=impl, note=reason, ok=False)


def measure(
    backend,
    impl: str,
    case: CaseSpec,
    size: int,
    count: int,
    type_name: str,
    redop: str,
    world: int,
    o: MeasureOpts,
    extras: dict,
) -> Row:
    """One row. `extras[impl]` collects detail for the JSON (kernel names, interference runs)."""
    import torch

    try:
        bench = backend.bench(impl, case)
    except Unavailable as e:
        return unavailable_row(size, count, type_name, redop, impl, str(e))
    except Exception as e:  # a baseline that fails to set up is reported, never hidden
        tb = traceback.format_exc(limit=3)
        extras.setdefault("errors", []).append({"impl": impl, "size": size, "traceback": tb})
        return unavailable_row(size, count, type_name, redop, impl, f"not run: {type(e).__name__}: {e}"[:300])
    stuck = False  # a collective timed out: never block on the device again in this row
    try:
        wrong = o.reduce_wrong(bench.check()) if o.check else None
        t, laps, proc_laps = gpu_time(bench.call, o)
        t = o.reduce_time(t)
        algbw, busbw = case.collective.bandwidth(size, world, t)
        sm = None
        detail = {}
        gemm_note = ""
        if o.sm_time:
            prof = _sm(bench.call)
            sm = o.reduce_time(prof["sm_us"])  # kernels + same-device copies (they run on SMs: perf/gpu.py)
            detail["profile"] = prof
        gx = None
        if o.gemm is not None:
            inter = o.gemm.slowdown(bench.call, t / 1e3, barrier=o.barrier)
            gx = inter["slowdown"]
            detail["interference"] = inter
            if inter["covered_runs"] < inter["runs"] or inter["late_runs"]:
                # the GEMM figure is then not the interference method's measurement: say so in the row
                ended = inter["runs"] - inter["covered_runs"]
                uncovered = f"GEMM: side work ended first in {ended} of {inter['runs']} runs"
                late = f", {inter['late_runs']} late" if inter["late_runs"] else ""
                gemm_note = uncovered + late
        host_us = gpu_us = None
        if bench.prepare_issue is not None and getattr(o, "issue_cost", True) and torch.cuda.is_available():
            from . import issue_cost

            try:  # an extra column: its failure is reported in the JSON, never fails the row
                prep = bench.prepare_issue()
                calls = issue_cost.calls_per_sample(prep.copies, prep.graph_route)
                hi = issue_cost.host_issue_us(prep, calls=calls, samples=5)
                host_us = hi["host_us"] if hi["valid_samples"] else None
                gl = issue_cost.gpu_latency_us(prep, samples=5)
                gpu_us = gl["gpu_us"] if gl["gpu_valid_samples"] else None
                detail["issue_cost"] = {**hi, **gl, "calls": calls}
            except Exception as e:
                detail["issue_cost"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        if detail:
            extras.setdefault("detail", []).append({"impl": impl, "size": size, **detail})
        return Row(
            size,
            count,
            type_name,
            redop,
            -1,
            Variant(t, algbw, busbw, wrong, iter_us=laps, proc_iter_us=proc_laps),
            NA,
            impl=impl,
            sm_us=sm,
            gemm_x=gx,
            note="; ".join(x for x in (bench.note, gemm_note) if x),
            host_us=host_us,
            gpu_us=gpu_us,
        )
    except Exception as e:
        from ..errors import TideTimeoutError

        stuck = isinstance(e, TideTimeoutError)
        tb = traceback.format_exc(limit=4)
        extras.setdefault("errors", []).append({"impl": impl, "size": size, "traceback": tb})
        return unavailable_row(size, count, type_name, redop, impl, f"failed: {type(e).__name__}: {e}"[:300])
    finally:
        try:
            if not stuck:
                torch.cuda.synchronize()
                if bench.cleanup:
                    bench.cleanup()
        except Exception as e:  # a broken context shows in this row's error list and in the next rows
            extras.setdefault("errors", []).append({"impl": impl, "size": size, "cleanup": repr(e)})
        finally:
            del bench
            import gc

            gc.collect()
            torch.cuda.empty_cache()


def gpu_time(call, o: MeasureOpts):
    """(mean time per call, None, None), or with -I 1 (mean, each iteration's max over processes, each process's
    iterations), as nccl-tests reports per-iteration times."""
    from . import gpu

    if o.barrier is not None:
        o.barrier()
    if not o.per_iter_agg:
        return gpu.time_call_us(call, o.iters, o.warmup), None, None
    laps = gpu.time_iters_us(call, o.iters // o.per_iter_agg, o.warmup, o.per_iter_agg)
    procs = o.gather_iters(laps) if o.gather_iters is not None else [laps]
    return sum(laps) / len(laps), [max(p[k] for p in procs) for k in range(len(laps))], procs


def gather_lists(backend, laps: List[float]) -> List[List[float]]:
    """Every torchrun process's list, in rank order (torch.distributed.all_gather_object)."""
    every: List = [None] * backend.W
    backend.dist.all_gather_object(every, laps)
    return every


def _sm(call) -> dict:
    from . import gpu

    return gpu.sm_time(call)
