# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf's flags: nccl-tests' letters and defaults, their rules, and the Options every later step reads.

The command line is parsed and checked once; resolve() turns it into one Options object (the collective's
descriptor, the backend, the types, the topology, the size loop, the counts) that travels through the harness.
Every rule fails before any work with a one-line error and exit status 2.
"""

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable, List, NoReturn, Optional, Tuple

from ..dtypes import RS_TYPES, DType, op_code
from ..dtypes import dtype as to_dtype
from ..errors import TideError
from ..layout import default_ranks_per_node
from ..models import MODELS
from . import collectives, impls
from .collective import Collective
from .collectives import COLLECTIVES

SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# Model layouts are one whole layer per row and simulate every rank in host memory: keep runs short.
MODEL_DEFAULT_ITERS, MODEL_DEFAULT_WARMUP = 1, 0
FLAT_DEFAULT_ITERS, FLAT_DEFAULT_WARMUP = 20, 1
DEFAULT_STEP_BYTES = 1 << 20
MAX_SEED = (1 << 63) - 1


# Exit statuses (benchmarks/README.md lists them). nccl-tests returns -1 (255) for sizes it cannot run and for options
# its build cannot honour, and testNumResults (7) when elements are wrong or the bandwidth misses NCCL_TESTS_MIN_BW.
EXIT_USAGE = 2  # a bad flag value or a conflict between flags (argparse's status)
EXIT_WRONG = 7  # wrong elements, or the average bus bandwidth below 0.9 x --min-busbw (nccl-tests' testNumResults)
EXIT_OUTPUT = 74  # the run finished but its JSON or plot could not be written (sysexits' EX_IOERR)
EXIT_INTERRUPTED = 130  # SIGINT (128 + 2)
EXIT_UNSUPPORTED = 255  # bad sizes, or an option tide-perf cannot honour (nccl-tests' -1)


def die(msg: str, status: int = EXIT_USAGE) -> NoReturn:
    print(f"tide-perf: error: {msg}", file=sys.stderr)
    sys.exit(status)


def unsupported(flag: str, why: str) -> "None":
    die(f"{flag} is not supported by tide-perf: {why}", EXIT_UNSUPPORTED)


def dtype_spellings(names=None) -> str:
    """The -d spellings, nccl-tests' name first: the same text in --help and in every type error."""
    from ..dtypes import DTYPES

    out = []
    for name, dt in DTYPES.items():
        if names is None or name in names:
            out.append(name if dt.nccl_tests_name == name else f"{dt.nccl_tests_name}|{name}")
    return ", ".join(out)


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
        # nccl-tests ends with -1 (255) on a size it cannot parse; every other usage error is argparse's 2.
        status = EXIT_UNSUPPORTED if "invalid size" in message else EXIT_USAGE
        print(f"{self.prog}: error: {message} (tide-perf --help lists the flags)", file=sys.stderr)
        sys.exit(status)


def parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = _Parser(
        prog="tide-perf",
        description="nccl-tests-style benchmark of TIDE all-gather / reduce-scatter.",
        formatter_class=_HelpFormatter,
        epilog="Backends: host (every rank simulated by the C host executor; no GPU), loopback (N virtual ranks on "
        "one GPU; --ranks-per-node R < N: N/R virtual nodes, TIDE's inter-node algorithm on one GPU), torchrun (one "
        "process per rank, NCCL; one GPU per rank unless --ranks-per-gpu). auto: no GPU -> host; GPU and WORLD_SIZE -> torchrun; GPU -> loopback. "
        "busbw = algbw * (W-1)/W for both collectives and any --ranks-per-node (nccl-tests' convention). "
        "'tide-perf plot FILE.json FILE.png' plots a JSON written with -J.",
    )
    names = sorted(COLLECTIVES) + sorted(c.perf_name for c in COLLECTIVES.values())
    p.add_argument("--version", action="version", version=f"tide-perf {__version__}")
    p.add_argument("collective", choices=names, help="what to measure")
    # nccl-tests' flags (same letters, long names and defaults where they mean something here).
    p.add_argument("-b", "--minbytes", type=parse_size, default="32M", help="smallest size (bytes, K/M/G suffix)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default="32M", help="largest size (bytes, K/M/G suffix)")
    p.add_argument("-i", "--stepbytes", type=parse_size, default=None,
                   help="size increment when -f is not given (default 1M)")
    p.add_argument("-f", "--stepfactor", type=int, default=None,
                   help="size multiplication factor, >= 2 (default: step by -i)")
    p.add_argument("-n", "--iters", type=int, default=None,
                   help="timed iterations, >= 1 (default 20; 1 for model layouts)")
    p.add_argument("-m", "--agg_iters", type=int, default=1,
                   help="calls per timed iteration, >= 1 (TIDE calls are not grouped: they run back to back)")
    p.add_argument("-w", "--warmup_iters", type=int, default=None,
                   help="warm-up iterations, >= 0 (default 1; 0 for model layouts)")
    p.add_argument("-N", "--run_cycles", type=int, default=1,
                   help="run the size loop this many times, printing each cycle (0: until interrupted)")
    p.add_argument("-p", "--parallel_init", type=int, default=0, choices=[0, 1],
                   help="accepted for nccl-tests compatibility: one thread per process, nothing to initialize "
                   "in parallel")
    p.add_argument("-c", "--check", type=int, default=1, choices=[0, 1],
                   help="1: validate every element against the reference; 0: do not")
    p.add_argument("-d", "--datatype", default="float", help=dtype_spellings())
    p.add_argument("-o", "--op", default=None,
                   help="reduce_scatter: sum, avg or premul (default sum); all_gather does not reduce: ignored")
    p.add_argument("-r", "--root", type=int, default=0,
                   help="accepted for nccl-tests compatibility: all_gather and reduce_scatter have no root (-1)")
    p.add_argument("-z", "--blocking", type=int, default=0, choices=[0, 1, 2, 3],
                   help="accepted for nccl-tests compatibility; host calls always block, GPU timing syncs per run")
    p.add_argument("-y", "--stream_null", type=int, default=0, choices=[0, 1],
                   help="0 only: GPU calls run on torch's current stream (not supported: 1, the NULL stream)")
    p.add_argument("-T", "--timeout", type=int, default=0,
                   help="0 only (not supported: GPU backends bound each synchronization themselves)")
    p.add_argument("-C", "--report_cputime", type=int, default=0, choices=[0, 1],
                   help="1: report CPU time (host backend, whose time is CPU wall time; not supported on GPU "
                   "backends)")
    p.add_argument("-S", "--report_timestamps", type=int, default=0, choices=[0, 1],
                   help="1: end every row with the time it was measured")
    p.add_argument("-a", "--average", type=int, default=1, choices=[0, 1, 2, 3],
                   help="torchrun: 1 average time over ranks, 0 rank 0's (2 min, 3 max: as 1)")
    p.add_argument("-J", "--output_file", default=None, metavar="FILE.json",
                   help="write results as nccl-tests' JSON (file version 3; tide-perf's own keys under 'extras'); "
                   "an existing FILE.json is kept and FILE.json.0, .1, ... written, as nccl-tests does, unless "
                   "--overwrite (default: no JSON)")
    p.add_argument("--overwrite", action="store_true", help="-J replaces an existing file (atomically)")
    p.add_argument("-t", "--nthreads", type=int, default=1, help="threads per process: 1 only (ranks are simulated "
                   "or one process per GPU)")
    p.add_argument("-g", "--ngpus", type=int, default=1, help="GPUs per thread: 1 only (loopback: --ranks virtual "
                   "ranks on one GPU; torchrun: one GPU per process)")
    p.add_argument("-G", "--cudagraph", type=int, default=0, help="CUDA graph launches: 0 only (not supported)")
    p.add_argument("-R", "--local_register", type=int, default=0, help="NCCL buffer registration: 0 only (TIDE "
                   "moves data between its own slots; -R 1/2 are not supported)")
    p.add_argument("-x", "--cta_policy", type=int, default=None, help="NCCL CTA policy: not supported (TIDE's "
                   "transfers use no CTAs; the NCCL rows run with NCCL's default)")
    p.add_argument("-D", "--device_implementation", type=int, default=0,
                   help="0 only (not supported: TIDE has no NCCL device-API kernels)")
    p.add_argument("-V", "--device_cta_count", type=int, default=16,
                   help="accepted for nccl-tests compatibility: only -D > 0 uses it")
    p.add_argument("-M", "--memory", type=int, default=0, choices=[0, 1],
                   help="1: report peak memory after the footer (GPU backends: torch's peak allocation; host: "
                   "peak resident set)")
    p.add_argument("-u", "--unalign", type=int, default=0,
                   help="0 only (not supported: TIDE addresses whole rows of each parameter's storage)")
    p.add_argument("-I", "--per_iter_timing", type=int, default=0,
                   help="1: time every iteration (i_min i_max i_p99 i_cv%% columns, per-iteration JSON)")
    p.add_argument("-K", "--per_iter_skip", type=int, default=0,
                   help="leading iterations left out of the -I statistics")
    p.add_argument("--wide", type=int, nargs="?", const=1, default=0, choices=[0, 1],
                   help="1: after nccl-tests' columns, tide-perf's (impl SM GEMM host gpu), one row per "
                   "implementation of --impl; 0: nccl-tests' columns for the first implementation only")
    p.add_argument("--plot", default=None, metavar="FILE",
                   help="plot busbw and SM time vs size (png, pdf, svg, ...; needs matplotlib) (default: no plot)")
    p.add_argument("--backend", default="auto", help="auto, host, loopback or torchrun")
    p.add_argument(
        "--impl", default="tide", help="comma list of tide, nccl, fsdp2, nccl-ce (or all) and nccl-dtype (reduce_scatter "
        "in -d's type; by name only): rows side by side"
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
    p.add_argument(
        "--ranks-per-gpu",
        type=int,
        default=None,
        help="torchrun: let up to this many local ranks share a GPU (rank -> GPU LOCAL_RANK %% device count); "
        "NCCL must allow it: NCCL_HOSTID distinct per rank with NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1, or "
        "NCCL_MULTI_RANK_GPU_ENABLE=1 on NCCL >= 2.30 (default: NCCL_TIDE_RANKS_PER_GPU, else one GPU per rank)",
    )
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
    p.add_argument("--seed", type=int, default=1, help=f"seed of the random inputs, 0..{MAX_SEED}")
    return p


# Options that take a value: a value that starts with '-' (e.g. -b -1K) is joined to its flag before argparse
# sees it, so that it is rejected for what it is rather than as "expected one argument".
_VALUE_FLAGS = {"-b", "-e", "-i", "-f", "-n", "-w", "-c", "-z", "-a", "-t", "-g", "-G", "-R", "-x", "-I", "-m", "-N",
                "-p", "-r", "-y", "-T", "-C", "-S", "-D", "-V", "-M", "-u", "-K",
                "--minbytes", "--maxbytes", "--stepbytes", "--stepfactor", "--iters", "--warmup_iters",
                "--ranks", "--ranks-per-node", "--ranks-per-gpu", "--pace-bytes", "--scale", "--seed", "--min-busbw", "--device",
                "--interfere-runs"}


def join_negative_values(argv: List[str]) -> List[str]:
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


def check_flags(a) -> None:
    """Every rule the flags must meet on their own, checked before any work: a one-line error, exit status 2 for a
    bad value, 255 for bad sizes and for options tide-perf cannot honour (nccl-tests' -1)."""
    if a.iters is not None and a.iters < 1:
        die(f"-n (iterations) must be >= 1, got {a.iters}")
    if a.warmup_iters is not None and a.warmup_iters < 0:
        die(f"-w (warm-up iterations) must be >= 0, got {a.warmup_iters}")
    if a.agg_iters < 1:
        die(f"-m (calls per iteration) must be >= 1, got {a.agg_iters}")
    if a.run_cycles < 0:
        die(f"-N (run cycles) must be >= 0 (0: until interrupted), got {a.run_cycles}")
    if a.stepfactor is not None and a.stepfactor < 1:
        die(f"-f (step factor) must be >= 1, got {a.stepfactor}")
    if a.layout == "flat":
        if a.minbytes > a.maxbytes:
            die(f"-b {a.minbytes} is larger than -e {a.maxbytes}: no size to run", EXIT_UNSUPPORTED)
        if a.minbytes < a.maxbytes:
            if (a.stepfactor or 1) > 1 and a.minbytes == 0:
                die("-b 0 with -f never grows (0 x factor = 0): start at -b >= 1, or step by -i")
            if a.stepfactor == 1 and a.stepbytes is None:
                die("-f 1 does not grow the size: give -f >= 2, or -i STEP to add STEP bytes per size")
            if (a.stepfactor or 1) == 1 and a.stepbytes == 0:
                die("-i 0 never grows the size: give -i >= 1 or -f >= 2")
    check_unsupported(a)
    if a.interfere_runs < 1:
        die(f"--interfere-runs must be >= 1, got {a.interfere_runs}")
    if not math.isfinite(a.scale):
        die(f"--scale must be a finite number, got {a.scale}")
    if not 0 <= a.seed <= MAX_SEED:
        die(f"--seed must be in 0..{MAX_SEED}, got {a.seed}")
    if a.min_busbw is not None and not (math.isfinite(a.min_busbw) and a.min_busbw >= 0):
        die(f"--min-busbw must be a finite number >= 0, got {a.min_busbw}")
    from .output import output_problem

    for flag, path, kind, overwrite in (("-J", a.output_file, "json", a.overwrite), ("--plot", a.plot, "plot", True)):
        why = None if path is None else output_problem(path, kind, overwrite)
        if why:
            die(f"{flag} {path or repr(path)}: {why}")


def check_unsupported(a) -> None:
    """nccl-tests' options that tide-perf cannot honour: one line saying why, exit 255."""
    if a.nthreads != 1:
        unsupported(f"-t {a.nthreads}", "it runs one thread per process (host: ranks simulated in one thread; "
                    "torchrun: one process per GPU)")
    if a.ngpus != 1:
        unsupported(f"-g {a.ngpus}", "one GPU per process (loopback: --ranks virtual ranks on one GPU; torchrun: "
                    "one process per GPU)")
    if a.cudagraph != 0:
        unsupported(f"-G {a.cudagraph}", "it does not time CUDA graph launches")
    if a.local_register != 0:
        unsupported(f"-R {a.local_register}", "TIDE moves data between its own registered slots, and the NCCL rows "
                    "run on unregistered buffers")
    if a.cta_policy is not None:
        unsupported("-x (NCCL CTA policy)", "TIDE's transfers use no CTAs and the NCCL rows run with NCCL's "
                    "default policy")
    if a.device_implementation != 0:
        unsupported(f"-D {a.device_implementation}", "TIDE has no NCCL device-API kernels to select")
    if a.stream_null != 0:
        unsupported("-y 1", "GPU calls are issued on torch's current stream, and TIDE's copies on its own streams")
    if a.timeout != 0:
        unsupported(f"-T {a.timeout}", "the GPU backends bound every synchronization with their own timeout (a "
                    "row that times out says so), and a host executor call cannot be interrupted")
    if a.unalign != 0:
        unsupported(f"-u {a.unalign}", "TIDE addresses whole rows of each parameter's storage from its start")


@dataclass(frozen=True)
class Options:
    """One run's settings, resolved from the flags once. `world` and `ranks_per_node` are the torchrun process
    group's once it is up (dataclasses.replace); until then --ranks and the backend's default topology."""

    collective: Collective
    argv: List[str]  # as given, for the JSON's command line
    backend: str  # host | loopback | torchrun
    backend_why: str
    impls: List[str]  # --impl in order; the first is the subject of the footer and --min-busbw
    dtype: DType
    out_dtype: DType
    op: str  # sum | avg | premul
    world: int
    ranks_per_node: int
    pace_bytes: Optional[int]  # --pace-bytes, or None for the layouts' own
    eff_pace: Optional[int]  # the cap the layouts use (None on torchrun)
    layout: str  # flat | a model
    minbytes: int
    maxbytes: int
    stepfactor: int  # 1: step by stepbytes
    stepbytes: int
    iters: int
    warmup: int
    agg_iters: int  # -m: calls per timed iteration
    run_cycles: int  # -N: passes over the size loop (0: until interrupted)
    check: int
    blocking: int
    average: int
    parallel_init: int
    cputime: bool  # -C 1: the time column is CPU time (host backend)
    timestamps: bool  # -S 1
    memory_report: bool  # -M 1
    per_iter: bool  # -I 1
    per_iter_skip: int  # -K
    wide: bool  # tide-perf's columns and one row per implementation
    output_file: Optional[str]
    overwrite: bool
    plot: Optional[str]
    interfere: str
    interfere_runs: int
    sm_time: bool
    min_busbw: Optional[float]
    device: int
    ranks_per_gpu: Optional[int]  # --ranks-per-gpu (torchrun), or None for NCCL_TIDE_RANKS_PER_GPU / one per rank
    scale: float
    seed: int
    flag_notes: Tuple[str, ...] = ()  # nccl-tests flags accepted with no effect here, said in the header

    @property
    def model(self) -> bool:
        return self.layout != "flat"

    @property
    def redop(self) -> str:
        return self.collective.redop(self.op)

    @property
    def nodes(self) -> int:
        return self.world // self.ranks_per_node

    def sizes(self) -> List[int]:
        return collectives.sizes(self.minbytes, self.maxbytes, self.stepfactor, self.stepbytes)

    def size_range(self) -> tuple:
        """(smallest, largest) size of the run: the flags', or a model layout's one row."""
        if self.model:
            b = collectives.model_bytes(self.layout, self.world, self.dtype)
            return b, b
        return self.minbytes, self.maxbytes


def resolve(a, argv: List[str], gpu: Callable[[], bool]) -> Options:
    """Options from checked flags (check_flags): backend, impls, types, topology, counts. Dies on a conflict."""
    coll = collectives.by_name(a.collective)
    if a.backend in ("auto", "loopback") and not os.environ.get("WORLD_SIZE"):
        # Loopback worlds need one hardware queue per busy stream: set before anything initializes CUDA
        # (the GPU probe of auto included; nccl_tide/cuda.py explains).
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    try:
        choice = impls.choose_backend(a.backend, gpu=gpu)
        wanted = impls.parse_impls(a.impl)
    except ValueError as e:
        die(str(e))
    backend = choice["backend"]
    if backend == "host" and not any(impls.static_reason(backend, i, coll.name) is None for i in wanted):
        die(f"--impl {a.impl} measures nothing on the host backend (only tide runs there; nccl, fsdp2 and nccl-ce "
            "need --backend loopback or torchrun)")
    if a.interfere != "none" and backend == "host":
        die("--interfere gemm needs a GPU backend (loopback or torchrun); the host backend has no GPU")
    if a.plot:  # fail before measuring, not after
        from .plot import PlotUnavailable, require_matplotlib

        try:
            require_matplotlib()
        except PlotUnavailable as e:
            die(str(e).replace("tide-perf: ", ""))

    dt = dtype_flag("-d", a.datatype)
    out_dt = dt if a.out_type == "same" else dtype_flag("--out-type", a.out_type)
    try:
        op = {0: "sum", 1: "avg", 2: "premul"}[op_code(a.op or "sum")]
    except TideError as e:
        die(e.detail)
    if coll.reduces and (dt.name not in RS_TYPES or out_dt.name not in RS_TYPES):
        die(f"reduce_scatter supports -d and --out-type in {dtype_spellings(RS_TYPES)}")
    if a.report_cputime and backend != "host":
        unsupported("-C 1", "the GPU backends time with CUDA events; the host time to issue a call is the `host` "
                    "column of --wide")
    per_iter, skip = per_iter_flags(a)
    if a.ranks < 1:
        die("--ranks must be >= 1")
    if a.ranks_per_node is not None:
        rpn = a.ranks_per_node
    else:  # loopback: one node unless asked (2..8 ranks: the host default is one node too)
        rpn = a.ranks if backend == "loopback" else default_ranks_per_node(a.ranks)
    if rpn < 1 or a.ranks % rpn:
        die(
            f"--ranks-per-node {rpn} must divide --ranks {a.ranks} (nodes of equal size; "
            f"divisors: {', '.join(str(d) for d in range(1, a.ranks + 1) if a.ranks % d == 0)})"
        )
    if a.ranks_per_gpu is not None and a.ranks_per_gpu < 1:
        die(f"--ranks-per-gpu must be >= 1, got {a.ranks_per_gpu}")
    if a.ranks_per_gpu is not None and backend != "torchrun":
        die(f"--ranks-per-gpu places torchrun's ranks on GPUs; the {backend} backend runs "
            + ("every virtual rank on one GPU already" if backend == "loopback" else "on no GPU"))
    if backend == "loopback" and not 2 <= a.ranks <= 8:
        die(f"--backend loopback runs 2..8 virtual ranks on one GPU, not --ranks {a.ranks}")
    pace = None
    if a.pace_bytes is not None:
        if backend == "torchrun":
            die("--pace-bytes sets the host and loopback layouts; torchrun layouts take NCCL_TIDE_PACE_BYTES")
        if a.pace_bytes < 1:
            die("--pace-bytes must be >= 1 (leave it out for NCCL_TIDE_PACE_BYTES or the library default)")
        pace = a.pace_bytes
    eff_pace = effective_pace(a.ranks, rpn, pace) if backend != "torchrun" else None
    model = a.layout != "flat"
    return Options(
        collective=coll, argv=list(argv), backend=backend, backend_why=choice["why"], impls=wanted,
        dtype=dt, out_dtype=out_dt, op=op, world=a.ranks, ranks_per_node=rpn, pace_bytes=pace,
        eff_pace=eff_pace, layout=a.layout, minbytes=a.minbytes, maxbytes=a.maxbytes,
        stepfactor=a.stepfactor or 1, stepbytes=DEFAULT_STEP_BYTES if a.stepbytes is None else a.stepbytes,
        iters=a.iters if a.iters is not None else (MODEL_DEFAULT_ITERS if model else FLAT_DEFAULT_ITERS),
        warmup=a.warmup_iters if a.warmup_iters is not None else (MODEL_DEFAULT_WARMUP if model else FLAT_DEFAULT_WARMUP),
        agg_iters=a.agg_iters, run_cycles=a.run_cycles, check=a.check, blocking=a.blocking, average=a.average,
        parallel_init=a.parallel_init, cputime=bool(a.report_cputime), timestamps=bool(a.report_timestamps),
        memory_report=bool(a.memory), per_iter=per_iter, per_iter_skip=skip, wide=bool(a.wide),
        output_file=a.output_file, overwrite=a.overwrite, plot=a.plot,
        interfere=a.interfere, interfere_runs=a.interfere_runs, sm_time=bool(a.sm_time), min_busbw=min_busbw(a),
        device=a.device, ranks_per_gpu=a.ranks_per_gpu, scale=a.scale, seed=a.seed, flag_notes=ignored_flags(a, coll),
    )


def dtype_flag(flag: str, text: str) -> DType:
    try:
        return to_dtype(text)
    except TideError:
        die(f"{flag} {text!r}: unknown type; use one of {dtype_spellings()}")


def per_iter_flags(a) -> Tuple[bool, int]:
    """-I and -K as nccl-tests takes them: a value it does not support is reported and turned off, not fatal."""
    warn = sys.stderr
    per_iter, skip = a.per_iter_timing, a.per_iter_skip
    if per_iter not in (0, 1):
        print("per-iteration timing (-I) only supports 0=off or 1=on. Disabling.", file=warn)
        per_iter = 0
    iters = a.iters if a.iters is not None else (MODEL_DEFAULT_ITERS if a.layout != "flat" else FLAT_DEFAULT_ITERS)
    if skip < 0 or skip >= iters:
        print(f"per-iteration skip (-K) must be between 0 and {iters - 1}. Disabling.", file=warn)
        skip = 0
    if skip and not per_iter:
        print("per-iteration skip (-K) requires per-iteration timing (-I 1). Disabling.", file=warn)
        skip = 0
    return bool(per_iter), skip


def ignored_flags(a, coll: Collective) -> Tuple[str, ...]:
    """nccl-tests flags given a value that means nothing here: each becomes a header line saying so."""
    notes = []
    if a.op is not None and not coll.reduces:
        notes.append(f"-o {a.op} ignored: all_gather does not reduce (redop none, as nccl-tests prints it)")
    if a.root != 0:
        notes.append(f"-r {a.root} ignored: {coll.name} has no root (root -1, as nccl-tests prints it)")
    if a.parallel_init:
        notes.append("-p 1 ignored: one thread per process, nothing to initialize in parallel")
    if a.device_cta_count != 16:
        notes.append(f"-V {a.device_cta_count} ignored: only a device implementation (-D > 0) uses it")
    if a.blocking:
        notes.append(f"-z {a.blocking} ignored: host calls always block, and GPU timing synchronizes once per row")
    return tuple(notes)


def effective_pace(world: int, rpn: int, pace: Optional[int]) -> int:
    """The pacing cap the layouts will use (pace, else NCCL_TIDE_PACE_BYTES, else the library default), read from a
    one-parameter layout of the run's topology; an unusable value ends the run here, before anything is measured."""
    from ..layout import Layout

    try:
        with Layout([world], "fp32", world, rpn, pace_bytes=pace) as lay:
            return int(lay.pace_bytes)
    except TideError as e:
        die(e.detail)


def min_busbw(a) -> Optional[float]:
    if a.min_busbw is not None:
        return a.min_busbw
    env = os.environ.get("NCCL_TESTS_MIN_BW")
    if env:
        try:
            value = float(env)
        except ValueError:
            die(f"NCCL_TESTS_MIN_BW={env!r} is not a number")
        if not (math.isfinite(value) and value >= 0):  # nan would turn the gate off and put NaN in the JSON
            die(f"NCCL_TESTS_MIN_BW={env!r}: set a finite number of GB/s >= 0, or unset it")
        return value
    return None


def check_some_size_runs(o: Options) -> None:
    """A flat run whose every size is below 16 bytes per rank would measure nothing (only rows of size 0, which make
    no call): refuse it, so that a size meant per rank rather than in total is caught before the run."""
    if not o.model and not any(collectives.per_rank_count(s, o.dtype.size, o.world) for s in o.sizes()):
        die(f"every size from -b {o.minbytes} to -e {o.maxbytes} is below 16 bytes per rank at {o.world} ranks: "
            f"nothing to run (no size reaches {16 * o.world} bytes: raise -b, or -e with -f 2)")
