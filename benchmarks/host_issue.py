# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Host issue time per rank per call, apart from GPU latency, for TIDE-AG and TIDE-RS on loopback worlds.

    python benchmarks/host_issue.py [--json FILE] [--route both|on|off]

Cases: flat AG/RS (one parameter) of 1 and 64 MiB of gathered output at W = 2 and 8; one Llama-3.1-8B decoder layer
(9 parameters, bf16) AG from per-parameter shards and RS with 4 pipeline chunks; a 64-parameter layout at W = 2
and 8, its shards and gradients allocated one by one ("64 params": the caching allocator places them back to back,
so the library's graphs copy them as strided runs, docs/architecture.md "Strided copies") and as views of one
buffer in reverse parameter order ("64 params rev": no strided run can form, one graph node per copy, the plain
copies): the two rows compare the runs with the plain copies in one run. Method: nccl_tide.perf.issue_cost (streams
gated behind a sleep kernel, prebuilt ctypes arguments).

--route both (default): the eager graph route (NCCL_TIDE_EAGER_GRAPHS, docs/architecture.md "Eager calls as graph
replays") off and on in the same run: the cases run first in a child process with NCCL_TIDE_EAGER_GRAPHS=0 (the
parameter is read once per process), then here with it on, and one table compares them (host us off / on, and the
GPU time of each, since a replayed graph runs memcpy nodes where the eager call runs batched copies). Cases whose
program cannot take the route (RS of more chunks than NCCL_TIDE_TOKEN_RS_CHUNKS, default 64) run
the epoch protocol in both columns and show "epoch" in the route column: with the limit at 2
(NCCL_TIDE_TOKEN_RS_CHUNKS=2) the Llama and 64-parameter RS rows (4 chunks) do. One process
issues every rank's call here; benchmarks/host_issue_ipc.py measures one process per rank.

AG rows also time a user-captured replay of the call ("replay us/rank": one graph per rank, one cuGraphLaunch
each) and, in the same run, its floor ("floor": the same launch path for a graph of one 4-byte memset node per
rank, issue_graphs.prepare_launch_floor): the replay's cost above the floor is what TIDE's nodes add.
Under each AG row a "#" line gives rank 0's replay graph by node kind (memop nodes with their operations, memcpy,
kernel, ...) and its edges (issue_graphs.graph_census), to read the replay's host time against.

Flat AG rows also time the same copies (every rank's send buffer into every rank's slot, its own row included) as
ONE hinted cudaMemcpyBatchAsync on one stream, no flags (issue_graphs.prepare_copy_floor; JSON copy_floor_gpu_us),
and print "AG / copy": the target is a 64 MiB AG within 1.15x of it.

Every row also records the launch floor of its world size ("floor_us") and its host time in floors ("host_floors";
AG rows "replay_floors"): host rows moved 2x between two H100 machines, whose W = 8 rows agreed in
floors within 1-7%; but a third machine gave the slow one's rows while its floor read 1.9 us in two
processes and 3.9 in a third, so a row in floors is a reading to keep beside the us, not a unit hosts agree in.

--per-rank: a second measurement per row times each rank's call apart: "last" (us per call of the last rank, whose
call also issues every rank's deferred rounds on loopback: W x rounds graph launches) and "others" (the mean of the
other ranks' calls: lookup, checks, announce). It shows where the RS rows' host time goes.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

for k, v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ.setdefault(k, v)
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

LLAMA8B_LAYER = [4096 * 4096, 1024 * 4096, 1024 * 4096, 4096 * 4096, 14336 * 4096, 14336 * 4096, 4096 * 14336, 4096,
                 4096]


