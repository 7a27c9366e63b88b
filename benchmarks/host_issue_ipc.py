# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Host issue time per rank per call when each rank is its own process (CUDA IPC peer memory).

    python benchmarks/host_issue_ipc.py [--ranks 2] [--device-per-rank] [--json FILE] [--samples 9] [--only SUBSTRING]

benchmarks/host_issue.py measures loopback worlds, where one process issues every rank's call and the ranks share
the device's hardware queues: the library then issues a token program in issue rounds (one graph launch per round
per rank, docs/architecture.md "More chunks than buffers"). A real node runs one process per GPU; this benchmark
runs that shape on one GPU: --ranks processes on cuda:0 (with --device-per-rank rank r on cuda:r, a node's shape,
which needs a machine of several GPUs), a gloo bootstrap, CUDA IPC peer memory
(Comm.from_bootstrap, as tests/multirank/test_multiprocess.py). Each process measures its own host time per call with
nccl_tide.perf.issue_cost (its stream gated behind a sleeping kernel, prebuilt ctypes arguments, a sample counts only
if the gate was still closed when the loop ended; median over samples), and also the host time of replaying a
graph that captured the call (one cuGraphLaunch; for the RS, the Slot-Reuse call below, since a captured RS needs
Slot-Reuse staging). Rank 0 prints every rank's median and the maximum.

Each RS row also runs with Slot-Reuse staging (a slot of rs_staging_bytes): `slot us` is that eager call and `slot
replay` the same call captured into a user graph and launched (one cuGraphLaunch; the graph's nodes by kind are
printed under the row), so `slot us` - `slot replay` is what the call costs outside its graph launch (checks,
binding lookup, the announce, the library's own graph launch against the user's). `floor` is each process's launch
floor (a one-node graph, issue_graphs.prepare_launch_floor) read before the rows: the host's launch speed.

