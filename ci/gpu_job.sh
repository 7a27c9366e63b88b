#!/usr/bin/env bash
# One device call (< 10 min): build, then the GPU test files named in TIDE_GPU_TESTS ("file:limit ..."; default
# every tests/gpu file with its usual limit; each test's name is logged as it ends, and each file's 15 slowest, so
# a file cut off by the deadline still shows how far it got), then the benchmark steps named in TIDE_GPU_BENCH
# (default all, in priority order), all under one deadline (TIDE_GPU_DEADLINE_S, default 540 s): a step that would not fit is
# skipped and says so. Logs and JSON go to $OUT, archived as all.tgz (the device returns few files) plus
# summary.txt. Usage: [TIDE_GPU_TESTS=...] [TIDE_GPU_BENCH=...] bash ci/gpu_job.sh
# Benchmark steps: sm_bandwidth share_8b host_issue host_issue_limit2 host_issue_split host_issue_ipc host_issue_ipc8
# host_issue_base probe fsdp_step fsdp_memory
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast stays off on shared machines (DESIGN.md section 6); every child inherits these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1
export PATH="/usr/local/cuda/bin:$PATH"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
START=$(date +%s)
DEADLINE=$((START + ${TIDE_GPU_DEADLINE_S:-540}))
ALL_TESTS="test_cuda_collectives:60 test_eager_graphs:260 test_eager_call_order:120 test_virtual_nodes:60 test_multiprocess:100 test_graph_capture:60
  test_graph_capture_multiprocess:200 test_pending_waits:40 test_reduce_kernel_gpu:80 test_abort:60 test_faults:90
  test_interposer_gpu:80 test_faults_multiprocess:80 test_concurrency_gpu:60 test_cuda_properties:60
  test_fsdp_native:90 test_share_gpu:60 test_hardening_gpu:200 test_perf_gpu:200"
TESTS="${TIDE_GPU_TESTS-$ALL_TESTS}"
BENCH="${TIDE_GPU_BENCH-sm_bandwidth share_8b host_issue probe fsdp_step host_issue_base}"
summary=()
left() { echo $((DEADLINE - $(date +%s))); }
# step NAME LIMIT MIN CMD...: CMD under min(LIMIT, time left) if at least MIN seconds are left; log in $OUT/NAME.log
step() {
  local name=$1 limit=$2 min=$3 l t0 rc line
  shift 3
  l=$(left)
  if [ "$l" -lt "$min" ]; then summary+=("$name: SKIPPED (${l} s left)"); return 0; fi
  [ "$l" -lt "$limit" ] && limit=$l
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  line=$(grep -E "[0-9]+ (passed|failed|error)" "$OUT/$name.log" | tail -1)
  summary+=("$name: rc $rc, $(( $(date +%s) - t0 )) s${line:+: $line}")
  echo "=== $name rc $rc $(( $(date +%s) - t0 )) s ${line}"
  [ "$rc" -eq 0 ] || grep -E "Error|error|FAIL|assert|Timeout" "$OUT/$name.log" | grep -vE "TIDE/|NCCL TIDE" | head -15
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.nccl.version())" \
  >> "$OUT/env.txt" 2>&1
git rev-parse HEAD >> "$OUT/env.txt" 2>&1; git status --short >> "$OUT/env.txt" 2>&1
( cmake -S . -B build/gpu -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    >"$OUT/build.log" 2>&1 && cmake --build build/gpu -j 14 >>"$OUT/build.log" 2>&1 ) || { tail -30 "$OUT/build.log"; exit 1; }
case " $BENCH " in *" host_issue_base "*)
  if [ -d baseline_src ]; then
    ( cmake -S baseline_src -B build/base -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_BUILD_TYPE=Release >"$OUT/build_base.log" 2>&1 && cmake --build build/base -j 4 >>"$OUT/build_base.log" 2>&1 ) &
  fi;; esac
