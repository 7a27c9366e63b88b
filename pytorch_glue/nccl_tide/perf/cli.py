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
import math
import os
import platform
import re
import shlex
import socket
import sys
import time
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


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every flag's help ends in its default; a help text that states its default itself is left as it is."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "(default" in text or action.default is argparse.SUPPRESS:
            return text
        if action.default is None:
            return text + " (default: none)"
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`tide-perf: error: ...`) and exit status 2, as every other check."""

    def error(self, message):  # noqa: D401
        print(f"{self.prog}: error: {message} (tide-perf --help lists the flags)", file=sys.stderr)
        sys.exit(2)


def parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = _Parser(
        prog="tide-perf",
        description="nccl-tests-style benchmark of TIDE all-gather / reduce-scatter.",
        formatter_class=_HelpFormatter,
        epilog="Backends: host (every rank simulated by the C host executor; no GPU), loopback (N virtual ranks on "
        "one GPU; --ranks-per-node R < N: N/R virtual nodes, TIDE's inter-node algorithm on one GPU), torchrun (one "
        "process per GPU, NCCL). auto: no GPU -> host; GPU and WORLD_SIZE -> torchrun; GPU -> loopback. "
        "busbw = algbw * (W-1)/W for both collectives and any --ranks-per-node (nccl-tests' convention). "
        "'tide-perf plot FILE.json FILE.png' plots a JSON written with -J.",
    )
    p.add_argument("--version", action="version", version=f"tide-perf {__version__}")
    p.add_argument("collective", choices=sorted(COLLECTIVES) + sorted(COLLECTIVES.values()), help="what to measure")
    # nccl-tests' flags (same letters, long names and defaults where they mean something here).
    p.add_argument("-b", "--minbytes", type=parse_size, default="32M", help="smallest size (bytes, K/M/G suffix)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default="32M", help="largest size (bytes, K/M/G suffix)")
    p.add_argument("-i", "--stepbytes", type=parse_size, default=None,
                   help="size increment when -f is not given (default 1M)")
    p.add_argument("-f", "--stepfactor", type=int, default=None,
                   help="size multiplication factor, >= 2 (default: step by -i)")
    p.add_argument("-n", "--iters", type=int, default=None,
                   help="timed iterations, >= 1 (default 20; 1 for model layouts)")
    p.add_argument("-w", "--warmup_iters", type=int, default=None,
                   help="warm-up iterations, >= 0 (default 1; 0 for model layouts)")
    p.add_argument("-c", "--check", type=int, default=1, choices=[0, 1],
                   help="1: validate every element against the reference; 0: do not")
    p.add_argument("-d", "--datatype", default="float",
                   help="bfloat16|bf16, half|fp16, float|fp32, f8e4m3, f8e5m2, int8, int32")
    p.add_argument("-o", "--op", default="sum", help="sum, avg or premul (reduce_scatter)")
    p.add_argument("-z", "--blocking", type=int, default=0, choices=[0, 1],
                   help="accepted for nccl-tests compatibility; host calls always block, GPU timing syncs per run")
    p.add_argument("-a", "--average", type=int, default=1, choices=[0, 1, 2, 3],
                   help="torchrun: 1 average time over ranks, 0 rank 0's (2 min, 3 max: as 1)")
    p.add_argument("-J", "--output_file", default=None, metavar="FILE.json",
                   help="write results as JSON (nccl-tests' keys plus tide-perf's) (default: no JSON)")
    p.add_argument("-t", "--nthreads", type=int, default=1, help="threads per process: 1 only (ranks are simulated "
                   "or one process per GPU)")
    p.add_argument("-g", "--ngpus", type=int, default=1, help="GPUs per thread: 1 only (loopback: --ranks virtual "
                   "ranks on one GPU; torchrun: one GPU per process)")
    p.add_argument("-G", "--cudagraph", type=int, default=0, help="CUDA graph launches: 0 only (not supported)")
    p.add_argument("-R", "--local_register", type=int, default=0, help="NCCL buffer registration: 0 only (TIDE "
                   "moves data between its own slots; -R 1/2 are not supported)")
    p.add_argument("-x", "--cta_policy", type=int, default=None, help="NCCL CTA policy: not supported (TIDE's "
                   "transfers use no CTAs; the NCCL rows run with NCCL's default)")
    p.add_argument("-I", "--per_iter_timing", type=int, default=0, help="per-iteration statistics: 0 only (not "
                   "supported)")
    p.add_argument("--plot", default=None, metavar="FILE",
                   help="plot busbw and SM time vs size (png, pdf, svg, ...; needs matplotlib) (default: no plot)")
    p.add_argument("--backend", default="auto", help="auto, host, loopback or torchrun")
    p.add_argument(
        "--impl", default="tide", help="comma list of tide, nccl, fsdp2, nccl-ce (or all): rows side by side"
    )
    p.add_argument("--interfere", default="none", choices=["none", "gemm"], help="gemm: slowdown of a single-wave GEMM")
    p.add_argument("--interfere-runs", type=int, default=11, help="GEMM runs per median (--interfere gemm), >= 1")
    p.add_argument("--sm-time", type=int, default=1, choices=[0, 1],
                   help="GPU backends: 1 measure SM time with torch.profiler")
    p.add_argument(
        "--min-busbw",
        type=float,
        default=None,
        help="fail if the first impl's average busbw < 0.9 x this GB/s "
        "(nccl-tests' NCCL_TESTS_MIN_BW rule; that variable is honoured too) (default: no minimum)",
    )
    p.add_argument("--device", type=int, default=0, help="loopback: CUDA device")
    p.add_argument("--ranks", type=int, default=8, help="world size (host: simulated; loopback: virtual ranks 2..8)")
    p.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        help="ranks per node R of the layouts; must divide --ranks. host: default the largest divisor of --ranks "
        "<= 8; loopback: default --ranks (one node), R < --ranks runs TIDE over --ranks/R virtual nodes on one GPU "
        "(the RS nccl/fsdp2 stand-ins are then not run); torchrun: ignored (default: as said per backend)",
    )
    p.add_argument(
        "--pace-bytes",
        type=parse_size,
        default=None,
        help="host, loopback: the layouts' inter-node pacing cap (bytes per schedule step, K/M/G suffixes); only "
        "multi-node layouts use it (default: NCCL_TIDE_PACE_BYTES or 8M)",
    )
    p.add_argument("--layout", default="flat", choices=["flat"] + sorted(MODELS),
                   help="flat: one tensor per size; a model: one row = that model layer's parameters")
    p.add_argument(
        "--out-type", default="fp32", help="reduce_scatter output type: fp32, bf16, fp16 or 'same' (= -d)"
    )
    p.add_argument("--scale", type=float, default=0.3, help="premul scale (finite fp32)")
    p.add_argument("--seed", type=int, default=1, help="seed of the random inputs")
    return p


# Options that take a value: a value that starts with '-' (e.g. -b -1K) is joined to its flag before argparse
# sees it, so that it is rejected for what it is rather than as "expected one argument".
_VALUE_FLAGS = {"-b", "-e", "-i", "-f", "-n", "-w", "-c", "-z", "-a", "-t", "-g", "-G", "-R", "-x", "-I",
                "--minbytes", "--maxbytes", "--stepbytes", "--stepfactor", "--iters", "--warmup_iters",
                "--ranks", "--ranks-per-node", "--pace-bytes", "--scale", "--seed", "--min-busbw", "--device",
                "--interfere-runs"}


def _join_negative_values(argv: List[str]) -> List[str]:
    out, k = [], 0
    while k < len(argv):
        x = argv[k]
        if x in _VALUE_FLAGS and k + 1 < len(argv) and re.match(r"^-[0-9.]", argv[k + 1]):
            out.append(f"{x}={argv[k + 1]}" if x.startswith("--") else x + argv[k + 1])
            k += 2
            continue
        out.append(x)
        k += 1
    return out


def check_args(a, coll: str) -> None:
    """Every rule a run's flags must meet, checked before any work (one-line error, exit status 2)."""
    if a.iters is not None and a.iters < 1:
        _die(f"-n (iterations) must be >= 1, got {a.iters}")
    if a.warmup_iters is not None and a.warmup_iters < 0:
        _die(f"-w (warm-up iterations) must be >= 0, got {a.warmup_iters}")
    if a.stepfactor is not None and a.stepfactor < 1:
        _die(f"-f (step factor) must be >= 1, got {a.stepfactor}")
    if a.layout == "flat":
        if a.minbytes > a.maxbytes:
            _die(f"-b {a.minbytes} is larger than -e {a.maxbytes}: no size to run")
        if a.minbytes < a.maxbytes:
            if (a.stepfactor or 1) > 1 and a.minbytes == 0:
                _die("-b 0 with -f never grows (0 x factor = 0): start at -b >= 1, or step by -i")
            if a.stepfactor == 1 and a.stepbytes is None:
                _die("-f 1 does not grow the size: give -f >= 2, or -i STEP to add STEP bytes per size")
            if (a.stepfactor or 1) == 1 and a.stepbytes == 0:
                _die("-i 0 never grows the size: give -i >= 1 or -f >= 2")
    if a.nthreads != 1:
        _die(f"-t {a.nthreads} is not supported: tide-perf runs one thread per process (host: ranks simulated in "
             "one thread; torchrun: one process per GPU)")
    if a.ngpus != 1:
        _die(f"-g {a.ngpus} is not supported: one GPU per process (loopback: --ranks virtual ranks on one GPU; "
             "torchrun: one process per GPU)")
    if a.cudagraph != 0:
        _die(f"-G {a.cudagraph} is not supported: tide-perf does not time CUDA graph launches")
    if a.local_register != 0:
        _die(f"-R {a.local_register} is not supported: TIDE moves data between its own registered slots, and the "
             "NCCL rows run on unregistered buffers")
    if a.cta_policy is not None:
        _die("-x (NCCL CTA policy) is not supported: TIDE's transfers use no CTAs and the NCCL rows run with NCCL's "
             "default policy")
    if a.per_iter_timing != 0:
        _die(f"-I {a.per_iter_timing} is not supported: tide-perf reports the average time per iteration only")
    if a.interfere_runs < 1:
        _die(f"--interfere-runs must be >= 1, got {a.interfere_runs}")
    if not math.isfinite(a.scale):
        _die(f"--scale must be a finite number, got {a.scale}")
    if a.min_busbw is not None and not (math.isfinite(a.min_busbw) and a.min_busbw >= 0):
        _die(f"--min-busbw must be a finite number >= 0, got {a.min_busbw}")
    if a.output_file:
        why = writable_file(a.output_file)
        if why:
            _die(f"-J {a.output_file}: {why}")
    if a.plot:
        from .plot import output_problem

        why = output_problem(a.plot)
        if why:
            _die(f"--plot {a.plot}: {why}")


