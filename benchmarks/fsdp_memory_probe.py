# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Where the memory at the peak of an FSDP2 training step goes: stock FSDP2 vs TIDE, per allocation.

Usage, from the repo root, on one GPU, with libnccl-tide.so built with CUDA (about 1 minute per variant on an H200):

    export NCCL_TIDE_LIBRARY_PATH=$PWD/build/gpu/libnccl-tide.so PYTHONPATH=$PWD/pytorch_glue
    python benchmarks/fsdp_memory_probe.py --out fsdp_memory_probe.json
    python benchmarks/fsdp_memory_probe.py --layers 2 --hidden 1024 --ffn 3584 --vocab 8000 --out small.json  # smaller
    python benchmarks/fsdp_memory_probe.py --variants stock,tide,tide-dedicated --out all.json
    python benchmarks/fsdp_memory_probe.py --show fsdp_memory_probe.json   # print a saved result again

Model and step are fsdp_step.py's (its VariantRun: Llama-style, bf16 params, fp32 reduce, AdamW, world
size 1; same defaults: --layers 4 --hidden 4096 --seq 2048 --tokens 8192; --slot-pool 2). Each variant
runs in a FRESH subprocess (nothing left from another variant; NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
NVSHMEM_DISABLE_NVLS=1 in its environment) that records torch.cuda.memory._record_memory_history(max_entries=200000,
Python stacks) from before the model is built, runs --warmup steps and then --steps measured steps, takes
torch.cuda.memory._snapshot() and analyses its device trace itself (live_at_peak, below). Between the steps and around
forward / backward / optimizer it allocates 512-byte markers from _probe_mark, which the analysis finds by their
frames, to cut the trace into phases.

What it prints per variant, for the measured steps:
  * torch peak: the peak of the live allocations replayed from the trace (alloc until free_requested, the rule of
    torch.cuda.memory_allocated; sizes are requested sizes rounded up to 512 B, so it can be slightly below torch's
    counter, printed next to it as a check);
  * device peak: the peak over time of the live allocations without TIDE's bound pool slots plus the TIDE slot
    bytes allocated at that moment (tideSlotAlloc, resident whether bound or not). A trimming pool
    (enable(slot_trim=...), on at world size 1) frees and allocates slots during the step: the child puts a
    marker labelled "slots:<bytes>" into the trace after every tideSlotAlloc/tideSlotFree of a pool
    (nccl_tide.fsdp._slot_memory.residency_hooks), so the resident slot bytes are known at every event; without
    markers they are constant (stats()["slot_pool"]["resident_slot_bytes"]). This is what the device holds; for
    stock it equals the torch peak. Compare this one; the table shows the slot bytes resident at that peak;
  * the live bytes at the device peak grouped by their most informative frame (the innermost frame in nccl_tide/,
    torch/distributed/fsdp/, the step benchmark or this script, else the innermost Python frame; allocations made by
    the autograd engine with no Python frame form one group), top --top groups in MiB, with the phase the peak fell in;
then a diff table: groups larger in tide than in stock (or absent in stock), and the largest savings.
The JSON (--out) holds all of it, plus per variant the peaks over warm-up and measured steps together, the live-set
check at the start of the measured steps, TIDE's stats and the child's log file name (<out>.<variant>.log).

