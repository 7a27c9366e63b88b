#!/usr/bin/env bash
# Session 27, one device call (< 10 min). Parts (default: perf agsource census):
#   perf:     tests/gpu/test_perf_gpu.py in full (limit 300 s) with every test's duration (--durations=0): it has not
#             passed in full since session 25 (8 of 10 in 121-133 s in runs 26.5-26.6, then the job's deadline).
#   agsource: issue 16's GEMM beside the AG share (1.05-1.08 against 1.03) with the incoming copies from the host
#             (copy engines, as a node's peers' copies are) beside the same-device copies (SM kernels on one GPU),
#             8B then 70B, both sources in one run each.
#   census:   issue 15: host_issue.py --route on, 64-parameter rows, which prints rank 0's AG replay graph by node
#             kind under each AG row (issue_cost.graph_census, never run on a GPU before).
# Everything is archived as $OUT/session27.tgz. TIDE_GPU_DEADLINE_S: default 540.
# Usage: bash ci/gpu_session27.sh [perf] [agsource] [census]
TAG=session27 parts="${*:-perf agsource census}"
source "$(dirname "$0")/gpu_session_lib.sh"
session_dirs share host tests
build_tree
S="python3 benchmarks/share.py --out $W/share --ranks 8 --link-gbps 370 --runs 31 --order gemm-after-first"
if want census; then
  run host/census 60 python3 benchmarks/host_issue.py --route on --only "64 params" --samples 9 \
    --json "$W/host/census.json"
  grep -vE "TIDE/|NCCL TIDE" "$W/host/census.log" | tail -40 | cut -c1-200
fi
if want perf; then
  run tests/test_perf_gpu 300 python3 -m pytest -v -rs --durations=0 -p no:cacheprovider \
    -o faulthandler_timeout=290 tests/gpu/test_perf_gpu.py
  grep -E "PASSED|FAILED|ERROR|s (call|setup|teardown) " "$W/tests/test_perf_gpu.log" | cut -c1-160 | tail -30
fi
if want agsource; then
  for L in llama3-8b-layer llama3-70b-layer; do
    for src in host device; do
      run "share/${L}_ag_$src" 70 $S --layouts $L --tag "ag_$src" --incoming-source $src --sides ag-share
    done
  done
  grep -hE "^\[share\]|^=== tide-perf|^#  " "$W"/share/*.log | cut -c1-220
fi
archive
