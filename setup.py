"""Builds libnccl-tide.so with CMake and ships it inside the nccl_tide package.

Metadata lives in pyproject.toml; this file only adds the native build step:
configure + build (Release, Ninja) into _build/cmake-ninja, then copy the library to
nccl_tide/lib/libnccl-tide.so in the build tree that setuptools turns into the wheel.

The wheel is py3-none-<platform>: the library is loaded with ctypes, so it does not depend on the CPython ABI.
On x86_64 Linux the library is linked against glibc 2.28 stand-ins (TIDE_GLIBC_COMPAT, cmake/glibc_stubs.py), so
the wheel is tagged manylinux_2_28_x86_64 (ci/wheel.sh has auditwheel confirm it). A CUDA build carries the
CUDA major as a local version, 0.1.0+cu13 (as torch's +cu130 wheels do); a host-only build has none.

Environment passed through to CMake:
  CMAKE_ARGS       extra configure arguments (shell-split), e.g. "-DNCCL_ROOT=/opt/nccl"
  TIDE_BUILD_CUDA  AUTO (default) | ON | OFF
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


def _nvcc() -> str:
    """The nvcc CMake will find (CUDACXX, PATH, /usr/local/cuda), or ""."""
    for exe in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if exe and os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
    return ""


def cuda_major() -> str:
    """CUDA major of the build ("" for a host-only build), for the local version."""
    if os.environ.get("TIDE_BUILD_CUDA", "AUTO").upper() == "OFF":
        return ""
    nvcc = _nvcc()
    if not nvcc:
        return ""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"release (\d+)\.", out)
    return m.group(1) if m else ""


def package_version() -> str:
    base = (ROOT / "VERSION").read_text().strip()
    major = cuda_major()
    return f"{base}+cu{major}" if major else base


def _built_cuda_major(build_dir: Path) -> str:
    m = re.search(r"^TIDE_CUDA_MAJOR_BUILT:INTERNAL=(\d*)$", (build_dir / "CMakeCache.txt").read_text(), re.M)
    return m.group(1) if m else ""


def build_native(out_dir: Path) -> Path:
    ninja = shutil.which("ninja")
    # One build dir per generator: a CMake cache cannot switch generators.
    default_dir = ROOT / "_build" / ("cmake-ninja" if ninja else "cmake-make")
    build_dir = Path(os.environ.get("TIDE_BUILD_DIR", default_dir))
    build_dir.mkdir(parents=True, exist_ok=True)
    cuda = os.environ.get("TIDE_BUILD_CUDA", "AUTO")
    args = [
        _cmake(),
        "-S",
        str(ROOT),
        "-B",
        str(build_dir),
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DTIDE_BUILD_CUDA={cuda}",
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
    if built != cuda_major():
        sys.exit(
            f"nccl-tide: the package version says CUDA {cuda_major() or 'none'} but CMake built with CUDA "
            f"{built or 'none'}; set CUDACXX (or PATH) to the nvcc CMake should use, or TIDE_BUILD_CUDA=OFF"
        )
    found = sorted(p for p in build_dir.rglob(LIB_NAME) if p.is_file() and not p.is_symlink())
    found = found or sorted(p for p in build_dir.rglob(LIB_NAME + "*") if p.is_file())
    if not found:
        sys.exit(f"nccl-tide: CMake finished but produced no {LIB_NAME} under {build_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / LIB_NAME
    shutil.copy2(found[0], dst)  # copy2 follows symlinks: the wheel gets the real file
    return dst


class BuildPyWithNative(build_py):
    def run(self):
        super().run()
        lib = build_native(Path(self.build_lib) / "nccl_tide" / "lib")
        print(f"nccl-tide: packaged {lib}", flush=True)
        # Editable/develop installs read the package from the source tree.
        if self.editable_mode:
            build_native(ROOT / "pytorch_glue" / "nccl_tide" / "lib")


class BinaryDistribution(Distribution):
    # The wheel holds a compiled library: it is platform-specific, never py3-none-any.
    def has_ext_modules(self):
        return True


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
    version=package_version(),
    cmdclass={"build_py": BuildPyWithNative, "bdist_wheel": BdistWheelPy3None},
)
