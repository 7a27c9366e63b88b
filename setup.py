# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Builds libnccl-tide.so with CMake and ships it inside the nccl_tide package.

Metadata lives in pyproject.toml; this file adds the native build step (configure + build, Release, Ninja, into
_build/cmake-ninja, then copy the library to nccl_tide/lib/libnccl-tide.so and include/tide.h to
nccl_tide/include/tide.h in the tree setuptools turns into the wheel), the build variant's distribution name, and the
wheel tag.

Build variants follow NVIDIA's naming (nvidia-nccl-cu12, cupy-cuda12x): the CUDA major is part of the distribution
name, never of the version, and it is chosen when building, never guessed from the build machine:
  TIDE_CUDA=cu13   nccl-tide-cu13: the CUDA data path, built with an nvcc of CUDA 13 (the build fails otherwise)
  TIDE_CUDA=cu12   nccl-tide-cu12: likewise for CUDA 12
  TIDE_CUDA=cpu    nccl-tide-cpu: host-only (host executor, C API; CUDA entry points answer tideUnsupported)
  unset            nccl-tide, the source package: builds what TIDE_BUILD_CUDA says (AUTO: the CUDA data path when
                   CMake finds nvcc, else host-only); `python -m nccl_tide` tells which
The version is VERSION's, plain, as PyPI requires.

The wheel is py3-none-<platform>: the library is loaded with ctypes, so it does not depend on the CPython ABI.
On x86_64 Linux the library is linked against glibc 2.28 stand-ins (TIDE_GLIBC_COMPAT, cmake/glibc_stubs.py), so
the wheel is tagged manylinux_2_28_x86_64 (ci/wheel.sh has auditwheel confirm it). setuptools stays the backend:
scikit-build-core would drive CMake as well, but it tags linux_x86_64 and leaves manylinux to `auditwheel repair`,
and no backend lets the distribution name follow the build variant (PEP 621 forbids a dynamic name).

