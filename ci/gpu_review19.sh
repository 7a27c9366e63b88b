#!/usr/bin/env bash
# Review 19 device call: the eager-graph call-order test (route forced on in its subprocesses), then the loopback
# files that exercise held calls, synchronize and close with the route on and with it off: three runs of
# ci/gpu_job.sh (build once, per-file limits, one shared deadline), logs under $OUT/{order,on,off}.
# Usage: bash ci/gpu_review19.sh   (TIDE_REVIEW_ON / TIDE_REVIEW_OFF: "file:limit ..." to change the lists)
set -uo pipefail
cd "$(dirname "$0")/.."
O="${OUT:-$PWD/gpu-out}"
END=$(( $(date +%s) + ${TIDE_GPU_DEADLINE_S:-540} ))
left() { echo $(( END - $(date +%s) )); }
OUT="$O/order" TIDE_GPU_TESTS="test_eager_call_order:240" TIDE_GPU_BENCH="" TIDE_GPU_DEADLINE_S=$(left) bash ci/gpu_job.sh
NCCL_TIDE_EAGER_GRAPHS=1 OUT="$O/on" TIDE_GPU_BENCH="" TIDE_GPU_DEADLINE_S=$(left) \
  TIDE_GPU_TESTS="${TIDE_REVIEW_ON:-test_eager_graphs:120 test_faults:90 test_abort:60 test_pending_waits:40 test_concurrency_gpu:60}" \
  bash ci/gpu_job.sh
NCCL_TIDE_EAGER_GRAPHS=0 OUT="$O/off" TIDE_GPU_BENCH="" TIDE_GPU_DEADLINE_S=$(left) \
  TIDE_GPU_TESTS="${TIDE_REVIEW_OFF:-test_cuda_collectives:90 test_faults:60 test_abort:40}" bash ci/gpu_job.sh
