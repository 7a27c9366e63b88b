#!/usr/bin/env bash
# Fails (exit 1) if a shared library exports any symbol other than the tide* C API and the nccl* names of the
# LD_PRELOAD interposer (plugin/api/interposer.cc), or lacks one of those. Usage: ci/check_exports.sh path/to/libnccl-tide.so
set -euo pipefail

if [[ $# -ne 1 || ! -f "$1" ]]; then
  echo "usage: $0 path/to/libnccl-tide.so" >&2
  exit 2
fi
lib="$1"

# The interposer's names (the same list as plugin/exports.map):
ALLOWED_NCCL=(
  ncclAllGather
  ncclReduceScatter
  ncclAllGatherConfig
  ncclReduceScatterConfig
  ncclGroupStart
  ncclGroupEnd
  ncclCommFinalize
  ncclCommDestroy
  ncclCommAbort
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

for name in "${ALLOWED_NCCL[@]}"; do
  if ! printf '%s\n' "${symbols[@]}" | grep -qx "${name}"; then
    bad+=("${name} (missing: the interposer must export it)")
  fi
done

if [[ ${#bad[@]} -gt 0 ]]; then
  echo "check_exports: $lib exports ${#bad[@]} unexpected (or lacks required) symbol(s):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
count=$(printf '%s\n' "${symbols[@]}" | grep -c . || true)
echo "check_exports: $lib exports only allowed symbols ($count)"
