# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""FSDP2 training-step benchmark: stock FSDP2, FSDP2 with symmetric memory, and TIDE, on one Llama-style model.

    torchrun --nproc_per_node 8 benchmarks/fsdp_step.py --layers 8 --hidden 4096 --seq 4096 --tokens 16384
    NCCL_MULTI_RANK_GPU_ENABLE=1 torchrun --nproc_per_node 2 benchmarks/fsdp_step.py --ranks-per-gpu 2 (NCCL >= 2.30)
    python benchmarks/fsdp_step.py --mode layout-cost --models llama3-70b-layer,llama3-8b-layer --worlds 8,64

step mode (needs CUDA; under torchrun, or one process = world size 1): bf16 parameters for compute, fp32 master
weights and fp32 gradient reduction (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)), fully_shard per
block and on the root, AdamW. Per variant: step time (CUDA events per step, median and spread over --steps after
--warmup), the share of step time in NCCL all-gather / reduce-scatter kernels and in FSDP2's layout conversion
kernels (split_with_sizes_copy copy-out, chunk_cat copy-in; also in us per step), copy-engine memcpy time, comm SM
time (NCCL and TIDE kernels: summed durations, and "occ.-weighted", each duration x min(1, CTAs / SMs)) from
torch.profiler over --profile-steps steps, and memory: torch peak
(torch.cuda.max_memory_allocated over the timed steps; with the pool's default alloc binder it includes the slots
bound at that moment), TIDE slots (the tideSlotAlloc bytes TIDE holds, resident; the JSON's torch_slot_GiB: pool
slots in torch's own memory, already in the torch peak), and peak total (one more step
under fsdp/_slot_pool.MemoryMeter: the maximum over the step of torch's allocated bytes plus the slot bytes torch
does not count at that moment; stock: its torch peak). Compare peak total across variants: torch peak + TIDE slots
double-counts the pool slots bound at torch's peak. Each variant starts after gc.collect() (FSDP2 modules are reference
cycles) and reports start_allocated_GiB, what the earlier variants left allocated (0 unless something leaks); for a
per-allocation breakdown of the peak, benchmarks/fsdp_memory_probe.py.
Shares are summed kernel durations / step time; kernels on other streams overlap compute, so they are loads, not a
critical path. Variants that cannot run print a row saying why. Every variant trains the same model from the same
seed on the same batches, so its per-step losses are compared with stock's (`loss vs stock`: = when bit-identical,
else the largest difference; --deterministic makes the compute deterministic so that only communication can differ).

Several ranks per GPU (--ranks-per-gpu K or NCCL_TIDE_RANKS_PER_GPU; nccl_tide.devices): rank -> GPU LOCAL_RANK %
device count, NCCL told to allow it (each rank its own NCCL host, NCCL_HOSTID, or NCCL_MULTI_RANK_GPU_ENABLE=1 on
NCCL >= 2.30; benchmarks/README.md) and TIDE's node declared (NCCL_TIDE_RANKS_PER_NODE) where ranks are distinct
NCCL hosts. The banner and the JSON's notes then say that such step times are not a node's.

