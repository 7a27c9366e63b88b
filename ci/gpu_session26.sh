#!/usr/bin/env bash
# Session 26, one device call (< 10 min). Parts (default: all three):
#   timeline: one rank's share with the new per-chunk timeline (issue 16's 8B RS gap: where the 60-80 us over the AG
#             share go): 8B with ag-share, rs-share, rs-share-drain64 at 4 MiB pieces; 8B ag-share, rs-share at 1 MiB
#             pieces (how much of the AG share's 1.048 is the harness's piece size); 8B rs-share at 16 MiB RS chunks;
#             70B ag-share, rs-share.
#   mergeab:  host_issue's 64-parameter rows with NCCL_TIDE_MERGE_FLAG_BATCHES 1, 0, 1, 0, 1, 0 (the AG replay column;
#             run 26.1's 1, 0, 0, 1 was mixed at W = 8).
#   ipc:      benchmarks/host_issue_ipc.py --ranks 2 (one process per rank; its only figures predate the signal kernels).
#   tests:    (second call) the graph test files with the merge's new default (1), then test_share_gpu (the pacer's
#             per-stream arrival words, the timeline's mapping, the new rs-share-serial side).
#   streams:  (second call) the RS share with one incoming stream per staging buffer (rs-share) against the one-stream
#             harness (rs-share-serial) in the same run, 8B and 70B; then the 8B rs-share with the reduce rule told
#             NCCL_TIDE_LINK_GBPS=470 (more CTAs per paced chunk; the pacer stays at 370).
#   share:    (third call) test_share_gpu; then one rank's share with timelines (the gate kernel now skipped), 8B
#             and 70B, rs-share and rs-share-serial, then the reduce rule of that tree (94 GB/s per CTA) and as if 70
#             (NCCL_TIDE_LINK_GBPS=500: 10 CTAs per paced full chunk instead of 8), alternated: base, 500, 500, base.
#   final:    (last call) the reduce rule at kReduceCtaGBps = 66, headroom 1.2: the 8B and 70B RS share with the
#             NCCL-like 32-CTA baseline (the SM-time ratio), before ci/gpu_job.sh runs every tests/gpu file.
# Everything is archived as $OUT/session26.tgz. TIDE_GPU_DEADLINE_S: default 540.
# Usage: bash ci/gpu_session26.sh [timeline] [mergeab] [ipc] [tests] [streams] [share] [final]
TAG=s26 parts="${*:-timeline mergeab ipc}"
source "$(dirname "$0")/gpu_session_lib.sh"
session_dirs share host tests
t0=$(date +%s)
build . build/gpu "$W/build/new.log" \
  || { echo "build failed"; tail -20 "$W/build/new.log"; tar czf "$O/session26.tgz" -C "$W" .; exit 1; }
echo "=== built $(( $(date +%s) - t0 )) s, $(left) s left"
env_txt
export NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so"
S="python3 benchmarks/share.py --out $W/share --ranks 8 --link-gbps 370 --runs 31 --order gemm-after-first --incoming-source device"
if want timeline; then
  run share/8b_p4m 100 $S --layouts llama3-8b-layer --tag p4m --sides ag-share,rs-share,rs-share-drain64
  run share/8b_p1m 80 $S --layouts llama3-8b-layer --tag p1m --piece-bytes 1M --sides ag-share,rs-share
  run share/8b_c16m 60 $S --layouts llama3-8b-layer --tag c16m --rs-chunk-bytes 16M --sides rs-share
  run share/70b_p4m 100 $S --layouts llama3-70b-layer --tag p4m --sides ag-share,rs-share
  grep -hE "^\[timeline\]|^\[share\]|^=== tide-perf" "$W"/share/*.log | cut -c1-260
fi
if want tests; then
  for f in test_eager_graphs:120 test_graph_capture:40 test_graph_capture_multiprocess:60 test_cuda_collectives:40 \
           test_share_gpu:150; do
    run "tests/${f%%:*}" "${f##*:}" python3 -m pytest -q -rs -x -p no:cacheprovider \
      -o faulthandler_timeout=$(( ${f##*:} - 5 )) "tests/gpu/${f%%:*}.py"
  done
fi
if want streams; then
  run share/8b_streams 110 $S --layouts llama3-8b-layer --tag streams --sides ag-share,rs-share,rs-share-serial
  run share/70b_streams 110 $S --layouts llama3-70b-layer --tag streams --sides rs-share,rs-share-serial
  run share/8b_link470 60 env NCCL_TIDE_LINK_GBPS=470 $S --layouts llama3-8b-layer --tag link470 --sides rs-share
  grep -hE "^\[timeline\]|^\[share\]|^=== tide-perf|^#  " "$W"/share/*.log | cut -c1-230
fi
if want share; then
  run tests/test_share_gpu 150 python3 -m pytest -q -rs -p no:cacheprovider -o faulthandler_timeout=145 \
    tests/gpu/test_share_gpu.py
  for L in llama3-8b-layer llama3-70b-layer; do
    run "share/${L}_streams" 60 $S --layouts $L --tag streams --sides rs-share,rs-share-serial,nccl-like-32
    i=0
    for g in 500 370 500 370; do  # the streams run above was the first "base"
      i=$((i + 1))
      run "share/${L}_rule_${i}_$g" 40 env NCCL_TIDE_LINK_GBPS=$g $S --layouts $L --tag "rule_${i}_$g" --sides rs-share
    done
  done
  grep -hE "^\[timeline\]|^\[share\]|^=== tide-perf" "$W"/share/*.log | cut -c1-200
fi
if want final; then
  for L in llama3-8b-layer llama3-70b-layer; do
    run "share/${L}_final" 50 $S --layouts $L --tag final --sides rs-share,nccl-like-32
  done
  grep -hE "^\[timeline\]|^\[share\]|^#  " "$W"/share/*.log | cut -c1-200
fi
if want mergeab; then
  i=0
  for m in 1 0 1 0 1 0; do
    i=$((i + 1))
    run "host/host_issue_${i}_merge$m" 30 env NCCL_TIDE_MERGE_FLAG_BATCHES=$m \
      python3 benchmarks/host_issue.py --route on --only "64 params" --samples 9 --json "$W/host/host_issue_${i}_merge$m.json"
    grep -E " ag " "$W/host/host_issue_${i}_merge$m.log" | cut -c1-160
  done
fi
if want ipc; then
  run host/ipc2 150 python3 benchmarks/host_issue_ipc.py --ranks 2 --samples 9 --json "$W/host/ipc2.json"
  tail -25 "$W/host/ipc2.log" | cut -c1-200
fi
tar czf "$O/session26.tgz" -C "$W" .
echo "=== done, $(left) s left"