def writable_file(path: str) -> Optional[str]:
    """Why `path` cannot be written (None if it can), checked before the run so that no result is lost after it."""
    if os.path.isdir(path):
        return "is a directory"
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else "exists and is not writable"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"directory {parent} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"directory {parent} is not writable"
    return None


def check_gpu_backend(backend: str) -> None:
    """loopback / torchrun need torch with CUDA, a GPU and a CUDA build of libnccl-tide.so: say which is missing."""
    try:
        import torch
    except ImportError:
        _die(f"--backend {backend} needs PyTorch with CUDA: pip install torch (or use --backend host)")
    if not getattr(torch.version, "cuda", None):
        _die(f"--backend {backend} needs a CUDA build of PyTorch; this one is {torch.__version__} (CPU only): "
             "install a CUDA wheel of torch, or use --backend host")
    try:
        ok = torch.cuda.is_available()
    except Exception as e:  # a broken driver install
        ok, e_text = False, f" ({e})"
    else:
        e_text = ""
    if not ok:
        _die(f"--backend {backend} needs a CUDA GPU, and torch sees none{e_text}; use --backend host")


def _die(msg: str) -> "None":
    print(f"tide-perf: error: {msg}", file=sys.stderr)
    sys.exit(2)


def _gpu_present() -> bool:
    """Indirection so tests can mock the GPU check of backend auto-selection."""
    return impls.gpu_available()