case " $BENCH " in *" probe "*)
  nvcc -O2 -arch=sm_90 benchmarks/host_cost_probe.cu -o /tmp/host_cost_probe >"$OUT/probe_build.log" 2>&1 & ;; esac
echo "=== built ($(( $(date +%s) - START )) s)"
export NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"
for spec in $TESTS; do
  f=${spec%%:*}; lim=${spec##*:}
  [ -f "tests/gpu/$f.py" ] || { summary+=("$f: not in this tree"); continue; }
  # faulthandler dumps every thread's stack 15 s before the file's limit (or the deadline), so a hang shows where.
  l=$(left); [ "$l" -lt "$lim" ] && lim=$l
  step "$f" "$lim" 20 python3 -m pytest -v -rs --durations=15 -p no:cacheprovider -o faulthandler_timeout=$(( lim > 30 ? lim - 15 : 15 )) \
    "tests/gpu/$f.py"
done
wait
for b in $BENCH; do
  case $b in
    sm_bandwidth) step sm_bandwidth 90 30 python3 benchmarks/sm_bandwidth.py --out "$OUT" --link-gbps 370 --ranks 8 ;;
    share_8b) step share_8b 180 60 python3 benchmarks/share.py --out "$OUT" --layouts llama3-8b-layer --ranks 8 \
                --link-gbps 370 --runs 31 ${TIDE_SHARE_ARGS:-} ;;
    host_issue) step host_issue 140 40 python3 benchmarks/host_issue.py --samples 9 --json "$OUT/host_issue.json" ;;
    host_issue_limit2) step host_issue_limit2 140 40 env NCCL_TIDE_TOKEN_RS_CHUNKS=2 python3 \
                         benchmarks/host_issue.py --samples 9 --json "$OUT/host_issue_limit2.json" ;;
    host_issue_split) step host_issue_split 100 40 env NCCL_TIDE_EAGER_GRAPHS=1 python3 benchmarks/host_issue.py \
                        --route on --per-rank --samples 9 --json "$OUT/host_issue_split.json" ;;
    host_issue_ipc) step host_issue_ipc 100 40 python3 benchmarks/host_issue_ipc.py --ranks 2 --samples 9 \
                      --json "$OUT/host_issue_ipc2.json" ;;
    host_issue_ipc8) step host_issue_ipc8 150 60 python3 benchmarks/host_issue_ipc.py --ranks 8 --samples 7 \
                       --timeout 140 --json "$OUT/host_issue_ipc8.json" ;;
    probe) step probe 120 20 /tmp/host_cost_probe ;;
    fsdp_step) step fsdp_step 150 60 python3 -m nccl_tide.bench.fsdp_step --layers 4 --variants stock,tide,tide-dedicated \
                 --slot-pool 2 --warmup 3 --steps 10 --profile-steps 2 --variant-timeout 45 -J "$OUT/fsdp_step_pool.json" ;;
    fsdp_memory) step fsdp_memory 150 60 python3 benchmarks/fsdp_memory_probe.py --out "$OUT/fsdp_memory_probe.json" ;;
    host_issue_base) [ -f build/base/libnccl-tide.so ] && step host_issue_base 80 40 env TIDE_BENCH_OLD_LIBRARY=1 \
                       NCCL_TIDE_LIBRARY_PATH="$PWD/build/base/libnccl-tide.so" python3 benchmarks/host_issue.py \
                       --samples 7 --json "$OUT/host_issue_base.json" ;;
    *) summary+=("$b: unknown step") ;;
  esac
done
echo "=== summary ($(( $(date +%s) - START )) s)"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
for f in sm_bandwidth share_8b host_issue host_issue_limit2 host_issue_split host_issue_ipc host_issue_ipc8 host_issue_base probe fsdp_step \
  fsdp_memory; do
  [ -f "$OUT/$f.log" ] && { echo "--- $f"; grep -vE "TIDE/|NCCL TIDE" "$OUT/$f.log" | tail -30; }
done
( cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz all.tgz )
printf '%s\n' "${summary[@]}" > "$OUT/summary.txt"
