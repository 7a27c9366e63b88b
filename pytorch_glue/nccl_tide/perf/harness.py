# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The harness every collective shares (nccl-tests' common.cu in Python): the cases of the size loop or of a model
layout, one row per (case, implementation) measured on the run's backend, the footer, the JSON and the plot, and
the exit status. What differs between collectives comes from their descriptor (perf/collective.py)."""

import contextlib
import json
import os
import platform
import re
import shlex
import sys
import time
from typing import List, NamedTuple, Optional, TextIO, Tuple

from ..errors import TideError
from ..models import model_params, numels_and_rows
from . import collectives, host_backend, host_memory, impls, output, preamble, report, results_json
from .collectives import BUSBW_FORMULA
from .options import EXIT_OUTPUT, EXIT_WRONG, Options, die

GPU_NOTE = ("GPU backends: in-place variants are not measured (N/A); SM = sum of kernel durations per call "
            "(torch.profiler), copy-engine transfers use no SMs")


class Case(NamedTuple):
    """One table row's tensors: per parameter its element count, its row length and its shape."""

    numels: List[int]
    rows: List[int]
    shapes: List[Tuple[int, ...]]


def cases(o: Options, out: TextIO) -> List[Case]:
    """The model layout's one case, or one flat tensor per size of the size loop. A size below 16 bytes per rank
    rounds down to a count of 0, whose row nccl-tests prints as `0 0 float ...` (its size loop has no skip): an empty
    case, which measure_all turns into that row without a call."""
    if o.model:
        params = model_params(o.layout)
        numels, rows = numels_and_rows(params)
        out.write(
            f"# layout: {o.layout} ({len(params)} parameters, {sum(numels)} elements): one row = the whole layer; "
            "the layout fixes the size, -b/-e/-f/-i are ignored\n"
        )
        return [Case(numels, rows, [tuple(s) for _, s in params])]
    out_cases = []
    for size in o.sizes():
        base = collectives.per_rank_count(size, o.dtype.size, o.world)
        out_cases.append(Case([base * o.world], [1], [(base * o.world,)]))
    return out_cases


def run(o: Options, gpu_backend, lib_version: str, leader: bool, out: TextIO, progress=None) -> int:
    """The whole run after the backend is up: preamble, table, footer, JSON / plot. Returns the exit status."""
    from .. import __version__

    start_time = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())  # nccl-tests' start_time format (local)
    json_path = None
    if leader and o.output_file:
        json_path = o.output_file if o.overwrite else output.free_name(o.output_file)
        out.write(f"# Writing JSON output to {json_path}\n")  # nccl-tests' first line
    versions = {"nccl_tide": __version__, "library": lib_version, "python": platform.python_version()}
    if gpu_backend is not None:
        from . import gpu

        versions.update(gpu.versions())
    table = impls.impl_table(
        o.backend, o.impls, o.collective.name, nodes=o.nodes if o.backend == "loopback" else 1,
        copy_op=o.collective.fsdp2_copy_op, out=o.out_dtype.name,
    )
    backend_notes = list(getattr(gpu_backend, "notes", ()) or ())
    preamble.write(out, o, versions, lib_version, gpu_backend, table, backend_notes)
    run_cases = cases(o, out)
    devices = preamble.devices(gpu_backend, o.world)
    preamble.write_devices(out, devices)
    layout = report.Table(per_iter=o.per_iter, wide=o.wide, cputime=o.cputime, timestamps=o.timestamps)
    report.header(out, layout)
    out.flush()

    rows, notes, extras = measure_all(o, gpu_backend, run_cases, table, out, layout, progress)
    for line in report.note_lines(rows if o.wide else [r for r in rows if r.impl == o.impls[0]]):
        out.write(line + "\n")
    for note in sorted(notes):
        out.write(f"# {note}\n")
    subject = o.impls[0]
    report.footer(out, rows, o.collective.perf_name, subject=subject, min_busbw=o.min_busbw)
    if o.memory_report:
        out.write(memory_report(gpu_backend) + "\n")
    report.finish(out)
    out.flush()

    failed = report.total_wrong(rows) or report.busbw_gate_failed(report.avg_busbw(rows, subject), o.min_busbw)
    status = EXIT_WRONG if failed else 0
    if leader and (json_path or o.plot):
        notes_all = backend_notes + list(o.flag_notes) + sorted(notes)
        doc = json_doc(o, versions, devices, rows, table, notes_all, extras, start_time)
        written = write_outputs(o, doc, json_path, out)
        if written:
            return written
    return status


def write_outputs(o: Options, doc: dict, json_path: Optional[str], out: TextIO) -> int:
    """Writes the JSON and the plot; 0, or the exit status of the first that could not be written (one line on
    stderr: the run itself finished and printed its table)."""
    if json_path:
        data = (json.dumps(doc, indent=2) + "\n").encode()
        try:
            written = output.write_whole(json_path, data, o.overwrite)
        except OSError as e:
            print(f"tide-perf: error: -J {json_path}: the JSON could not be written: {e.strerror or e}",
                  file=sys.stderr)
            return EXIT_OUTPUT
        if written != json_path:
            out.write(f"# {json_path} was taken while the run measured: JSON written to {written}\n")
    if o.plot:
        from .plot import PlotUnavailable, plot

        try:
            plot(doc, o.plot)
        except PlotUnavailable as e:
            print(str(e), file=sys.stderr)
            return 3
        except OSError as e:
            print(f"tide-perf: error: --plot {o.plot}: the figure could not be written: {e.strerror or e}",
                  file=sys.stderr)
            return EXIT_OUTPUT
        out.write(f"# plot written to {o.plot}\n")
    return 0


