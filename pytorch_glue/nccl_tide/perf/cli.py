"""tide-perf command line: nccl-tests' flags, table and exit status.

tide-perf all_gather|reduce_scatter [-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-n ITERS] [-w WARMUP]
          [-c CHECK] [-d TYPE] [-o OP] [-z BLOCKING] [-a AVERAGE] [-J FILE.json] [--plot FILE.png]
          [--backend auto|host|loopback|torchrun] [--impl tide,nccl,fsdp2,nccl-ce] [--interfere gemm]
          [--min-busbw GB/s] [--ranks N] [--ranks-per-node R] [--pace-bytes B] [--layout flat|<model>]
tide-perf plot FILE.json FILE.png
tide-perf share [all_gather|reduce_scatter|both] [--link-gbps 370] ...   (perf/share.py: one rank's share)

busbw = algbw * (W - 1) / W for both collectives, nccl-tests' all-gather/reduce-scatter factor, whatever the node
topology (--ranks-per-node): the same convention as nccl-tests on several nodes (BUSBW_FORMULA).
"""

import argparse
import os
import platform
import shlex
import socket
import sys
from typing import List, Optional, Tuple

from .. import _native
from ..dtypes import RS_TYPES, op_code
from ..dtypes import dtype as to_dtype
from ..errors import TideError
from ..layout import default_ranks_per_node
from ..models import MODELS, model_params, numels_and_rows
from . import host_backend, impls, report

COLLECTIVES = {"all_gather": "all_gather_perf", "reduce_scatter": "reduce_scatter_perf"}
SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# Model layouts are one whole layer per row and simulate every rank in host memory: keep runs short.
MODEL_DEFAULT_ITERS, MODEL_DEFAULT_WARMUP = 1, 0
FLAT_DEFAULT_ITERS, FLAT_DEFAULT_WARMUP = 20, 1
BUSBW_FORMULA = (
    "busbw = algbw * (W-1)/W (nccl-tests' all_gather/reduce_scatter factor, W = world size); kept for every "
    "--ranks-per-node: it does not depend on the node topology, as in nccl-tests on several nodes"
)


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
        epilog="Backends: host (every rank simulated by the C host executor; no GPU), loopback (N virtual ranks on "
        "one GPU; --ranks-per-node R < N: N/R virtual nodes, TIDE's inter-node algorithm on one GPU), torchrun (one "
        "process per GPU, NCCL). auto: no GPU -> host; GPU and WORLD_SIZE -> torchrun; GPU -> loopback. "
        "busbw = algbw * (W-1)/W for both collectives and any --ranks-per-node (nccl-tests' convention). "
        "'tide-perf plot FILE.json FILE.png' plots a JSON written with -J.",
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
    p.add_argument("-a", "--average", type=int, default=1, help="torchrun: 1 average time over ranks, 0 rank 0's")
    p.add_argument("-J", "--output_file", default=None, help="write results as JSON")
    p.add_argument("--plot", default=None, metavar="FILE", help="plot busbw and SM time vs size (needs matplotlib)")
    p.add_argument("--backend", default="auto", help="auto (default), host, loopback or torchrun")
    p.add_argument(
        "--impl", default="tide", help="comma list of tide, nccl, fsdp2, nccl-ce (or all): rows side by side"
    )
    p.add_argument("--interfere", default="none", choices=["none", "gemm"], help="gemm: slowdown of a single-wave GEMM")
    p.add_argument("--interfere-runs", type=int, default=11, help="GEMM runs per median (--interfere gemm)")
    p.add_argument("--sm-time", type=int, default=1, help="GPU backends: 1 measure SM time with torch.profiler")
    p.add_argument(
        "--min-busbw",
        type=float,
        default=None,
        help="fail if the first impl's average busbw < 0.9 x this "
        "(nccl-tests' NCCL_TESTS_MIN_BW rule; that variable is honoured too)",
    )
    p.add_argument("--device", type=int, default=0, help="loopback: CUDA device")
    p.add_argument("--ranks", type=int, default=8, help="world size (host: simulated; loopback: virtual ranks 2..8)")
    p.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        help="ranks per node R of the layouts; must divide --ranks. host: default the largest divisor of --ranks "
        "<= 8; loopback: default --ranks (one node), R < --ranks runs TIDE over --ranks/R virtual nodes on one GPU "
        "(the RS nccl/fsdp2 stand-ins are then not run); torchrun: ignored",
    )
    p.add_argument(
        "--pace-bytes",
        type=parse_size,
        default=None,
        help="host, loopback: the layouts' inter-node pacing cap (bytes per schedule step, K/M/G suffixes); only "
        "multi-node layouts use it; default NCCL_TIDE_PACE_BYTES or 8M",
    )
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
    """Indirection so tests can mock the GPU check of backend auto-selection."""
    return impls.gpu_available()


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


