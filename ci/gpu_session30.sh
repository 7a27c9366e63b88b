#!/usr/bin/env bash
# Session 30's first device call (< 10 min), written at the end of session 29 (its one call, 29.1, ran the graph and
# token test files; test_eager_graphs stopped at the removed NCCL_TIDE_FENCE_ONCE test, so its last five tests and
# every other tests/gpu file have not run on this library). Parts, in this order (default: all):
#   all:   every tests/gpu file, the flag-touching ones first (gpu_job.sh's limits; the deadline may cut the last).
#   share: issue 16's one-rank shares on the final tree (8B and 70B layers, W = 8, 370 GB/s, 31 runs): the AG share
#          without its own-shard copy with incoming copies from the host (copy engines, as NVLink writes would be),
#          then the RS share beside the 32-CTA NCCL-like baseline with incoming copies from the device. Worth its time
#          on an H200 (the issue's device; no H200 ran since session 19).
#   calls: issue 15's 64-parameter rows at 1 call per sample (what host_issue gave them until session 29: the P x W
#          cap) against 6 (what the Llama rows had), host_ab.py, 6 rounds, --only "64 params": is part of the
#          64-parameter RS's extra host time over the Llama RS the sample's single call (a fresh gate per call)?
#   table: (added in session 30) issue 15's whole host_issue table in 12 processes: host_ab.py with two identical
#          variants (an A/A: about 3% of its verdicts come out resolved by chance at 6 pairs; each row gets 12 process medians), 6 rounds;
#          flat AG rows also time the same copies as one hinted batch copy (the 1.15x GPU target).
#   machine: (session 30) the machine's unit costs and the host rows in one call: parts per_rank, ipc and probe.
#   per_rank: host_issue --route on --per-rank (the last rank's call, which issues every rank's rounds, apart).
#   table3: (session 30) host_issue --route on, the whole table, in 3 processes one after another (about 80 s).
#   ipc:   (session 31) host_issue_ipc.py --ranks 2 alone (one process per rank, the calls rule of session 30).
#   ipc8:  (session 31) host_issue_ipc.py --ranks 8 (eight processes sharing one GPU, so launches cost more than on
#          a node's own GPUs: an upper bound).
#   probe: (session 31) benchmarks/host_cost_probe.cu alone (the machine's unit costs).
#   perf:  test_perf_gpu alone (tide-perf's host column took issue_cost.calls_per_sample after run 30.1).
#   ab:    benchmarks/host_ab.py with AB_VARIANTS (e.g. "base:NCCL_TIDE_X=0 new:NCCL_TIDE_X=1"), AB_ROUNDS rounds
#          (default 6), host_issue --route on --only "$AB_ONLY" (default "64 params") --samples 15.
# Everything is archived as $OUT/$TAG.tgz. TIDE_GPU_DEADLINE_S: default 560. `all` alone takes about 8 minutes.
TAG=${TAG:-session30} parts="${*:-all}"
: "${TIDE_GPU_DEADLINE_S:=560}"
source "$(dirname "$0")/gpu_session_lib.sh"
session_dirs host tests share
build_tree
if want all; then
  run_test_files test_eager_graphs:260 test_graph_capture:60 test_graph_capture_multiprocess:200 test_pending_waits:40 \
    test_cuda_collectives:60 test_multiprocess:100 test_virtual_nodes:60 test_eager_call_order:120 test_abort:60 \
    test_faults:90 test_faults_multiprocess:80 test_concurrency_gpu:60 test_cuda_properties:60 test_interposer_gpu:80 \
    test_hardening_gpu:200 test_fsdp_native:90 test_reduce_kernel_gpu:80 test_share_gpu:60 test_perf_gpu:200
fi
if want share; then
  S="python3 benchmarks/share.py --out $W/share --ranks 8 --link-gbps 370 --runs 31 --order gemm-after-first"
  for L in llama3-8b-layer llama3-70b-layer; do
    run "share/${L}_ag" 70 $S --layouts $L --tag ag_host --incoming-source host --sides ag-share-incoming
    run "share/${L}_rs" 70 $S --layouts $L --tag rs_device --incoming-source device --sides rs-share,nccl-like-32
  done
  grep -hE "^\[share\]|^#  " "$W"/share/*.log | cut -c1-220
fi
if want calls; then
  run host/ab_calls 420 python3 benchmarks/host_ab.py --variant calls1:HOST_ISSUE_CALLS=1 \
    --variant calls6:HOST_ISSUE_CALLS=6 --rounds 6 --only "64 params" --samples 15 --child-timeout 70 \
    --json "$W/host/ab_calls.json"
  grep -E "^#|^(flat|llama|64)" "$W/host/ab_calls.log" | cut -c1-170 | tail -30
fi
if want table; then
  run host/ab_table 520 python3 benchmarks/host_ab.py --variant a:HOST_ISSUE_CALLS=6 --variant b:HOST_ISSUE_CALLS=6 \
    --rounds 6 --samples 15 --child-timeout 120 --json "$W/host/ab_table.json"
  grep -E "^#|^(flat|llama|64)" "$W/host/ab_table.log" | grep -v "^# round" | cut -c1-170 | tail -40
fi
want machine && parts="$parts per_rank ipc probe"  # machine: these three parts (each runs where its block stands)
if want per_rank; then
  run host/per_rank 120 python3 benchmarks/host_issue.py --route on --per-rank --samples 15 --json "$W/host/per_rank.json"
  grep -E "^(flat|llama|64)" "$W/host/per_rank.log" | cut -c1-150
fi
if want table3; then
  for k in 1 2 3; do
    run host/table3_$k 60 python3 benchmarks/host_issue.py --route on --samples 15 --json "$W/host/table3_$k.json"
  done
  grep -E "^(flat|llama|64)|hinted" "$W/host/table3_1.log" | cut -c1-150
fi
if want ipc; then
  run host/ipc2 110 python3 benchmarks/host_issue_ipc.py --ranks 2 --samples 9 --json "$W/host/ipc2.json"
  grep -E "^#|^(flat|llama|64)" "$W/host/ipc2.log" | cut -c1-170
fi
if want ipc8; then
  run host/ipc8 200 python3 benchmarks/host_issue_ipc.py --ranks 8 --samples 9 --timeout 190 --json "$W/host/ipc8.json"
  grep -E "^#|^(flat|llama|64)" "$W/host/ipc8.log" | cut -c1-170
fi
if want probe; then
  nvcc -O2 -arch=sm_90 benchmarks/host_cost_probe.cu -o "$W/host/host_cost_probe" > "$W/host/probe_build.log" 2>&1 \
    && run host/probe 150 "$W/host/host_cost_probe"
  tail -25 "$W/host/probe.log"
fi
if want perf; then
  run_test_files test_perf_gpu:200
fi
if want ab; then
  [ -n "${AB_VARIANTS:-}" ] || { echo "ab: set AB_VARIANTS"; archive; exit 2; }
  v=(); for x in $AB_VARIANTS; do v+=(--variant "$x"); done
  run host/ab 420 python3 benchmarks/host_ab.py "${v[@]}" --rounds "${AB_ROUNDS:-6}" --only "${AB_ONLY:-64 params}" \
    --samples 15 --child-timeout 120 --json "$W/host/ab.json"
  grep -E "^#|^(flat|llama|64)" "$W/host/ab.log" | cut -c1-170 | tail -30
fi
archive
