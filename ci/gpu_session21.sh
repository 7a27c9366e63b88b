#!/usr/bin/env bash
# Session 21's device calls (< 10 min each; every stage builds build/gpu through ci/gpu_job.sh or reuses it).
#   1: what sessions 19-21 changed and never ran: test_eager_graphs (strided runs; the two-lane token RSs of 3-8
#      chunks in a subprocess with NCCL_TIDE_TOKEN_RS_CHUNKS raised), the call-order test, the IPC capture with a
#      forked 4-chunk RS (test_graph_capture_multiprocess), the held-call files with the route on, then the
#      route-off files, then as many other tests/gpu files as fit (route on).
#   2: the rest of tests/gpu (test_perf_gpu last).
#   3: the figures: host issue time (default and NCCL_TIDE_TOKEN_RS_CHUNKS=64; "64 params" vs "64 params rev" is
#      strided runs vs plain copies), the issue-16 shares with the fixed harness, the world-size-1 FSDP2 step at 30
#      steps.
# Each job writes under $OUT/<job>/ (ci/gpu_job.sh leaves all.tgz and summary.txt there when it ends; a job cut
# off at the device's limit leaves its logs, of which the device returns up to 8 files). At most 7 files per stage.
# TIDE_GPU_DEADLINE_S: the stage's budget (default 565 s; set it from the device time left).
# Usage: bash ci/gpu_session21.sh 1|2|3
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
case "${1:-}" in
  1)
    job on "test_eager_graphs:260 test_eager_call_order:150 test_graph_capture_multiprocess:200 test_graph_capture:60
      test_faults:70 test_abort:50 test_pending_waits:40" ""
    job off "test_cuda_collectives:60 test_faults:50 test_abort:40" "" NCCL_TIDE_EAGER_GRAPHS=0
    job on2 "test_concurrency_gpu:50 test_cuda_collectives:60 test_multiprocess:90 test_virtual_nodes:60
      test_reduce_kernel_gpu:60 test_share_gpu:50" ""
    ;;
  2)
    job rest "test_interposer_gpu:70 test_faults_multiprocess:70 test_cuda_properties:50 test_fsdp_native:90
      test_hardening_gpu:170 test_perf_gpu:170" ""
    ;;
  3)
    job bench "" "host_issue host_issue_pipelined"
    OUT="$O/share" TIDE_GPU_DEADLINE_S=$(( $(left) - 110 )) bash ci/gpu_share19.sh
    mkdir -p "$O/fsdp"
    export NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so" PYTHONPATH="$PWD/pytorch_glue${PYTHONPATH:+:$PYTHONPATH}"
    timeout -k 5 $(( $(left) > 20 ? $(left) - 5 : 15 )) python3 -m nccl_tide.bench.fsdp_step --layers 4 \
      --variants stock,tide --slot-pool 2 --slot-trim on --warmup 3 --steps 30 --variant-timeout 90 \
      -J "$O/fsdp/fsdp_step_30.json" > "$O/fsdp/fsdp_step_30.log" 2>&1
    echo "=== fsdp_step 30 steps rc $?"; grep -vE "TIDE/|NCCL TIDE" "$O/fsdp/fsdp_step_30.log" | tail -12
    ;;
  *) echo "usage: bash ci/gpu_session21.sh 1|2|3" >&2; exit 2 ;;
esac
for s in "$O"/*/summary.txt; do [ -f "$s" ] && { echo "--- $s"; cat "$s"; }; done
