# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf command line: nccl-tests' flags, table, JSON and exit statuses (benchmarks/README.md lists them).

tide-perf all_gather|reduce_scatter [-b MIN] [-e MAX] [-f FACTOR | -i STEP] [-n ITERS] [-m AGG] [-w WARMUP]
          [-N CYCLES] [-c CHECK] [-d TYPE] [-o OP] [-z BLOCKING] [-a AVERAGE] [-I 0|1] [-K SKIP] [-C 0|1] [-S 0|1]
          [-M 0|1] [-J FILE.json [--overwrite]] [--plot FILE.png] [--wide]
          [--backend auto|host|loopback|torchrun] [--impl tide,nccl,fsdp2,nccl-ce] [--interfere gemm]
          [--min-busbw GB/s] [--ranks N] [--ranks-per-node R] [--ranks-per-gpu K] [--pace-bytes B]
          [--layout flat|<model>]
tide-perf plot FILE.json FILE.png

busbw = algbw * (W - 1) / W for both collectives, nccl-tests' all-gather/reduce-scatter factor, whatever the node
topology (--ranks-per-node): the same convention as nccl-tests on several nodes (collectives.BUSBW_FORMULA).

Flags -> Options (perf/options.py) -> the backend -> the shared harness (perf/harness.py); the harness and the
backends read what is particular to a collective from its descriptor (perf/collective.py: perf/all_gather.py,
perf/reduce_scatter.py).
"""

import dataclasses
import os
import signal
import sys
from typing import List, Optional

from .. import _native
from .._pipes import closed_pipe_exit
from ..errors import TideError
from ..layout import default_ranks_per_node
from . import harness, host_memory, impls
from .options import (EXIT_INTERRUPTED, Options, check_flags, check_some_size_runs, die, join_negative_values, parser,
                      resolve)
from .progress import Progress

# `tide-perf share` measured one rank's share of a node beside a GEMM; that measurement is a benchmark of the
# repository now, not part of the package.
SHARE_MOVED = ("tide-perf share is not part of tide-perf: one rank's share is a benchmark of the nccl-tide "
               "repository, run it from a checkout with `python benchmarks/share --help`")


def check_gpu_backend(backend: str) -> None:
    """loopback / torchrun need torch with CUDA, a GPU and a CUDA build of libnccl-tide.so: say which is missing."""
    try:
        import torch
    except ImportError:
        die(f"--backend {backend} needs PyTorch with CUDA: pip install torch (or use --backend host)")
    if not getattr(torch.version, "cuda", None):
        die(f"--backend {backend} needs a CUDA build of PyTorch; this one is {torch.__version__} (CPU only): "
            "install a CUDA wheel of torch, or use --backend host")
    try:
        ok = torch.cuda.is_available()
    except Exception as e:  # a broken driver install
        ok, e_text = False, f" ({e})"
    else:
        e_text = ""
    if not ok:
        die(f"--backend {backend} needs a CUDA GPU, and torch sees none{e_text}; use --backend host")


def _gpu_present() -> bool:
    """Indirection so tests can mock the GPU check of backend auto-selection."""
    return impls.gpu_available()


def open_backend(o: Options):
    """The GPU backend of the run (None: host). torchrun's world size is known only once its process group is up."""
    if o.backend == "host":
        return None
    check_gpu_backend(o.backend)
    from . import gpu

    gpu.no_multicast_env()
    if o.backend == "loopback":
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")  # before CUDA initializes (nccl_tide.cuda)
        from . import loopback_backend

        return loopback_backend.make(o.world, o.device, ranks_per_node=o.ranks_per_node, pace_bytes=o.pace_bytes)
    from . import torchrun_backend

    if o.ranks_per_gpu is not None:  # the flag is the variable's value for this run (and shows in the JSON's env)
        from ..devices import RANKS_PER_GPU_ENV

        os.environ[RANKS_PER_GPU_ENV] = str(o.ranks_per_gpu)
    return torchrun_backend.make(o.average)


def _launcher_world() -> Optional[tuple]:
    """(RANK, WORLD_SIZE) when a launcher (torchrun) started this process as one of several, else None."""
    try:
        world, rank = int(os.environ.get("WORLD_SIZE") or 1), int(os.environ.get("RANK") or 0)
    except ValueError:
        return None
    return (rank, world) if world > 1 else None


class Terminated(Exception):
    """SIGTERM, raised in the main thread so that a partly written result file is removed on the way out."""


def _terminate(signum, frame):
    raise Terminated()


def main(argv: Optional[List[str]] = None) -> int:
    """tide-perf's entry point: an interrupted run ends with one line and 128 + the signal, as command-line tools
    do, never with a traceback; a closed output pipe ends it quietly with 128 + SIGPIPE."""
    previous = signal.signal(signal.SIGTERM, _terminate) if _main_thread() else None
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except KeyboardInterrupt:
        print("\ntide-perf: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print("\ntide-perf: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:  # the reader left (| head): quietly, as other command-line tools
        return closed_pipe_exit()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _main(argv: List[str]) -> int:
    if argv and argv[0] == "plot":
        from . import plot

        return plot.main(argv[1:])
    if argv and argv[0] == "share":
        die(SHARE_MOVED)
    a = parser().parse_args(join_negative_values(argv))
    check_flags(a)
    o = resolve(a, argv, gpu=_gpu_present)
    launched = _launcher_world()
    if o.backend == "host" and launched:
        # torchrun started several processes, but the host backend simulates every rank in one: each process would
        # run the whole job, print its table and take the next -J name. Rank 0 runs it once; the others leave.
        rank, world = launched
        if rank != 0:
            return 0
        print(f"tide-perf: note: the host backend ({o.backend_why}) runs all --ranks {o.world} in one process; "
              f"of the launcher's {world} processes rank 0 measures and the others exit", file=sys.stderr)
    try:
        lib_version = _native.version_string()
    except TideError as e:
        die(str(e))
    if o.backend != "torchrun":  # torchrun: the world size is known once the process group is up (below)
        check_some_size_runs(o)
    if o.backend == "host":
        host_memory.check(o)
    gpu_backend = open_backend(o)
    progress = None
    try:
        if o.backend == "torchrun":  # its layouts use the default topology of its world (--ranks-per-node ignored)
            o = dataclasses.replace(o, world=gpu_backend.W, ranks_per_node=default_ranks_per_node(gpu_backend.W))
            check_some_size_runs(o)
        leader = o.backend != "torchrun" or gpu_backend.rank == 0  # rank 0 prints, as in nccl-tests
        out = sys.stdout if leader else open(os.devnull, "w")
        progress = Progress() if leader else None
        return harness.run(o, gpu_backend, lib_version, leader, out, progress)
    finally:
        if progress is not None:
            progress.close()
        if gpu_backend is not None:
            gpu_backend.close()


if __name__ == "__main__":
    sys.exit(main())
