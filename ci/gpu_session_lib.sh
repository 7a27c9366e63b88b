# Sourced by the per-session device scripts (ci/gpu_session25.sh .. ci/gpu_session30.sh): what every such call needs.
# Before sourcing set TAG (the work folder's and the archive's name) and parts; afterwards the script has
#   $O (= $OUT, where the archive goes), $W (the work folder; subfolders as `session_dirs` makes them),
#   left (seconds to TIDE_GPU_DEADLINE_S, default 540), want PART, build SRC DIR LOG, env_txt,
#   run NAME LIMIT CMD... (CMD under min(LIMIT, time left) if 20 s are left; log in $W/NAME.log),
#   build_tree (this tree into build/gpu, env.txt, the library and tests/gpu in the environment; archives and exits
#   on a failed build), run_test_files FILE:LIMIT... (pytest -v -x per tests/gpu file, logs in $W/tests), and
#   archive (everything into $O/$TAG.tgz).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# NVLink multicast stays off on shared machines (DESIGN.md section 6); every child inherits these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1 PATH="/usr/local/cuda/bin:$PATH"
O="${OUT:-$PWD/gpu-out}"; mkdir -p "$O"
W="$(mktemp -d)/$TAG"; mkdir -p "$W/build"
END=$(( $(date +%s) + ${TIDE_GPU_DEADLINE_S:-540} ))
left() { echo $(( END - $(date +%s) )); }
want() { case " $parts " in *" $1 "*) return 0;; esac; return 1; }
session_dirs() { local d; for d in "$@"; do mkdir -p "$W/$d"; done; }
build() {  # build SRC DIR LOG
  cmake -S "$1" -B "$2" -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
    > "$3" 2>&1 && cmake --build "$2" -j 16 >> "$3" 2>&1
}
env_txt() {
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse HEAD 2>/dev/null; \
    python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; } > "$W/env.txt" 2>&1
}
run() {
  local name=$1 lim=$2 l rc t; shift 2; l=$(left)
  [ "$l" -lt 20 ] && { echo "=== $name SKIPPED ($l s left)"; return; }
  [ "$l" -lt "$lim" ] && lim=$l
  t=$(date +%s); timeout -k 5 "$lim" "$@" > "$W/$name.log" 2>&1; rc=$?
  echo "=== $name rc $rc $(( $(date +%s) - t )) s, $(left) s left: $(grep -E '[0-9]+ (passed|failed)' "$W/$name.log" | tail -1)"
}
export PYTHONPATH="$PWD/pytorch_glue${PYTHONPATH:+:$PYTHONPATH}"
archive() {
  tar czf "$O/$TAG.tgz" -C "$W" .
  echo "=== done, $(left) s left"
}
build_tree() {
  local t0; t0=$(date +%s)
  build . build/gpu "$W/build/new.log" || { echo "build failed"; tail -20 "$W/build/new.log"; archive; exit 1; }
  echo "=== built $(( $(date +%s) - t0 )) s, $(left) s left"
  env_txt
  export NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so"
  export PYTHONPATH="$PWD/tests/gpu:$PYTHONPATH"
}
run_test_files() {  # run_test_files FILE:LIMIT ...
  local f; mkdir -p "$W/tests"
  for f in "$@"; do
    run "tests/${f%%:*}" "${f##*:}" python3 -m pytest -v -rs -x -p no:cacheprovider --durations=5 \
      -o faulthandler_timeout=$(( ${f##*:} - 5 )) "tests/gpu/${f%%:*}.py"
  done
}
