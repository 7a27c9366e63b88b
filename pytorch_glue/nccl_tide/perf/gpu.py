# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""GPU measurement methods shared by the loopback and torchrun backends (the methods of benchmarks/*.py):

* time per call: CUDA events around `iters` back-to-back calls on the current stream, after the warm-up and after a
  ~1 ms sleep kernel so the CPU gets ahead of the GPU (launch overhead is not timed at large sizes);
* SM time per call: sum of kernel durations from torch.profiler (ProfilerActivity.CUDA, chrome trace cat=kernel)
  plus the durations of same-device copies and memsets (trace names "Memcpy DtoD ..." and "Memset ..."): on the H200
  (driver 580, CUDA 13) every same-device device-to-device copy form, the hinted cudaMemcpyBatchAsync included, and
  every memset runs on SMs: none of them runs beside a kernel that holds every SM (benchmarks/copy_engine_probe.cu,
  as measured on an H200), although the trace files them as copies. Peer copies ("Memcpy PtoP") and
  host<->device copies are copy-engine work and are not SM time;
* --interfere gemm: the interference method of benchmarks/interference.py. A single-wave bf16 GEMM (1024x4096x16384) is
  timed alone, then beside K calls of the measured collective on a side stream: the GEMM stream waits for an event
  recorded after the first call, so the side work is running when the GEMM starts and K is chosen so it lasts well
  past the GEMM's end; everything is enqueued behind a GPU sleep sized to the host's enqueue time, so host-bound
  calls run as densely as the GPU allows (Gemm.slowdown). Slowdown = median(with) / median(alone), alone measured in
  the same run; the JSON gives covered_runs (side work still running when the GEMM ended) and late_runs, and a row
  whose runs were not all covered says so in its note.

Every call passed in here enqueues its work so that the current stream waits for it (it may use other streams).
torch is imported inside the functions: importing this module needs no torch.
"""

import json
import math
import os
import statistics
import tempfile
import time
from typing import Callable, List, Optional

SLEEP_CYCLES = 2_000_000  # ~1 ms at H200 clocks
GEMM_MKN = (1024, 4096, 16384)  # 128 output tiles of 128x1024: one wave on 132 SMs

# Never NVLink multicast on shared machines; set in this process and its children.
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def no_multicast_env() -> None:
    for k, v in NO_MULTICAST_ENV.items():
        os.environ.setdefault(k, v)


def torch_dtype(name: str):
    import torch

    return {
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp32": torch.float32,
        "fp8_e4m3": getattr(torch, "float8_e4m3fn", None),
        "fp8_e5m2": getattr(torch, "float8_e5m2", None),
        "int8": torch.int8,
        "int32": torch.int32,
    }[name]


def bits_dtype(size: int):
    """Integer torch dtype of `size` bytes, for bit-exact comparisons and copies of any element type."""
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32}[size]


def copy_dtype(name: str, size: int):
    """The torch dtype FSDP2's copy ops see for `name` (bf16/fp16/fp32), else the integer type of its size. Results
    are always compared as bits (random bytes can be NaN patterns)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}.get(name) or bits_dtype(size)


def zero_nans(buf_u8, dtype) -> None:
    """Sets every element of the byte buffer that is a NaN of the float type `dtype` to +0, in place (integer types:
    nothing to do). For inputs that pass through FSDP2's copy-in: on CUDA torch._foreach_copy_ loads bf16/fp16 as
    fp32 and stores it back, which writes every NaN as one canonical NaN, so a NaN's payload and sign do not survive
    it while every other value does, bit for bit. Without NaNs, a bit-exact check of its output is right, and no
    expected element is the all-ones fill (a NaN) that marks an element nothing wrote."""
    import torch

    if dtype.is_floating_point:
        v = buf_u8.view(dtype)
        v.masked_fill_(torch.isnan(v), 0)


def sleep(ms: float = 1.0) -> None:
    """A GPU sleep of about `ms` milliseconds on the current stream (holds the work queued behind it)."""
    import torch

    torch.cuda._sleep(int(SLEEP_CYCLES * max(ms, 0.05)))


def time_call_us(call: Callable[[], None], iters: int, warmup: int) -> float:
    """Mean time per call (us) of `iters` back-to-back calls, CUDA events on the current stream."""
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    sleep()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        call()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / max(iters, 1)


def time_iters_us(call: Callable[[], None], iters: int, warmup: int, agg: int = 1) -> List[float]:
    """-I 1: the time per call (us) of each of `iters` iterations of `agg` back-to-back calls, one CUDA event
    between iterations (nothing but the calls runs between two events)."""
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    sleep()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    events[0].record()
    for k in range(iters):
        for _ in range(agg):
            call()
        events[k + 1].record()
    torch.cuda.synchronize()
    return [events[k].elapsed_time(events[k + 1]) * 1e3 / agg for k in range(iters)]


