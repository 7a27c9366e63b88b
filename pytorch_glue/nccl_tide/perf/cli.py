"""tide-perf command line: nccl-tests' flags, table and exit status.

tide-perf all_gather|reduce_scatter [-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP]
          [-c CHECK] [-d TYPE] [-o OP] [-z BLOCKING] [-a AVERAGE] [-J FILE.json]
          [--backend host] [--ranks N] [--ranks-per-node R] [--layout flat|<model>]
"""

import argparse
import os
import platform
import shlex
import socket
import sys
from typing import List, Optional

from .. import _native
from ..dtypes import RS_TYPES, op_code
from ..dtypes import dtype as to_dtype
from ..errors import TideError
from ..layout import default_ranks_per_node
from ..models import MODELS, model_params, numels_and_rows
from . import host_backend, report

COLLECTIVES = {"all_gather": "all_gather_perf", "reduce_scatter": "reduce_scatter_perf"}
LATER_BACKENDS = ("loopback", "cuda", "nccl")
SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# Model layouts are one whole layer per row and simulate every rank in host memory: keep runs short.
MODEL_DEFAULT_ITERS, MODEL_DEFAULT_WARMUP = 1, 0
FLAT_DEFAULT_ITERS, FLAT_DEFAULT_WARMUP = 20, 1


def parse_size(text: str) -> int:
    """nccl-tests' parsesize: an integer with an optional K/M/G suffix (powers of 1024)."""
    t = text.strip().upper()
    mult = 1
    if t and t[-1] in SUFFIX:
        mult, t = SUFFIX[t[-1]], t[:-1]
    try:
        value = int(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: use an integer with an optional K, M or G suffix"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: must be >= 0")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tide-perf",
        description="nccl-tests-style benchmark of TIDE all-gather / reduce-scatter.",
        epilog="The host backend simulates all ranks in one process with the C host executor; "
        "GPU backends (loopback, cuda, nccl) come in a later release.",
    )
    p.add_argument("collective", choices=sorted(COLLECTIVES) + sorted(COLLECTIVES.values()))
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("32M"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("32M"))
    p.add_argument("-i", "--stepbytes", type=parse_size, default=parse_size("1M"))
    p.add_argument("-f", "--stepfactor", type=int, default=1)
    p.add_argument("-n", "--iters", type=int, default=None, help="timed iterations (20; 1 for model layouts)")
    p.add_argument("-w", "--warmup_iters", type=int, default=None, help="warm-up iterations (1; 0 for model layouts)")
    p.add_argument("-c", "--check", type=int, default=1, help="validate against the numpy reference (1) or not (0)")
    p.add_argument(
        "-d", "--datatype", default="float", help="bfloat16|bf16, half|fp16, float|fp32, f8e4m3, f8e5m2, int8, int32"
    )
    p.add_argument("-o", "--op", default="sum", help="sum, avg or premul (reduce_scatter)")
    p.add_argument("-z", "--blocking", type=int, default=0, help="accepted; host calls are always blocking")
    p.add_argument("-a", "--average", type=int, default=1, help="accepted; the host backend is one process")
    p.add_argument("-J", "--output_file", default=None, help="write results as JSON")
    p.add_argument("--backend", default="auto", help="host (default without a GPU); loopback/cuda/nccl come later")
    p.add_argument("--ranks", type=int, default=8, help="simulated world size")
    p.add_argument("--ranks-per-node", type=int, default=None, help="default: largest divisor of --ranks <= 8")
    p.add_argument("--layout", default="flat", choices=["flat"] + sorted(MODELS))
    p.add_argument(
        "--out-type", default="fp32", help="reduce_scatter output type: fp32 (default), bf16, fp16 or 'same' (= -d)"
    )
    p.add_argument("--scale", type=float, default=0.3, help="premul scale (fp32)")
    p.add_argument("--seed", type=int, default=1)
    return p


def _die(msg: str) -> "None":
    print(f"tide-perf: error: {msg}", file=sys.stderr)
    sys.exit(2)


