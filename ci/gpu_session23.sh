#!/usr/bin/env bash
# Session 23's second device call (< 10 min): issue 16's shares and issue 17's world-size-1 A/B, same machine.
#   shares: ci/gpu_share19.sh with SHARE19_RUNS (default "new rs-8m rs-4m"): the RS share with 2 (new), 8 and 4 MiB
#           per reduce CTA in one run (GEMM slowdown against end to end over the link floor).
#   fsdp:   python -m nccl_tide.bench.fsdp_step (4 layers, 30 steps, world size 1) with this tree's library (the
#           world-1 RS cast on every SM) and with w1_src's (the same tree but for that cast on kReduceMaxPacedCtas
#           CTAs; carried untracked, .git/info/exclude), in the order main, w1, w1, main, each run stock and tide.
# Carry: w1_src. Each part writes under $OUT/<part>/. TIDE_GPU_DEADLINE_S: the call's budget (default 560 s).
# Usage: bash ci/gpu_session23.sh [shares] [fsdp]   (no argument: both)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1 PATH="/usr/local/cuda/bin:$PATH"
O="${OUT:-$PWD/gpu-out}"; mkdir -p "$O"
END=$(( $(date +%s) + ${TIDE_GPU_DEADLINE_S:-560} ))
left() { echo $(( END - $(date +%s) )); }
parts="${*:-shares fsdp}"
want() { case " $parts " in *" $1 "*) return 0;; esac; return 1; }
build() {  # build SRC DIR LOG
  cmake -S "$1" -B "$2" -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    > "$3" 2>&1 && cmake --build "$2" -j 8 >> "$3" 2>&1
}
mkdir -p "$O/build"
t0=$(date +%s)
[ -f build/gpu/libnccl-tide.so ] || build . build/gpu "$O/build/main.log" & pm=$!
if want fsdp && [ -d w1_src ]; then build w1_src build/w1 "$O/build/w1.log" & pw=$!; else pw=; fi
wait $pm || { echo "main build failed"; tail -20 "$O/build/main.log"; exit 1; }
[ -n "$pw" ] && { wait $pw || { echo "w1 build failed"; tail -20 "$O/build/w1.log"; }; }
echo "=== built $(( $(date +%s) - t0 )) s, $(left) s left"
if want shares; then
  fsdp_reserve=0; want fsdp && fsdp_reserve=200
  SHARE19_RUNS="${SHARE19_RUNS:-new rs-8m rs-4m}" OUT="$O/share" TIDE_GPU_DEADLINE_S=$(( $(left) - fsdp_reserve )) \
    bash ci/gpu_share19.sh
  echo "##### shares done, $(left) s left"
fi
if want fsdp; then
  mkdir -p "$O/fsdp"
  export PYTHONPATH="$PWD/pytorch_glue${PYTHONPATH:+:$PYTHONPATH}"
  i=0
  for tree in main w1 w1 main; do
    i=$((i + 1))
    lib="$PWD/build/gpu/libnccl-tide.so"; [ "$tree" = w1 ] && lib="$PWD/build/w1/libnccl-tide.so"
    [ -f "$lib" ] || { echo "=== fsdp $i $tree: no library"; continue; }
    l=$(left); [ "$l" -lt 40 ] && { echo "=== fsdp $i $tree SKIPPED ($l s left)"; continue; }
    variants=stock,tide; [ $((i % 2)) -eq 0 ] && variants=tide,stock
    NCCL_TIDE_LIBRARY_PATH="$lib" timeout -k 5 $(( l > 100 ? 95 : l - 5 )) python3 -m nccl_tide.bench.fsdp_step \
      --layers 4 --variants $variants --slot-pool 2 --slot-trim on --warmup 3 --steps 30 --variant-timeout 60 \
      -J "$O/fsdp/fsdp_${i}_${tree}.json" > "$O/fsdp/fsdp_${i}_${tree}.log" 2>&1
    echo "=== fsdp $i $tree ($variants) rc $?, $(left) s left"
    grep -vE "TIDE/|NCCL TIDE" "$O/fsdp/fsdp_${i}_${tree}.log" | tail -6
  done
fi
[ -f "$O/share/share19_summary.txt" ] && { echo "--- shares"; cat "$O/share/share19_summary.txt"; }
# The device returns at most 8 files: one archive of everything (run 24.2 lost 5 loose files).
if [ -n "${OUT:-}" ]; then
  tar czf "$O/session23.tgz" -C "$O" $(cd "$O" && ls -d build share fsdp 2>/dev/null) && rm -rf "$O/build" "$O/share" "$O/fsdp"
fi
