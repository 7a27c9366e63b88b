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
TAG=s28 parts="${*:-tests agsig}"
source "$(dirname "$0")/gpu_session_lib.sh"
session_dirs host tests
t0=$(date +%s)
build . build/gpu "$W/build/new.log" \
  || { echo "build failed"; tail -20 "$W/build/new.log"; tar czf "$O/session28.tgz" -C "$W" .; exit 1; }
echo "=== built $(( $(date +%s) - t0 )) s, $(left) s left"
env_txt
export NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so"
export PYTHONPATH="$PWD/tests/gpu:$PYTHONPATH"
if want tests; then
  for f in test_eager_graphs:150 test_graph_capture:40 test_graph_capture_multiprocess:80 test_pending_waits:40 \
           test_multiprocess:100; do
    run "tests/${f%%:*}" "${f##*:}" python3 -m pytest -v -rs -x -p no:cacheprovider --durations=5 \
      -o faulthandler_timeout=$(( ${f##*:} - 5 )) "tests/gpu/${f%%:*}.py"
  done
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
tar czf "$O/session28.tgz" -C "$W" .
echo "=== done, $(left) s left"
