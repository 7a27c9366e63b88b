#!/usr/bin/env bash
# Session 27, second device call (< 10 min). Parts, run in this order (default: all four):
#   tests:  the graph and token test files with NCCL_TIDE_PAIR_TOKENS=1 as the default (test_eager_graphs runs the
#           graph tests with 0 in a subprocess), test_pending_waits, test_cuda_collectives, test_share_gpu (the new
#           ag-share-incoming side) in the part sharetest.
#   pairs:  host_issue's 64-parameter rows (--route on: replay and the graph census) with NCCL_TIDE_PAIR_TOKENS
#           1, 0, 1, 0 (issue 15's replay target; the census shows the operations per memop node).
#   agown:  issue 16: the AG share with and without its own-shard copy (ag-share, ag-share-incoming), 8B and 70B,
#           incoming from the host (copy engines) and from the device.
# Everything is archived as $OUT/session27b.tgz. TIDE_GPU_DEADLINE_S: default 540.
TAG=session27b parts="${*:-pairs agown tests sharetest}"
source "$(dirname "$0")/gpu_session_lib.sh"
session_dirs share host tests
build_tree
if want pairs; then
  i=0
  for m in 1 0 1 0; do
    i=$((i + 1))
    run "host/pairs_${i}_$m" 40 env NCCL_TIDE_PAIR_TOKENS=$m \
      python3 benchmarks/host_issue.py --route on --only "64 params" --samples 9 --json "$W/host/pairs_${i}_$m.json"
    grep -E " ag |replay graph" "$W/host/pairs_${i}_$m.log" | cut -c1-160
  done
fi
S="python3 benchmarks/share.py --out $W/share --ranks 8 --link-gbps 370 --runs 31 --order gemm-after-first"
if want agown; then
  for L in llama3-8b-layer llama3-70b-layer; do
    for src in host device; do
      run "share/${L}_own_$src" 80 $S --layouts $L --tag "own_$src" --incoming-source $src \
        --sides ag-share,ag-share-incoming
    done
  done
  grep -hE "^\[share\]|^#  " "$W"/share/*.log | cut -c1-240
fi
if want tests; then
  run_test_files test_eager_graphs:200 test_graph_capture:40 test_graph_capture_multiprocess:90 test_pending_waits:40 \
    test_cuda_collectives:40
fi
if want sharetest; then
  run tests/test_share_gpu 150 python3 -m pytest -v -rs -p no:cacheprovider -o faulthandler_timeout=145 \
    tests/gpu/test_share_gpu.py
fi
archive
