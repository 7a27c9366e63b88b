# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Shared helpers of the one-GPU benchmarks (benchmarks/*.py).

Everything that touches the GPU goes through `Ctx`, so that `--dry-run` can run the same code
on the CPU with tiny sizes: CPU "events" read a wall clock, streams are no-ops, the loopback
world is a torch reference of the documented semantics (CpuLoopbackWorld) and layouts fall back
to a pure-Python mirror of the tide.h layout math (RefLayout) when the native library is absent.
"""

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace

# nccl_tide.cuda: with 5+ virtual ranks, more busy streams than hardware queues can alias two ranks onto one
# queue and deadlock on the cross-rank flags; this must be set before CUDA initializes.
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TIDE_SLOT_ALIGN = 256
SLEEP_CYCLES = 2_000_000  # ~1 ms at H200 clocks: lets the CPU get ahead of the GPU before a timed region


def import_nccl_tide():
    """nccl_tide from the environment, else from the source tree; None if neither imports."""
    try:
        import nccl_tide

        return nccl_tide
    except ImportError:
        pass
    glue = str(REPO / "pytorch_glue")
    if glue not in sys.path:
        sys.path.insert(0, glue)
    try:
        import nccl_tide

        return nccl_tide
    except ImportError:
        return None


# ---------------------------------------------------------------------------------------------
# Models and layouts
# ---------------------------------------------------------------------------------------------


def model_params(name):
    """[(param name, shape)] of one decoder layer, in FSDP2 parameter order (nccl_tide.models), or, for the dry
    run, "tiny-layer": odd sizes so that dim-0 padding happens at 8 and 64 ranks."""
    from nccl_tide import models

    if name == "tiny-layer":
        return [(n, tuple(s)) for n, s in models._llama_layer(48, 136, 3, 1, 16)]
    return [(n, tuple(int(d) for d in s)) for n, s in models.model_params(name)]


def numels_rows(params):
    numels = [math.prod(s) for _, s in params]
    rows = [math.prod(s[1:]) for _, s in params]
    return numels, rows


def _align(x, a):
    return (x + a - 1) // a * a


class RefLayout:
    """Pure-Python mirror of the tide.h layout math (one dtype for the whole group)."""

    source = "python-reference"

    def __init__(self, numels, elem_size, world_size, rank=0, row_numels=None):
        row_numels = row_numels or [1] * len(numels)
        self.world_size, self.rank = world_size, rank
        self.params = []
        send = slot = rs = 0
        for n, c in zip(numels, row_numels):
            rows = n // c
            shard = -(-rows // world_size) * c
            send = _align(send, elem_size)
            slot = _align(slot, TIDE_SLOT_ALIGN)
            self.params.append(
                SimpleNamespace(
                    numel=n, row_numel=c, shard_numel=shard, dtype="bf16", elem_size=elem_size,
                    send_offset=send, slot_offset=slot, rs_out_offset=rs,
                )
            )
            send += shard * elem_size
            slot += shard * world_size * elem_size
            rs += shard
        self.send_bytes, self.slot_bytes, self.rs_out_numel = send, slot, rs
        self.rs_staging_bytes = None


def make_layout(numels, world_size, rank=0, row_numels=None, dtype="bf16", notes=None, **kw):
    """nccl_tide.Layout when the library loads, else RefLayout (and a note saying so)."""
    nt = import_nccl_tide()
    if nt is not None:
        try:
            lay = nt.Layout(numels, dtype, world_size, rank=rank, row_numels=row_numels, **kw)
            lay.source = "libnccl-tide"
            return lay
        except Exception as e:  # LibraryNotFoundError in a CPU-only checkout
            if notes is not None and not any("RefLayout" in n for n in notes):
                notes.append(f"nccl_tide.Layout unavailable ({type(e).__name__}: {e}); using RefLayout")
    elif notes is not None and not any("RefLayout" in n for n in notes):
        notes.append("nccl_tide not importable; using RefLayout")
    elem = {"bf16": 2, "fp16": 2, "fp32": 4}[dtype]
    return RefLayout(numels, elem, world_size, rank, row_numels)


def check_layout(lay, numels, row_numels, world_size):
    """Cross-checks a library layout against RefLayout; returns a list of mismatch strings."""
    ref = RefLayout(numels, lay.params[0].elem_size, world_size, 0, row_numels)
    bad = []
    for i, (p, q) in enumerate(zip(lay.params, ref.params)):
        for f in ("shard_numel", "send_offset", "slot_offset", "rs_out_offset"):
            if int(getattr(p, f)) != int(getattr(q, f)):
                bad.append(f"param {i} {f}: lib {getattr(p, f)} vs ref {getattr(q, f)}")
    if int(lay.rs_out_numel) != ref.rs_out_numel:
        bad.append(f"rs_out_numel: lib {lay.rs_out_numel} vs ref {ref.rs_out_numel}")
    return bad


# ---------------------------------------------------------------------------------------------
# Device context: CUDA, or the CPU stand-ins of the dry run
# ---------------------------------------------------------------------------------------------


class CpuEvent:
    def __init__(self, enable_timing=True):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3

    def synchronize(self):
        pass


class Ctx:
    def __init__(self, dry_run=False):
        self.dry_run = dry_run
        if not dry_run and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device: run with --dry-run for the CPU check")
        self.cuda = not dry_run
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.cuda else torch.device("cpu")

    # streams and events
    def stream(self):
        return torch.cuda.Stream() if self.cuda else None

    def streams_avoiding(self, n, avoid=()):
        """n distinct streams, none equal to a stream in `avoid` (torch hands out streams round-robin
        from a pool of 32, so a later request can return a stream already in use elsewhere)."""
        if not self.cuda:
            return [None] * n
        seen = {int(s.cuda_stream) for s in avoid if s is not None}
        out = []
        for _ in range(128):
            s = torch.cuda.Stream()
            if int(s.cuda_stream) not in seen:
                seen.add(int(s.cuda_stream))
                out.append(s)
                if len(out) == n:
                    return out
        raise RuntimeError(f"could not get {n} streams distinct from {len(avoid)} others")

    @staticmethod
    def rank_streams(world):
        """The loopback world's own streams, one per virtual rank (None in the dry run)."""
        return list(world.streams) if hasattr(world, "streams") else None

    def world_sync(self, world, timeout=60.0):
        """Host wait for the world's streams with a timeout (a cross-rank deadlock raises instead of hanging)."""
        if self.cuda and hasattr(world, "synchronize"):
            world.synchronize(timeout=timeout)
        self.sync()

    def event(self):
        return torch.cuda.Event(enable_timing=True) if self.cuda else CpuEvent()

    def use_stream(self, s):
        return torch.cuda.stream(s) if (self.cuda and s is not None) else nullcontext()

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def sleep(self, stream=None):
        """Keeps `stream` (default: current) busy ~1 ms so the CPU gets ahead of the GPU."""
        if self.cuda:
            with self.use_stream(stream):
                torch.cuda._sleep(SLEEP_CYCLES)

    def fanout(self, streams):
        """Every stream in `streams` waits for the work enqueued so far on the current stream."""
        if self.cuda and streams:
            cur = torch.cuda.current_stream()
            for s in _unique(streams):
                if s != cur:
                    s.wait_stream(cur)

    def join(self, streams):
        """The current stream waits for everything enqueued so far on `streams`."""
        if self.cuda and streams:
            cur = torch.cuda.current_stream()
            for s in _unique(streams):
                if s != cur:
                    cur.wait_stream(s)

    def loopback_world(self, n):
        if not self.cuda:
            return CpuLoopbackWorld(n)
        nt = import_nccl_tide()
        if nt is None:
            raise RuntimeError("nccl_tide is not importable (pip install -e . or set PYTHONPATH=pytorch_glue)")
        from nccl_tide.cuda import LoopbackWorld

        return LoopbackWorld(n, device=self.device.index)

    def free(self):
        import gc

        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def _unique(streams):
    out = []
    for s in streams:
        if s is not None and all(s is not t and s != t for t in out):
            out.append(s)
    return out


