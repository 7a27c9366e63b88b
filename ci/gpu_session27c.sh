#!/usr/bin/env bash
# Session 27, third device call (< 10 min). Parts, run in this order (default: all):
#   fsdp:   the FSDP2 GPU tests with the cast in place (NCCL_TIDE_FSDP_CAST_IN_PLACE=1, the new default):
#           test_fsdp_native, and test_perf_gpu's FSDP2 step tests (-k fsdp).
#   castab: the world-size-1 FSDP2 step (stock against TIDE) with NCCL_TIDE_FSDP_CAST_IN_PLACE 1, 0, 1, 0: at world
#           size 1 the own-shard copy is the whole all-gather, so the cast in place removes every AG copy.
#   ipc:    the one-process-per-rank test files (token programs with token pairs over IPC): test_multiprocess,
#           test_faults_multiprocess.
# Everything is archived as $OUT/session27c.tgz. TIDE_GPU_DEADLINE_S: default 540.
TAG=session27c parts="${*:-fsdp castab ipc}"
source "$(dirname "$0")/gpu_session_lib.sh"
session_dirs fsdp tests
build_tree
T="python3 -m pytest -v -rs -p no:cacheprovider --durations=5"
if want fsdp; then
  run tests/test_fsdp_native 90 $T -o faulthandler_timeout=85 tests/gpu/test_fsdp_native.py
  run tests/test_perf_gpu_fsdp 90 $T -o faulthandler_timeout=85 -k fsdp tests/gpu/test_perf_gpu.py
fi
if want castab; then
  i=0
  for c in 1 0 1 0; do
    i=$((i + 1))
    run "fsdp/step_${i}_cast$c" 75 env NCCL_TIDE_FSDP_CAST_IN_PLACE=$c python3 -m nccl_tide.bench.fsdp_step \
      --layers 4 --variants stock,tide --slot-pool 2 --warmup 3 --steps 10 --profile-steps 2 --variant-timeout 35 \
      -J "$W/fsdp/step_${i}_cast$c.json"
    grep -vE "TIDE/|NCCL TIDE" "$W/fsdp/step_${i}_cast$c.log" | tail -14 | cut -c1-200
  done
fi
if want ipc; then
  run tests/test_multiprocess 100 $T -o faulthandler_timeout=95 tests/gpu/test_multiprocess.py
  run tests/test_faults_multiprocess 80 $T -o faulthandler_timeout=75 tests/gpu/test_faults_multiprocess.py
fi
archive
