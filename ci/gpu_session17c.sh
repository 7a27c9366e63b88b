#!/usr/bin/env bash
# Session 17, third device call: build; the GPU files not yet run with the eager graph route on, with it on (the
# reduce kernel's bit-exactness included); the reduce per CTA (sm_bandwidth), one rank's share (8B, 70B; 70B AG
# also with 1 MiB pieces and unpaced); FSDP2 step and memory with the end-of-forward trimming vs untrimmed vs stock.
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
    > "$O/build.log" 2>&1 && cmake --build build/gpu -j 14 >> "$O/build.log" 2>&1 ) || { tail -30 "$O/build.log"; exit 1; }
echo "=== built $(( $(date +%s) - START )) s"
export NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so" PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu"
PT="python3 -m pytest -q -rs -p no:cacheprovider"
for spec in test_reduce_kernel_gpu:80 test_eager_graphs:60 test_fsdp_native:90 test_virtual_nodes:60 \
    test_interposer_gpu:80 test_faults_multiprocess:80 test_concurrency_gpu:60 test_cuda_properties:60 test_share_gpu:60; do
  f=${spec%%:*}; lim=${spec##*:}
  run "on_$f" "$lim" env NCCL_TIDE_EAGER_GRAPHS=1 $PT -o faulthandler_timeout=$((lim - 10)) tests/gpu/$f.py
done
TAIL=16 run sm_bandwidth 60 python3 benchmarks/sm_bandwidth.py --out "$O" --link-gbps 370 --ranks 8
TAIL=14 run share 120 python3 benchmarks/share.py --out "$O" --layouts llama3-8b-layer,llama3-70b-layer --ranks 8 \
  --link-gbps 370 --runs 31 --sides ag-share,ag-share-unpaced,rs-share,rs-share-unpaced,nccl-like-16,nccl-like-32
mkdir -p "$O/p1m"
TAIL=6 run share_70b_1m 60 python3 benchmarks/share.py --out "$O/p1m" --layouts llama3-70b-layer --ranks 8 \
  --link-gbps 370 --runs 31 --sides ag-share --piece-bytes 1M
for trim in on off; do
  TAIL=4 run "fsdp_step_$trim" 70 python3 -m nccl_tide.bench.fsdp_step --layers 4 --variants stock,tide --slot-pool 2 \
    --slot-trim $trim --warmup 3 --steps 10 --variant-timeout 30 -J "$O/fsdp_step_trim_$trim.json"
done
TAIL=30 run probe_trim 70 python3 benchmarks/fsdp_memory_probe.py --variants stock,tide --slot-pool 2 --slot-trim on \
  --timeout 60 --out "$O/probe_trim_fwd.json"
for spec in test_hardening_gpu:200 test_perf_gpu:200; do
  f=${spec%%:*}; lim=${spec##*:}
  run "on_$f" "$lim" env NCCL_TIDE_EAGER_GRAPHS=1 $PT -o faulthandler_timeout=$((lim - 10)) tests/gpu/$f.py
done
echo "=== end $(( $(date +%s) - START )) s"
# the device returns few files: everything in one archive
( cd "$O" && tar czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz all.tgz )
