# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The one way tests start several processes: spawn W workers with a deadline, collect what each rank reports, and
fail with every rank's evidence.

Two kinds of worker:

* In-process functions (`run_ranks`, through torch.multiprocessing's spawn): the worker is
  `fn(rank, world, port, report, *args)`; `report` is a dict the worker fills ({"rank", "ok", "errors": [...]} plus
  whatever it adds). The harness catches any exception into report["errors"], writes the report to
  out_dir/rank<r>.json and prints it to stderr (an outer kill cannot lose it), and leaves the process with
  os._exit (status 0 when no error was recorded): CUDA and gloo teardown never decide a test.
* Scripts (`run_script`, `run_processes`): `python SCRIPT worker <rank> <world> <port> <args...>` or any argv per
  rank, as separate interpreters; `run_script` returns the JSON object each rank printed on its last stdout line.

A hang is a failure: past the deadline every process is killed and the test fails naming the ranks still running.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

TAIL = 6000  # characters of each rank's output shown in a failure


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _environ(env: Optional[Mapping[str, Optional[str]]]):
    """os.environ with `env` applied (None removes a variable) for the duration; spawned children inherit it."""
    saved = {k: os.environ.get(k) for k in (env or {})}
    try:
        for k, v in (env or {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------------------------------------------


def init_gloo(rank: int, world: int, port: int, timeout_s: Optional[float] = 60.0):
    """torch.distributed over gloo on 127.0.0.1:port; returns torch.distributed."""
    import datetime

    import torch.distributed as dist

    kw = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **kw)
    return dist


def _rank_main(rank, fn, world, port, out_dir, rank_env, args):
    """Entry of every spawned rank: runs fn, records any exception, writes and prints the report, leaves."""
    os.environ.update(rank_env[rank] if rank_env else {})
    report = {"rank": rank, "ok": False, "errors": []}
    try:
        fn(rank, world, port, report, *args)
    except BaseException:
        report["errors"].append(f"rank {rank}: " + traceback.format_exc())
    report["ok"] = not report["errors"]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    print(f"[{fn.__name__} rank {rank}] {json.dumps(report)[:4000]}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(0 if report["ok"] else 1)


# ---------------------------------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------------------------------


def spawn(fn: Callable, world: int, args: Sequence, out_dir, timeout: float, env=None, rank_env=None) -> int:
    """Starts `world` ranks of fn (see the module docstring) and waits at most `timeout` seconds. Returns 0, or the
    exit status of the first rank that failed. env: variables for every rank (None unsets one); rank_env: one dict
    per rank, applied in that rank before fn runs."""
    import pytest
    import torch.multiprocessing as mp

    with _environ(env):
        ctx = mp.start_processes(
            _rank_main,
            args=(fn, world, free_port(), str(out_dir), list(rank_env or []), tuple(args)),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                pytest.fail(f"{world} processes: ranks {alive} still running after {timeout:.0f} s (cross-process hang)")
    except mp.ProcessExitedException as e:
        return e.exit_code
    return 0


def read_reports(out_dir, world: int, rc: int) -> list:
    """Every rank's report; fails naming a rank that wrote none, or listing the first errors of all ranks."""
    reports = []
    for r in range(world):
        path = Path(out_dir) / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no report (exit status {rc}; its stderr shows why)"
        reports.append(json.loads(path.read_text()))
    errors = [e for rep in reports for e in rep["errors"]]
    assert not errors, "\n".join(errors[:10])
    return reports


def run_ranks(fn: Callable, world: int, args: Sequence, out_dir, timeout: float, env=None, rank_env=None) -> list:
    """spawn + read_reports: every rank reported no error and exited with status 0. Returns the reports."""
    rc = spawn(fn, world, args, out_dir, timeout, env=env, rank_env=rank_env)
    reports = read_reports(out_dir, world, rc)
    assert rc == 0, f"a rank exited with status {rc} after reporting no error"
    assert all(rep["ok"] for rep in reports)
    return reports


@dataclass
class RankOutput:
    rank: int
    returncode: int
    stdout: str
    stderr: str  # empty when merged into stdout


def run_processes(argv: Callable[[int], Sequence[str]], world: int, timeout: float, env=None,
                  merge_stderr: bool = True) -> list:
    """Runs argv(rank) for every rank as its own process (environment: os.environ, then env, OMP_NUM_THREADS=1
    unless set) and returns each RankOutput. Past the deadline every process is killed and AssertionError shows
    each rank's output."""
    e = dict(os.environ)
    e.update(env or {})
    e.setdefault("OMP_NUM_THREADS", "1")
    procs = [
        subprocess.Popen(
            list(map(str, argv(r))),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            text=True,
            env=e,
        )
        for r in range(world)
    ]
    deadline = time.monotonic() + timeout
    outs, hung = [], []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=None if hung else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
            out = (out or "") + f"\n<timeout after {timeout} s: killed>"
            hung.append(r)
        outs.append(RankOutput(r, p.returncode, out or "", err or ""))
    if hung:
        raise AssertionError(f"ranks {hung} still running after {timeout} s (hang)\n" + _show(outs))
    return outs


def run_script(script: Path, world: int, args: Sequence, timeout: float = 180.0, env=None) -> list:
    """`python script worker <rank> <world> <port> <args...>` on `world` processes; every rank must exit with status
    0. Returns the JSON object each rank printed on its last stdout line."""
    port = free_port()
    outs = run_processes(
        lambda r: [sys.executable, str(script), "worker", r, world, port, *args], world, timeout, env=env
    )
    if any(o.returncode != 0 for o in outs):
        raise AssertionError("exit status " + str([o.returncode for o in outs]) + "\n" + _show(outs))
    return [json.loads(o.stdout.strip().splitlines()[-1]) for o in outs]


def _show(outs) -> str:
    return "\n\n".join(f"--- rank {o.rank} ---\n{(o.stdout + o.stderr)[-TAIL:]}" for o in outs)