def _min_busbw(a) -> Optional[float]:
    if a.min_busbw is not None:
        return a.min_busbw
    env = os.environ.get("NCCL_TESTS_MIN_BW")
    if env:
        try:
            return float(env)
        except ValueError:
            _die(f"NCCL_TESTS_MIN_BW={env!r} is not a number")
    return None


def _flat_cases(a, dt, world: int, out) -> List[Tuple[List[int], List[int], List[tuple]]]:
    cases = []
    for size in sizes(a):
        count = size // dt.size
        base = (count // world) & ~(16 // dt.size - 1)  # nccl-tests: per-rank count, 16-byte multiple
        if base == 0:
            out.write(f"# size {size}: fewer than 16 bytes per rank, skipped\n")
            continue
        cases.append(([base * world], [1], [(base * world,)]))
    return cases


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "plot":
        from . import plot

        return plot.main(argv[1:])
    if argv and argv[0] == "share":  # one rank's share of a node on this GPU (issue 16): perf/share.py
        from . import share

        return share.main(argv[1:])
    a = parser().parse_args(argv)
    coll = a.collective.replace("_perf", "")
    name = COLLECTIVES[coll]

    if a.backend in ("auto", "loopback") and not os.environ.get("WORLD_SIZE"):
        # Loopback worlds need one hardware queue per busy stream: set before anything initializes CUDA
        # (the GPU probe of auto included; nccl_tide/cuda.py explains).
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    try:
        choice = impls.choose_backend(a.backend, gpu=_gpu_present)
        wanted = impls.parse_impls(a.impl)
    except ValueError as e:
        _die(str(e))
    backend = choice["backend"]
    if a.interfere != "none" and backend == "host":
        _die("--interfere gemm needs a GPU backend (loopback or torchrun); the host backend has no GPU")
    if a.plot:  # fail before measuring, not after
        from .plot import PlotUnavailable, require_matplotlib

        try:
            require_matplotlib()
        except PlotUnavailable as e:
            _die(str(e).replace("tide-perf: ", ""))

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
    if a.ranks_per_node is not None:
        rpn = a.ranks_per_node
    else:  # loopback: one node unless asked (2..8 ranks: the host default is one node too)
        rpn = a.ranks if backend == "loopback" else default_ranks_per_node(a.ranks)
    if rpn < 1 or a.ranks % rpn:
        _die(
            f"--ranks-per-node {rpn} must divide --ranks {a.ranks} (nodes of equal size; "
            f"divisors: {', '.join(str(d) for d in range(1, a.ranks + 1) if a.ranks % d == 0)})"
        )
    if backend == "loopback" and not 2 <= a.ranks <= 8:
        _die(f"--backend loopback runs 2..8 virtual ranks on one GPU, not --ranks {a.ranks}")
    pace = None
    if a.pace_bytes is not None:
        if backend == "torchrun":
            _die("--pace-bytes sets the host and loopback layouts; torchrun layouts take NCCL_TIDE_PACE_BYTES")
        if a.pace_bytes < 1:
            _die("--pace-bytes must be >= 1 (leave it out for NCCL_TIDE_PACE_BYTES or the library default)")
        pace = a.pace_bytes
    eff_pace = _effective_pace(a.ranks, rpn, pace) if backend != "torchrun" else None
    min_busbw = _min_busbw(a)

    model = a.layout != "flat"
    iters = a.iters if a.iters is not None else (MODEL_DEFAULT_ITERS if model else FLAT_DEFAULT_ITERS)
    warmup = a.warmup_iters if a.warmup_iters is not None else (MODEL_DEFAULT_WARMUP if model else FLAT_DEFAULT_WARMUP)
    redop = "none" if coll == "all_gather" else op

    try:
        lib_version = _native.version_string()
    except TideError as e:
        _die(str(e))

    gpu_backend = None
    if backend != "host":
        from . import gpu

        gpu.no_multicast_env()
        if backend == "loopback":
            os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")  # before CUDA initializes (nccl_tide.cuda)
            from . import loopback_backend

            gpu_backend = loopback_backend.make(a.ranks, a.device, ranks_per_node=rpn, pace_bytes=pace)
        else:
            from . import torchrun_backend

            gpu_backend = torchrun_backend.make(a.average)
    world = a.ranks if backend != "torchrun" else gpu_backend.W
    if backend == "torchrun":
        rpn = default_ranks_per_node(world)  # what its layouts use (--ranks-per-node is ignored there)
    leader = backend != "torchrun" or gpu_backend.rank == 0
    out = sys.stdout if leader else open(os.devnull, "w")
    try:
        return _run(
            a,
            argv,
            name,
            coll,
            backend,
            choice,
            wanted,
            gpu_backend,
            world,
            rpn,
            pace,
            eff_pace,
            dt,
            out_dt,
            op,
            redop,
            model,
            iters,
            warmup,
            min_busbw,
            lib_version,
            leader,
            out,
        )
    finally:
        if gpu_backend is not None:
            gpu_backend.close()


def _run(
    a,
    argv,
    name,
    coll,
    backend,
    choice,
    wanted,
    gpu_backend,
    world,
    rpn,
    pace,
    eff_pace,
    dt,
    out_dt,
    op,
    redop,
    model,
    iters,
    warmup,
    min_busbw,
    lib_version,
    leader,
    out,
) -> int:
    from .. import __version__

    versions = {"nccl_tide": __version__, "library": lib_version, "python": platform.python_version()}
    if gpu_backend is not None:
        from . import gpu

        versions.update(gpu.versions())
    nccl_h = versions.get("nccl_header", "N/A")
    nccl_r = versions.get("nccl_runtime", "N/A")
    short = lambda v: v if len(str(v)) <= 12 else "N/A"  # noqa: E731  (the reason is in the JSON)
    out.write(
        f"# nccl-tide tide-perf {__version__} library={lib_version} nccl-headers={short(nccl_h)} "
        f"nccl-library={short(nccl_r)} (backend {backend})\n"
    )
    out.write(f"# Collective test starting: {name}\n")
    step = f"{a.stepfactor}(factor)" if a.stepfactor > 1 else f"{a.stepbytes}(bytes)"
    out.write(
        f"# nThread 1 nGpus {0 if backend == 'host' else 1} minBytes {a.minbytes} maxBytes {a.maxbytes} step: {step} "
        f"warmup iters: {warmup} iters: {iters} agg iters: 1 validation: {a.check} graph: 0 unalign: 0\n"
    )
    nodes = world // rpn
    if backend == "host":
        out.write(f"# backend: host executor, {world} simulated ranks, {rpn} ranks per node, {nodes} nodes\n")
    else:
        out.write(f"# backend: {gpu_backend.describe()}\n")
        if "torch" in versions:
            out.write(
                f"# torch {versions.get('torch')} CUDA {versions.get('cuda_runtime')} "
                f"NCCL(torch) {versions.get('nccl_torch', 'N/A')} device {versions.get('device', '?')}\n"
            )
    kind = {"host": "simulated ", "loopback": "virtual "}.get(backend, "")
    pace_text = "" if eff_pace is None or nodes == 1 else f", pacing cap {eff_pace} bytes per schedule step"
    plural = "s" if nodes > 1 else ""
    out.write(f"# topology: {world} ranks, {rpn} ranks per node, {nodes} {kind}node{plural}{pace_text}\n")
    out.write(f"# {BUSBW_FORMULA}\n")
    out.write(f"# backend chosen by {choice['why']}\n")
    if coll == "reduce_scatter":
        out.write(
            f"# reduce_scatter: input {dt.name}, output {out_dt.name}, op {op}"
            + (f", scale {a.scale}" if op == "premul" else "")
            + "\n"
        )
    copy_op = "split_with_sizes_copy" if coll == "all_gather" else "chunk_cat"
    table = impls.impl_table(
        backend, wanted, coll, nodes=nodes if backend == "loopback" else 1, copy_op=copy_op, out=out_dt.name
    )
    for impl in wanted:
        t = table[impl]
        out.write(f"# impl {impl}: {t['description']}\n")
        if t["measured_as"]:
            out.write(f"#   measured as {t['measured_as']}\n")
    if a.interfere == "gemm":
        from . import gpu

        out.write(
            f"# GEMM column: single-wave bf16 GEMM {'x'.join(map(str, gpu.GEMM_MKN))} beside the collective, "
            f"median of {a.interfere_runs} runs / GEMM alone (DESIGN.md section 9)\n"
        )

    if model:
        params = model_params(a.layout)
        numels, rows = numels_and_rows(params)
        out.write(
            f"# layout: {a.layout} ({len(params)} parameters, {sum(numels)} elements): one row = the whole layer; "
            "the layout fixes the size, -b/-e/-f/-i are ignored\n"
        )
        cases = [(numels, rows, [tuple(s) for _, s in params])]
    else:
        cases = _flat_cases(a, dt, world, out)
    out.write("#\n# Using devices\n")
    devices = _devices(backend, gpu_backend)
    for d in devices:
        out.write(
            "#  Rank %2d Group %2d Pid %6d on %10s device %4s %s\n"
            % (d["rank"], d["group"], d["pid"], d["hostname"], d["device"], d.get("name", ""))
        )
    out.write("#\n")
    report.header(out)
    out.flush()

    rows: List[report.Row] = []
    notes = set()
    extras: dict = {}
    opts = None
    if gpu_backend is not None:
        from . import gpu, runner

        gemm = gpu.Gemm(a.interfere_runs) if a.interfere == "gemm" else None
        barrier = gpu_backend.barrier if backend == "torchrun" else None
        opts = runner.MeasureOpts(
            iters,
            warmup,
            a.check,
            bool(a.sm_time),
            gemm,
            reduce_time=getattr(gpu_backend, "reduce_time", lambda t: t),
            reduce_wrong=getattr(gpu_backend, "reduce_wrong", lambda n: n),
            barrier=barrier,
        )
        if gemm is not None:
            extras["gemm_alone"] = gemm.alone
    hopts = host_backend.Opts(dt, out_dt, op, a.scale, iters, warmup, a.check, a.seed)
    run_host = host_backend.all_gather if coll == "all_gather" else host_backend.reduce_scatter
    for numels, prow, shapes in cases:
        count = sum(-(-n // r // world) * r for n, r in zip(numels, prow))
        size = count * world * dt.size
        for impl in wanted:
            reason = table[impl]["not_run_reason"]
            if reason:
                row = report.Row(
                    size, count, dt.nccl_tests_name, redop, -1, report.NA, report.NA, impl=impl, note=reason, ok=False
                )
            elif backend == "host":
                try:
                    oop, ip, note = run_host(host_backend.Case(numels, prow, world, rpn, pace), hopts)
                except MemoryError:
                    _die(
                        "out of host memory: the host backend holds every simulated rank; use fewer --ranks or a "
                        "smaller layout"
                    )
                except TideError as e:
                    _die(str(e))
                if note:
                    notes.add(note)
                row = report.Row(size, count, dt.nccl_tests_name, redop, -1, oop, ip, impl=impl)
            else:
                from . import runner

                spec = runner.CaseSpec(coll, numels, prow, shapes, dt, out_dt, op, a.scale, a.seed)
                row = runner.measure(
                    gpu_backend, impl, spec, size, count, dt.nccl_tests_name, redop, world, opts, extras
                )
            rows.append(row)
            out.write(report.row_line(row) + "\n")
            out.flush()
    if gpu_backend is not None:
        notes.add(
            "GPU backends: in-place variants are not measured (N/A); SM = sum of kernel durations per call "
            "(torch.profiler), copy-engine transfers use no SMs"
        )
    for note in sorted(notes):
        out.write(f"# {note}\n")
    subject = wanted[0]
    report.footer(out, rows, name, subject=subject, min_busbw=min_busbw)
    out.flush()

    wrong = report.total_wrong(rows)
    gate_failed = report.busbw_gate_failed(report.avg_busbw(rows, subject), min_busbw)
    if leader and (a.output_file or a.plot):
        config = {
            "collective": name,
            "command_line": "tide-perf " + " ".join(shlex.quote(x) for x in argv),
            "argv": [sys.executable] + sys.argv,
            "versions": versions,
            "backend": backend,
            "backend_choice": choice["why"],
            "date_utc": _utc_now(),
            "busbw_formula": BUSBW_FORMULA,
            "config": {
                "nranks": world,
                "ranks_per_node": rpn,
                "nodes": nodes,
                "virtual_nodes": backend == "loopback" and nodes > 1,
                "pace_bytes": eff_pace,
                "layout": a.layout,
                "impls": wanted,
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
                "interfere": a.interfere,
                "interfere_runs": a.interfere_runs if a.interfere != "none" else None,
                "sm_time": bool(a.sm_time) and backend != "host",
            },
            "notes": sorted(notes),
            "extras": extras,
        }
        doc = report.build_json(config, devices, rows, table, subject, min_busbw)
        if a.output_file:
            report.write_json(a.output_file, doc)
        if a.plot:
            from .plot import PlotUnavailable, plot

            try:
                plot(doc, a.plot)
                out.write(f"# plot written to {a.plot}\n")
            except PlotUnavailable as e:
                print(str(e), file=sys.stderr)
                return 3
    return 1 if (wrong or gate_failed) else 0


def _effective_pace(world: int, rpn: int, pace: Optional[int]) -> int:
    """The pacing cap the layouts will use (pace, else NCCL_TIDE_PACE_BYTES, else the library default), read from a
    one-parameter layout of the run's topology; an unusable value ends the run here, before anything is measured."""
    from ..layout import Layout

    try:
        with Layout([world], "fp32", world, rpn, pace_bytes=pace) as lay:
            return int(lay.pace_bytes)
    except TideError as e:
        _die(e.detail)


def _utc_now() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _devices(backend, gpu_backend) -> list:
    if gpu_backend is not None:
        return gpu_backend.devices()
    return [
        {
            "rank": 0,
            "group": 0,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "device": "host",
            "name": f"[host] {platform.processor() or platform.machine()} (host executor)",
        }
    ]


if __name__ == "__main__":
    sys.exit(main())
