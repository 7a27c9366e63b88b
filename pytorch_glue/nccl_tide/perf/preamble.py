# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The lines tide-perf prints before its table (nccl-tests' "# nThread ..." and "# Using devices" blocks, plus what
a reader needs to know of the backend, the topology and each implementation) and the run's device list."""

import os
import platform
import socket
from typing import TextIO

from .collectives import BUSBW_FORMULA
from .options import Options


def write(out: TextIO, o: Options, versions: dict, lib_version: str, gpu_backend, table: dict,
          backend_notes=()) -> None:
    from .. import __version__

    nccl_h = versions.get("nccl_header", "N/A")
    nccl_r = versions.get("nccl_runtime", "N/A")
    short = lambda v: v if len(str(v)) <= 12 else "N/A"  # noqa: E731  (the reason is in the JSON)
    out.write(
        f"# nccl-tide tide-perf {__version__} library={lib_version} nccl-headers={short(nccl_h)} "
        f"nccl-library={short(nccl_r)} (backend {o.backend})\n"
    )
    out.write(f"# Collective test starting: {o.collective.perf_name}\n")
    step = f"{o.stepfactor}(factor)" if o.stepfactor > 1 else f"{o.stepbytes}(bytes)"
    lo, hi = o.size_range()
    out.write(
        f"# nThread 1 nGpus {0 if o.backend == 'host' else 1} minBytes {lo} maxBytes {hi} step: {step} "
        f"warmup iters: {o.warmup} iters: {o.iters} agg iters: {o.agg_iters} validation: {o.check} graph: 0 "
        "unalign: 0\n"
    )
    if o.per_iter:
        clock = "host wall-clock timing" if o.backend == "host" else "CUDA event timing"
        skip = f"; summary skips first {o.per_iter_skip} iterations" if o.per_iter_skip else ""
        out.write(f"# Per-Iteration Report: {clock}; i_* uses max over process rows{skip} \n")
    for note in list(backend_notes) + list(o.flag_notes):
        out.write(f"# {note}\n")
    world, rpn, nodes = o.world, o.ranks_per_node, o.nodes
    if o.backend == "host":
        out.write(f"# backend: host executor, {world} simulated ranks, {rpn} ranks per node, {nodes} nodes\n")
    else:
        out.write(f"# backend: {gpu_backend.describe()}\n")
        if "torch" in versions:
            out.write(
                f"# torch {versions.get('torch')} CUDA {versions.get('cuda_runtime')} "
                f"NCCL(torch) {versions.get('nccl_torch', 'N/A')} device {versions.get('device', '?')}\n"
            )
    kind = {"host": "simulated ", "loopback": "virtual "}.get(o.backend, "")
    pace_text = "" if o.eff_pace is None or nodes == 1 else f", pacing cap {o.eff_pace} bytes per schedule step"
    plural = "s" if nodes > 1 else ""
    out.write(f"# topology: {world} ranks, {rpn} ranks per node, {nodes} {kind}node{plural}{pace_text}\n")
    out.write(f"# {BUSBW_FORMULA}\n")
    out.write(f"# backend chosen by {o.backend_why}\n")
    if o.collective.reduces:
        out.write(
            f"# {o.collective.name}: input {o.dtype.name}, output {o.out_dtype.name}, op {o.op}"
            + (f", scale {o.scale}" if o.op == "premul" else "")
            + "\n"
        )
    for impl in o.impls:
        t = table[impl]
        out.write(f"# impl {impl}: {t['description']}\n")
        if t["measured_as"]:
            out.write(f"#   measured as {t['measured_as']}\n")
    if o.interfere == "gemm":
        from . import gpu

        out.write(
            f"# GEMM column: single-wave bf16 GEMM {'x'.join(map(str, gpu.GEMM_MKN))} beside the collective, "
            f"median of {o.interfere_runs} runs / GEMM alone (the interference method)\n"
        )


def write_devices(out: TextIO, devices: list) -> None:
    """nccl-tests' device lines, which its JSON writer parses back: `device` an integer, then [device_hex]."""
    out.write("#\n# Using devices\n")
    for d in devices:
        out.write(
            "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s\n"
            % (d["rank"], d["group"], d["pid"], d["hostname"], int(d["device"]), d.get("device_hex") or "unknown",
               d.get("name", ""))
        )


def devices(gpu_backend, world: int) -> list:
    """One entry per rank. The host backend's ranks are simulated in this process, on no CUDA device (-1)."""
    if gpu_backend is not None:
        return gpu_backend.devices()
    cpu = platform.processor() or platform.machine()
    return [
        {"rank": r, "group": 0, "pid": os.getpid(), "hostname": socket.gethostname(), "device": -1,
         "device_hex": "host", "name": f"{cpu} (host executor, simulated rank {r})"}
        for r in range(world)
    ]
