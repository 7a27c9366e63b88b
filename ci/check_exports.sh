#!/usr/bin/env bash
# Fails (exit 1) if a shared library exports any symbol other than the tide* C API (and, once the interposer lands,
# the nccl* names it is allowed to interpose). Usage: ci/check_exports.sh path/to/libnccl-tide.so
set -euo pipefail

if [[ $# -ne 1 || ! -f "$1" ]]; then
  echo "usage: $0 path/to/libnccl-tide.so" >&2
  exit 2
fi
lib="$1"

# The interposer's names, allowed when it exists (uncomment together with plugin/exports.map):
ALLOWED_NCCL=(
  # ncclAllGather
  # ncclReduceScatter
  # ncclCommInitRankConfig
  # ncclCommSplit
  # ncclCommDestroy
)

allowed_re='^tide[A-Z]'
for name in "${ALLOWED_NCCL[@]+"${ALLOWED_NCCL[@]}"}"; do
  allowed_re+="|^${name}\$"
done

# Defined dynamic symbols, names only (strip @VERSION suffixes).
mapfile -t symbols < <(nm -D --defined-only "$lib" | awk 'NF >= 3 {print $3}' | sed 's/@.*//' | sort -u)

bad=()
for s in "${symbols[@]}"; do
  [[ -z "$s" ]] && continue
  if ! [[ "$s" =~ $allowed_re ]]; then
    bad+=("$s")
  fi
done

if [[ ${#bad[@]} -gt 0 ]]; then
  echo "check_exports: $lib exports ${#bad[@]} unexpected symbol(s):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
count=$(printf '%s\n' "${symbols[@]}" | grep -c . || true)
echo "check_exports: $lib exports only allowed symbols ($count)"
