#!/usr/bin/env bash
# Session 29's second device call (< 10 min). Parts, in this order (default: ab tests):
#   ab:    benchmarks/host_ab.py: NCCL_TIDE_FENCE_ONCE 0 (base) against 1 in fresh processes, AB_ROUNDS rounds (default
#          6) of alternating order, host_issue --route on --only "$AB_ONLY" (default "64 params": W = 2 and 8, plain
#          and reversed) --samples 15: per row the median paired difference, its 90% bootstrap interval, a verdict.
#   share: issue 16's one-rank shares on the final tree (8B and 70B layers, W = 8, 370 GB/s, 31 runs): the AG share
#          without its own-shard copy with incoming copies from the host (copy engines, as NVLink writes would be),
#          then the RS share beside the 32-CTA NCCL-like baseline with incoming copies from the device.
#   tests: test_eager_graphs (its subprocess test runs the graph tests with NCCL_TIDE_FENCE_ONCE flipped).
# Everything is archived as $OUT/$TAG.tgz. TIDE_GPU_DEADLINE_S: default 560.
TAG=${TAG:-session29b} parts="${*:-ab tests}"
: "${TIDE_GPU_DEADLINE_S:=560}"
source "$(dirname "$0")/gpu_session_lib.sh"
session_dirs host tests
build_tree
if want ab; then
  run host/ab_fence 420 python3 benchmarks/host_ab.py --variant nofence:NCCL_TIDE_FENCE_ONCE=0 \
    --variant fence:NCCL_TIDE_FENCE_ONCE=1 --rounds "${AB_ROUNDS:-6}" --only "${AB_ONLY:-64 params}" --samples 15 \
    --child-timeout 120 --json "$W/host/ab_fence.json"
  grep -E "^#|^(flat|llama|64)" "$W/host/ab_fence.log" | cut -c1-170 | tail -30
fi
if want share; then
  mkdir -p "$W/share"
  S="python3 benchmarks/share.py --out $W/share --ranks 8 --link-gbps 370 --runs 31 --order gemm-after-first"
  for L in llama3-8b-layer llama3-70b-layer; do
    run "share/${L}_ag" 70 $S --layouts $L --tag ag_host --incoming-source host --sides ag-share-incoming
    run "share/${L}_rs" 70 $S --layouts $L --tag rs_device --incoming-source device --sides rs-share,nccl-like-32
  done
  grep -hE "^\[share\]|^#  " "$W"/share/*.log | cut -c1-220
fi
if want tests; then
  run_test_files test_eager_graphs:200
fi
archive
