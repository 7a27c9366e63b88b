#!/usr/bin/env bash
# Session 17, second device call (issues 15-17), one call under a deadline: build; route-on runs of the GPU files
# that assert pending waits or cross-process behaviour; the reduce kernel variants (sm_bandwidth); one rank's share of
# Llama-8B and 70B layers with a drain-cap side; with TIDE_FSDP=1 the FSDP2 step (trimming vs untrimmed vs stock),
# the memory probe and test_fsdp_native.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1 PATH="/usr/local/cuda/bin:$PATH"
O="${OUT:-$PWD/gpu-out}"; mkdir -p "$O"
START=$(date +%s); DEADLINE=$((START + ${TIDE_GPU_DEADLINE_S:-500}))
left() { echo $((DEADLINE - $(date +%s))); }
run() {  # run NAME LIMIT CMD...: under min(LIMIT, time left), log in $O/NAME.log, tail shown
  local name=$1 lim=$2 l rc; shift 2; l=$(left)
  if [ "$l" -lt 20 ]; then echo "=== $name SKIPPED ($l s left)"; return; fi
  [ "$l" -lt "$lim" ] && lim=$l
  local t0=$(date +%s); timeout -k 5 "$lim" "$@" > "$O/$name.log" 2>&1; rc=$?
  echo "=== $name rc $rc $(( $(date +%s) - t0 )) s"; grep -vE "^TIDE/|NCCL TIDE" "$O/$name.log" | tail -${TAIL:-6}
}
( cmake -S . -B build/gpu -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    > "$O/build.log" 2>&1 && cmake --build build/gpu -j 14 >> "$O/build.log" 2>&1 ) || { tail -30 "$O/build.log"; exit 1; }
echo "=== built $(( $(date +%s) - START )) s; $(git rev-parse --short HEAD)"
export NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so" PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu"
PT="python3 -m pytest -q -rs -p no:cacheprovider"
for f in ${TIDE_ON_FILES:-test_faults test_abort test_graph_capture_multiprocess}; do
  TAIL=4 run "on_$f" 90 env NCCL_TIDE_EAGER_GRAPHS=1 $PT -o faulthandler_timeout=75 tests/gpu/$f.py
done
TAIL=30 run sm_bandwidth 100 python3 benchmarks/sm_bandwidth.py --out "$O" --link-gbps 370 --ranks 8
TAIL=24 run share 240 python3 benchmarks/share.py --out "$O" --layouts llama3-8b-layer,llama3-70b-layer --ranks 8 \
  --link-gbps 370 --runs 31 --sides ${TIDE_SHARE_SIDES:-ag-share,rs-share,rs-share-drain64,nccl-like-32}
if [ "${TIDE_FSDP:-0}" = 1 ]; then
TAIL=8 run fsdp_step 130 python3 -m nccl_tide.bench.fsdp_step --layers 4 --variants stock,tide --slot-pool 2 \
  --slot-trim on --warmup 3 --steps 10 --variant-timeout 40 -J "$O/fsdp_step_trim_fwd.json"
TAIL=8 run fsdp_step_off 90 python3 -m nccl_tide.bench.fsdp_step --layers 4 --variants stock,tide --slot-pool 2 \
  --slot-trim off --warmup 3 --steps 10 --variant-timeout 40 -J "$O/fsdp_step_trim_off.json"
TAIL=10 run probe_trim 90 python3 benchmarks/fsdp_memory_probe.py --variants stock,tide --slot-pool 2 --slot-trim on \
  --timeout 70 --out "$O/probe_trim_fwd.json"
TAIL=12 run fsdp_native 60 $PT -o faulthandler_timeout=50 tests/gpu/test_fsdp_native.py
fi
echo "=== end $(( $(date +%s) - START )) s"