def rand(ctx, shape, dtype, seed):
    g = torch.Generator(device=ctx.device).manual_seed(seed)
    return torch.randn(shape, dtype=dtype, device=ctx.device, generator=g)


# ---------------------------------------------------------------------------------------------
# The dry run's loopback world: the documented semantics in plain torch
# ---------------------------------------------------------------------------------------------


class CpuLoopbackWorld:
    """CPU stand-in of nccl_tide.cuda.LoopbackWorld with the same call signatures."""

    def __init__(self, n_ranks, device=None):
        self.n = n_ranks

    def alloc_slot(self, nbytes):
        return [torch.empty(int(nbytes), dtype=torch.uint8) for _ in range(self.n)]

    def all_gather(self, layouts, slots, sendbufs=None, shards=None, streams=None):
        assert len(layouts) == len(slots) == self.n and (sendbufs is None) != (shards is None)
        for s in range(self.n):
            for i, p in enumerate(layouts[s].params):
                nb = p.shard_numel * p.elem_size
                if sendbufs is not None:
                    src = sendbufs[s][p.send_offset : p.send_offset + nb]
                else:
                    src = shards[s][i].reshape(-1).view(torch.uint8)
                for d in range(self.n):
                    slots[d][p.slot_offset + s * nb : p.slot_offset + (s + 1) * nb].copy_(src)

    def reduce_scatter(self, layouts, grads, outs, op="sum", scale=1.0, staging=None, streams=None):
        assert len(layouts) == len(grads) == len(outs) == self.n
        for r in range(self.n):
            for i, p in enumerate(layouts[r].params):
                k = p.shard_numel
                lo, hi = r * k, min((r + 1) * k, p.numel)
                acc = torch.zeros(k, dtype=torch.float32)
                if hi > lo:
                    for s in range(self.n):
                        x = grads[s][i].reshape(-1)[lo:hi].float()
                        acc[: hi - lo] += x * scale if op == "premul" else x
                if op == "avg":
                    acc /= float(self.n)
                outs[r][p.rs_out_offset : p.rs_out_offset + k].copy_(acc)

    def close(self):
        pass