def sizes(a) -> List[int]:
    """nccl-tests' size loop; check_args has ruled out the loops that would never grow."""
    out, s = [], a.minbytes
    factor = a.stepfactor or 1
    step = sizes_step(a)
    while s <= a.maxbytes:
        out.append(s)
        if factor > 1:
            s *= factor
        elif step > 0:
            s += step
        else:
            break
    return out


def sizes_step(a) -> int:
    return parse_size("1M") if a.stepbytes is None else a.stepbytes


def model_bytes(layout: str, world: int, dt) -> int:
    """Bytes of a model layout's one row (what its table row shows as size)."""
    numels, prow = numels_and_rows(model_params(layout))
    return sum(-(-n // r // world) * r for n, r in zip(numels, prow)) * world * dt.size


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


def _per_rank_count(size: int, dt, world: int) -> int:
    """nccl-tests' per-rank count of a size: whole 16-byte multiples (0: the size is skipped)."""
    return ((size // dt.size) // world) & ~(16 // dt.size - 1)


def _check_some_size_runs(a, dt, world: int) -> None:
    """A flat run whose every size is below 16 bytes per rank would print a header and no row: refuse it."""
    if a.layout == "flat" and not any(_per_rank_count(s, dt, world) for s in sizes(a)):
        _die(f"every size from -b {a.minbytes} to -e {a.maxbytes} is below 16 bytes per rank at {world} ranks: "
             f"nothing to run (no size reaches {16 * world} bytes: raise -b, or -e with -f 2)")


def _flat_cases(a, dt, world: int, out) -> List[Tuple[List[int], List[int], List[tuple]]]:
    cases = []
    for size in sizes(a):
        base = _per_rank_count(size, dt, world)
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
    a = parser().parse_args(_join_negative_values(argv))
    coll = a.collective.replace("_perf", "")
    name = COLLECTIVES[coll]
    check_args(a, coll)

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
    if backend == "host" and not any(impls.static_reason(backend, i, coll) is None for i in wanted):
        _die(f"--impl {a.impl} measures nothing on the host backend (only tide runs there; nccl, fsdp2 and nccl-ce "
             "need --backend loopback or torchrun)")
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

    if backend != "torchrun":  # torchrun: the world size is known once the process group is up (below)
        _check_some_size_runs(a, dt, a.ranks)
    gpu_backend = None
    if backend != "host":
        check_gpu_backend(backend)
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
        try:
            _check_some_size_runs(a, dt, world)
        except SystemExit:
            gpu_backend.close()
            raise
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

    start_time = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())  # nccl-tests' start_time format (local)
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
    factor = a.stepfactor or 1
    step = f"{factor}(factor)" if factor > 1 else f"{sizes_step(a)}(bytes)"
    lo, hi = (a.minbytes, a.maxbytes) if not model else (model_bytes(a.layout, world, dt),) * 2
    out.write(
        f"# nThread 1 nGpus {0 if backend == 'host' else 1} minBytes {lo} maxBytes {hi} step: {step} "
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
                except MemoryError as e:
                    _die(
                        f"out of host memory: {e or 'an allocation failed'}; the host backend holds every simulated "
                        "rank: use fewer --ranks or a smaller layout"
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
                "minbytes": a.minbytes if not model else model_bytes(a.layout, world, dt),
                "maxbytes": a.maxbytes if not model else model_bytes(a.layout, world, dt),
                "stepfactor": a.stepfactor or 1,
                "stepbytes": sizes_step(a),
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
        head = {
            "version": report.JSON_FILE_VERSION,
            "start_time": start_time,
            "args": ["tide-perf"] + list(argv),
            "env": json_env(),
            "nccl_version": nccl_version_code(versions.get("nccl_runtime")),
        }
        factor = a.stepfactor or 1
        nccl_config = {
            "nthreads": 1,
            "ngpus": 0 if backend == "host" else 1,
            "minimum_bytes": config["config"]["minbytes"],
            "maximum_bytes": config["config"]["maxbytes"],
            **({"step_factor": factor} if factor > 1 else {"step_bytes": sizes_step(a)}),
            "warmup_iters": warmup,
            "iterations": iters,
            "aggregated_iterations": 1,
            "validation": a.check,
            "graph": 0,
            "blocking_collectives": "true" if a.blocking else "false",
            "per_iter_timing": "false",
            "parallel_init": "false",
        }
        doc = report.build_json(
            config, devices, rows, table, subject, min_busbw, head=head, nccl_config=nccl_config, iters=iters,
            name=name,
        )
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
