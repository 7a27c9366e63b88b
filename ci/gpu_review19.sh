#!/usr/bin/env bash
# Review 19 device call: build; the eager-graph call-order test (route forced on in its subprocesses); the loopback
# files that exercise held calls, synchronize and close, with the route on and off.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1 PATH="/usr/local/cuda/bin:$PATH"
O="${OUT:-$PWD/gpu-out}"; mkdir -p "$O"
START=$(date +%s); DEADLINE=$((START + ${TIDE_GPU_DEADLINE_S:-540}))
left() { echo $((DEADLINE - $(date +%s))); }
run() {  # run NAME LIMIT CMD...: under min(LIMIT, time left), log in $O/NAME.log, tail shown
  local name=$1 lim=$2 l rc; shift 2; l=$(left)
  if [ "$l" -lt 20 ]; then echo "=== $name SKIPPED ($l s left)"; return; fi
  [ "$l" -lt "$lim" ] && lim=$l
  local t0=$(date +%s); timeout -k 5 "$lim" "$@" > "$O/$name.log" 2>&1; rc=$?
  echo "=== $name rc $rc $(( $(date +%s) - t0 )) s"; grep -vE "^TIDE/|NCCL TIDE" "$O/$name.log" | tail -${TAIL:-3}
}
( cmake -S . -B build/gpu -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    > "$O/build.log" 2>&1 && cmake --build build/gpu -j 16 >> "$O/build.log" 2>&1 ) || { tail -30 "$O/build.log"; exit 1; }
echo "=== built $(( $(date +%s) - START )) s"
export NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so" PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu"
PT="python3 -m pytest -q -rs -p no:cacheprovider"
TAIL=12 run call_order 240 $PT -o faulthandler_timeout=230 tests/gpu/test_eager_call_order.py
for spec in ${TIDE_REVIEW_ON:-test_eager_graphs:120 test_faults:90 test_abort:60 test_pending_waits:40 test_concurrency_gpu:60}; do
  f=${spec%%:*}; lim=${spec##*:}
  run "on_$f" "$lim" env NCCL_TIDE_EAGER_GRAPHS=1 $PT -o faulthandler_timeout=$((lim - 10)) tests/gpu/$f.py
done
for spec in ${TIDE_REVIEW_OFF:-test_cuda_collectives:90 test_faults:60 test_abort:40}; do
  f=${spec%%:*}; lim=${spec##*:}
  run "off_$f" "$lim" env NCCL_TIDE_EAGER_GRAPHS=0 $PT -o faulthandler_timeout=$((lim - 10)) tests/gpu/$f.py
done
echo "=== end $(( $(date +%s) - START )) s"