def memory_report(gpu_backend) -> str:
    """-M 1: nccl-tests' memory line. GPU backends: torch's peak allocation on this rank's device; host: the peak
    resident set of this process (every simulated rank lives in it)."""
    if gpu_backend is None:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
        return "# %-20s : Peak resident %s" % ("Host memory usage", mem_string(peak))
    import torch

    peak = torch.cuda.max_memory_allocated(gpu_backend.device)
    return "# %-20s : Collective %s | Total  %s" % ("GPU memory usage", mem_string(peak), mem_string(peak))


def mem_string(n: int) -> str:
    """nccl-tests' getMemString: B, KB, MB or GB (powers of 1024), 2, 1 or 0 decimals by magnitude."""
    amount, unit = float(n), "B"
    for name, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if abs(amount) >= scale:
            amount, unit = amount / scale, name
            break
    prec = 2 if abs(amount) < 10 else 1 if abs(amount) < 100 else 0
    return f"{amount:.{prec}f} {unit}"


def measure_all(o: Options, gpu_backend, run_cases: List[Case], table: dict, out: TextIO,
                layout: report.Table = report.Table(wide=True), progress=None):
    """Every (case, impl) row, -N times over (0: until interrupted), each printed as it is measured (the first
    impl's only, unless --wide). Returns (rows, notes, extras for the JSON)."""
    rows: List[report.Row] = []
    notes = set()
    extras: dict = {}
    mopts = None
    if gpu_backend is not None:
        from . import gpu, runner

        gemm = gpu.Gemm(o.interfere_runs) if o.interfere == "gemm" else None
        mopts = runner.MeasureOpts(
            o.iters * o.agg_iters,
            o.warmup,
            o.check,
            o.sm_time,
            gemm,
            reduce_time=getattr(gpu_backend, "reduce_time", lambda t: t),
            reduce_wrong=getattr(gpu_backend, "reduce_wrong", lambda n: n),
            barrier=gpu_backend.barrier if o.backend == "torchrun" else None,
            per_iter_agg=o.agg_iters if o.per_iter else 0,
            gather_iters=(lambda t: runner.gather_lists(gpu_backend, t)) if o.backend == "torchrun" else None,
        )
        if gemm is not None:
            extras["gemm_alone"] = gemm.alone
    type_name, redop = o.dtype.nccl_tests_name, o.redop
    total = len(run_cases) * len(o.impls)
    cycle = 0
    while o.run_cycles == 0 or cycle < o.run_cycles:
        cycle += 1
        for k, case in enumerate(run_cases):
            count = collectives.rank_count(case.numels, case.rows, o.world)
            size = count * o.world * o.dtype.size
            for j, impl in enumerate(o.impls):
                if progress is not None:
                    cyc = f"cycle {cycle}, " if o.run_cycles != 1 else ""
                    progress.stage(f"{cyc}row {k * len(o.impls) + j + 1}/{total}: {impl}, {size} bytes")
                reason = table[impl]["not_run_reason"]
                if reason:
                    row = report.Row(size, count, type_name, redop, -1, report.NA, report.NA, impl=impl, note=reason,
                                     ok=False)
                elif count == 0:
                    row = zero_row(o, impl, gpu_backend is None)
                elif gpu_backend is None:
                    row = _host_row(o, case, size, count, impl, notes)
                else:
                    from . import runner

                    spec = runner.CaseSpec(o.collective, case.numels, case.rows, case.shapes, o.dtype,
                                           o.out_dtype, o.op, o.scale, o.seed)
                    row = runner.measure(gpu_backend, impl, spec, size, count, type_name, redop, o.world, mopts,
                                         extras)
                if o.timestamps:
                    row = row._replace(stamp=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime()))
                rows.append(row)
                if layout.wide or impl == o.impls[0]:
                    with progress.paused() if progress is not None else contextlib.nullcontext():
                        out.write(report.row_line(row, layout, o.per_iter_skip) + "\n")
                        out.flush()
    if progress is not None:
        progress.close()  # the ticker ends with the measurements: no line after the notes and the footer
    if gpu_backend is not None:
        notes.add(GPU_NOTE)
    return rows, notes, extras


ZERO_NOTE = ("a count of 0 (fewer than 16 bytes per rank) moves nothing: no call is made, so time, algbw and busbw "
             "are 0, as nccl-tests prints its zero-count rows")