# ---------------------------------------------------------------------------------------------
# Timing and profiling
# ---------------------------------------------------------------------------------------------


def stats(xs):
    xs = sorted(float(x) for x in xs)
    if not xs:
        return {"n": 0}
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return {"n": len(xs), "median": statistics.median(xs), "min": xs[0], "max": xs[-1], "p25": q[0], "p75": q[2]}


def time_ms(ctx, fn, iters=20, warmup=3):
    """Per-iteration GPU time of fn (which enqueues on, or joins back to, the current stream):
    CUDA events around each call, a ~1 ms sleep kernel before each so that launch overhead is
    not timed. Returns stats() in ms."""
    for _ in range(warmup):
        fn()
    ctx.sync()
    pairs = []
    for _ in range(iters):
        ctx.sleep()
        a, b = ctx.event(), ctx.event()
        a.record()
        fn()
        b.record()
        pairs.append((a, b))
    ctx.sync()
    return stats(a.elapsed_time(b) for a, b in pairs)


def _union_len(intervals):
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _merge(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _intersection_len(xs, ys):
    xs, ys = _merge(xs), _merge(ys)
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def profile_gpu(ctx, fn, iters=5, warmup=2):
    """Kernel and memcpy activity of fn from torch.profiler (ProfilerActivity.CUDA), per call:
    n_kernels, kernel_us (sum of durations = SM time), kernel_busy_us (union of intervals),
    n_memcpy, memcpy_us, kernel_memcpy_overlap_us, top kernel names."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    ctx.sync()
    acts = [ProfilerActivity.CUDA] if ctx.cuda else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        for _ in range(iters):
            fn()
        ctx.sync()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            data = json.load(f)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    n_sm = torch.cuda.get_device_properties(ctx.device).multi_processor_count if ctx.cuda else None
    return parse_trace(events, iters, n_sm)


def parse_trace(events, iters, n_sm=None):
    """Per-call kernel/memcpy figures from chrome-trace events (see profile_gpu)."""
    kern, mem = [], []
    names = Counter()
    sm_weighted = 0.0 if n_sm else None
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        iv = (float(e.get("ts", 0.0)), float(e.get("ts", 0.0)) + float(e.get("dur", 0.0)))
        if cat == "kernel":
            kern.append(iv)
            names[str(e.get("name", "?"))[:80]] += 1
            grid = (e.get("args") or {}).get("grid")
            if sm_weighted is not None and isinstance(grid, list) and grid:
                blocks = math.prod(int(g) for g in grid)
                sm_weighted += (iv[1] - iv[0]) * min(1.0, blocks / n_sm)
            else:
                sm_weighted = None
        elif cat in ("gpu_memcpy", "gpu_memset"):
            mem.append(iv)
    return {
        "iters": iters,
        "n_kernels": len(kern) / iters,
        "kernel_us": sum(b - a for a, b in kern) / iters,
        "kernel_busy_us": _union_len(kern) / iters,
        "n_memcpy": len(mem) / iters,
        "memcpy_us": sum(b - a for a, b in mem) / iters,
        "kernel_memcpy_overlap_us": _intersection_len(kern, mem) / iters,
        "sm_weighted_us": None if sm_weighted is None else sm_weighted / iters,  # dur x min(1, CTAs/SMs)
        "kernel_names": dict(names.most_common(6)),
    }


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------


def env_info(ctx):
    info = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "device": torch.cuda.get_device_name(ctx.device) if ctx.cuda else "cpu (dry run)",
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    try:
        v = torch.cuda.nccl.version() if ctx.cuda else None
        info["nccl_torch"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception as e:
        info["nccl_torch"] = f"unavailable ({type(e).__name__})"
    nt = import_nccl_tide()
    info["nccl_tide"] = getattr(nt, "__version__", None) if nt else None
    try:
        info["nccl_tide_library"] = nt.library_version() if nt else None
    except Exception as e:
        info["nccl_tide_library"] = f"unavailable ({type(e).__name__})"
    try:
        info["git_commit"] = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except Exception:
        info["git_commit"] = None
    return info


def fmt(x, nd=3):
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        if x != x:
            return "nan"
        if x == 0:
            return "0"
        if abs(x) >= 1e4 or abs(x) < 1e-3:
            return f"{x:.3g}"
        return f"{x:.{nd}f}".rstrip("0").rstrip(".") if "." in f"{x:.{nd}f}" else f"{x:.{nd}f}"
    return str(x)


def row(item, metric, tide=None, baseline=None, ratio=None, target="", ok=None, unit=""):
    """One line of the final summary table."""
    return {"item": item, "metric": metric, "tide": tide, "baseline": baseline, "ratio": ratio,
            "target": target, "ok": ok, "unit": unit}


def table(rows):
    head = ["#", "metric", "TIDE", "baseline", "ratio", "unit", "target", "met"]
    lines = [[str(r["item"]), r["metric"], fmt(r["tide"]), fmt(r["baseline"]), fmt(r["ratio"]), r["unit"],
              r["target"], "-" if r["ok"] is None else fmt(bool(r["ok"]))] for r in rows]
    w = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h) for i, h in enumerate(head)]
    out = ["| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(head)) + " |",
           "|" + "|".join("-" * (x + 2) for x in w) + "|"]
    out += ["| " + " | ".join(x[i].ljust(w[i]) for i in range(len(head))) + " |" for x in lines]
    return "\n".join(out)


def jsonable(x):
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and (x != x or x in (math.inf, -math.inf)):
        return str(x)
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    return str(x)


def standalone(run, name=None, argv=None):
    """`python benchmarks/<name>.py [--dry-run] [--out DIR]`: one benchmark on its own."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, no CUDA-only parts")
    ap.add_argument("--out", default=None, help="directory for <name>.json")
    a = ap.parse_args(argv)
    ctx = Ctx(a.dry_run)
    print(json.dumps(env_info(ctx)))
    res = run(ctx)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"{name or run.__module__}.json"), "w") as f:
            json.dump(jsonable(res), f, indent=1)
    print(table(res.get("summary", [])))
    return res