Environment passed through to CMake:
  CMAKE_ARGS       extra configure arguments (shell-split), e.g. "-DNCCL_ROOT=/opt/nccl"
  TIDE_BUILD_CUDA  AUTO (default) | ON | OFF, for the source package (TIDE_CUDA unset)
  TIDE_GLIBC_COMPAT  glibc version to link for (default 2.28 on x86_64 Linux; "off": the build machine's glibc,
                   and a plain linux_x86_64 tag)
  TIDE_BUILD_DIR   CMake binary directory (default _build/cmake-ninja)
  CMAKE_BUILD_PARALLEL_LEVEL  parallel jobs (CMake's own variable)
"""

import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 has the command; older ones take it from the wheel package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel

ROOT = Path(__file__).resolve().parent
LIB_NAME = "libnccl-tide.so"
HEADER = "tide.h"


def _cmake() -> str:
    # Prefer the cmake that pip put on PATH for an isolated build, else the system one.
    exe = shutil.which("cmake")
    if exe is None:
        sys.exit("nccl-tide: cmake >= 3.24 not found; `pip install cmake ninja` or install it with your OS packages")
    return exe


def glibc_compat() -> str:
    """The glibc version the library is linked for ("" = the build machine's)."""
    value = os.environ.get("TIDE_GLIBC_COMPAT", "2.28" if _x86_64_linux() else "").strip()
    return "" if value.lower() in ("", "off", "0", "no") else value


def _x86_64_linux() -> bool:
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


VARIANTS = {"cu12": "12", "cu13": "13", "cpu": ""}  # TIDE_CUDA value: CUDA major it builds ("": host-only)


def variant() -> str:
    """TIDE_CUDA: "cu12", "cu13", "cpu", or "" (the source package)."""
    value = os.environ.get("TIDE_CUDA", "").strip().lower()
    if value not in VARIANTS and value != "":
        sys.exit(f"nccl-tide: TIDE_CUDA must be one of {', '.join(VARIANTS)} or unset (got {value!r})")
    return value


def distribution_name(base: str) -> str:
    return f"{base}-{variant()}" if variant() else base


def build_cuda() -> str:
    """TIDE_BUILD_CUDA for CMake: what TIDE_CUDA implies, else the environment's (AUTO by default)."""
    given = os.environ.get("TIDE_BUILD_CUDA", "").strip().upper()
    if not variant():
        return given or "AUTO"
    implied = "ON" if VARIANTS[variant()] else "OFF"
    if given not in ("", "AUTO", implied):
        sys.exit(f"nccl-tide: TIDE_CUDA={variant()} builds with TIDE_BUILD_CUDA={implied}, not {given}")
    return implied


def _built_cuda_major(build_dir: Path) -> str:
    m = re.search(r"^TIDE_CUDA_MAJOR_BUILT:INTERNAL=(\d*)$", (build_dir / "CMakeCache.txt").read_text(), re.M)
    return m.group(1) if m else ""


def build_native(out_dir: Path) -> Path:
    ninja = shutil.which("ninja")
    # One build dir per generator: a CMake cache cannot switch generators.
    default_dir = ROOT / "_build" / ("cmake-ninja" if ninja else "cmake-make")
    build_dir = Path(os.environ.get("TIDE_BUILD_DIR", default_dir))
    build_dir.mkdir(parents=True, exist_ok=True)
    args = [
        _cmake(),
        "-S",
        str(ROOT),
        "-B",
        str(build_dir),
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DTIDE_BUILD_CUDA={build_cuda()}",
        # The wheel ships the build-tree library: give it the install RPATH (never an
        # absolute build path) so the packaging test's RPATH check holds.
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
        f"-DPython3_EXECUTABLE={sys.executable}",
        f"-DTIDE_GLIBC_COMPAT={glibc_compat()}",
        "-DTIDE_BUILD_BENCHMARKS=OFF",  # libnccl-tide-bench.so is never part of the wheel
    ]
    if ninja:
        # Pin the ninja of *this* build: an isolated build's ninja lives in a temp dir that
        # is gone next time, and a stale cached path would break the reconfigure.
        args += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    args += shlex.split(os.environ.get("CMAKE_ARGS", ""))
    print("nccl-tide: " + " ".join(shlex.quote(a) for a in args), flush=True)
    subprocess.check_call(args)
    subprocess.check_call([_cmake(), "--build", str(build_dir), "--config", "Release"])

    built = _built_cuda_major(build_dir)
    if variant() and built != VARIANTS[variant()]:
        wanted = VARIANTS[variant()]
        sys.exit(
            f"nccl-tide: TIDE_CUDA={variant()} needs CUDA {wanted}, but CMake built with CUDA {built}; set CUDACXX "
            f"(or PATH) to a CUDA {wanted} nvcc, or pass -DCMAKE_CUDA_COMPILER in CMAKE_ARGS"
        )
    print(f"nccl-tide: built {'with CUDA ' + built if built else 'host-only'}", flush=True)
    found = sorted(p for p in build_dir.rglob(LIB_NAME) if p.is_file() and not p.is_symlink())
    found = found or sorted(p for p in build_dir.rglob(LIB_NAME + "*") if p.is_file())
    if not found:
        sys.exit(f"nccl-tide: CMake finished but produced no {LIB_NAME} under {build_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / LIB_NAME
    shutil.copy2(found[0], dst)  # copy2 follows symlinks: the wheel gets the real file
    return dst


def package_header(out_dir: Path) -> Path:
    """Ships the C API header with the library (nccl_tide.include_dir() finds it): error hints name tide.h, and C
    users compile against it. include/tide.h stays the one tracked copy; a source checkout reads it there."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / HEADER
    shutil.copyfile(ROOT / "include" / HEADER, dst)
    return dst


class BuildPyWithNative(build_py):
    def run(self):
        super().run()
        lib = build_native(Path(self.build_lib) / "nccl_tide" / "lib")
        print(f"nccl-tide: packaged {lib}", flush=True)
        header = package_header(Path(self.build_lib) / "nccl_tide" / "include")
        print(f"nccl-tide: packaged {header}", flush=True)
        # Editable/develop installs read the package from the source tree.
        if self.editable_mode:
            build_native(ROOT / "pytorch_glue" / "nccl_tide" / "lib")


class BinaryDistribution(Distribution):
    # The wheel holds a compiled library: it is platform-specific, never py3-none-any.
    def has_ext_modules(self):
        return True

    def parse_config_files(self, *args, **kwargs):
        super().parse_config_files(*args, **kwargs)
        # pyproject.toml names the source package; a chosen variant carries its suffix (nccl-tide-cu13).
        self.metadata.name = distribution_name(self.metadata.name)


class BdistWheelPy3None(bdist_wheel):
    """py3-none-<platform>: ctypes loads the library, so any CPython 3 can use it (has_ext_modules would otherwise
    give a cp311-cp311 tag). The platform is manylinux_2_28_x86_64 when the library was linked for glibc 2.28."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        if plat == "linux_x86_64" and glibc_compat() == "2.28":
            plat = "manylinux_2_28_x86_64"
        return "py3", "none", plat


setup(
    distclass=BinaryDistribution,
    version=(ROOT / "VERSION").read_text().strip(),
    cmdclass={"build_py": BuildPyWithNative, "bdist_wheel": BdistWheelPy3None},
)
