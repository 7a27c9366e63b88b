#!/usr/bin/env bash
# Session 27, fourth device call (< 10 min). Parts, in this order (default: both):
#   hostab: host_issue.py --route on, every case (flat, Llama layer, 64 parameters), with NCCL_TIDE_PAIR_TOKENS
#           1, 0, 1, 0 on the tree with the RS's parity banks (the RS full and consumed tokens paired too).
#   graphs: test_eager_graphs (RS graph route, pipelined RS, the subprocess with pairs flipped) and
#           test_graph_capture_multiprocess (token programs over IPC).
# Everything is archived as $OUT/session27d.tgz. TIDE_GPU_DEADLINE_S: default 540.
TAG=session27d parts="${*:-hostab graphs}"
source "$(dirname "$0")/gpu_session_lib.sh"
session_dirs host tests
build_tree
if want hostab; then
  i=0
  for m in 1 0 1 0; do
    i=$((i + 1))
    run "host/pairs_${i}_$m" 60 env NCCL_TIDE_PAIR_TOKENS=$m \
      python3 benchmarks/host_issue.py --route on --samples 9 --json "$W/host/pairs_${i}_$m.json"
    grep -E "^(flat|llama|64)" "$W/host/pairs_${i}_$m.log" | cut -c1-120
  done
fi
if want graphs; then
  run_test_files test_eager_graphs:150 test_graph_capture_multiprocess:80
fi
archive
