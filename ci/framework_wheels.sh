#!/usr/bin/env bash
# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
# The training frameworks of examples/frameworks (DeepSpeed, Megatron-Core, torchtitan) as wheels, for a GPU machine
# that cannot reach a package index (tests/multirank/test_frameworks.py).
#
#   bash ci/framework_wheels.sh download DIR   # here, with PyPI: the wheels below into DIR (about 9 MiB)
#   bash ci/framework_wheels.sh install DIR    # there: pip install --no-index from DIR, then import each framework
#
# The set is what a CUDA image with torch 2.11 (Python 3.12) lacks: the three frameworks and their dependencies
# beyond torch, numpy, pyarrow, pandas, fsspec, huggingface-hub, tokenizers, tensorboard, einops, psutil, py-cpuinfo,
# msgpack, ninja, tqdm, pyyaml, xxhash, requests, rich and triton, which such an image carries. The wheels are
# installed with --no-deps, so nothing the image already has is replaced; the import check at the end names any
# module still missing. Versions: DeepSpeed 0.19.8 (built here from its sdist with DS_BUILD_OPS=0: no CUDA
# extension, pure Python), Megatron-Core 0.16.1 (the newest for Python 3.11, where the CPU examples run; its
# 0.17+ need Python >= 3.12), torchtitan 0.2.2 (0.3.0 imports torch.distributed.fsdp.DataParallelMeshDims,
# which torch 2.11 does not have).
set -euo pipefail

PY=${PYTHON:-python3}
TARGET_PY=${TARGET_PY:-3.12}
FRAMEWORKS=(deepspeed==0.19.8 megatron-core==0.16.1 torchtitan==0.2.2)
DEPS=(
  hjson==3.1.0
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
  torchdata==0.11.0 tomli==2.3.0
  tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
)

usage() { echo "usage: $0 download|install DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
DIR=$2

case $1 in
download)
  mkdir -p "$DIR"
  platforms=()
  for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
           manylinux2014_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version "$TARGET_PY" --implementation cp \
    "${platforms[@]}" -d "$DIR" megatron-core==0.16.1 torchtitan==0.2.2 "${DEPS[@]}"
  # DeepSpeed ships an sdist only; with DS_BUILD_OPS=0 its wheel is pure Python (py3-none-any)
  DS_BUILD_OPS=0 "$PY" -m pip wheel --no-deps -w "$DIR" deepspeed==0.19.8
  du -sh "$DIR"
  ;;
install)
  "$PY" -m pip install --no-index --no-deps --find-links "$DIR" "${FRAMEWORKS[@]}" "${DEPS[@]}"
  "$PY" -m pip check || echo "pip check found the requirements above unmet (the import check decides)"
  "$PY" - <<'EOF'
import importlib
for name in ("deepspeed", "megatron.core.distributed", "torchtitan.models.llama3", "torchtitan.config"):
    importlib.import_module(name)
print("framework imports: ok")
EOF
  ;;
*)
  usage
  ;;
esac