def _gpu_present() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def sizes(a) -> List[int]:
    out, s = [], a.minbytes
    while s <= a.maxbytes:
        out.append(s)
        if a.stepfactor > 1:
            s *= a.stepfactor
        elif a.stepbytes > 0:
            s += a.stepbytes
        else:
            break
    return out


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parser().parse_args(argv)
    coll = a.collective.replace("_perf", "")
    name = COLLECTIVES[coll]

    backend = a.backend
    if backend == "auto":
        backend = "host"  # the only backend so far, with or without a GPU
    if backend in LATER_BACKENDS:
        _die(f"--backend {backend} is not available yet: GPU backends come in a later release; use --backend host")
    if backend != "host":
        _die(f"unknown --backend {backend!r}; use host")

    try:
        dt = to_dtype(a.datatype)
        out_dt = dt if a.out_type == "same" else to_dtype(a.out_type)
        op = {0: "sum", 1: "avg", 2: "premul"}[op_code(a.op)]
    except TideError as e:
        _die(e.detail)
    if coll == "reduce_scatter" and (dt.name not in RS_TYPES or out_dt.name not in RS_TYPES):
        _die(f"reduce_scatter supports -d and --out-type in {', '.join(RS_TYPES)}")
    if a.ranks < 1:
        _die("--ranks must be >= 1")
    rpn = a.ranks_per_node if a.ranks_per_node is not None else default_ranks_per_node(a.ranks)
    if rpn < 1 or a.ranks % rpn:
        _die(f"--ranks-per-node {rpn} must divide --ranks {a.ranks}")

    model = a.layout != "flat"
    iters = a.iters if a.iters is not None else (MODEL_DEFAULT_ITERS if model else FLAT_DEFAULT_ITERS)
    warmup = a.warmup_iters if a.warmup_iters is not None else (MODEL_DEFAULT_WARMUP if model else FLAT_DEFAULT_WARMUP)
    opts = host_backend.Opts(dt, out_dt, op, a.scale, iters, warmup, a.check, a.seed)
    redop = "none" if coll == "all_gather" else op

    try:
        lib_version = _native.version_string()
    except TideError as e:
        _die(str(e))

    from .. import __version__

    out = sys.stdout
    out.write(
        f"# nccl-tide tide-perf {__version__} library={lib_version} nccl-headers=N/A nccl-library=N/A (backend host)\n"
    )
    out.write(f"# Collective test starting: {name}\n")
    step = f"{a.stepfactor}(factor)" if a.stepfactor > 1 else f"{a.stepbytes}(bytes)"
    out.write(
        f"# nThread 1 nGpus 0 minBytes {a.minbytes} maxBytes {a.maxbytes} step: {step} warmup iters: {warmup} "
        f"iters: {iters} agg iters: 1 validation: {a.check} graph: 0 unalign: 0\n"
    )
    out.write(f"# backend: host executor, {a.ranks} simulated ranks, {rpn} ranks per node, {a.ranks // rpn} nodes\n")
    if coll == "reduce_scatter":
        out.write(
            f"# reduce_scatter: input {dt.name}, output {out_dt.name}, op {op}"
            + (f", scale {a.scale}" if op == "premul" else "")
            + "\n"
        )
    if model:
        params = model_params(a.layout)
        numels, rows = numels_and_rows(params)
        out.write(
            f"# layout: {a.layout} ({len(params)} parameters, {sum(numels)} elements): one row = the whole layer; "
            "the layout fixes the size, -b/-e/-f/-i are ignored\n"
        )
        cases = [host_backend.Case(numels, rows, a.ranks, rpn)]
    else:
        cases = []
        for size in sizes(a):
            count = size // dt.size
            base = (count // a.ranks) & ~(16 // dt.size - 1)  # nccl-tests: per-rank count, 16-byte multiple
            if base == 0:
                out.write(f"# size {size}: fewer than 16 bytes per rank, skipped\n")
                continue
            cases.append(host_backend.Case([base * a.ranks], [1], a.ranks, rpn))
    out.write("#\n# Using devices\n")
    out.write(
        "#  Rank %2d Group %2d Pid %6d on %10s device %4s [host] %s\n"
        % (
            0,
            0,
            os.getpid(),
            socket.gethostname(),
            "host",
            f"{platform.processor() or platform.machine()} (host executor)",
        )
    )
    out.write("#\n")
    report.header(out)
    out.flush()

    rows: List[report.Row] = []
    notes = set()
    run = host_backend.all_gather if coll == "all_gather" else host_backend.reduce_scatter
    for case in cases:
        try:
            oop, ip, note = run(case, opts)
        except MemoryError:
            _die(
                "out of host memory: the host backend holds every simulated rank; use fewer --ranks or a smaller layout"
            )
        except TideError as e:
            _die(str(e))
        if note:
            notes.add(note)
        count = sum(-(-n // r // case.world) * r for n, r in zip(case.numels, case.row_numels))
        row = report.Row(count * case.world * dt.size, count, dt.nccl_tests_name, redop, -1, oop, ip)
        rows.append(row)
        out.write(report.row_line(row) + "\n")
        out.flush()
    for note in sorted(notes):
        out.write(f"# {note}\n")
    report.footer(out, rows, name)

    if a.output_file:
        config = {
            "collective": name,
            "command_line": "tide-perf " + " ".join(shlex.quote(x) for x in argv),
            "versions": {"nccl_tide": __version__, "library": lib_version, "python": platform.python_version()},
            "backend": "host",
            "config": {
                "nranks": a.ranks,
                "ranks_per_node": rpn,
                "layout": a.layout,
                "minbytes": a.minbytes,
                "maxbytes": a.maxbytes,
                "stepfactor": a.stepfactor,
                "stepbytes": a.stepbytes,
                "iters": iters,
                "warmup_iters": warmup,
                "check": a.check,
                "datatype": dt.nccl_tests_name,
                "op": redop,
                "out_type": out_dt.name if coll == "reduce_scatter" else dt.name,
                "blocking": a.blocking,
                "average": a.average,
            },
        }
        devices = [{"rank": 0, "group": 0, "pid": os.getpid(), "hostname": socket.gethostname(), "device": "host"}]
        report.write_json(a.output_file, config, devices, rows)
    return 1 if report.total_wrong(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
