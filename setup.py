"""Builds libnccl-tide.so with CMake and ships it inside the nccl_tide package.

Metadata lives in pyproject.toml; this file only adds the native build step:
configure + build (Release, Ninja) into _build/cmake-ninja, then copy the library to
nccl_tide/lib/libnccl-tide.so in the build tree that setuptools turns into the wheel.

Environment passed through to CMake:
  CMAKE_ARGS       extra configure arguments (shell-split), e.g. "-DNCCL_ROOT=/opt/nccl"
  TIDE_BUILD_CUDA  AUTO (default) | ON | OFF
  TIDE_BUILD_DIR   CMake binary directory (default _build/cmake-ninja)
  CMAKE_BUILD_PARALLEL_LEVEL  parallel jobs (CMake's own variable)
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
LIB_NAME = "libnccl-tide.so"


def _cmake() -> str:
    # Prefer the cmake that pip put on PATH for an isolated build, else the system one.
    exe = shutil.which("cmake")
    if exe is None:
        sys.exit("nccl-tide: cmake >= 3.24 not found; `pip install cmake ninja` or install it with your OS packages")
    return exe


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
    ]
    if ninja:
        # Pin the ninja of *this* build: an isolated build's ninja lives in a temp dir that
        # is gone next time, and a stale cached path would break the reconfigure.
        args += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    args += shlex.split(os.environ.get("CMAKE_ARGS", ""))
    print("nccl-tide: " + " ".join(shlex.quote(a) for a in args), flush=True)
    subprocess.check_call(args)
    subprocess.check_call([_cmake(), "--build", str(build_dir), "--config", "Release"])

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


setup(distclass=BinaryDistribution, cmdclass={"build_py": BuildPyWithNative})