def pci_hex(index: int) -> str:
    """nccl-tests' device_hex of a CUDA device, domain:bus:device ("unknown" where torch does not say)."""
    import torch

    p = torch.cuda.get_device_properties(index)
    try:
        return "%04x:%02x:%02x" % (p.pci_domain_id, p.pci_bus_id, p.pci_device_id)
    except AttributeError:
        return "unknown"


def runs_on_sms(cat: str, name: str) -> bool:
    """Whether a copy/memset trace event (Kineto names: "Memcpy DtoD (Device -> Device)", "Memcpy PtoP (...)",
    "Memcpy HtoD (...)", "Memset (Device)") ran on SMs on this GPU: same-device copies and memsets do (module
    docstring); peer and host copies run on copy engines."""
    return cat.lower() == "gpu_memset" or name.startswith("Memcpy DtoD")


def parse_kernel_time(events, iters: int) -> dict:
    """Per-call kernel figures from chrome-trace events: n_kernels, kernel_us (sum of kernel durations), n_memcpy,
    memcpy_us (every copy and memset), local_copy_us (the same-device copies and memsets among them, which run on
    SMs: module docstring), sm_us (kernel_us + local_copy_us: the SM time), top kernel names."""
    n_k = n_m = 0
    k_us = m_us = local_us = 0.0
    names = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        dur = float(e.get("dur", 0.0))
        if cat == "kernel":
            n_k += 1
            k_us += dur
            name = str(e.get("name", "?"))[:60]
            names[name] = names.get(name, 0) + 1
        elif cat in ("gpu_memcpy", "gpu_memset"):
            n_m += 1
            m_us += dur
            if runs_on_sms(cat, str(e.get("name", ""))):
                local_us += dur
    it = max(iters, 1)
    top = dict(sorted(names.items(), key=lambda kv: -kv[1])[:4])
    return {
        "n_kernels": n_k / it,
        "kernel_us": k_us / it,
        "n_memcpy": n_m / it,
        "memcpy_us": m_us / it,
        "local_copy_us": local_us / it,
        "sm_us": (k_us + local_us) / it,
        "kernel_names": top,
    }


