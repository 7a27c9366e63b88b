#!/usr/bin/env bash
# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
# Fails (exit 1) if a shared library exports a symbol outside its rule, or lacks a required one.
#   ci/check_exports.sh path/to/libnccl-tide.so           the tide* C API and the nccl* names of the LD_PRELOAD
#                                                         interposer (plugin/api/interposer.cc), all of those, and
#                                                         no tideBench* name (those live in the benchmark library)
#   ci/check_exports.sh --bench path/to/libnccl-tide-bench.so   tideBench* only (benchmarks/native/tide_bench.h)
set -euo pipefail

bench=0
if [[ "${1:-}" == "--bench" ]]; then
  bench=1
  shift
fi
if [[ $# -ne 1 || ! -f "$1" ]]; then
  echo "usage: $0 [--bench] path/to/libnccl-tide.so (or, with --bench, libnccl-tide-bench.so)" >&2
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
  ncclGroupSimulateEnd
  ncclRedOpCreatePreMulSum
  ncclRedOpDestroy
  ncclCommFinalize
  ncclCommDestroy
  ncclCommAbort
  ncclCommWindowRegister
  ncclCommWindowDeregister
  ncclCommRegister
  ncclCommDeregister
)

if [[ $bench -eq 1 ]]; then
  allowed_re='^tideBench[A-Z]'
  denied_re='^$'
  required=()
else
  allowed_re='^tide[A-Z]'
  for name in "${ALLOWED_NCCL[@]}"; do
    allowed_re+="|^${name}\$"
  done
  denied_re='^tideBench'
  required=("${ALLOWED_NCCL[@]}")
fi

# Defined dynamic symbols, names only (strip @VERSION suffixes).
mapfile -t symbols < <(nm -D --defined-only "$lib" | awk 'NF >= 3 {print $3}' | sed 's/@.*//' | sort -u)

bad=()
for s in "${symbols[@]}"; do
  [[ -z "$s" ]] && continue
  if [[ "$s" =~ $denied_re ]]; then
    bad+=("$s (benchmark entry point: belongs in libnccl-tide-bench.so)")
  elif ! [[ "$s" =~ $allowed_re ]]; then
    bad+=("$s")
  fi
done

# A set, not `printf | grep -q`: grep exits at the first match, and under pipefail printf's SIGPIPE would then
# report the name as missing.
declare -A exported=()
for s in "${symbols[@]}"; do
  [[ -n "$s" ]] && exported["$s"]=1
done
for name in "${required[@]+"${required[@]}"}"; do
  if [[ -z "${exported[$name]+x}" ]]; then
    bad+=("${name} (missing: the interposer must export it)")
  fi
done

if [[ ${#bad[@]} -gt 0 ]]; then
  echo "check_exports: $lib exports ${#bad[@]} unexpected (or lacks required) symbol(s):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_exports: $lib exports only allowed symbols (${#exported[@]})"
