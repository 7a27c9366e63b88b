#!/usr/bin/env bash
# Next session's first device call (< 10 min), written at the end of session 27 when no device time was left.
# Parts, in this order (default: both):
#   tests: the graph and token test files on session 27's final code, which no GPU has run since its review mends
#          (a token pair only where both words have a writer; bind's pair check; INFO when pairs are off) and the new,
#          default-off NCCL_TIDE_AG_SIGNAL_KERNELS (test_eager_graphs runs the AG graph tests with it flipped in a
#          subprocess): test_eager_graphs, test_graph_capture, test_graph_capture_multiprocess, test_pending_waits,
#          test_multiprocess.
#   agsig: host_issue.py --route on, 64-parameter rows (AG replay and census), NCCL_TIDE_AG_SIGNAL_KERNELS 1, 0, 1, 0:
#          does the AG replay drop by about 15 memop operations' worth (session 27: about 0.25 us each), and what does
#          the GPU time do (two one-warp kernels per AG)? If it drops and the tests pass, make 1 the default
#          (params.cc, docs/env.md, docs/architecture.md "Flag writes in RS graphs are kernel nodes").
# Everything is archived as $OUT/session28.tgz. TIDE_GPU_DEADLINE_S: default 540.
TAG=session28 parts="${*:-tests agsig}"
source "$(dirname "$0")/gpu_session_lib.sh"
session_dirs host tests
build_tree
if want tests; then
  run_test_files test_eager_graphs:150 test_graph_capture:40 test_graph_capture_multiprocess:80 test_pending_waits:40 \
    test_multiprocess:100
fi
if want agsig; then
  i=0
  for m in 1 0 1 0; do
    i=$((i + 1))
    run "host/agsig_${i}_$m" 40 env NCCL_TIDE_AG_SIGNAL_KERNELS=$m \
      python3 benchmarks/host_issue.py --route on --only "64 params" --samples 9 --json "$W/host/agsig_${i}_$m.json"
    grep -E " ag |replay graph" "$W/host/agsig_${i}_$m.log" | cut -c1-160
  done
fi
archive