def profiled_events(call: Callable[[], None], iters: int) -> list:
    """The CUDA trace events (Chrome trace format) of `iters` calls of `call`, from torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            call()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            data = json.load(f)
    return data.get("traceEvents", []) if isinstance(data, dict) else data


def sm_time(call: Callable[[], None], iters: int = 3) -> dict:
    """SM time per call from torch.profiler (see parse_kernel_time); one unprofiled warm-up call first."""
    call()
    return parse_kernel_time(profiled_events(call, iters), iters)


def side_ops_for(unit_ms: float, gemm_ms: float) -> int:
    """K side calls so the side work lasts past 3x the GEMM time + 1 ms (interference.py's rule), at most 200."""
    return min(200, 1 + max(2, math.ceil((3 * gemm_ms + 1.0) / max(unit_ms, 1e-3))))


class Gemm:
    """The single-wave bf16 GEMM of the interference method and its alone time (measured once per run)."""

    def __init__(self, runs: int = 11):
        import torch

        m, k, n = GEMM_MKN
        g = torch.Generator(device="cuda").manual_seed(1)
        self.a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        self.b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g)
        self.c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        self.stream = torch.cuda.Stream()
        self.side = torch.cuda.Stream()
        self.head = torch.cuda.Stream()
        self.runs = runs
        with torch.cuda.stream(self.stream):  # cuBLAS picks its kernel per stream: warm up where it is timed
            for _ in range(5):
                self()
        torch.cuda.synchronize()
        self.alone = self._alone()

    def __call__(self):
        import torch

        torch.matmul(self.a, self.b, out=self.c)

    def _alone(self) -> dict:
        import torch

        times = []
        for _ in range(self.runs):
            torch.cuda.synchronize()
            with torch.cuda.stream(self.stream):
                sleep()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                self()
                b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}

    def slowdown(self, call: Callable[[], None], unit_ms: float, barrier: Optional[Callable[[], None]] = None) -> dict:
        """GEMM beside K calls of `call` (on the side stream) / GEMM alone; median over self.runs runs.

        The first side call, the GEMM (waiting for that call) and the other K - 1 calls, in that order, are enqueued
        behind a GPU sleep (the hold) before anything runs, so the side work is as dense as the GPU makes it, not as
        the host issues it: a host-bound call (loopback issues every virtual rank's work from one thread) would
        otherwise leave the GPU idle between calls and start the GEMM late, after its start event (without it, no
        loopback run was covered and the GEMM figure was its own launch gap). Untimed first runs size it: run 0
        measures the host's enqueue time (hold = 1 ms + 1.5x it); run 1, without a barrier (one process: nothing else
        must issue the same calls), measures the side work's GPU time per call and re-derives K from it (unit_ms, the
        caller's time per call, is host-bound for such calls). A timed run whose hold had ended before the last side
        call was enqueued counts as late (reported; the hold doubles for the next run). No run is repeated, so the
        ranks of a multi-process run issue the same calls."""
        import torch

        k = side_ops_for(unit_ms, self.alone["median_ms"])
        times: List[float] = []
        covered = late = 0
        hold_ms, side_ms = 1.0, None
        untimed = 1 if barrier is not None else 2
        for run in range(untimed + self.runs):
            torch.cuda.synchronize()
            if barrier is not None:
                barrier()
            with torch.cuda.stream(self.head):
                sleep(hold_ms)
                held = torch.cuda.Event()
                held.record()
            self.side.wait_stream(self.head)
            h0 = time.perf_counter()
            with torch.cuda.stream(self.side):
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                first = torch.cuda.Event()
                first.record()
            # The GEMM goes onto its stream right after the first call, before the rest of the side work: however
            # long the host then takes (or blocks on a full stream queue), the GEMM's events cannot be recorded late
            # (the share benchmark's harness found that with a 70B share).
            self.stream.wait_event(first)
            with torch.cuda.stream(self.stream):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                self()
                b.record()
            with torch.cuda.stream(self.side):
                for _ in range(k - 1):
                    call()
                last = torch.cuda.Event(enable_timing=True)
                last.record()
            enqueue_ms = (time.perf_counter() - h0) * 1e3
            was_late = held.query()  # the hold had ended: the GPU ran (some of) the side work as the host issued it
            torch.cuda.synchronize()
            if run == 0:
                hold_ms = max(hold_ms, 1.0 + 1.5 * enqueue_ms)
                continue
            if run < untimed:
                if not was_late:
                    side_ms = start.elapsed_time(last) / k
                    k_gpu = side_ops_for(side_ms, self.alone["median_ms"])
                    hold_ms = max(hold_ms, 1.0 + 1.5 * enqueue_ms * k_gpu / k)
                    k = k_gpu
                else:
                    hold_ms *= 2
                continue
            if was_late:
                late += 1
                hold_ms *= 2
            times.append(a.elapsed_time(b))
            covered += int(b.elapsed_time(last) > 0)  # side work still running when the GEMM ended
        med = statistics.median(times)
        return {
            "slowdown": med / self.alone["median_ms"],
            "with_median_ms": med,
            "alone_median_ms": self.alone["median_ms"],
            "side_calls": k,
            "side_call_gpu_ms": side_ms,
            "runs": self.runs,
            "covered_runs": covered,
            "late_runs": late,
            "hold_ms": hold_ms,
        }


def count_wrong_bits(got, want) -> int:
    """Elements whose bits differ (equal-shaped integer views)."""
    import torch

    return int(torch.count_nonzero(got != want))


def count_wrong_close(got, ref64, abs_sum64, tol: float) -> int:
    """Elements not within tol x sum|x_i| of the fp64 reference (NaN counts as wrong)."""
    import torch

    g = got.double()
    bad = ~((g - ref64).abs() <= tol * abs_sum64 + 1e-30)
    return int(torch.count_nonzero(bad | torch.isnan(g)))


# Tolerance of a reduce-scatter result relative to sum|x_i|, by output type (fp32 accumulation throughout).
RS_TOL = {"fp32": 1e-5, "bf16": 2.0**-7, "fp16": 2.0**-10}


def versions(torch_mod=None) -> dict:
    """torch, CUDA, NCCL (torch's, and the one TIDE sees via nccl_tide.comm.nccl_info() where available), device."""
    out = {}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            out["device"] = torch.cuda.get_device_name()
            v = torch.cuda.nccl.version()
            out["nccl_torch"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception as e:  # report, never fail the benchmark on a version probe
        out.setdefault("torch", f"unavailable ({type(e).__name__}: {e})")
    try:
        from ..comm import nccl_info

        info = nccl_info()
        out["nccl_header"] = info["header"]
        out["nccl_runtime"] = info["runtime"]
        out["nccl_features"] = info["features"]
    except Exception as e:
        out["nccl_header"] = out["nccl_runtime"] = f"N/A ({type(e).__name__}: {str(e)[:120]})"
    return out