layout-cost mode (one GPU): fsdp_layout_cost.py (per-layer copy-out / copy-in of stock FSDP2 vs TIDE's none).

pool-check mode (CPU, gloo; fsdp_pool_check.py): per world size (--worlds, default 2,4) stock FSDP2 vs the
native executor over a simulated tideComm with --slot-pool (default 2) slots; asserts bit identity to stock and that
the pool's peak slot bytes equal the bytes of the groups stock FSDP2 holds unsharded at once (exit 1 otherwise).

On a machine without CUDA the step and layout-cost modes exit with status 2 and a message saying what they need (the
FSDP2 parity of TIDE on CPU/gloo is covered by tests/multirank/test_fsdp_parity.py and the pool-check mode).
"""

import argparse
import json
import math
import os
import shlex
import statistics
import sys
from typing import List, Optional

from fsdp_model import LlamaConfig

VARIANTS = ("stock", "symm", "tide", "tide-dedicated")
NO_CUDA = (
    "needs a CUDA GPU (step mode: one per torchrun process; layout-cost mode: one) and found "
    "none. On a CPU machine, FSDP2 parity with TIDE is covered by tests/multirank/test_fsdp_parity.py (gloo)."
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/fsdp_step.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["step", "layout-cost", "pool-check"], default="step")
    p.add_argument(
        "--variants",
        default="stock,tide,symm",
        help="comma list of stock, tide (native executor, default slot pool), tide-dedicated (one resident slot per "
        "group, slot_pool=0), symm (symm last: a failure there cannot disturb the others)",
    )
    p.add_argument(
        "--slot-pool",
        type=int,
        default=None,
        help="tide variant: nccl_tide.fsdp.enable(slot_pool=N) (default: enable()'s default); tide-dedicated is 0",
    )
    p.add_argument(
        "--slot-trim",
        choices=["auto", "on", "off", "all"],
        default="auto",
        help="tide variant: enable(slot_trim=None|True|False|'all'): the pool frees its slots at the end of forward "
        "(auto: on at shard world size 1; all: also at the end of backward, the root's slot too)",
    )
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per GPU per step (batch = tokens / seq)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--profile-steps", type=int, default=2, help="steps under torch.profiler (0: no SM figures)")
    p.add_argument(
        "--ranks-per-gpu",
        type=int,
        default=None,
        help="step mode: let up to this many local ranks share a GPU (NCCL must allow it: NCCL_HOSTID per rank, or "
        "NCCL_MULTI_RANK_GPU_ENABLE=1 on NCCL >= 2.30) (default: NCCL_TIDE_RANKS_PER_GPU, else one GPU per rank)",
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="step mode: torch.use_deterministic_algorithms (warn only), so that losses differ only where the "
        "communication does",
    )
    p.add_argument("--models", default="llama3-70b-layer,llama3-8b-layer", help="layout-cost: layer layouts")
    p.add_argument("--worlds", default=None, help="layout-cost: simulated world sizes (default 8,64); pool-check: "
                   "gloo world sizes (default 2,4)")
    p.add_argument("--iters", type=int, default=20, help="layout-cost: timed iterations")
    p.add_argument(
        "--variant-timeout",
        type=float,
        default=300.0,
        help="step mode: seconds per variant; a variant still running then is reported as hung and the process "
        "exits with status 3 (the JSON keeps the variants done so far)",
    )
    p.add_argument("-J", "--json", default=None, help="write the results as JSON")
    return p


# ---------------------------------------------------------------------------------------------
# Kernel classification (CPU-testable)
# ---------------------------------------------------------------------------------------------


def classify_kernel(name: str) -> str:
    """ag / rs (NCCL collectives), comm (other NCCL kernels), layout (FSDP2 copy-out / copy-in), tide (TIDE's reduce
    kernel) or compute."""
    n = name.lower()
    if "nccl" in n:
        if "allgather" in n or "all_gather" in n:
            return "ag"
        if "reducescatter" in n or "reduce_scatter" in n:
            return "rs"
        return "comm"
    if "split_with_sizes_copy" in n or "chunk_cat" in n or "chunkcat" in n:
        return "layout"
    if "tide" in n:
        return "tide"
    return "compute"


def summarize_trace(events, steps: int, sm_count: int = 0) -> dict:
    """Per-step summed durations (us) by class, plus ce_memcpy_us (memcpy events: copy engines) and comm_sm_us.

    comm_sm_us sums the communication kernels' durations, which counts a kernel stretched by the compute it shares
    the GPU with (or one of few CTAs running long) as fully as one holding every SM. With sm_count > 0,
    comm_sm_weighted_us also weighs each by min(1, CTAs / SMs) (share.method.occupancy_weighted_us, the
    share benchmark's measure; the grid from the trace's "grid" argument; a kernel without it counts as holding every
    SM)."""
    from share.method import occupancy_weighted_us

    comm = ("ag", "rs", "comm", "tide")  # the kernel classes of communication
    out = {k: 0.0 for k in (*comm, "layout", "compute", "memcpy")}
    comm_kernels = []  # (duration us, CTAs) of the communication kernels
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        dur = float(e.get("dur", 0.0))
        if cat == "kernel":
            cls = classify_kernel(str(e.get("name", "")))
            out[cls] += dur
            if cls in comm:
                grid = (e.get("args") or {}).get("grid")
                ok = isinstance(grid, list) and grid
                comm_kernels.append((dur, math.prod(int(x) for x in grid) if ok else max(sm_count, 1)))
        elif cat == "gpu_memcpy":
            out["memcpy"] += dur
    per = {f"{k}_us": v / max(steps, 1) for k, v in out.items()}
    per["comm_sm_us"] = sum(per[f"{k}_us"] for k in comm)
    if sm_count > 0:
        per["comm_sm_weighted_us"] = occupancy_weighted_us(comm_kernels, sm_count) / max(steps, 1)
    return per


# ---------------------------------------------------------------------------------------------
# Step mode
# ---------------------------------------------------------------------------------------------


def _init_dist(ranks_per_gpu: Optional[int] = None):
    """(torch.distributed, rank, world size, device, ranks share GPUs) of this process (nccl_tide.devices: the rank's
    GPU, and NCCL's refusal of ranks sharing one explained)."""
    from nccl_tide.devices import init_nccl_process_group

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist, device, shared = init_nccl_process_group(ranks_per_gpu)
    return dist, dist.get_rank(), dist.get_world_size(), device, shared


def compare_losses(rows: List[dict]) -> None:
    """Adds to every variant that ran its per-step losses against stock's: loss_vs_stock = {"equal": bit-identical
    lists, "max_abs_diff"}, or None where stock did not run (then nothing to compare with)."""
    stock = next((r for r in rows if r["variant"] == "stock" and r.get("ran")), None)
    for r in rows:
        if not r.get("ran") or r is stock:
            continue
        if stock is None or len(stock["losses"]) != len(r["losses"]):
            r["loss_vs_stock"] = None
            continue
        diff = max((abs(a - b) for a, b in zip(stock["losses"], r["losses"])), default=0.0)
        r["loss_vs_stock"] = {"equal": stock["losses"] == r["losses"], "max_abs_diff": diff}


def loss_cell(r: dict) -> str:
    """The table's `loss vs stock`: '=' bit-identical losses, else the largest difference; '-' nothing to compare."""
    c = r.get("loss_vs_stock")
    if c is None:
        return "-"
    return "=" if c["equal"] else f"max diff {c['max_abs_diff']:.2e}"


def shared_gpu_notes(dist, shared: bool, device) -> List[str]:
    """[SHARED_GPU_CAVEAT] when ranks of any host share a GPU (every rank learns it: one all_reduce), else []."""
    import torch
    from nccl_tide.devices import SHARED_GPU_CAVEAT

    flag = torch.tensor([int(shared)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return [SHARED_GPU_CAVEAT] if flag.item() else []


def _shard(model, variant: str, slot_pool=None, slot_trim="auto"):
    """fully_shard per block and root; returns (None, note) on success or (reason, None) when the variant cannot run."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    mods = [m for m in model.modules() if hasattr(m, "set_symm_mem_for_comm")]
    if variant == "symm":
        if not mods:
            return f"unavailable: torch {torch.__version__} has no FSDPModule.set_symm_mem_for_comm", None
        try:
            for m in mods:
                m.set_symm_mem_for_comm()
        except Exception as e:
            return f"unavailable: set_symm_mem_for_comm failed: {type(e).__name__}: {e}"[:300], None
        pol = os.environ.get("NCCL_CTA_POLICY")
        return None, f"set_symm_mem_for_comm on {len(mods)} modules; NCCL_CTA_POLICY={pol or 'unset'}"
    if variant in ("tide", "tide-dedicated"):
        kw = {"slot_pool": 0} if variant == "tide-dedicated" else ({} if slot_pool is None else {"slot_pool": slot_pool})
        if variant == "tide":  # auto: enable(slot_trim=None), on at world size 1 (the default)
            kw["slot_trim"] = None if slot_trim == "auto" else "all" if slot_trim == "all" else slot_trim == "on"
        try:
            import nccl_tide.fsdp

            h = nccl_tide.fsdp.enable(model, executor="native", **kw)
        except Exception as e:
            return f"unavailable: nccl_tide.fsdp.enable(executor='native', {kw}): {type(e).__name__}: {e}"[:400], None
        st = h.stats()
        pool = st.get("slot_pool") or {}
        return None, (
            f"TIDE groups {len(st['tide_groups'])}, stock groups {len(st['stock_groups'])}, "
            f"slot pool size {pool.get('size', 0)} x {pool.get('slot_capacity', 0)} B ({pool.get('binder')} binder), "
            f"{pool.get('dedicated_slots', 0)} dedicated, "
            f"trim {'at ' + ' and '.join(pool.get('trim_at') or []) if pool.get('trim') else 'off'}"
        )
    return None, ""


class VariantRun:
    """One variant's model (sharded, TIDE enabled for the tide variants), AdamW and batch: what run_variant measures
    (benchmarks/fsdp_memory_probe.py builds its variants with this class too, so both run the same step).

    `reason` is set (and nothing else kept) when the variant cannot run. close() disables TIDE, drops every reference
    and runs gc.collect(): FSDP2 modules live in reference cycles (module -> FSDPState -> hooks -> module), so dropping
    the last name does not free the sharded parameters; a variant measured after another one used to count the earlier
    variants' models in its peak (about 4.2 GiB of fp32 sharded parameters per earlier variant at 1.13B
    parameters)."""

    def __init__(self, variant: str, cfg: LlamaConfig, a, rank: int, device):
        import torch

        from fsdp_model import build

        self.variant, self.cfg = variant, cfg
        self.device = torch.device(device)
        self.opt = self.x = self.y = None
        self.model = build(cfg, seed=0, device=self.device)
        self.reason, self.note = _shard(
            self.model, variant, getattr(a, "slot_pool", None), getattr(a, "slot_trim", "auto") or "auto"
        )
        if self.reason:
            self.close()
            return
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, foreach=True)
        batch = max(1, a.tokens // a.seq)
        g = torch.Generator(device=self.device).manual_seed(100 + rank)
        tokens = torch.randint(0, cfg.vocab, (batch, a.seq + 1), device=self.device, generator=g)
        self.x, self.y = tokens[:, :-1], tokens[:, 1:]

    def step(self, mark=None):
        """One training step; mark(phase) is called before 'backward' and before 'optimizer' (the memory probe's
        phase markers)."""
        import torch

        logits = self.model(self.x)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, self.cfg.vocab), self.y.reshape(-1))
        if mark is not None:
            mark("backward")
        loss.backward()
        if mark is not None:
            mark("optimizer")
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def tide_stats(self) -> Optional[dict]:
        import nccl_tide.fsdp

        return nccl_tide.fsdp.stats(self.model) if self.model is not None else None

    def close(self) -> None:
        import gc

        import torch

        if self.model is not None and self.variant.startswith("tide"):
            try:
                import nccl_tide.fsdp

                nccl_tide.fsdp.disable(self.model)
            except Exception:
                pass
        self.model = self.opt = self.x = self.y = None
        gc.collect()  # the FSDP2 reference cycles (class docstring)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def run_variant(variant: str, cfg: LlamaConfig, a, rank: int, world: int, device) -> dict:
    import gc

    import torch

    row = {"variant": variant, "ran": False}
    gc.collect()
    torch.cuda.empty_cache()
    # what earlier variants (or anything else in the process) left allocated: part of this variant's torch peak
    row["start_allocated_GiB"] = torch.cuda.memory_allocated(device) / 2**30
    v = VariantRun(variant, cfg, a, rank, device)
    if v.reason:
        row["reason"] = v.reason
        return row
    row["note"] = v.note
    step = v.step
    try:
        losses = []  # every step's loss, read after the timed steps (reading one syncs the host with the GPU)
        for _ in range(a.warmup):
            losses.append(step().detach())
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        times = []
        for _ in range(a.steps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            loss = step()
            e.record()
            times.append((s, e))
            losses.append(loss.detach())
        torch.cuda.synchronize()
        ms = sorted(s.elapsed_time(e) for s, e in times)
        row["step_ms"] = {
            "median": statistics.median(ms),
            "min": ms[0],
            "max": ms[-1],
            "p25": ms[len(ms) // 4],
            "p75": ms[(3 * len(ms)) // 4],
            "n": len(ms),
        }
        row["peak_mem_GiB"] = torch.cuda.max_memory_allocated(device) / 2**30  # torch's peak over the timed steps
        row["loss"] = float(loss.item())
        row["losses"] = [float(x.item()) for x in losses]
        loss = losses = None
        # one more step for memory alone: torch's peak + TIDE's slot bytes outside torch at that moment
        # (fsdp/_slot_pool.MemoryMeter: exact, read at every slot bind/unbind; stock: torch's peak)
        from nccl_tide.fsdp import _slot_pool

        torch.cuda.synchronize()
        meter = _slot_pool.start_meter(device)
        try:
            step()
            torch.cuda.synchronize()
        finally:
            _slot_pool.stop_meter()
        row["peak_total_GiB"] = meter.read() / 2**30
        # allocated now (trimmed slots not): TIDE's own (tideSlotAlloc) bytes; a pool on torch memory (the torch
        # binder at shard world size 1) is in torch's counters and reported apart
        row["slot_GiB"] = _slot_pool.tide_resident_bytes() / 2**30
        row["torch_slot_GiB"] = (_slot_pool.resident_bytes() - _slot_pool.tide_resident_bytes()) / 2**30
        if a.profile_steps > 0:
            row["profile"] = _profile(step, a.profile_steps)
            med_us = row["step_ms"]["median"] * 1e3
            p = row["profile"]
            row["share"] = {
                "ag_rs": (p["ag_us"] + p["rs_us"]) / med_us,
                "layout": p["layout_us"] / med_us,
                "ce_memcpy": p["memcpy_us"] / med_us,
            }
        if variant.startswith("tide"):
            st = v.tide_stats() or {}
            row["tide_stats"] = st.get("total")  # TIDE AG/RS calls and per-call fallbacks to stock
            row["slot_pool"] = st.get("slot_pool")
        row["ran"] = True
    except Exception as e:
        row["reason"] = f"failed: {type(e).__name__}: {e}"[:400]
    finally:
        step = None
        v.close()  # TIDE disabled, model and optimizer collected (frees the variant's memory before the next one)
    row["end_allocated_GiB"] = torch.cuda.memory_allocated(device) / 2**30  # should be back at start_allocated_GiB
    return row


def _profile(step, steps: int) -> dict:
    from nccl_tide.perf.gpu import profiled_events

    import torch

    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return summarize_trace(profiled_events(step, steps), steps, sm_count=sms)


def _left_over(r: dict) -> str:
    """A warning for the note column when the variant did not start from an empty device (its torch peak then
    includes what was left; run_variant collects garbage before each variant, so this means a real leak)."""
    left = r.get("start_allocated_GiB", 0.0)
    return f"[started with {left:.2f} GiB allocated by earlier variants: in its torch peak] " if left >= 0.01 else ""


def step_table(rows: List[dict]) -> str:
    head = (
        "variant",
        "step ms (median)",
        "min-max",
        "AG+RS %",
        "layout %",
        "CE memcpy %",
        "layout us/step",
        "comm SM us/step",
        "occ.-weighted",
        "torch peak GiB",
        "TIDE slots GiB",
        "peak total GiB",
        "loss vs stock",
        "note",
    )
    lines = []
    for r in rows:
        if not r.get("ran"):
            lines.append((r["variant"], "N/A", "", "", "", "", "", "", "", "", "", "", "", r.get("reason", "")))
            continue
        st, sh, p = r["step_ms"], r.get("share", {}), r.get("profile", {})
        pct = lambda k, sh=sh: f"{100 * sh[k]:.1f}" if k in sh else "-"  # noqa: E731
        lines.append(
            (
                r["variant"],
                f"{st['median']:.2f}",
                f"{st['min']:.2f}-{st['max']:.2f}",
                pct("ag_rs"),
                pct("layout"),
                pct("ce_memcpy"),
                f"{p['layout_us']:.0f}" if "layout_us" in p else "-",
                f"{p['comm_sm_us']:.0f}" if p else "-",
                f"{p['comm_sm_weighted_us']:.0f}" if "comm_sm_weighted_us" in p else "-",
                f"{r['peak_mem_GiB']:.2f}",
                f"{r.get('slot_GiB', 0.0):.2f}",
                f"{r['peak_total_GiB']:.2f}" if "peak_total_GiB" in r else "-",
                loss_cell(r),
                _left_over(r) + r.get("note", ""),
            )
        )
    w = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h) for i, h in enumerate(head)]
    out = [
        "| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(head)) + " |",
        "|" + "|".join("-" * (x + 2) for x in w) + "|",
    ]
    out += ["| " + " | ".join(x[i].ljust(w[i]) for i in range(len(head))) + " |" for x in lines]
    return "\n".join(out)


def _versions() -> dict:
    from nccl_tide.perf.gpu import versions

    return versions()


class _Watchdog:
    """A variant that hangs (a collective that never completes) must not hang the benchmark: after `seconds` this
    prints which variant, writes the JSON of the variants done so far and ends the process with status 3."""

    def __init__(self, seconds: float, variant: str, rows: list, doc: dict, json_path: Optional[str]):
        import threading

        self.seconds, self.variant, self.rows, self.doc, self.json_path = seconds, variant, rows, doc, json_path
        self.timer = threading.Timer(seconds, self._fire)
        self.timer.daemon = True

    def _fire(self):
        msg = f"variant {self.variant} did not finish within {self.seconds:.0f} s (hung?)"
        print(f"fsdp_step: {msg}; exiting with status 3", file=sys.stderr, flush=True)
        if self.json_path:
            doc = dict(
                self.doc, results=self.rows + [{"variant": self.variant, "ran": False, "reason": f"hung: {msg}"}]
            )
            with open(self.json_path, "w") as f:
                json.dump(doc, f, indent=2)
        os._exit(3)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parser().parse_args(argv)
    from nccl_tide.perf.gpu import no_multicast_env

    no_multicast_env()
    try:
        import torch
    except ImportError:
        print("fsdp_step: needs PyTorch: pip install torch", file=sys.stderr)
        return 2
    if a.mode == "pool-check":  # CPU, gloo
        import fsdp_pool_check as pool_check

        worlds = [int(x) for x in (a.worlds or "2,4").split(",") if x]
        k = 2 if a.slot_pool is None else a.slot_pool
        print(
            f"# slot pool check on CPU/gloo, torch {torch.__version__}: stock FSDP2 vs nccl_tide.fsdp native "
            f"(simulated tideComm), slot_pool={k}, {pool_check.CFG.layers} blocks, {pool_check.STEPS} steps, "
            f"worlds {worlds}"
        )
        rows, failures = pool_check.run(worlds, k)
        print(pool_check.table(rows))
        for f in failures:
            print(f"FAILED: {f}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"mode": a.mode, "torch": torch.__version__, "results": rows, "failures": failures}, f, indent=2)
        return 1 if failures or not rows else 0
    if not torch.cuda.is_available():
        print(f"fsdp_step: {NO_CUDA}", file=sys.stderr)
        return 2
    doc = {
        "command_line": "python benchmarks/fsdp_step.py " + " ".join(shlex.quote(x) for x in argv),
        "mode": a.mode,
        "versions": _versions(),
    }
    if a.mode == "layout-cost":
        import fsdp_layout_cost as layout_cost

        rows = []
        for m in [x for x in a.models.split(",") if x]:
            for w in [int(x) for x in (a.worlds or "8,64").split(",") if x]:
                rows.append(layout_cost.measure(m, w, a.iters))
        print(
            f"# layout cost per FSDP2 rank and layer, {doc['versions'].get('device', '?')}, torch "
            f"{torch.__version__}: stock FSDP2 copy-out ({rows[0]['copy_out_op'] if rows else '?'}) and fp32 "
            f"copy-in ({rows[0]['copy_in_op'] if rows else '?'}); TIDE has neither"
        )
        print(layout_cost.table(rows))
        doc["results"] = rows
        wrong = sum(r["wrong_params"] for r in rows)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(doc, f, indent=2)
        return 1 if wrong else 0

    variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        print(
            f"fsdp_step: unknown --variants {bad}; choose from {', '.join(VARIANTS)}", file=sys.stderr
        )
        return 2
    if a.ranks_per_gpu is not None and a.ranks_per_gpu < 1:
        print(f"fsdp_step: --ranks-per-gpu must be >= 1, got {a.ranks_per_gpu}", file=sys.stderr)
        return 2
    if a.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS' deterministic workspace
        torch.use_deterministic_algorithms(True, warn_only=True)
    from nccl_tide.errors import TideError

    try:
        dist, rank, world, device, shared = _init_dist(a.ranks_per_gpu)
    except TideError as e:  # no GPU for this rank, or NCCL refused ranks sharing one: say what to set
        print(f"fsdp_step: {e.detail}", file=sys.stderr)
        return 2
    notes = shared_gpu_notes(dist, shared, device)
    cfg = LlamaConfig(a.layers, a.hidden, a.heads, a.kv_heads, a.ffn, a.vocab)
    doc.update(
        {
            "notes": notes,
            "deterministic": a.deterministic,
            "world_size": world,
            "model": dict(cfg._asdict(), n_params=cfg.n_params()),
            "seq": a.seq,
            "tokens_per_gpu": a.tokens,
            "warmup": a.warmup,
            "steps": a.steps,
        }
    )
    rows = []
    for v in variants:
        with _Watchdog(a.variant_timeout, v, rows, doc, a.json if rank == 0 else None):
            rows.append(run_variant(v, cfg, a, rank, world, device))
            dist.barrier(device_ids=[device.index])
    compare_losses(rows)
    if rank == 0:
        print(
            f"# FSDP2 step, world size {world}, {doc['versions'].get('device', '?')}, torch {torch.__version__}, "
            f"NCCL {doc['versions'].get('nccl_torch', '?')}; Llama-style {cfg.layers} layers, hidden {cfg.hidden}, "
            f"{cfg.n_params() / 1e9:.2f}B params, seq {a.seq}, {a.tokens} tokens/GPU; bf16 params, fp32 reduce"
        )
        for note in notes:
            print(f"# {note}")
        print(step_table(rows))
        doc["results"] = rows
        if a.json:
            with open(a.json, "w") as f:
                json.dump(doc, f, indent=2)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
