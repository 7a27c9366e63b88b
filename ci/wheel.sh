#!/usr/bin/env bash
# Builds the platform wheel (libnccl-tide.so inside, no libnccl) into dist/.
# Offline (no PyPI): NCCL_TIDE_OFFLINE=1 uses the installed setuptools, cmake and ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p dist
if [ "${NCCL_TIDE_OFFLINE:-0}" = "1" ]; then
  pip wheel --no-build-isolation --no-deps -w dist .
else
  pip wheel --no-deps -w dist .
fi
ls -l dist/nccl_tide-*.whl
