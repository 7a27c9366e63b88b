# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Host time per call of TIDE's Python entry points beside torch.distributed's NCCL call on the same bytes, in the
same processes: what a training loop pays on the CPU to issue each.

    python benchmarks/host_vs_nccl.py [--ranks 2 4] [--samples 15] [--calls 4] [--json FILE]

--ranks W: W processes share cuda:0 as a real NCCL world (every rank its own NCCL host: NCCL_HOSTID per rank,
NCCL_SOCKET_IFNAME=lo, NCCL_IB_DISABLE=1) declared one TIDE node (NCCL_TIDE_RANKS_PER_NODE=W); the TIDE comm is
Comm.from_process_group on torch's NCCL communicator, as nccl_tide.fsdp makes it. Each of several --ranks runs its
own world, one after the other.

Cases: "flat 16 MiB" (one bf16 parameter of 16 MiB) and "64 x 256K" (64 bf16 parameters of 256K elements: the
gradients one tensor each, as FSDP2 hands them over; the AG from per-parameter shards). Rows, each the host us per
call on the current stream (median over valid samples):

* tide rs: Comm.reduce_scatter(layout, grads, out) with an fp32 output, stream=None (the current stream, looked up
  per call as torch's call does); nccl rs: dist.reduce_scatter_tensor on one bf16 tensor of the gradients' bytes.
* tide ag: Comm.all_gather(layout, slot, sendbuf= / shards=); nccl ag: dist.all_gather_into_tensor of the same
  gathered bytes.
* tide rs C / tide ag C: the same library call with its ctypes arguments built beforehand (no Python checks): the
  part of the tide row spent in the library; the difference is the Python entry's own cost.

Method: every sample first holds the current stream behind a sleeping kernel (torch.cuda._sleep), so nothing a call
enqueues can run, and no call waits for the GPU, while the host issues `--calls` calls; the sample counts only if
that kernel was still running when the loop ended. The rows of one case are interleaved sample by sample (in a
rotating order), so a drift of the host's speed reaches them alike. Ranks sharing a GPU make the GPU's work slower,
not the host's enqueue: the ratios are what a node's processes would see, give or take their CPUs.

Printed: every rank's figures, the ratio tide / nccl per rank (same process, same samples), and its maximum over
the ranks: the target is a ratio <= 1.0 for RS and AG.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback

for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ.setdefault(_k, _v)  # inherited by the spawned ranks
WORLD_ENV = {"NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "32",
             "NCCL_TIDE_TIMEOUT_MS": "60000"}

MIB = 1 << 20
CASES = {"flat 16 MiB": [8 * MIB], "64 x 256K": [1 << 18] * 64}
ROWS = ("tide rs", "nccl rs", "tide rs C", "tide ag", "nccl ag", "tide ag C")
WARMUP_CALLS = 4  # per row, before the samples: the library captures its graph of a call after a few repeats
GATE_CYCLES = 40_000_000  # ~20 ms at 2 GHz; doubled after a sample it did not cover


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prebuilt(comm, layout, **kw):
    """The library call of a collective with its ctypes arguments built once (the 'C' rows)."""
    import ctypes

    import torch

    from nccl_tide import _native as N

    lib = N.lib()
    h, ch = layout.handle, comm.handle
    raw_stream = torch.cuda.current_stream().cuda_stream
    if "grads" in kw:
        table = N.pointer_table([g.data_ptr() for g in kw["grads"]])
        out = ctypes.c_void_p(kw["out"].data_ptr())
        scale = ctypes.c_float(1.0)

        def call():
            return lib.tideReduceScatter(ch, h, table, out, N.tideFloat32, N.tideSum, scale, None,
                                         raw_stream)
    else:
        table = None if kw.get("shards") is None else N.pointer_table([s.data_ptr() for s in kw["shards"]])
        send = None if kw.get("sendbuf") is None else ctypes.c_void_p(kw["sendbuf"].data_ptr())
        slot = ctypes.c_void_p(kw["slot"].data_ptr())

        def call():
            return lib.tideAllGather(ch, h, send, table, slot, raw_stream)

    def checked():
        if call() != 0:
            raise RuntimeError(f"TIDE call failed: {N.last_error()}")

    return checked


def _row_calls(comm, lay, slot, numels, world):
    """The rows' calls of one case: TIDE's Python entries, torch.distributed's on the same bytes, the library call."""
    import torch
    import torch.distributed as dist

    bf16, dev = torch.bfloat16, torch.device("cuda", 0)
    total = sum(numels)
    grads = [torch.randn(n, dtype=bf16, device=dev) for n in numels]
    out = torch.empty(lay.rs_out_numel, dtype=torch.float32, device=dev)
    if len(numels) == 1:
        ag_kw = {"sendbuf": torch.randn(lay.send_bytes // 2, dtype=bf16, device=dev)}
    else:
        ag_kw = {"shards": [torch.randn(p.shard_numel, dtype=bf16, device=dev) for p in lay.params]}
    rs_in = torch.randn(total, dtype=bf16, device=dev)  # the gradients' bytes as one tensor
    rs_out = torch.empty(total // world, dtype=bf16, device=dev)
    ag_in = torch.randn(total // world, dtype=bf16, device=dev)
    ag_out = torch.empty(total, dtype=bf16, device=dev)
    return {
        "tide rs": lambda: comm.reduce_scatter(lay, grads, out, op="sum"),
        "nccl rs": lambda: dist.reduce_scatter_tensor(rs_out, rs_in),
        "tide rs C": _prebuilt(comm, lay, grads=grads, out=out),
        "tide ag": lambda: comm.all_gather(lay, slot, **ag_kw),
        "nccl ag": lambda: dist.all_gather_into_tensor(ag_out, ag_in),
        "tide ag C": _prebuilt(comm, lay, slot=slot, **ag_kw),
    }


def _measure(fns, samples, calls):
    """{row: [us per call of each valid sample]} for the row functions `fns`, interleaved, the stream gated."""
    import torch

    got = {k: [] for k in fns}
    names = list(fns)
    cycles = GATE_CYCLES
    for s in range(samples):
        order = names[s % len(names):] + names[: s % len(names)]
        for name in order:
            fn = fns[name]
            torch.cuda._sleep(cycles)
            gate = torch.cuda.Event()
            gate.record()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            dt = time.perf_counter() - t0
            if gate.query():  # the gate opened while the host issued: the GPU may have made it wait
                cycles = min(cycles * 2, 16 * GATE_CYCLES)
            else:
                got[name].append(dt / calls * 1e6)
            torch.cuda.synchronize()
    return got


def _rank(rank, world, port, args, out_path):
    os.environ["NCCL_HOSTID"] = f"tide-bench-host-{rank}"
    rows, err, meta = [], None, {}
    try:
        import datetime

        import torch
        import torch.distributed as dist

        import nccl_tide
        from nccl_tide.comm import Comm

        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120), device_id=dev)
        comm = Comm.from_process_group()
        meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "provider": comm.provider,
                "nccl_tide": nccl_tide.__version__, "comm_ranks_per_node": comm.ranks_per_node}
        for name, numels in CASES.items():
            if args.only and args.only not in name:
                continue
            lay = nccl_tide.Layout(numels, "bf16", world, rank=rank)
            slot = comm.alloc_slot(lay.slot_bytes)
            fns = _row_calls(comm, lay, slot, numels, world)
            for _ in range(WARMUP_CALLS):  # agreement, own staging growth, NCCL's lazy set-up, bindings, graphs
                for fn in fns.values():
                    fn()
            torch.cuda.synchronize()
            dist.barrier()
            got = _measure(fns, args.samples, args.calls)
            row = {"case": name, "W": world, "P": len(numels), "calls": args.calls}
            for k, v in got.items():
                row[k] = statistics.median(v) if v else float("nan")
                row[k + " valid"] = len(v)
            rows.append(row)
            comm.synchronize(timeout=60)
            comm.free_slot(slot)
            lay.close()
            dist.barrier()
        comm.close()
        dist.destroy_process_group()
    except BaseException:
        err = traceback.format_exc()
    with open(f"{out_path}.rank{rank}", "w") as f:
        json.dump({"rank": rank, "rows": rows, "error": err, "meta": meta}, f)
    os._exit(0 if err is None else 1)


def _run_world(world, args, tmp):
    """Spawns the W ranks; returns their reports (None for a rank that wrote none)."""
    import torch.multiprocessing as mp

    base = os.path.join(tmp, f"w{world}.json")
    saved = {k: os.environ.get(k) for k in [*WORLD_ENV, "NCCL_TIDE_RANKS_PER_NODE"]}
    os.environ.update(WORLD_ENV, NCCL_TIDE_RANKS_PER_NODE=str(world))
    try:
        ctx = mp.start_processes(_rank, args=(world, _free_port(), args, base), nprocs=world, join=False,
                                 start_method="spawn")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    deadline = time.monotonic() + args.timeout
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                print(f"W={world}: ranks still running after {args.timeout:.0f} s: killed", file=sys.stderr)
                break
    except mp.ProcessExitedException as e:
        print(f"W={world}: a rank exited with {e.exit_code}", file=sys.stderr)
    reports = []
    for r in range(world):
        try:
            with open(f"{base}.rank{r}") as f:
                reports.append(json.load(f))
        except OSError:
            print(f"W={world}: rank {r} wrote no report", file=sys.stderr)
            reports.append(None)
    return reports


def ratios(row):
    """tide / nccl of one rank's row, RS and AG (NaN where a figure is missing)."""
    out = {}
    for coll in ("rs", "ag"):
        t, n = row.get(f"tide {coll}", float("nan")), row.get(f"nccl {coll}", float("nan"))
        out[coll] = t / n if n == n and n > 0 and t == t else float("nan")
    return out


def print_table(world, reports):
    m = next((r["meta"] for r in reports if r and r.get("meta")), {})
    print(f"# W={world}: {world} processes on one GPU, NCCL hosts, TIDE provider {m.get('provider')}; torch "
          f"{m.get('torch')}, {m.get('device')}, nccl_tide {m.get('nccl_tide')}")
    head = "".join(f"{k:>11}" for k in ROWS)
    print(f"{'case':<13}{'rank':>5}{head}{'rs x':>7}{'ag x':>7}{'valid':>7}")
    worst = {}
    for rep in reports:
        if rep is None:
            continue
        for row in rep["rows"]:
            r = ratios(row)
            valid = min(row.get(k + " valid", 0) for k in ROWS)
            cells = "".join(f"{row.get(k, float('nan')):>11.1f}" for k in ROWS)
            print(f"{row['case']:<13}{rep['rank']:>5}{cells}{r['rs']:>7.2f}{r['ag']:>7.2f}{valid:>7}")
            w = worst.setdefault(row["case"], {"rs": 0.0, "ag": 0.0})
            for c in ("rs", "ag"):
                w[c] = max(w[c], r[c]) if r[c] == r[c] else float("nan")
    for case, w in worst.items():
        verdict = "met" if w["rs"] <= 1.0 and w["ag"] <= 1.0 else "NOT met"
        print(f"# W={world} {case}: max over ranks tide/nccl: rs {w['rs']:.2f}x, ag {w['ag']:.2f}x (target <= 1.0: "
              f"{verdict})")
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--calls", type=int, default=4, help="calls per sample, all issued behind one gate")
    ap.add_argument("--only", default=None, help="substring of case names to run")
    ap.add_argument("--json", default=None)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per world")
    args = ap.parse_args()
    if min(args.ranks) < 2:
        print("--ranks: worlds of at least 2", file=sys.stderr)
        return 2
    rc, everything = 0, {}
    with tempfile.TemporaryDirectory(prefix="tide_host_vs_nccl_") as tmp:
        for world in args.ranks:
            reports = _run_world(world, args, tmp)
            for rep in reports:
                if rep is None or rep["error"]:
                    rc = 1
                    if rep is not None:
                        print(f"W={world} rank {rep['rank']} failed:\n{rep['error']}", file=sys.stderr)
            everything[world] = {"reports": reports, "worst": print_table(world, reports)}
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