def cases():
    mib = 1 << 20
    out = []
    for w in (2, 8):
        for size in (1 * mib, 64 * mib):
            out.append((f"flat {size // mib} MiB", w, [size // 2], None))
    out.append(("llama8b layer", 8, LLAMA8B_LAYER, 4))
    for w in (2, 8):
        out.append(("64 params", w, [1 << 18] * 64, 4))
        out.append(("64 params rev", w, [1 << 18] * 64, 4))
    return out


def tensors(torch, numels, dev, reverse):
    """bf16 random tensors of these numels: allocated one by one, or (reverse) views of one buffer with the first
    parameter last in memory (decreasing addresses: no strided run forms)."""
    if not reverse:
        return [torch.randn(n, dtype=torch.bfloat16, device=dev) for n in numels]
    flat = torch.randn(sum(numels), dtype=torch.bfloat16, device=dev)
    out, end = [], flat.numel()
    for n in numels:
        out.append(flat[end - n : end])
        end -= n
    return out


def in_floors(us: float, floor_us: float) -> float:
    """us in launch floors; NaN without a valid floor."""
    return us / floor_us if floor_us == floor_us and floor_us > 0 else float("nan")


def main() -> int:
    # HOST_ISSUE_CALLS: the default of --calls from the environment, so that benchmarks/host_ab.py can A/B it
    # (its variants differ only in environment): e.g. 1 against 6 calls per sample.
    calls_env = os.environ.get("HOST_ISSUE_CALLS", "6")
    if not calls_env.isascii() or not calls_env.isdecimal() or int(calls_env) < 1:
        print(f"HOST_ISSUE_CALLS must be a positive integer (got {calls_env!r})", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--calls", type=int, default=int(calls_env),
                    help="calls per rank per sample (default 6, or HOST_ISSUE_CALLS)")
    ap.add_argument("--samples", type=int, default=11)
    ap.add_argument("--only", default=None, help="substring of case names to run")
    ap.add_argument("--per-rank", action="store_true",
                    help="also time each rank's call apart (a second measurement): 'last' = the last rank's call, "
                         "which issues every rank's deferred rounds; 'others' = the mean of the other ranks' calls")
    ap.add_argument("--route", choices=("both", "on", "off"), default="both",
                    help="eager graph route: off and on in one run (default), or only the current process's setting")
    args = ap.parse_args()
    env_route = os.environ.get("NCCL_TIDE_EAGER_GRAPHS", "1")  # the default is on
    if args.route != "both":
        if env_route != ("1" if args.route == "on" else "0"):
            print(f"--route {args.route} needs NCCL_TIDE_EAGER_GRAPHS={'1' if args.route == 'on' else '0'} "
                  f"(it is {env_route})", file=sys.stderr)
            return 2
        return run(args)
    if "NCCL_TIDE_EAGER_GRAPHS" in os.environ and env_route != "1":
        print("--route both runs the 'on' half in this process: unset NCCL_TIDE_EAGER_GRAPHS (or set it to 1)",
              file=sys.stderr)
        return 2
    os.environ["NCCL_TIDE_EAGER_GRAPHS"] = "1"  # before the library is loaded (it is read once per process)
    with tempfile.TemporaryDirectory() as tmp:
        off_json = os.path.join(tmp, "off.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--route", "off", "--json", off_json,
               "--calls", str(args.calls), "--samples", str(args.samples)]
        if args.only:
            cmd += ["--only", args.only]
        if args.per_rank:
            cmd += ["--per-rank"]
        print("# route off (child process, NCCL_TIDE_EAGER_GRAPHS=0):", flush=True)
        child = subprocess.run(cmd, env=dict(os.environ, NCCL_TIDE_EAGER_GRAPHS="0"))
        if child.returncode != 0:
            print(f"route-off run failed ({child.returncode})", file=sys.stderr)
            return child.returncode
        with open(off_json) as f:
            off_rows = json.load(f)
    print("# route on (this process):", flush=True)
    on_json = args.json
    args.json = None
    rows_on = []
    rc = run(args, rows_on)
    if rc != 0:
        return rc
    off = {(r["case"], r["W"], r["coll"]): r for r in off_rows}
    print("\n# eager graph route off vs on, same run: host us per rank per call (median), GPU us per call of the world")
    # calls: per sample, off / on: the eager (off) route keeps the P x W cap, so at 64 parameters and W = 8 its
    # samples are single calls and the on route's 6 (the ratio then mixes the two)
    print(f"{'case':<18}{'W':>3}{'P':>4}{'coll':>5}{'chunks':>7}{'route':>7}{'host off':>10}{'host on':>10}"
          f"{'off/on':>8}{'gpu off':>10}{'gpu on':>10}{'calls':>8}")
    merged = []
    for r in rows_on:
        o = off.get((r["case"], r["W"], r["coll"]), {})
        route = r["route"]  # run()'s: RSs of more chunks than the token limit take the epoch protocol either way
        h_off, h_on = o.get("host_us", float("nan")), r.get("host_us", float("nan"))
        ratio = h_off / h_on if h_on and h_on == h_on and h_off == h_off else float("nan")
        print(f"{r['case']:<18}{r['W']:>3}{r['P']:>4}{r['coll']:>5}{r['chunks']:>7}{route:>7}{h_off:>10.1f}"
              f"{h_on:>10.1f}{ratio:>8.1f}{o.get('gpu_us', float('nan')):>10.1f}{r.get('gpu_us', float('nan')):>10.1f}"
              f"{str(o.get('calls', '?')) + '/' + str(r.get('calls', '?')):>8}")
        merged.append({"case": r["case"], "W": r["W"], "P": r["P"], "coll": r["coll"], "chunks": r["chunks"],
                       "route": route, "off": o, "on": r})
    if on_json:
        with open(on_json, "w") as f:
            json.dump(merged, f, indent=1)
    return 0


def run(args, rows_out=None) -> int:
    import torch

    from nccl_tide import _native as _N

    if os.environ.get("TIDE_BENCH_OLD_LIBRARY") == "1":
        # An older libnccl-tide.so (a baseline build) lacks functions added since: do not require them.
        for name in ("tideCommGetPendingWaits",):
            _N.SIGNATURES.pop(name, None)
    import nccl_tide
    from nccl_tide.cuda import LoopbackWorld
    from nccl_tide.dtypes import dtype as to_dtype
    from nccl_tide.dtypes import op_code
    import issue_graphs as ig
    from nccl_tide.perf import issue_cost as ic

    rows = [] if rows_out is None else rows_out
    print(f"# torch {torch.__version__}, device {torch.cuda.get_device_name(0)}, nccl_tide {nccl_tide.__version__}")
    print(f"{'case':<18}{'W':>3}{'P':>4}{'coll':>5}{'chunks':>7}{'host us/rank':>14}{'iqr':>8}{'valid':>6}{'gpu us':>10}"
          f"{'replay us/rank':>16}{'floor':>7}" + (f"{'last':>8}{'others':>8}" if args.per_rank else ""))
    worlds = {}
    floors = {}  # W -> host us per rank of launching a one-node graph (prepare_launch_floor)
    for name, w, numels, chunks in cases():
        if args.only and args.only not in name:
            continue
        world = worlds.get(w) or LoopbackWorld(w)
        if w not in worlds:
            # The replay column's floor on this world: a one-node graph per rank through the same ctypes launch path.
            try:
                fl = ig.prepare_launch_floor(world)
                floors[w] = ic.host_issue_us(fl, calls=50, samples=args.samples)["host_us"]
                fl.close()
            except Exception as e:  # report, do not hide
                floors[w] = float("nan")
                print(f"# graph launch floor W={w}: failed ({str(e)[:160]})", flush=True)
        worlds[w] = world
        dev = torch.device("cuda", 0)
        shard_total = None
        for coll in ("ag", "rs"):
            rs_chunk = None
            if coll == "rs" and chunks:
                probe = nccl_tide.Layout(numels, "bf16", w, rank=0)
                rs_chunk = -(-probe.rs_out_numel // chunks) * 4
                probe.close()
            layouts = [nccl_tide.Layout(numels, "bf16", w, rank=r, rs_chunk_bytes=rs_chunk) for r in range(w)]
            l0 = layouts[0]
            if coll == "ag":
                slots = world.alloc_slot(l0.slot_bytes)
                if len(numels) == 1:
                    sends = [torch.randn(l0.send_bytes // 2, dtype=torch.bfloat16, device=dev) for _ in range(w)]
                    prep = ic.prepare_all_gather(world, layouts, slots, sendbufs=sends)
                else:
                    shards = [tensors(torch, [p.shard_numel for p in l0.params], dev, name.endswith(" rev"))
                              for _ in range(w)]
                    prep = ic.prepare_all_gather(world, layouts, slots, shards=shards)
            else:
                grads = [tensors(torch, numels, dev, name.endswith(" rev")) for _ in range(w)]
                outs = [torch.empty(l0.rs_out_numel, dtype=torch.float32, device=dev) for _ in range(w)]
                prep = ic.prepare_reduce_scatter(world, layouts, grads, outs, op_code("sum"), to_dtype("fp32").code)
            # The call's route decides the calls per sample (issue_cost.calls_per_sample: the P x W cap for eager
            # epoch calls, --calls on the graph route, where one call per sample overstated the 64-parameter rows
            # by 1.4-16.5 us per rank on an H100).
            calls = ic.calls_per_sample(prep.copies, prep.graph_route, args.calls)
            h = ic.host_issue_us(prep, calls=calls, samples=args.samples)
            if args.per_rank:  # a second measurement, so that host_us keeps its method (no timer reads per call)
                split = ic.host_issue_us(prep, calls=calls, samples=args.samples, per_rank=True)
                h.update(last_rank_us=split["last_rank_us"], other_ranks_us=split["other_ranks_us"])
            g = ic.gpu_latency_us(prep, samples=args.samples)
            world.synchronize()
            row = {"case": name, "W": w, "P": len(numels), "coll": coll, "chunks": l0.rs_num_chunks if coll == "rs" else 0,
                   "calls": calls, "route": "graph" if prep.graph_route else "epoch",
                   **h, **g}
            # The same figure in launch floors of this process (kept beside the us; not a unit in which
            # machines agree, see the module's docstring).
            row["floor_us"] = floors.get(w, float("nan"))
            row["host_floors"] = in_floors(h["host_us"], row["floor_us"])
            if coll == "ag" and len(numels) == 1:
                # The GPU target: a flat AG within 1.15x of the same copies as one hinted batch copy (no flags).
                try:
                    floor = ig.prepare_copy_floor(world, ig.flat_all_gather_copies(l0, slots, sends))
                    cf = ic.gpu_latency_us(floor, samples=args.samples)
                    if not cf["gpu_us"] > 0:  # NaN (no valid sample) or 0
                        raise RuntimeError(f"no valid GPU time ({cf})")
                    row["copy_floor_gpu_us"] = cf["gpu_us"]
                    print(f"#   {name}, W {w}: the same copies as one hinted batch copy: {cf['gpu_us']:.1f} us of GPU "
                          f"time; AG / copy = {g['gpu_us'] / cf['gpu_us']:.3f}", flush=True)
                except Exception as e:  # report, do not hide
                    row["copy_floor_error"] = str(e)[:200]
                    print(f"#   {name}, W {w}: copy floor failed ({row['copy_floor_error']})", flush=True)
            if coll == "ag":
                # A graph-captured replay of the same call (one graph per virtual rank): host cost of the launches.
                try:
                    graphs = ig.prepare_graph_replays(prep)
                    row["replay_host_us"] = ic.host_issue_us(graphs, calls=calls, samples=args.samples)["host_us"]
                    row["replay_floor_us"] = floors.get(w, float("nan"))
                    row["replay_floors"] = in_floors(row["replay_host_us"], row["replay_floor_us"])
                    row["replay_census"] = graphs.census
                    graphs.close()
                except Exception as e:  # report, do not hide: the row says why
                    row["replay_error"] = str(e)[:200]
            rows.append(row)
            print(f"{name:<18}{w:>3}{len(numels):>4}{coll:>5}{row['chunks']:>7}{h['host_us']:>14.1f}"
                  f"{h.get('host_iqr_us', float('nan')):>8.1f}{h['valid_samples']:>6}{g['gpu_us']:>10.1f}"
                  f"{row.get('replay_host_us', float('nan')):>16.1f}{row.get('replay_floor_us', float('nan')):>7.1f}"
                  + (f"{h['last_rank_us']:>8.1f}{h['other_ranks_us']:>8.1f}" if args.per_rank else "")
                  + f" {row.get('replay_error', '')}", flush=True)
            if row.get("replay_census"):  # what rank 0's replayed graph holds (issue_graphs.graph_census)
                print(f"#   {name}, W {w}: rank 0's replay graph: {ig.format_census(row['replay_census'][0])}", flush=True)
            if coll == "ag":
                world.free_slot(slots)
            for lay in layouts:
                lay.close()
            del shard_total
            shard_total = None
    for world in worlds.values():
        world.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
