#!/usr/bin/env bash
# Session 28's device call (< 10 min). Parts, in this order (default: all):
#   tests: the graph and token test files on this tree: session 27's review mends (a token pair only where both words
#          have a writer; bind's pair check; INFO when pairs are off), the trailing resets (the barrier resets and
#          phase write moved behind the copies, at the head of the done / full writes), the kernel tails (a flag
#          batch's trailing writes as a signal kernel in graphs, its own resets stored first) and the relaxed writes
#          (resets and phases without a memory barrier); test_eager_graphs runs the AG graph tests with
#          NCCL_TIDE_AG_SIGNAL_KERNELS flipped (1) in a subprocess.
# Run 28.1 (TAG session28) ran this before the relaxed writes (and with new1 old new0 only); run 28.2 (TAG
# session28b) with them and NCCL_TIDE_FENCE_ONCE (nofence: 0). The old library ignores NCCL_TIDE_FENCE_ONCE (unknown),
# and since session 29 so does main (removed: the v2 memop API refuses its flag), so fence and nofence now run the
# same library the same way.
#   ab:    benchmarks/host_issue.py --route on (every row: AG replay and census, RS host time, GPU time), alternating
#          new/AG signal kernels 1, old (76fa1d1, session 27's final code, from build/old76.tar: carry it), new/0,
#          and the same again: what the kernel tails save the RS (new/0 vs old) and the AG (new/1 vs new/0), and what
#          they cost in GPU time.
#   all:   every tests/gpu file instead of `tests` (the flag-touching ones first; the deadline may cut the last).
# AB: the variants of `ab`, in order. Everything is archived as $OUT/$TAG.tgz. TIDE_GPU_DEADLINE_S: default 560.
TAG=${TAG:-session28} parts="${*:-tests ab}"
: "${TIDE_GPU_DEADLINE_S:=560}"
source "$(dirname "$0")/gpu_session_lib.sh"
session_dirs host tests
build_tree
AB="${AB:-new1 old new0 nofence new1 old new0 nofence}"
if want ab && [[ " $AB " == *" old "* ]]; then
  mkdir -p build/old76-src
  if tar xf build/old76.tar -C build/old76-src && build build/old76-src build/gpu-old "$W/build/old.log"; then
    echo "=== built old, $(left) s left"
  else
    echo "old build failed"; tail -5 "$W/build/old.log"
  fi
fi
if want ab; then
  NEW="$NCCL_TIDE_LIBRARY_PATH" OLD="$PWD/build/gpu-old/libnccl-tide.so"
  i=0
  # new1: AG signal kernels; new0: the defaults; fence / nofence: NCCL_TIDE_FENCE_ONCE=1 / 0; old: 76fa1d1
  for v in $AB; do
    i=$((i + 1))
    lib=$NEW ag=0 fence=0
    case $v in old) lib=$OLD;; new1) ag=1;; fence) fence=1;; esac
    [ -f "$lib" ] || { echo "=== $v: no library"; continue; }
    run "host/ab_${i}_$v" 60 env NCCL_TIDE_LIBRARY_PATH="$lib" NCCL_TIDE_AG_SIGNAL_KERNELS=$ag \
      NCCL_TIDE_FENCE_ONCE=$fence python3 benchmarks/host_issue.py --route on --samples 7 --json "$W/host/ab_${i}_$v.json"
    grep -E "^(flat|llama|64)|replay graph" "$W/host/ab_${i}_$v.log" | cut -c1-150 | head -12
  done
fi
if want tests && ! want all; then
  run_test_files test_eager_graphs:150 test_graph_capture:40 test_graph_capture_multiprocess:80 test_pending_waits:40 \
    test_multiprocess:100
fi
if want all; then  # every tests/gpu file, the ones these changes touch first (gpu_job.sh's limits)
  run_test_files test_eager_graphs:260 test_graph_capture:60 test_graph_capture_multiprocess:200 test_pending_waits:40 \
    test_cuda_collectives:60 test_multiprocess:100 test_virtual_nodes:60 test_eager_call_order:120 test_abort:60 \
    test_faults:90 test_faults_multiprocess:80 test_concurrency_gpu:60 test_cuda_properties:60 test_interposer_gpu:80 \
    test_hardening_gpu:200 test_fsdp_native:90 test_reduce_kernel_gpu:80 test_share_gpu:60 test_perf_gpu:200
fi
archive