def zero_row(o: Options, impl: str, host: bool) -> report.Row:
    """The row of a size whose per-rank count is 0, on every backend alike. nccl-tests prints it (size 0, count 0,
    busbw 0, counted in the average bus bandwidth); TIDE has no zero-element layout to call, and no backend is asked
    for one, so the figures are exact zeros rather than the time of a call. The in-place variant is 0 where the
    run measures in place at all (the host backend, and for reduce-scatter an output type equal to -d), N/A
    elsewhere, as the run's other rows have it."""
    wrong = 0 if o.check else None  # -c 0: N/A, as every unchecked variant
    zero = report.Variant(0.0, 0.0, 0.0, wrong, iter_us=[0.0] * o.iters if o.per_iter else None)
    in_place = host and (not o.collective.reduces or o.out_dtype.name == o.dtype.name)
    return report.Row(0, 0, o.dtype.nccl_tests_name, o.redop, -1, zero, zero if in_place else report.NA, impl=impl,
                      note=ZERO_NOTE)


def _host_row(o: Options, case: Case, size: int, count: int, impl: str, notes: set) -> report.Row:
    hcase = host_backend.Case(case.numels, case.rows, o.world, o.ranks_per_node, o.pace_bytes)
    hopts = host_backend.Opts(o.dtype, o.out_dtype, o.op, o.scale, o.iters, o.warmup, o.check, o.seed,
                              agg=o.agg_iters, per_iter=o.per_iter)
    try:
        oop, ip, note = host_backend.measure(o.collective, hcase, hopts)
    except MemoryError as e:
        die(f"out of host memory: {e or 'an allocation failed'}; the host backend holds every simulated rank: "
            f"{host_memory.advice(o)}")
    except TideError as e:
        die(str(e))
    if note:
        notes.add(note)
    return report.Row(size, count, o.dtype.nccl_tests_name, o.redop, -1, oop, ip, impl=impl)


def json_doc(o: Options, versions: dict, devices: list, rows, table: dict, notes: List[str], extras: dict,
             start_time: str) -> dict:
    """nccl-tests' JSON (file version 3) with tide-perf's keys under `extras` (perf/results_json.py)."""
    lo, hi = o.size_range()
    head = {
        "version": results_json.JSON_FILE_VERSION,
        "start_time": start_time,
        "args": ["tide-perf"] + list(o.argv),
        "env": json_env(),
        "nccl_version": nccl_version_code(versions.get("nccl_runtime")),
    }
    tf = results_json.tf
    nccl_config = {
        "nthreads": 1,
        "ngpus": 0 if o.backend == "host" else 1,
        "minimum_bytes": lo,
        "maximum_bytes": hi,
        **({"step_factor": o.stepfactor} if o.stepfactor > 1 else {"step_bytes": o.stepbytes}),
        "warmup_iters": o.warmup,
        "iterations": o.iters,
        "aggregated_iterations": o.agg_iters,
        "validation": o.check,
        "graph": 0,
        "blocking_collectives": tf(bool(o.blocking)),
        "per_iter_timing": tf(o.per_iter),
        "per_iter_skip": o.per_iter_skip,
        "parallel_init": tf(bool(o.parallel_init)),
    }
    tide = {
        "collective": o.collective.perf_name,
        "command_line": "tide-perf " + " ".join(shlex.quote(x) for x in o.argv),
        "argv": [sys.executable] + sys.argv,
        "versions": versions,
        "backend": o.backend,
        "backend_choice": o.backend_why,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "busbw_formula": BUSBW_FORMULA,
        "config": {
            "nranks": o.world,
            "ranks_per_node": o.ranks_per_node,
            "nodes": o.nodes,
            "virtual_nodes": o.backend == "loopback" and o.nodes > 1,
            "pace_bytes": o.eff_pace,
            "layout": o.layout,
            "impls": o.impls,
            "datatype": o.dtype.nccl_tests_name,
            "op": o.redop,
            "out_type": o.out_dtype.name if o.collective.reduces else o.dtype.name,
            "average": o.average,
            "run_cycles": o.run_cycles,
            "interfere": o.interfere,
            "interfere_runs": o.interfere_runs if o.interfere != "none" else None,
            "sm_time": o.sm_time and o.backend != "host",
        },
        "notes": notes,
        "impls": table,
        **extras,
    }
    return results_json.document(head, nccl_config, devices, rows, o.impls[0], o.min_busbw, o.iters,
                                 o.collective.perf_name, tide, cputime=o.cputime, skip=o.per_iter_skip)


# Prefixes of the variables -J records under "env". nccl-tests writes the whole environment; tide-perf writes the
# variables that shape a run, so that a JSON committed next to benchmark results carries no unrelated secrets.
ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "NVSHMEM_", "OMP_", "PYTORCH_", "LD_PRELOAD", "WORLD_SIZE", "RANK",
                "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def json_env() -> List[str]:
    return sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith(ENV_PREFIXES))


def nccl_version_code(text) -> Optional[int]:
    """"2.28.9" -> 22809 (NCCL's code, what nccl-tests writes as nccl_version); None when unknown."""
    m = re.match(r"^(\d+)\.(\d+)\.(\d+)", str(text or ""))
    if not m:
        return None
    major, minor, patch = (int(x) for x in m.groups())
    return major * 10000 + minor * 100 + patch if (major, minor) >= (2, 9) else major * 1000 + minor * 100 + patch
