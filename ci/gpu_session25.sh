#!/usr/bin/env bash
# Session 25, one device call (< 10 min): the reduce grid's 1 MiB floor (kReduceCtaMinBytes) against the tree before
# it (base_src, carried untracked: `git archive <base> | tar -x -C base_src`), same machine, alternated:
#   tests: tests/gpu files touched by the reduce shape (this tree's library);
#   share: one rank's RS share (8B and 70B layers, W = 8, 370 GB/s, 31 runs) with this tree's library and the base's,
#          in the order new, base, then the full "new" side set (AG, RS, unpaced, NCCL-like 32 CTAs) once;
#   fsdp:  fsdp_step at world size 1 (4 layers, 30 steps, stock and tide) in the order new, base, base, new.
# Everything is archived as $OUT/session25.tgz (the device returns few files). TIDE_GPU_DEADLINE_S: default 560.
#   sig:    (second call) the graph files of tests/gpu with signal kernels on (the default), then
#   hostab: benchmarks/host_issue.py --route on --per-rank with NCCL_TIDE_SIGNAL_KERNELS=1 and =0, alternated.
#   merge:  (last call) the capture test files (unless sig ran them), then host_issue's 64-parameter rows with
#           NCCL_TIDE_MERGE_FLAG_BATCHES 1, 0, 0, 1 (the AG replay column).
# Usage: bash ci/gpu_session25.sh [tests] [share] [fsdp] [sig] [hostab] [merge]   (no argument: the first three)
TAG=s25 parts="${*:-tests share fsdp}"
TIDE_GPU_DEADLINE_S="${TIDE_GPU_DEADLINE_S:-560}"
source "$(dirname "$0")/gpu_session_lib.sh"
session_dirs tests share fsdp
t0=$(date +%s)
build . build/gpu "$W/build/new.log" & pn=$!
pb=; [ -d base_src ] && { build base_src build/base "$W/build/base.log" & pb=$!; }
wait $pn || { echo "new build failed"; tail -20 "$W/build/new.log"; exit 1; }
[ -n "$pb" ] && { wait $pb || echo "base build failed"; }
echo "=== built $(( $(date +%s) - t0 )) s, $(left) s left"
env_txt
lib_of() { [ "$1" = base ] && echo "$PWD/build/base/libnccl-tide.so" || echo "$PWD/build/gpu/libnccl-tide.so"; }
if want tests; then
  for f in test_reduce_kernel_gpu:120 test_share_gpu:70 test_fsdp_native:90; do
    run "tests/${f%%:*}" "${f##*:}" env NCCL_TIDE_LIBRARY_PATH="$(lib_of new)" python3 -m pytest -q -rs \
      -p no:cacheprovider "tests/gpu/${f%%:*}.py"
  done
fi
S="python3 benchmarks/share.py --out $W/share --layouts llama3-8b-layer,llama3-70b-layer --ranks 8 --link-gbps 370 --runs 31 --order gemm-after-first --incoming-source device"
if want sig; then
  for f in test_eager_graphs:200 test_graph_capture:100 test_graph_capture_multiprocess:120 test_cuda_collectives:100; do
    run "tests/${f%%:*}" "${f##*:}" env NCCL_TIDE_LIBRARY_PATH="$(lib_of new)" python3 -m pytest -q -rs -x \
      -p no:cacheprovider -o faulthandler_timeout=$(( ${f##*:} - 15 )) "tests/gpu/${f%%:*}.py"
  done
fi
if want hostab; then
  i=0
  for sig in 1 0 0 1; do
    i=$((i + 1))
    run "tests/host_issue_${i}_sig$sig" 100 env NCCL_TIDE_LIBRARY_PATH="$(lib_of new)" NCCL_TIDE_SIGNAL_KERNELS=$sig \
      python3 benchmarks/host_issue.py --route on --per-rank --samples 7 --json "$W/tests/host_issue_${i}_sig$sig.json"
    grep -E " rs " "$W/tests/host_issue_${i}_sig$sig.log" | cut -c1-160
  done
fi
if want merge; then
  want sig || for f in test_graph_capture:20 test_graph_capture_multiprocess:45 test_eager_graphs:80; do
    run "tests/${f%%:*}" "${f##*:}" env NCCL_TIDE_LIBRARY_PATH="$(lib_of new)" python3 -m pytest -q -rs -x \
      -p no:cacheprovider -o faulthandler_timeout=$(( ${f##*:} - 5 )) "tests/gpu/${f%%:*}.py"
  done
  i=0
  for m in 1 0 0 1; do
    i=$((i + 1))
    run "tests/host_issue_${i}_merge$m" 25 env NCCL_TIDE_LIBRARY_PATH="$(lib_of new)" NCCL_TIDE_MERGE_FLAG_BATCHES=$m \
      python3 benchmarks/host_issue.py --route on --only "64 params" --samples 7 --json "$W/tests/host_issue_${i}_merge$m.json"
    grep -E " ag " "$W/tests/host_issue_${i}_merge$m.log" | cut -c1-160
  done
fi
if want share; then
  for tree in new base; do
    [ -f "$(lib_of $tree)" ] || continue
    run "share/rs_$tree" 60 env NCCL_TIDE_LIBRARY_PATH="$(lib_of $tree)" $S --tag "rs-$tree" --sides rs-share
  done
  run share/full_new 80 env NCCL_TIDE_LIBRARY_PATH="$(lib_of new)" $S --tag full-new \
    --sides ag-share,rs-share,ag-share-unpaced,rs-share-unpaced,nccl-like-32
  grep -hE "rs-share|ag-share|nccl-like" "$W"/share/*.log | grep -vE "^TIDE/|NCCL TIDE" | tail -30
fi
if want fsdp; then
  i=0
  for tree in new base base new; do
    i=$((i + 1)); lib="$(lib_of $tree)"
    [ -f "$lib" ] || { echo "=== fsdp $i $tree: no library"; continue; }
    variants=stock,tide; [ $((i % 2)) -eq 0 ] && variants=tide,stock
    run "fsdp/fsdp_${i}_$tree" 95 env NCCL_TIDE_LIBRARY_PATH="$lib" python3 -m nccl_tide.bench.fsdp_step \
      --layers 4 --variants $variants --slot-pool 2 --slot-trim on --warmup 3 --steps 30 --variant-timeout 60 \
      -J "$W/fsdp/fsdp_${i}_$tree.json"
    grep -E "^\| (stock|tide) " "$W/fsdp/fsdp_${i}_$tree.log" | cut -c1-200
  done
fi
tar czf "$O/session25.tgz" -C "$W" .
echo "=== done, $(left) s left"
