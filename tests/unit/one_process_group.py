# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""A worker in a gloo process group of one process (world size 1: nccl_tide.fsdp runs the reference executor), in a
subprocess: the process group is process state, so each run gets an interpreter of its own.

A test file defines `_worker(seed) -> dict` (JSON-able) and ends with `if __name__ == "__main__":
serve_worker(_worker)`; its tests call `run_worker(__file__, tmp_dir, seed)`. By hand:
python FILE worker <store file> <seed>
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable


def run_worker(script, tmp_dir, seed: int) -> dict:
    """Runs `python script worker <store file in tmp_dir> <seed>` and returns the worker's dict. The environment is
    passed on as it is: the worker imports the nccl_tide under test (the installed package, or PYTHONPATH's)."""
    store = Path(tmp_dir) / "store"
    r = subprocess.run([sys.executable, str(script), "worker", str(store), str(seed)], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def serve_worker(worker: Callable[[int], dict]) -> None:
    """The worker side (argv: worker <store file> <seed>): worker(seed) inside the group, its dict printed as JSON on
    the last line of stdout."""
    if sys.argv[1:2] != ["worker"]:
        return
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{sys.argv[2]}", rank=0, world_size=1)
    out = worker(int(sys.argv[3]))
    dist.destroy_process_group()
    print(json.dumps(out))