GPU latency is not measured: the processes' contexts time-slice one GPU, so device time here is not one GPU's share
of a node (benchmarks/share/ measures that). Cases as host_issue.py's, at W = --ranks: flat AG/RS of 1 and 64 MiB
of gathered output, one Llama-3.1-8B layer (AG from per-parameter shards, RS of 4 chunks), 64 parameters (AG from
shards, RS of 4 chunks).
"""

import argparse
import datetime
import json
import os
import socket
import sys
import time
import traceback

for k, v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ.setdefault(k, v)  # inherited by the spawned ranks
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_issue import LLAMA8B_LAYER  # noqa: E402


def cases(w):
    mib = 1 << 20
    out = [(f"flat {size // mib} MiB", [size // 2], None) for size in (1 * mib, 64 * mib)]
    out.append(("llama8b layer", LLAMA8B_LAYER, 4))
    out.append(("64 params", [1 << 18] * 64, 4))
    return out


def _max(xs):
    """The largest figure, or NaN if any rank has none (Python's max() with a NaN depends on the order)."""
    return float("nan") if any(x != x for x in xs) else max(xs)


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, world, port, args, out_path):
    rows, err, meta = [], None, {}
    try:
        import torch
        import torch.distributed as dist

        import nccl_tide
        from nccl_tide import _native as N
        from nccl_tide.comm import Comm
        from nccl_tide.dtypes import dtype as to_dtype
        from nccl_tide.dtypes import op_code
        import issue_graphs as ig
        from nccl_tide.perf import issue_cost as ic

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        d = rank if args.device_per_rank else 0
        torch.cuda.set_device(d)
        dev = torch.device("cuda", d)
        comm = Comm.from_bootstrap(rank, world, device=d)
        stream = torch.cuda.Stream(device=dev)  # not the legacy default stream: the replay rows capture on it
        meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name(d),
                "nccl_tide": nccl_tide.__version__,
                "token_rs_chunks": int(N.param_value("NCCL_TIDE_TOKEN_RS_CHUNKS")),
                "eager_graphs": N.param_value("NCCL_TIDE_EAGER_GRAPHS")}
        with torch.cuda.stream(stream):
            fl = ig.prepare_launch_floor(ic.OneRank(comm))
            meta["floor_us"] = ic.host_issue_us(fl, calls=args.calls, samples=args.samples)["host_us"]
            fl.close()
            for name, numels, chunks in cases(world):
                if args.only and args.only not in name:
                    continue
                for coll in ("ag", "rs"):
                    rs_chunk = None
                    if coll == "rs" and chunks:
                        probe = nccl_tide.Layout(numels, "bf16", world, rank=rank)
                        rs_chunk = -(-probe.rs_out_numel // chunks) * 4
                        probe.close()
                    lay = nccl_tide.Layout(numels, "bf16", world, rank=rank, rs_chunk_bytes=rs_chunk)
                    keep = []
                    if coll == "ag":
                        slot = comm.alloc_slot(lay.slot_bytes)
                        if len(numels) == 1:
                            send = torch.randn(lay.send_bytes // 2, dtype=torch.bfloat16, device=dev)
                            prep = ic.prepare_comm_all_gather(comm, lay, slot, sendbuf=send)
                            keep.append(send)
                        else:
                            shards = [torch.randn(p.shard_numel, dtype=torch.bfloat16, device=dev) for p in lay.params]
                            prep = ic.prepare_comm_all_gather(comm, lay, slot, shards=shards)
                            keep.append(shards)
                    else:
                        grads = [torch.randn(n, dtype=torch.bfloat16, device=dev) for n in numels]
                        out = torch.empty(lay.rs_out_numel, dtype=torch.float32, device=dev)
                        prep = ic.prepare_comm_reduce_scatter(comm, lay, grads, out, op_code("sum"),
                                                              to_dtype("fp32").code)
                        keep.append((grads, out))
                    calls = ic.calls_per_sample(prep.copies, prep.graph_route, args.calls)
                    h = ic.host_issue_us(prep, calls=calls, samples=args.samples)
                    row = {"case": name, "W": world, "P": len(numels), "coll": coll, "calls": calls,
                           "chunks": lay.rs_num_chunks if coll == "rs" else 0, **h}
                    if coll == "ag":  # a captured RS needs Slot-Reuse staging (own staging may grow): AG only
                        try:
                            graphs = ig.prepare_graph_replays(prep)
                            row["replay_host_us"] = ic.host_issue_us(graphs, calls=calls,
                                                                     samples=args.samples)["host_us"]
                            graphs.close()
                        except Exception as e:  # report, do not hide: the row says why
                            row["replay_error"] = f"{type(e).__name__}: {str(e)[:160]}"
                    if coll == "rs":  # Slot-Reuse staging: eager, then captured and replayed
                        stag = comm.alloc_slot(lay.rs_staging_bytes)
                        try:
                            ps = ic.prepare_comm_reduce_scatter(comm, lay, grads, out, op_code("sum"),
                                                                to_dtype("fp32").code, staging=stag)
                            row["slot_host_us"] = ic.host_issue_us(ps, calls=calls, samples=args.samples)["host_us"]
                            graphs = ig.prepare_graph_replays(ps)
                            row["replay_host_us"] = ic.host_issue_us(graphs, calls=calls,
                                                                     samples=args.samples)["host_us"]
                            row["replay_census"] = graphs.census[0]
                            graphs.close()
                        except Exception as e:  # report, do not hide: the row says why
                            row["replay_error"] = f"{type(e).__name__}: {str(e)[:160]}"
                        comm.synchronize(timeout=60)
                        comm.free_slot(stag)
                    comm.synchronize(timeout=60)
                    rows.append(row)
                    if coll == "ag":
                        comm.free_slot(slot)
                    lay.close()
                    del keep, prep
                    dist.barrier()
        comm.close()
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        err = traceback.format_exc()
    with open(f"{out_path}.rank{rank}", "w") as f:
        json.dump({"rank": rank, "rows": rows, "error": err, "meta": meta}, f)
    os._exit(0 if err is None else 1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--device-per-rank", action="store_true",
                    help="rank r on cuda:r (a node's shape: no GPU shared between processes) instead of all on cuda:0")
    ap.add_argument("--json", default=None)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--samples", type=int, default=9)
    ap.add_argument("--only", default=None, help="substring of case names to run")
    ap.add_argument("--timeout", type=float, default=240.0)
    args = ap.parse_args()
    # Inherited by the spawned ranks: a rank whose peer stopped issuing raises instead of hanging. Set here, not at
    # import, so that importing this module (its tests do) leaves the importing process's environment alone.
    os.environ.setdefault("NCCL_TIDE_TIMEOUT_MS", "60000")
    if args.ranks < 2:
        print("--ranks must be at least 2", file=sys.stderr)
        return 2
    if args.device_per_rank:
        import torch

        if torch.cuda.device_count() < args.ranks:
            print(f"--device-per-rank needs {args.ranks} GPUs; {torch.cuda.device_count()} visible", file=sys.stderr)
            return 2
    import tempfile

    import torch.multiprocessing as mp

    tmp = tempfile.mkdtemp(prefix="tide_host_ipc_")
    base = os.path.join(tmp, "rows.json")
    ctx = mp.start_processes(_rank, args=(args.ranks, _free_port(), args, base), nprocs=args.ranks, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + args.timeout
    rc = 0
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                print(f"ranks still running after {args.timeout:.0f} s: killed", file=sys.stderr)
                rc = 1
                break
    except mp.ProcessExitedException as e:
        print(f"a rank exited with {e.exit_code}", file=sys.stderr)
        rc = 1
    reports = []
    for r in range(args.ranks):
        try:
            with open(f"{base}.rank{r}") as f:
                reports.append(json.load(f))
        except OSError:
            print(f"rank {r} wrote no report", file=sys.stderr)
            rc = 1
    for rep in reports:
        if rep["error"]:
            print(f"rank {rep['rank']} failed:\n{rep['error']}", file=sys.stderr)
            rc = 1
    if not reports:
        return rc
    return report(reports, args, rc)


def report(reports, args, rc=0) -> int:
    """Prints the table (and writes --json) from the ranks' reports; returns rc."""
    from issue_graphs import format_census

    m = reports[0]["meta"]
    where = "one GPU each" if args.device_per_rank else "one GPU"
    print(f"# {args.ranks} processes on {where} over CUDA IPC; torch {m.get('torch')}, device {m.get('device')}, "
          f"nccl_tide {m.get('nccl_tide')}, NCCL_TIDE_TOKEN_RS_CHUNKS {m.get('token_rs_chunks')}, "
          f"NCCL_TIDE_EAGER_GRAPHS {m.get('eager_graphs')}")
    floors = [rep["meta"].get("floor_us", float("nan")) for rep in reports]
    print("# host us per call of each rank's process (median over valid samples); max over ranks; replay: the call "
          "captured into a user graph, one cuGraphLaunch (RS: with Slot-Reuse staging, as `slot us`); launch floor "
          "per rank: " + " ".join(f"{x:.2f}" for x in floors))
    print(f"{'case':<16}{'W':>3}{'P':>4}{'coll':>5}{'chunks':>7}{'host us max':>13}{'per rank':>28}{'valid min':>10}"
          f"{'replay max':>12}{'slot us max':>12}")
    merged = []
    for i, row in enumerate(reports[0]["rows"]):
        per = [rep["rows"][i] for rep in reports if i < len(rep["rows"])]
        hosts = [p["host_us"] for p in per]
        replays = [p.get("replay_host_us", float("nan")) for p in per]
        slots = [p.get("slot_host_us", float("nan")) for p in per]
        merged.append(dict(row, host_us_per_rank=hosts, host_us_max=_max(hosts), slot_host_us_per_rank=slots,
                           slot_host_us_max=_max(slots), floor_us_per_rank=floors,
                           valid_min=min(p["valid_samples"] for p in per), replay_host_us_per_rank=replays,
                           replay_host_us_max=_max(replays),
                           replay_errors=[p.get("replay_error") for p in per if p.get("replay_error")]))
    if args.json:  # first: a failure below loses no figure
        with open(args.json, "w") as f:
            json.dump({"meta": m, "ranks": args.ranks, "rows": merged}, f, indent=1)
    for e in merged:
        per_txt = " " + " ".join(f"{h:.1f}" for h in e["host_us_per_rank"])
        print(f"{e['case']:<16}{e['W']:>3}{e['P']:>4}{e['coll']:>5}{e['chunks']:>7}{e['host_us_max']:>13.1f}"
              f"{per_txt:>28}{e['valid_min']:>10}{e['replay_host_us_max']:>12.1f}{e['slot_host_us_max']:>12.1f}  "
              f"{e['replay_errors'][0] if e['replay_errors'] else ''}", flush=True)
        if e.get("replay_census") and e["coll"] == "rs":
            print(f"#   {e['case']}, RS: rank 0's replay graph: {format_census(e['replay_census'])}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
