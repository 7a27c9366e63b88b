# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The interference harness: the single-wave GEMM alone, a side unit alone, and the GEMM beside K side units."""

import statistics
import time
from typing import List, Tuple

from .gpu import Gpu
from .method import stats
from .profile import is_gate_kernel, profile_unit
from .sides import Side


GEMM_MKN = (1024, 4096, 16384)


class Harness:
    """The interference method: GEMM alone; GEMM beside K side units (side busy before it starts and past its end)."""

    def __init__(self, g: Gpu, runs: int):
        t = g.torch
        self.g, self.runs = g, runs
        m, k, n = GEMM_MKN
        self.a = g.rand(m * k, t.bfloat16, 11).view(m, k)
        self.b = g.rand(k * n, t.bfloat16, 12).view(k, n)
        self.c = t.empty(m, n, dtype=t.bfloat16, device=g.dev)
        self.gs, self.head = g.stream(), g.stream()
        with t.cuda.stream(self.gs):
            for _ in range(5):
                self.gemm()
        t.cuda.synchronize()

    def gemm(self):
        self.g.torch.matmul(self.a, self.b, out=self.c)

    def alone(self) -> List[float]:
        t, out = self.g.torch, []
        for _ in range(self.runs):
            t.cuda.synchronize()
            self.g.sleep_ms(1.0, self.gs)
            a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            a.record(self.gs)
            with t.cuda.stream(self.gs):
                self.gemm()
            b.record(self.gs)
            t.cuda.synchronize()
            out.append(a.elapsed_time(b))
        return out

    def gemm_shape(self) -> dict:
        kernels, _ = profile_unit(self.g, lambda: self._gemm_on_stream(), iters=1)
        ks = [k for k in kernels if not is_gate_kernel(k[0])]
        if not ks:
            return {}
        name, dur, ctas, args = max(ks, key=lambda k: k[1])
        keep = {k: v for k, v in args.items() if k not in ("External id", "correlation", "queued", "device",
                                                            "context", "stream")}
        return {"kernel": name, "ctas": ctas, "dur_us": dur, "args": keep, "sms": self.g.n_sm,
                "waves": ctas / self.g.n_sm if self.g.n_sm else None}

    def _gemm_on_stream(self):
        with self.g.torch.cuda.stream(self.gs):
            self.gemm()

    def unit_time(self, side: Side, iters=5) -> Tuple[dict, float]:
        """Side unit time alone (ms, events after a sleep) and the host time to enqueue one unit (ms)."""
        t = self.g.torch
        s0 = side.streams[0]
        h0 = time.perf_counter()
        side.unit()  # warm-up; also how long the host takes to enqueue a unit
        first_host = (time.perf_counter() - h0) * 1e3
        t.cuda.synchronize()
        times, host = [], []
        for _ in range(iters):
            self.g.sleep_ms(1.0 + 1.5 * first_host, s0)  # the unit is enqueued before it starts running
            a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            a.record(s0)
            h0 = time.perf_counter()
            side.unit()
            host.append((time.perf_counter() - h0) * 1e3)
            b.record(s0)
            t.cuda.synchronize()
            times.append(a.elapsed_time(b))
        return stats(times), statistics.median(host)

    def beside(self, side: Side, k: int, host_ms: float, order: str = "gemm-after-first") -> dict:
        """GEMM runs beside K side units: per run its time (events around it on its own stream), the margin by
        which the side work outlasted it, and whether the run met the method (run_valid). The GPU is held behind a
        sleep on the head stream while the host enqueues; the GEMM waits for the end of the first unit.

        order "gemm-after-first" (the default): unit 1, the GEMM, then units 2..K. The GEMM is on its stream
        before anything can run, whatever the rest of the side work costs the host. "side-first":
        all K units, then the GEMM. A paced Llama-70B share is ~700 stream operations per unit (354
        pieces of 4 MiB, each a flag wait and a copy batch); K = 3 units exceed what the driver queues on one
        stream, so enqueueing blocks until the GPU has drained enough of it, and the GEMM was enqueued only
        after the GPU had started, at a point the method does not control (gemm_late below)."""
        t = self.g.torch
        sleep = 1.0 + 1.5 * k * host_ms  # the whole side work and the GEMM are enqueued before anything runs
        out = {"times": [], "margins": [], "gemm_late": [], "side_gap": []}
        for _ in range(self.runs):
            t.cuda.synchronize()
            self.g.sleep_ms(sleep, self.head)
            started = t.cuda.Event()  # reached once the GPU is past the gate: nothing may have run before
            started.record(self.head)
            s0 = side.streams[0]
            s0.wait_stream(self.head)
            side.unit()
            first = t.cuda.Event()
            first.record(s0)
            if order == "side-first":
                gap = self._more_units(side, k - 1, first)
                late = started.query()
                a, b = self._timed_gemm(first)
            else:
                a, b = self._timed_gemm(first)
                late = started.query()
                gap = self._more_units(side, k - 1, first)
            last = t.cuda.Event(enable_timing=True)
            last.record(s0)
            t.cuda.synchronize()
            out["times"].append(a.elapsed_time(b))
            out["margins"].append(b.elapsed_time(last))  # > 0: the side work ended after the GEMM
            out["gemm_late"].append(bool(late))
            out["side_gap"].append(bool(gap))
        out["run_valid"] = [m > 0 and not la and not gp
                            for m, la, gp in zip(out["margins"], out["gemm_late"], out["side_gap"])]
        return out

    def _timed_gemm(self, first):
        t = self.g.torch
        self.gs.wait_event(first)
        a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        a.record(self.gs)
        with t.cuda.stream(self.gs):
            self.gemm()
        b.record(self.gs)
        return a, b

    def _more_units(self, side: Side, n: int, prev) -> bool:
        """Enqueues n more units on the side; True if the side's stream had run dry before one of them was
        enqueued (the host fell behind the GPU: a gap in the side work, which the method excludes)."""
        t = self.g.torch
        gap = False
        for _ in range(n):
            gap = gap or prev.query()
            side.unit()
            prev = t.cuda.Event()
            prev.record(side.streams[0])
        return gap