Exit status: 0 when every variant ran, 1 when one failed (its error and the end of its log are printed), 2 when
something it needs is missing (CUDA, torch's memory history, nccl_tide on the path, the library).

The pure analysis (trace events -> live set at the peak -> groups -> diff) has no torch dependency and is unit-tested
on a synthetic trace in benchmarks/tests/test_fsdp_memory_probe.py.
"""

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
GLUE = REPO / "pytorch_glue"
MAX_ENTRIES = 200000
MARK_FN = "_probe_mark"
MARK_BYTES = 512
SLOT_MARK = "slots:"  # marker label prefix: TIDE slot bytes resident from this event on
# Files whose frames name an allocation: the package, FSDP2, and the step benchmark this probe runs.
FOCUS = ("nccl_tide/", "torch/distributed/fsdp/", "fsdp_memory_probe.py", "fsdp_step.py", "fsdp_model.py")
NO_FRAME = "<no Python frame: autograd engine / C++>"
SLOT_GROUP = "TIDE slots (tideSlotAlloc, resident: pool + dedicated)"
CHILD_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
VARIANTS = ("stock", "tide", "tide-dedicated")
MiB = 1 << 20


class ProbeError(Exception):
    """A clear, one-paragraph failure (no traceback is printed for it)."""


# ---------------------------------------------------------------------------------------------
# Pure analysis: a device trace of torch.cuda.memory._snapshot() -> live set at the peak -> groups
# (trace entries: dicts with 'action', 'addr', 'size', 'frames'; frames innermost first, each with
# 'filename', 'line', 'name'; checked against torch/cuda/memory.py and _memory_viz.py, torch 2.11/2.13)
# ---------------------------------------------------------------------------------------------


def block_bytes(size: int, rounding: int = 512) -> int:
    """The caching allocator's block rounding of a request (round_size: at least 512 B, multiples of 512 B)."""
    if not rounding:
        return int(size)
    return max(rounding, -(-int(size) // rounding) * rounding)


def _frame_str(f: dict) -> str:
    fn = str(f.get("filename", "?"))
    for root in ("nccl_tide/", "torch/", "benchmarks/"):
        k = fn.rfind(root)
        if k >= 0:
            fn = fn[k:]
            break
    else:
        fn = fn.rsplit("/", 1)[-1]
    return f"{fn}:{f.get('line', '?')}:{f.get('name', '?')}"


def group_key(frames: Sequence[dict], focus: Sequence[str] = FOCUS) -> str:
    """The most informative frame of an allocation, as file:line:function: the innermost frame whose file is in
    `focus`, else the innermost Python frame, else the innermost frame; NO_FRAME without frames."""
    if not frames:
        return NO_FRAME
    for f in frames:
        fn = str(f.get("filename", ""))
        if any(p in fn for p in focus) and MARK_FN != f.get("name"):
            return _frame_str(f)
    py = next((f for f in frames if str(f.get("filename", "")).endswith(".py")), None)
    return _frame_str(py if py is not None else frames[0])


def is_mark(e: dict) -> bool:
    return e.get("action") == "alloc" and any(f.get("name") == MARK_FN for f in e.get("frames") or ())


def is_slot_bind(e: dict) -> bool:
    """A TIDE pool slot bound under a group's storage (alloc binder: _CudaAllocBinder.bind's resize_ inside the
    slot's MemPool): torch counts it, but its memory is a resident tideSlotAlloc slot. Not the torch binder's moves
    (_TorchBinder._torch_slot_memory, shard world size 1 with trimming): those slots are torch memory, counted here
    once, and the "slots:" markers leave them out (_slot_memory.tide_resident_bytes)."""
    frames = e.get("frames") or ()
    if any(f.get("name") == "_torch_slot_memory" for f in frames):
        return False
    return any(
        str(f.get("filename", "")).endswith("nccl_tide/fsdp/_slot_binders.py") and f.get("name") == "bind" for f in frames
    )


def _replay(events, upto: int, mode: str, weight: Callable[[dict], int], track_from: Optional[int], zero,
            extra=None):
    """Replays events[0..upto] (inclusive); allocations at the indices in `zero` count 0 bytes. Returns (live,
    current bytes, peak, peak index, unknown frees, extra bytes at the peak), the peak of current + extra bytes taken
    over indices >= track_from (None: no tracking). extra: (initial bytes, [(index, bytes from that index on), ...]
    sorted by index), e.g. the TIDE slot bytes resident at each event; None: 0."""
    live: Dict[int, tuple] = {}  # addr -> (bytes, index of its alloc)
    requested = set()  # addrs freed (free_requested) whose free_completed has not come yet
    cur = 0
    peak, peak_idx, unknown = None, None, 0
    add, steps = extra if extra is not None else (0, [])
    k, add_at_peak = 0, 0
    for i in range(upto + 1):
        while k < len(steps) and steps[k][0] <= i:
            add = steps[k][1]
            k += 1
        e = events[i]
        act = e.get("action")
        addr = e.get("addr")
        if act == "alloc":
            if addr in live:  # an alloc over a live block: a lost free (wrapped trace); the old one is gone
                cur -= live.pop(addr)[0]
                unknown += 1
            b = 0 if i in zero else int(weight(e))
            live[addr] = (b, i)
            cur += b
        elif act == "free_requested":
            if mode == "allocated":
                if addr in live:
                    cur -= live.pop(addr)[0]
                else:
                    unknown += 1  # allocated before the trace began (or lost to the ring buffer)
            elif addr not in live:
                unknown += 1
            requested.add(addr)
        elif act == "free_completed":
            if addr in requested:
                requested.discard(addr)
                if mode == "active" and addr in live:
                    cur -= live.pop(addr)[0]
            elif addr in live:  # no free_requested recorded for it: it ends here in both modes
                cur -= live.pop(addr)[0]
            else:
                unknown += 1
        if track_from is not None and i >= track_from and (peak is None or cur + add > peak):
            peak, peak_idx, add_at_peak = cur + add, i, add
    return live, cur, peak, peak_idx, unknown, add_at_peak


def live_at_peak(
    events: Sequence[dict],
    start: int = 0,
    end: Optional[int] = None,
    mode: str = "allocated",
    weight: Optional[Callable[[dict], int]] = None,
    zero: Optional[set] = None,
    extra=None,
) -> dict:
    """Replays a device trace's alloc / free_requested / free_completed events and returns the live allocation set at
    the moment, between event indices start (inclusive) and end (exclusive), when the live bytes peak.

    mode 'allocated': an allocation counts from its alloc to its free_requested (torch.cuda.memory_allocated's rule:
    the caching allocator stops counting a block when it is freed, even when a record_stream use defers its reuse),
    or to its free_completed if no free_requested was recorded; 'active': to its free_completed (active_bytes).
    weight(entry) gives the bytes an allocation counts for (default: its size rounded to the allocator's 512 B);
    the allocations at the event indices in `zero` count 0 (default: the markers, is_mark). Other actions
    (segment_alloc, segment_free, snapshot, oom, ...) do not change the live set. Frees of addresses never allocated
    in the trace are counted in 'unknown_frees' (allocated before the
    recording began, or lost when the ring buffer of max_entries wrapped).

    extra: bytes added at each event outside the live set, as _replay's (initial, [(index, bytes), ...]); the peak
    is then that of live + extra, and extra_at_peak says how much of it is extra.

    Returns peak_bytes, peak_index, live (list of {addr, bytes, size, index, frames}, largest first),
    unknown_frees, extra_at_peak, events.
    """
    if mode not in ("allocated", "active"):
        raise ValueError(f"mode {mode!r}: 'allocated' or 'active'")
    w = weight or (lambda e: block_bytes(e.get("size", 0)))
    n = len(events)
    end = n if end is None else max(0, min(end, n))
    start = max(0, start)
    if n == 0 or start >= end:
        return {"peak_bytes": 0, "peak_index": None, "live": [], "unknown_frees": 0, "extra_at_peak": 0, "events": n}
    zero = set(find_marks(events)) if zero is None else zero
    _, _, peak, idx, unknown, add = _replay(events, end - 1, mode, w, start, zero, extra)
    live, cur, _, _, _, _ = _replay(events, idx, mode, w, None, zero)
    assert cur + add == peak
    out = [
        {"addr": a, "bytes": b, "size": int(events[i].get("size", 0)), "index": i,
         "frames": events[i].get("frames") or []}
        for a, (b, i) in live.items()
        if b
    ]
    out.sort(key=lambda r: -r["bytes"])
    return {"peak_bytes": peak, "peak_index": idx, "live": out, "unknown_frees": unknown, "extra_at_peak": add,
            "events": n}


def live_bytes_at(events: Sequence[dict], index: int, mode: str = "allocated", weight=None, zero=None) -> int:
    """Live bytes after events[0..index] (the same replay)."""
    if index is None or index < 0 or not events:
        return 0
    w = weight or (lambda e: block_bytes(e.get("size", 0)))
    zero = set(find_marks(events)) if zero is None else zero
    return _replay(events, min(index, len(events) - 1), mode, w, None, zero)[1]


def slot_timeline(marks: Sequence[int], labels: Sequence[str], initial: int = 0) -> tuple:
    """(initial bytes, [(event index, TIDE slot bytes resident from there on), ...]) from the "slots:<bytes>"
    markers, for live_at_peak(extra=...)."""
    steps = [(m, int(lab[len(SLOT_MARK):])) for m, lab in zip(marks, labels) if lab.startswith(SLOT_MARK)]
    return int(initial), steps


def group_live(live: Sequence[dict], key: Callable[[Sequence[dict]], str] = group_key) -> List[dict]:
    """Live allocations grouped by key(frames): [{group, bytes, count, example}], largest first; `example` is the
    innermost 10 frames of the group's largest allocation."""
    groups: Dict[str, dict] = {}
    for r in live:
        k = key(r["frames"])
        g = groups.setdefault(k, {"group": k, "bytes": 0, "count": 0, "example": None, "_max": -1})
        g["bytes"] += r["bytes"]
        g["count"] += 1
        if r["bytes"] > g["_max"]:
            g["_max"] = r["bytes"]
            g["example"] = [_frame_str(f) for f in (r["frames"] or [])[:10]]
    out = sorted(groups.values(), key=lambda g: (-g["bytes"], g["group"]))
    for g in out:
        del g["_max"]
    return out


def diff_groups(tide: Sequence[dict], stock: Sequence[dict]) -> dict:
    """Per group, tide's bytes minus stock's. 'more': groups larger in tide (or only there), largest excess first;
    'less': groups smaller in tide (or only in stock), largest saving first; 'total': sum of tide - stock."""
    t = {g["group"]: g["bytes"] for g in tide}
    s = {g["group"]: g["bytes"] for g in stock}
    rows = [
        {"group": k, "tide_bytes": t.get(k, 0), "stock_bytes": s.get(k, 0), "delta": t.get(k, 0) - s.get(k, 0),
         "only": "tide" if k not in s else ("stock" if k not in t else "")}
        for k in set(t) | set(s)
    ]
    more = sorted((r for r in rows if r["delta"] > 0), key=lambda r: (-r["delta"], r["group"]))
    less = sorted((r for r in rows if r["delta"] < 0), key=lambda r: (r["delta"], r["group"]))
    return {"more": more, "less": less, "total": sum(t.values()) - sum(s.values())}


def find_marks(events: Sequence[dict]) -> List[int]:
    """Indices of the marker allocations (_probe_mark), in trace order."""
    return [i for i, e in enumerate(events) if is_mark(e)]


def phase_at(index: Optional[int], marks: Sequence[int], labels: Sequence[str]) -> str:
    """The label of the last marker at or before `index`."""
    if index is None:
        return "?"
    best = "before the first marker"
    for m, lab in zip(marks, labels):
        if m <= index and not lab.startswith(SLOT_MARK):
            best = lab
    return best


def analyze(events: Sequence[dict], labels: Sequence[str], resident_slot_bytes: int = 0, top: int = 60) -> dict:
    """The probe's analysis of one variant's device trace. `labels`: the marker labels in the order the child
    allocated them ('measure' and 'end' bound the measured steps; labels 'step<k>:<phase>' mark the phases). Per
    window ('measured'; 'all_steps': warm-up and measured steps, not the model build): torch peak (all
    live allocations), device peak (live allocations without bound pool slots, plus resident_slot_bytes as one
    group), each with its index, phase and top groups. With "slots:<bytes>" markers among the labels the slot
    bytes follow them (resident_slot_bytes is then the value before the first one: a wrapped trace lost it)."""
    marks = find_marks(events)
    labels = list(labels)
    if 0 < len(marks) < len(labels) and len(events) >= MAX_ENTRIES:  # the ring buffer dropped the earliest events
        labels = labels[len(labels) - len(marks):]
    if len(marks) != len(labels) or "measure" not in labels:
        raise ProbeError(
            f"found {len(marks)} marker allocations in the trace, expected {len(labels)} (frames missing? the trace "
            f"wrapped at max_entries={MAX_ENTRIES}?)"
        )
    at = dict(zip(labels, marks))
    first = next((m for m, lab in zip(marks, labels) if lab.startswith("step")), 0)  # the model build excluded
    windows = {"measured": (at["measure"], at.get("end", len(events))), "all_steps": (first, len(events))}
    zero = set(marks)
    slots = {i for i, e in enumerate(events) if e.get("action") == "alloc" and is_slot_bind(e)}
    timeline = slot_timeline(marks, labels, resident_slot_bytes)
    timed = bool(timeline[1])
    res = {"events": len(events), "marks": len(marks), "windows": {}}
    for name, (a, b) in windows.items():
        tp = live_at_peak(events, a, b, zero=zero)
        # the device peak: bound slots are in the resident slot bytes, added at every event
        dp = live_at_peak(events, a, b, zero=zero | slots, extra=timeline)
        dgroups = group_live(dp["live"])
        at_peak = dp["extra_at_peak"]
        if at_peak:
            dgroups.append({"group": SLOT_GROUP, "bytes": int(at_peak), "count": 0, "example": None})
            dgroups.sort(key=lambda g: (-g["bytes"], g["group"]))
        bound = [r for r in tp["live"] if r["index"] in slots]
        res["windows"][name] = {
            "torch_peak_bytes": tp["peak_bytes"],
            "torch_peak_index": tp["peak_index"],
            "torch_peak_phase": phase_at(tp["peak_index"], marks, labels),
            "torch_peak_bound_slots": len(bound),
            "torch_peak_bound_slot_bytes": sum(r["bytes"] for r in bound),
            "torch_groups": group_live(tp["live"]) if name == "measured" else group_live(tp["live"])[:top],
            "device_peak_bytes": dp["peak_bytes"],
            "slot_bytes_at_device_peak": at_peak,
            "slot_bytes_timed": timed,  # True: from the markers (a trimming pool), False: constant
            "device_peak_index": dp["peak_index"],
            "device_peak_phase": phase_at(dp["peak_index"], marks, labels),
            "device_groups": dgroups if name == "measured" else dgroups[:top],  # measured: all (the diff)
            "n_groups": len(dgroups),
            "unknown_frees": tp["unknown_frees"],
        }
    res["live_bytes_at_measure"] = live_bytes_at(events, at.get("measure"), zero=zero)
    return res


# ---------------------------------------------------------------------------------------------
# Child: one variant in a fresh process, on the GPU
# ---------------------------------------------------------------------------------------------

_MARK_LABELS: List[str] = []


def _probe_mark(label: str, device) -> None:
    """A 512-byte allocation, freed at once: the analysis finds it by this function's name in its frames."""
    import torch

    _MARK_LABELS.append(label)
    t = torch.empty(MARK_BYTES, dtype=torch.uint8, device=device)
    del t


def _use_nccl_tide() -> Path:
    """Imports nccl_tide: the installed package if there is one (its library included), else this checkout's
    pytorch_glue/ (with NCCL_TIDE_LIBRARY_PATH pointing at a built library). Returns the directory it came from."""
    try:
        import nccl_tide
    except ImportError:
        sys.path.insert(0, str(GLUE))
        import nccl_tide
    return Path(nccl_tide.__file__).resolve().parents[1]


def _child(a) -> dict:
    import torch

    _use_nccl_tide()
    import fsdp_step
    from fsdp_model import LlamaConfig

    if not torch.cuda.is_available():
        raise ProbeError("no CUDA device visible in the child process")
    mem = torch.cuda.memory
    if not hasattr(mem, "_record_memory_history") or not hasattr(mem, "_snapshot"):
        raise ProbeError(f"torch {torch.__version__} has no torch.cuda.memory._record_memory_history/_snapshot")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    mem._record_memory_history(enabled="all", context="alloc", stacks=a.stacks, max_entries=MAX_ENTRIES)
    dist, rank, world, device = fsdp_step._init_dist()
    if world != 1:
        raise ProbeError(f"world size {world}: the probe runs one process on one GPU")
    cfg = LlamaConfig(a.layers, a.hidden, a.heads, a.kv_heads, a.ffn, a.vocab)
    out = {"variant": a.child, "torch": torch.__version__, "device": torch.cuda.get_device_name(device),
           "model": dict(cfg._asdict(), n_params=cfg.n_params())}
    t0 = time.time()
    _probe_mark("start", device)
    from nccl_tide.fsdp import _slot_memory

    def slot_mark(nbytes: int) -> None:  # after every tideSlotAlloc / tideSlotFree of a pool: the resident bytes
        _probe_mark(f"{SLOT_MARK}{int(nbytes)}", device)

    _slot_memory.residency_hooks.append(slot_mark)
    v = fsdp_step.VariantRun(a.child, cfg, a, rank, device)
    if v.reason:
        raise ProbeError(f"variant {a.child} cannot run: {v.reason}")
    out["note"] = v.note
    st = v.tide_stats() if a.child.startswith("tide") else None
    if a.child.startswith("tide"):
        if not st or not st["tide_groups"]:
            raise ProbeError(f"variant {a.child}: TIDE took no group ({(st or {}).get('stock_groups')})")
        if st["stock_groups"]:
            out["warning"] = f"groups kept on stock FSDP2: {st['stock_groups']}"

    def step(k: int) -> None:
        _probe_mark(f"step{k}:forward", device)
        v.step(mark=lambda phase: _probe_mark(f"step{k}:{phase}", device))

    for k in range(a.warmup):
        step(k)
    torch.cuda.synchronize()
    out["allocated_at_measure"] = torch.cuda.memory_allocated(device)
    out["slot_bytes_at_measure"] = _slot_memory.tide_resident_bytes()  # torch binder slots: in the trace
    _probe_mark("measure", device)
    torch.cuda.reset_peak_memory_stats(device)
    for k in range(a.warmup, a.warmup + a.steps):
        step(k)
    torch.cuda.synchronize()
    out["torch_max_memory_allocated"] = torch.cuda.max_memory_allocated(device)  # over the measured steps
    _probe_mark("end", device)
    _slot_memory.residency_hooks.remove(slot_mark)  # disable() frees slots after the snapshot: no markers there
    out["build_and_steps_s"] = time.time() - t0
    snap = mem._snapshot()
    mem._record_memory_history(enabled=None)
    if a.child.startswith("tide"):
        st = v.tide_stats()
        pool = st.get("slot_pool") or {}
        out["tide"] = {"total": st.get("total"), "slot_pool": pool, "slot_pools": st.get("slot_pools")}
        # slot bytes outside torch (binder "torch" slots are torch memory, in the trace)
        resident = int(pool.get("tide_resident_slot_bytes", pool.get("resident_slot_bytes")) or 0)
        # the most TIDE slot bytes outside torch (binder "torch" pools are torch memory: in the trace, left out)
        pools = st.get("slot_pools") or []
        tide_max = sum(p["slot_capacity"] * p["slots"] for p in pools if not p.get("torch_memory"))
        out["max_resident_slot_bytes"] = int(
            (tide_max if any(p.get("torch_memory") for p in pools) else pool.get("max_resident_slot_bytes")) or resident
        )
    else:
        resident = 0
    out["resident_slot_bytes"] = resident  # at the end of the measured steps
    traces = snap.get("device_traces") or []
    idx = device.index or 0
    if idx >= len(traces) or not traces[idx]:
        raise ProbeError(f"the snapshot has no device trace for cuda:{idx} (memory history not recorded?)")
    events = traces[idx]
    out["trace_entries"] = len(events)
    out["trace_wrapped"] = len(events) >= MAX_ENTRIES
    if not any(e.get("frames") for e in events if e.get("action") == "alloc"):
        raise ProbeError("the trace's allocations carry no frames (torch recorded no Python stacks)")
    if a.snapshot_path:
        import pickle

        with open(a.snapshot_path, "wb") as f:
            pickle.dump(snap, f)
        out["snapshot_file"] = a.snapshot_path
    # slot bytes before the first "slots:" marker: none allocated (the hook was in place before enable()), unless
    # the ring buffer dropped the earliest events (then those at the first measured step stand in)
    initial = out["slot_bytes_at_measure"] if out["trace_wrapped"] else 0
    if not any(lab.startswith(SLOT_MARK) for lab in _MARK_LABELS):
        initial = resident  # no pool event at all: constant
    out["analysis"] = analyze(events, _MARK_LABELS, initial, top=a.top_json)
    v.close()
    dist.destroy_process_group()
    return out


# ---------------------------------------------------------------------------------------------
# Parent: checks, one subprocess per variant, tables, JSON
# ---------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python benchmarks/fsdp_memory_probe.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--variants", default="stock,tide", help=f"comma list of {', '.join(VARIANTS)} (default stock,tide)")
    p.add_argument("--out", default="fsdp_memory_probe.json", help="JSON result (children's logs: <out>.<variant>.log)")
    p.add_argument("--slot-pool", type=int, default=2, help="tide: nccl_tide.fsdp.enable(slot_pool=N) (default 2)")
    p.add_argument("--slot-trim", choices=["auto", "on", "off", "all"], default="auto",
                   help="tide: enable(slot_trim=None|True|False|'all') (auto: on at world size 1, the pool's slots "
                   "freed at the end of forward; off: the slots stay allocated, as the step benchmark measures by default; all: also at "
                   "the end of backward, the root's slot too)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--tokens", type=int, default=8192, help="tokens per step (batch = tokens / seq)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=2, help="measured steps")
    p.add_argument("--top", type=int, default=20, help="groups printed per table")
    p.add_argument("--top-json", type=int, default=60,
                   help="groups kept in the JSON for the other tables (the measured device peak keeps all)")
    p.add_argument("--stacks", choices=["python", "all"], default="python",
                   help="frames recorded: python (fast) or all (C++ too: autograd-engine allocations get frames; slow)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds per variant's subprocess (about 40-60 s expected at the defaults on an H200)")
    p.add_argument("--keep-snapshot", action="store_true", help="also save each child's raw snapshot "
                   "(<out>.<variant>.pickle, for torch.cuda._memory_viz; large)")
    p.add_argument("--show", metavar="JSON", default=None, help="print the tables of a saved result and exit")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    p.add_argument("--snapshot-path", default=None, help=argparse.SUPPRESS)
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _checks(variants: List[str]) -> None:
    """Fails (ProbeError) with what is missing, before any child starts."""
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise ProbeError(f"--variants {','.join(variants)}: choose from {', '.join(VARIANTS)}")
    try:
        import torch
    except ImportError as e:
        raise ProbeError(f"needs PyTorch with CUDA ({e})")
    if not torch.cuda.is_available():
        raise ProbeError(f"needs a CUDA GPU; torch {torch.__version__} sees none")
    if not hasattr(torch.cuda.memory, "_record_memory_history") or not hasattr(torch.cuda.memory, "_snapshot"):
        raise ProbeError(f"torch {torch.__version__} lacks torch.cuda.memory._record_memory_history / _snapshot")
    try:
        pkg_dir = _use_nccl_tide()
        import nccl_tide.fsdp  # noqa: F401
    except ImportError as e:
        raise ProbeError(
            f"cannot import nccl_tide from {GLUE} ({e}); run from the repo root with PYTHONPATH=pytorch_glue"
        )
    if any(v.startswith("tide") for v in variants):
        lib = os.environ.get("NCCL_TIDE_LIBRARY_PATH")
        if lib and not Path(lib).is_file():
            raise ProbeError(f"NCCL_TIDE_LIBRARY_PATH={lib}: no such file (build: cmake -S . -B build/gpu -G Ninja "
                             "-DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build build/gpu -j)")
        if not lib and not (pkg_dir / "nccl_tide" / "lib" / "libnccl-tide.so").is_file():
            raise ProbeError("the tide variants need libnccl-tide.so built with CUDA: set NCCL_TIDE_LIBRARY_PATH "
                             "(e.g. $PWD/build/gpu/libnccl-tide.so)")


def _model_args(a) -> List[str]:
    keys = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "tokens", "warmup", "steps", "slot_pool",
            "slot_trim", "top_json")
    out = []
    for k in keys:
        out += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
    return out + ["--stacks", a.stacks]


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if not x.startswith("TIDE/")]
    except OSError:
        return "(no log)"
    return "\n".join("    " + x for x in lines[-n:])


def _run_child(variant: str, a, out_path: Path) -> dict:
    log = out_path.with_name(f"{out_path.name}.{variant}.log")
    res = out_path.with_name(f"{out_path.name}.{variant}.child.json")
    res.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(CHILD_ENV)
    env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    env.update(PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0",
               WORLD_SIZE="1", LOCAL_RANK="0")
    # The child imports the same nccl_tide as this process (installed, or this checkout's pytorch_glue/).
    env["PYTHONPATH"] = os.pathsep.join([str(_use_nccl_tide())] +
                                        [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", variant, "--child-out", str(res), *_model_args(a)]
    if a.keep_snapshot:
        cmd += ["--snapshot-path", str(out_path.with_name(f"{out_path.name}.{variant}.pickle"))]
    t0 = time.time()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=a.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = None
    wall = time.time() - t0
    doc = None
    if res.is_file():
        try:
            doc = json.loads(res.read_text())
        except ValueError:
            doc = None
        res.unlink(missing_ok=True)
    if rc is None:
        return {"variant": variant, "ok": False, "error": f"did not finish within {a.timeout:.0f} s (hung? see {log})",
                "log": str(log), "log_tail": _tail(log), "wall_s": wall}
    if doc is None or not doc.get("ok"):
        err = (doc or {}).get("error") or f"the child exited with status {rc} and wrote no result"
        return {"variant": variant, "ok": False, "error": err, "log": str(log), "log_tail": _tail(log), "wall_s": wall}
    doc.update(log=str(log), wall_s=wall)
    return doc


def _mib(b) -> str:
    return f"{b / MiB:,.1f}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    w = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = ["| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(head)) + " |",
             "|" + "|".join("-" * (x + 2) for x in w) + "|"]
    lines += ["| " + " | ".join(r[i].ljust(w[i]) for i in range(len(head))) + " |" for r in rows]
    return "\n".join(lines)


def report(doc: dict, top: int = 20) -> str:
    out = []
    s = doc.get("settings", {})
    model = ", ".join(f"{k} {s[k]}" for k in ("layers", "hidden", "ffn", "vocab", "seq", "tokens", "warmup", "steps",
                                               "slot_pool", "slot_trim") if k in s)
    out.append(f"# FSDP2 step memory at the peak of the measured steps, {s.get('device', '?')}, torch "
               f"{s.get('torch', '?')}, world size 1; {model}")
    rows = []
    for name, r in doc["variants"].items():
        if not r.get("ok"):
            rows.append((name, "FAILED", "", "", "", "", "", r.get("error", "")[:120]))
            continue
        w = r["analysis"]["windows"]["measured"]
        wa = r["analysis"]["windows"]["all_steps"]
        tide = (r.get("tide") or {}).get("total") or {}
        note = f"AG/RS fallbacks {tide.get('fallbacks', 0)}" if tide else ""
        if r.get("warning"):
            note += f"; {r['warning']}"
        rows.append((
            name,
            _mib(w["device_peak_bytes"]),
            w["device_peak_phase"],
            _mib(w["torch_peak_bytes"]),
            _mib(r["torch_max_memory_allocated"]),
            f"{_mib(w.get('slot_bytes_at_device_peak', r['resident_slot_bytes']))} at the device peak (max "
            f"{_mib(r.get('max_resident_slot_bytes', r['resident_slot_bytes']))}; "
            f"{w['torch_peak_bound_slots']} bound at torch peak)"
            if r.get("resident_slot_bytes") or r.get("max_resident_slot_bytes") else "-",
            _mib(wa["device_peak_bytes"]),
            note,
        ))
    head = ("variant", "device peak MiB", "phase", "torch peak MiB (trace)", "torch max_memory_allocated MiB",
            "TIDE slots MiB", "device peak incl. warm-up MiB", "note")
    out.append(_table(head, rows))
    ok = {k: v for k, v in doc["variants"].items() if v.get("ok")}
    for name, r in ok.items():
        w = r["analysis"]["windows"]["measured"]
        out.append(f"\n## {name}: live bytes at the device peak ({_mib(w['device_peak_bytes'])} MiB, "
                   f"{w['device_peak_phase']}), top {top} of {w['n_groups']} groups")
        head = ("MiB", "count", "group (innermost frame in nccl_tide/, torch/distributed/fsdp/, the step benchmark, this probe)")
        out.append(_table(head, [(_mib(g["bytes"]), str(g["count"]), g["group"]) for g in w["device_groups"][:top]]))
        chk = r["analysis"]["live_bytes_at_measure"]
        out.append(f"check: live at the first measured step {_mib(chk)} MiB (trace) vs torch.cuda.memory_allocated "
                   f"{_mib(r['allocated_at_measure'])} MiB; trace entries {r['trace_entries']}"
                   f"{' (WRAPPED: early events lost)' if r.get('trace_wrapped') else ''}, unknown frees "
                   f"{w['unknown_frees']}")
    d = doc.get("diff_torch")
    if d:
        out.append(f"\n## diff at the torch peak (torch.cuda.max_memory_allocated's view: bound pool slots counted, "
                   f"unbound and dedicated slots not): tide - stock = {_mib(d['total'])} MiB; top {min(top, 10)} "
                   "each way")
        out.append(_table(("+/-MiB", "tide MiB", "stock MiB", "group"),
                          [(("+" if x["delta"] > 0 else "") + _mib(x["delta"]), _mib(x["tide_bytes"]),
                            _mib(x["stock_bytes"]), x["group"]) for x in d["more"][:10] + d["less"][:10]]))
    d = doc.get("diff")
    if d:
        out.append(f"\n## diff at the device peak: tide - stock = {_mib(d['total'])} MiB "
                   f"(tide {_mib(d['tide_peak'])}, stock {_mib(d['stock_peak'])})")
        out.append("groups larger in tide (or only in tide):")
        out.append(_table(("+MiB", "tide MiB", "stock MiB", "group"),
                          [(_mib(x["delta"]), _mib(x["tide_bytes"]), _mib(x["stock_bytes"]),
                            x["group"] + (" [tide only]" if x["only"] == "tide" else "")) for x in d["more"][:top]]))
        out.append("largest savings (smaller in tide, or only in stock):")
        out.append(_table(("-MiB", "tide MiB", "stock MiB", "group"),
                          [(_mib(-x["delta"]), _mib(x["tide_bytes"]), _mib(x["stock_bytes"]),
                            x["group"] + (" [stock only]" if x["only"] == "stock" else "")) for x in d["less"][:top]]))
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    a = parser().parse_args(argv)
    if a.child:  # inside the child process
        doc = {"variant": a.child, "ok": False}
        try:
            doc.update(_child(a), ok=True)
        except ProbeError as e:
            doc["error"] = str(e)
        except Exception as e:  # the child's log has the traceback
            import traceback

            traceback.print_exc()
            doc["error"] = f"{type(e).__name__}: {e}"[:1000]
        with open(a.child_out, "w") as f:
            json.dump(doc, f)
        return 0 if doc["ok"] else 1
    if a.show:
        try:
            doc = json.loads(Path(a.show).read_text())
        except (OSError, ValueError) as e:
            print(f"fsdp_memory_probe: cannot read {a.show}: {e}", file=sys.stderr)
            return 2
        print(report(doc, a.top))
        return 0
    variants = [v for v in a.variants.split(",") if v]
    try:
        _checks(variants)
    except ProbeError as e:
        print(f"fsdp_memory_probe: {e}", file=sys.stderr)
        return 2
    import torch

    out_path = Path(a.out).resolve()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "command_line": "python benchmarks/fsdp_memory_probe.py "
        + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:])),
        "settings": {"torch": torch.__version__, "device": "?", "layers": a.layers,  # device: from a child
                     "hidden": a.hidden, "ffn": a.ffn, "vocab": a.vocab, "seq": a.seq, "tokens": a.tokens,
                     "warmup": a.warmup, "steps": a.steps, "slot_pool": a.slot_pool, "slot_trim": a.slot_trim},
        "variants": {},
    }
    for v in variants:
        print(f"fsdp_memory_probe: {v} ...", file=sys.stderr, flush=True)
        r = _run_child(v, a, out_path)
        doc["variants"][v] = r
        if r.get("ok"):
            doc["settings"]["device"] = r.get("device", "?")  # (the parent opens no CUDA context of its own)
        status = "ok" if r.get("ok") else f"FAILED: {r['error']}"
        print(f"fsdp_memory_probe: {v} {status} ({r.get('wall_s', 0):.0f} s, log {r.get('log')})", file=sys.stderr,
              flush=True)
        if not r.get("ok"):
            print(r.get("log_tail", ""), file=sys.stderr, flush=True)
        with open(out_path, "w") as f:  # after every variant: a later failure keeps the earlier results
            json.dump(doc, f, indent=1)
    t, s = doc["variants"].get("tide"), doc["variants"].get("stock")
    if t and s and t.get("ok") and s.get("ok"):
        tw, sw = t["analysis"]["windows"]["measured"], s["analysis"]["windows"]["measured"]
        doc["diff"] = diff_groups(tw["device_groups"], sw["device_groups"])
        doc["diff"].update(tide_peak=tw["device_peak_bytes"], stock_peak=sw["device_peak_bytes"])
        doc["diff_torch"] = diff_groups(tw["torch_groups"], sw["torch_groups"])
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
    print(report(doc, a.top))
    print(f"\nJSON: {out_path}")
    return 0 if all(r.get("ok") for r in doc["variants"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
