#!/usr/bin/env bash
# Session-14 GPU job (issue 15): builds the library (build/gpu) and, if baseline_src/ is present (the sources of an
# earlier commit), that baseline (build/base); runs the core GPU test files, the host-cost probe, and
# benchmarks/host_issue.py against both libraries. Usage: ci/gpu_session14.sh [suite files...]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1
export PATH="/usr/local/cuda/bin:$PATH"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
echo "=== build ($(date +%T))"
( cmake -S . -B build/gpu -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    >"$OUT/build.log" 2>&1 && cmake --build build/gpu -j 12 >>"$OUT/build.log" 2>&1 ) &
b1=$!
if [ -d baseline_src ]; then
  ( cmake -S baseline_src -B build/base -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DCMAKE_BUILD_TYPE=Release >"$OUT/build_base.log" 2>&1 && cmake --build build/base -j 4 >>"$OUT/build_base.log" 2>&1 ) &
  b2=$!
fi
nvcc -O2 -arch=sm_90 benchmarks/host_cost_probe.cu -o /tmp/host_cost_probe >"$OUT/probe_build.log" 2>&1 &
wait $b1 || { tail -40 "$OUT/build.log"; echo "build FAILED"; exit 1; }
echo "=== built ($(date +%T))"
export TIDE_GPU_BUILD=build/gpu
files=("$@")
[ ${#files[@]} -eq 0 ] && files=(tests/gpu/test_cuda_collectives.py:150 tests/gpu/test_virtual_nodes.py:200 tests/gpu/test_graph_capture.py:150)
bash ci/gpu_suite.sh "${files[@]}" 2>&1 | grep -E "===|passed|failed|error|Error|summary|rc " | tail -40
wait
echo "=== probe ($(date +%T))"
timeout 60 /tmp/host_cost_probe | tee "$OUT/host_cost_probe.txt"
export PYTHONPATH="$PWD/pytorch_glue${PYTHONPATH:+:$PYTHONPATH}"
if [ -f build/base/libnccl-tide.so ]; then
  echo "=== host_issue baseline ($(date +%T))"
  TIDE_BENCH_OLD_LIBRARY=1 NCCL_TIDE_LIBRARY_PATH=$PWD/build/base/libnccl-tide.so timeout 150 python3 benchmarks/host_issue.py --json "$OUT/host_issue_base.json" 2>&1 | grep -v TRACE | tee "$OUT/host_issue_base.txt"
fi
echo "=== host_issue new ($(date +%T))"
NCCL_TIDE_LIBRARY_PATH=$PWD/build/gpu/libnccl-tide.so timeout 150 python3 benchmarks/host_issue.py --json "$OUT/host_issue_new.json" 2>&1 | grep -v TRACE | tee "$OUT/host_issue_new.txt"
echo "=== end ($(date +%T))"
