#!/usr/bin/env bash
# What session 20 (no device lent) left for the next device calls, in three calls of < 10 min each. Every stage
# builds build/gpu through ci/gpu_job.sh (or reuses it) and writes under $OUT/<stage>.
#   A: review19's device checks (ci/gpu_review19.sh: call order, route on / off) with test_eager_graphs, whose
#      pipelined tests (token RSs of 3-8 chunks, NCCL_TIDE_TOKEN_RS_CHUNKS=64 in a subprocess) are new.
#   B: issue 16's shares with the fixed harness (ci/gpu_share19.sh), host issue time with the default limit and with
#      NCCL_TIDE_TOKEN_RS_CHUNKS=64 (the Llama 4-chunk and 64-parameter RS rows take tokens then), and issue 17's
#      world-size-1 step at 30 steps (trim on, the default).
#   C: every tests/gpu file on this tree (ci/gpu_job.sh's default list), no benchmarks.
# Usage: bash ci/gpu_session20.sh A|B|C
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1 PATH="/usr/local/cuda/bin:$PATH"
O="${OUT:-$PWD/gpu-out}"
mkdir -p "$O"
END=$(( $(date +%s) + ${TIDE_GPU_DEADLINE_S:-560} ))
left() { echo $(( END - $(date +%s) )); }
case "${1:-}" in
  A)
    OUT="$O/A" TIDE_GPU_DEADLINE_S=$(left) \
      TIDE_REVIEW_ON="test_eager_graphs:260 test_faults:90 test_abort:60 test_pending_waits:40 test_concurrency_gpu:60" \
      bash ci/gpu_review19.sh
    ;;
  B)
    OUT="$O/B" TIDE_GPU_TESTS="" TIDE_GPU_BENCH="host_issue host_issue_pipelined" TIDE_GPU_DEADLINE_S=250 \
      bash ci/gpu_job.sh
    OUT="$O/B" TIDE_GPU_DEADLINE_S=$(( $(left) - 100 )) bash ci/gpu_share19.sh
    export NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so" PYTHONPATH="$PWD/pytorch_glue${PYTHONPATH:+:$PYTHONPATH}"
    timeout -k 5 $(( $(left) > 20 ? $(left) - 5 : 15 )) python3 -m nccl_tide.bench.fsdp_step --layers 4 \
      --variants stock,tide --slot-pool 2 --slot-trim on --warmup 3 --steps 30 --variant-timeout 90 \
      -J "$O/B/fsdp_step_trim_on_30.json" > "$O/B/fsdp_step_trim_on_30.log" 2>&1
    echo "=== fsdp_step 30 steps rc $?"; grep -vE "TIDE/|NCCL TIDE" "$O/B/fsdp_step_trim_on_30.log" | tail -12
    ;;
  C)
    OUT="$O/C" TIDE_GPU_BENCH="" TIDE_GPU_DEADLINE_S=$(left) bash ci/gpu_job.sh
    ;;
  *) echo "usage: bash ci/gpu_session20.sh A|B|C" >&2; exit 2 ;;
esac
tar -C "$O" -czf "$O/session20-${1}.tgz" "${1}" 2>/dev/null || true
