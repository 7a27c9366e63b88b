# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Runs the training examples of examples/frameworks the way torchrun would (one process per rank with torchrun's
variables, started by multirank.harness.run_processes) and reads their per-step losses. Shared by
tests/unit/test_framework_examples.py (gloo on the CPU) and tests/multirank/test_frameworks.py (NCCL on one GPU)."""

import importlib.util
import os
import sys
from pathlib import Path

from multirank.harness import _show, free_port, run_processes

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "frameworks"

# framework -> (module that must import, example script)
FRAMEWORKS = {
    "deepspeed": ("deepspeed", "deepspeed_train.py"),
    "megatron": ("megatron.core", "megatron_train.py"),
    "torchtitan": ("torchtitan", "torchtitan_train.py"),
}


def _load_common():
    spec = importlib.util.spec_from_file_location("framework_examples_common", EXAMPLES / "common.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


parse_losses = _load_common().parse_losses


def missing(framework: str):
    """None when the framework imports here, else why not (a skip reason)."""
    module = FRAMEWORKS[framework][0]
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:
        found = False
    return None if found else f"{module} is not installed (bash ci/framework_wheels.sh download|install DIR)"


def run(framework: str, args, world: int = 2, env=None, rank_env=None, timeout: float = 300.0, check: bool = True):
    """Runs the framework's example on `world` ranks. env: for every rank; rank_env(r): a dict for rank r.
    Returns (per-rank outputs, {rank: [losses]}); with check, every rank must exit 0 and print a loss per step."""
    script = EXAMPLES / FRAMEWORKS[framework][1]
    # The ranks import the nccl_tide this process imports (the installed package in CI, with its library; the
    # source tree where PYTHONPATH names it), not pytorch_glue/ unconditionally, which has no library when installed.
    import nccl_tide

    here = str(Path(nccl_tide.__file__).resolve().parents[1])
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
              "LOCAL_WORLD_SIZE": str(world), "PYTHONUNBUFFERED": "1",
              "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    common.update(env or {})

    def argv(r):
        per_rank = {"RANK": str(r), "LOCAL_RANK": str(r), **(rank_env(r) if rank_env else {})}
        return ["env", *(f"{k}={v}" for k, v in per_rank.items()), sys.executable, str(script), *map(str, args)]

    outs = run_processes(argv, world, timeout, env=common)
    losses = parse_losses("\n".join(o.stdout for o in outs))
    if check:
        codes = [o.returncode for o in outs]
        assert codes == [0] * world, f"exit status {codes}\n" + _show(outs)
        steps = int(args[list(args).index("--steps") + 1])
        assert sorted(losses) == list(range(world)) and all(len(v) == steps for v in losses.values()), (
            f"expected {steps} losses from each of {world} ranks, got {losses}\n" + _show(outs))
    return outs, losses