def selftest():
    """CPU checks of the parts a dry run cannot reach otherwise (GPU trace parsing, stats)."""
    ev = [
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 0.0, "dur": 10.0, "args": {"grid": [66, 1, 1]}},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 5.0, "dur": 10.0, "args": {"grid": [264, 1, 1]}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 12.0, "dur": 8.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0.0, "dur": 100.0},
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 0.0},
    ]
    r = parse_trace(ev, iters=1, n_sm=132)
    assert r["n_kernels"] == 2 and r["kernel_us"] == 20.0 and r["kernel_busy_us"] == 15.0, r
    assert r["n_memcpy"] == 1 and r["memcpy_us"] == 8.0 and r["kernel_memcpy_overlap_us"] == 3.0, r
    assert abs(r["sm_weighted_us"] - (10.0 * 0.5 + 10.0)) < 1e-9, r
    assert parse_trace(ev[:1], iters=1, n_sm=None)["sm_weighted_us"] is None
    s = stats([3.0, 1.0, 2.0, 4.0])
    assert s["median"] == 2.5 and s["min"] == 1.0 and s["max"] == 4.0 and s["p25"] <= s["median"] <= s["p75"], s
    lay = RefLayout([10 * 4, 5], 2, 4, 0, [4, 1])
    assert [p.shard_numel for p in lay.params] == [12, 2] and lay.params[1].slot_offset == 256, vars(lay)
    assert lay.send_bytes == 28 and lay.rs_out_numel == 14
    return True


def record_failure(bench, errors, what, e):
    """Prints the traceback of a failed measurement and records it, so the other measurements still run."""
    import traceback

    tb = traceback.format_exc()
    print(f"[{bench}] {what} FAILED:\n{tb}", flush=True)
    errors.append({"what": what, "error": f"{type(e).__name__}: {e}", "traceback": tb})
