#!/usr/bin/env bash
# Session 22's device calls (< 10 min each; every stage builds build/gpu through ci/gpu_job.sh or reuses it).
#   1: build; test_faults_multiprocess twice with NCCL_TIDE_TOKEN_RS_CHUNKS=64 (the candidate default) and once with
#      the default 2 (its staging-OOM leak check failed once at 64 in run 21.7; the test now records a free-memory
#      trace with NVML's per-process use); every tests/gpu file but test_perf_gpu with the limit at 64
#      (TIDE_S1_TOKEN_RS_CHUNKS overrides); then the host cost probe (graph launch of a chained vs forked round-like
#      graph), host issue time against baseline_src (an older tree, carried untracked: host_issue_base),
#      sm_bandwidth (the reduce rule's shape at 2, 4, 8, 16 MiB per CTA), 2 processes over CUDA IPC
#      (host_issue_ipc.py). Written in session 22, which never got a device; not run yet.
#   2: the issue-16 shares (2 MiB reduce CTAs; the RS share also with 4 and 8 MiB in the same run) and the world-size-1
#      FSDP2 step at 30 steps; builds build/gpu if absent.
#   3: test_perf_gpu.
# Each job writes under $OUT/<job>/. TIDE_GPU_DEADLINE_S: the stage's budget (default 565 s).
#   0: build, test_faults_multiprocess twice, test_eager_graphs, test_graph_capture_multiprocess (what fits in ~3 min).
#   0p: 0 with one faults run, then the probe, host_issue and host_issue_base (~8 min; session 23).
#   0q: 0p without host_issue and host_issue_base (~5 min).
# Usage: bash ci/gpu_session22.sh 0|1|2|3
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1 PATH="/usr/local/cuda/bin:$PATH"
O="${OUT:-$PWD/gpu-out}"
mkdir -p "$O"
END=$(( $(date +%s) + ${TIDE_GPU_DEADLINE_S:-565} ))
left() { echo $(( END - $(date +%s) )); }
job() {  # job NAME TESTS BENCH [ENV=...]: ci/gpu_job.sh under what is left, into $O/NAME
  local name=$1 tests=$2 bench=$3; shift 3
  env "$@" OUT="$O/$name" TIDE_GPU_TESTS="$tests" TIDE_GPU_BENCH="$bench" TIDE_GPU_DEADLINE_S=$(left) bash ci/gpu_job.sh
  echo "##### $name done, $(left) s left"
}
faults() {  # faults NAME [ENV=...]: test_faults_multiprocess with -rP (its staging-OOM trace shows when it passes)
  local name=$1; shift; mkdir -p "$O/$name"
  env "$@" NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so" PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu" \
    timeout -k 5 70 python3 -m pytest -q -rP -p no:cacheprovider tests/gpu/test_faults_multiprocess.py \
    > "$O/$name/faults.log" 2>&1
  echo "=== $name rc $? ($(grep -E '[0-9]+ (passed|failed)' "$O/$name/faults.log" | tail -1))"
  grep -E "staging OOM trace|staging OOM: free" "$O/$name/faults.log" | cut -c1-700 | head -4
}
case "${1:-}" in
  0)  # the least that answers the default flip's question (a few minutes of device time)
    job build "" ""
    faults faults64_1 NCCL_TIDE_TOKEN_RS_CHUNKS=64
    faults faults64_2 NCCL_TIDE_TOKEN_RS_CHUNKS=64
    job s0 "test_eager_graphs:90 test_graph_capture_multiprocess:90" "" NCCL_TIDE_TOKEN_RS_CHUNKS=64
    ;;
  0p)  # session 23, when under 10 minutes of device time were left: stage 0 less one faults run, plus the probe and
       # host issue time folded (this tree, limit 64) against forked (baseline_src at the same limit)
    job build "" ""
    faults faults64_1 NCCL_TIDE_TOKEN_RS_CHUNKS=64
    job s0 "test_eager_graphs:90 test_graph_capture_multiprocess:90" "probe host_issue host_issue_base" \
      NCCL_TIDE_TOKEN_RS_CHUNKS=64
    ;;
  0q)  # session 23's last few minutes: 0p without host_issue
    job build "" ""
    faults faults64_1 NCCL_TIDE_TOKEN_RS_CHUNKS=64
    job s0 "test_eager_graphs:90 test_graph_capture_multiprocess:90" "probe" NCCL_TIDE_TOKEN_RS_CHUNKS=64
    ;;
  1)
    job build "" ""  # builds build/gpu (and nothing else)
    faults faults64_1 NCCL_TIDE_TOKEN_RS_CHUNKS=64
    faults faults64_2 NCCL_TIDE_TOKEN_RS_CHUNKS=64
    faults faults2
    job s1 "test_eager_graphs:120 test_graph_capture_multiprocess:120 test_cuda_collectives:60 test_reduce_kernel_gpu:60
      test_share_gpu:60 test_multiprocess:100 test_faults:60 test_abort:60 test_graph_capture:60 test_pending_waits:40
      test_virtual_nodes:60 test_hardening_gpu:60 test_eager_call_order:60 test_fsdp_native:60 test_interposer_gpu:60
      test_concurrency_gpu:60 test_cuda_properties:60" "probe host_issue host_issue_base sm_bandwidth host_issue_ipc" \
      NCCL_TIDE_TOKEN_RS_CHUNKS=${TIDE_S1_TOKEN_RS_CHUNKS:-64}
    ;;
  2)
    SHARE19_RUNS="new rs-4m rs-8m" OUT="$O/share" TIDE_GPU_DEADLINE_S=$(( $(left) - 110 )) bash ci/gpu_share19.sh
    mkdir -p "$O/fsdp"
    [ -f build/gpu/libnccl-tide.so ] || { echo "no build/gpu"; exit 1; }
    export NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so" PYTHONPATH="$PWD/pytorch_glue${PYTHONPATH:+:$PYTHONPATH}"
    timeout -k 5 $(( $(left) > 20 ? $(left) - 5 : 15 )) python3 -m nccl_tide.bench.fsdp_step --layers 4 \
      --variants stock,tide --slot-pool 2 --slot-trim on --warmup 3 --steps 30 --variant-timeout 90 \
      -J "$O/fsdp/fsdp_step_30.json" > "$O/fsdp/fsdp_step_30.log" 2>&1
    echo "=== fsdp_step 30 steps rc $?"; grep -vE "TIDE/|NCCL TIDE" "$O/fsdp/fsdp_step_30.log" | tail -12
    ;;
  3)
    job perf "test_perf_gpu:200" ""
    ;;
  *) echo "usage: bash ci/gpu_session22.sh 0|0p|0q|1|2|3" >&2; exit 2 ;;
esac
for s in "$O"/*/summary.txt; do [ -f "$s" ] && { echo "--- $s"; cat "$s"; }; done
