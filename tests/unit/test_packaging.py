# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The sdist and the wheel built from it: everything the native build needs in the sdist; in the wheel the library,
no libnccl, relative RPATH, clean exports, metadata PyPI accepts; the wheel installs into a fresh venv and runs.

Builds the sdist from this checkout with setuptools' PEP 517 hook (what `python -m build --sdist --no-isolation`
calls), then the wheel from that sdist only (offline: the installed setuptools and CMake), as a fresh machine would
from PyPI. $TIDE_TEST_WHEEL names a ready wheel instead (the sdist tests still build the sdist).
"""

import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# What the native build reads besides the Python package (CMakeLists.txt, setup.py, cmake/, include/, plugin/).
SDIST_NEEDS = ["CMakeLists.txt", "setup.py", "pyproject.toml", "VERSION", "LICENSE", "NOTICE", "README.md",
               "cmake/FindNCCL.cmake", "cmake/glibc_stubs.py", "include/tide.h", "plugin/exports.map",
               "plugin/compat/glibc_shims.cc", "pytorch_glue/nccl_tide/py.typed", "pytorch_glue/nccl_tide/__main__.py"]


@pytest.fixture(scope="module")
def sdist(repo, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    r = subprocess.run([sys.executable, "-c", code, str(out)], cwd=repo, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out / r.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def wheel(sdist, tmp_path_factory) -> Path:
    given = os.environ.get("TIDE_TEST_WHEEL")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(out), str(sdist)]
    # The sdist's own CMake tree, never the checkout's (a CMake cache belongs to one source directory).
    env = {k: v for k, v in os.environ.items() if k != "TIDE_BUILD_DIR"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = out.glob("nccl_tide*.whl")
    return whl


@pytest.fixture(scope="module")
def wheel_lib(wheel, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("unzipped")
    with zipfile.ZipFile(wheel) as z:
        z.extract("nccl_tide/lib/libnccl-tide.so", out)
    return out / "nccl_tide" / "lib" / "libnccl-tide.so"


def test_sdist_holds_the_native_sources(sdist, repo):
    version = (repo / "VERSION").read_text().strip()
    assert sdist.name == f"nccl_tide-{version}.tar.gz", sdist.name
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    missing = [n for n in SDIST_NEEDS if n not in names]
    assert not missing, missing
    for folder in ("plugin/core", "plugin/api", "plugin/nccl", "plugin/cuda"):
        tracked = subprocess.run(["git", "ls-files", folder], cwd=repo, capture_output=True, text=True).stdout.split()
        if tracked:  # a git checkout: every tracked source is in the sdist
            assert set(tracked) <= names, set(tracked) - names
        else:
            assert [n for n in names if n.startswith(folder + "/")], folder
    assert not [n for n in names if n.endswith((".so", ".o", ".pyc")) or n.startswith(("_build/", "build/"))]


@pytest.mark.parametrize("folder", ["examples", "docs"])
def test_sdist_holds_examples_and_docs(sdist, repo, folder):
    # README.md points to examples/, and error messages and warnings name docs/env.md and docs/fsdp.md: the source
    # package carries both (sources only, no built program).
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    tracked = subprocess.run(["git", "ls-files", folder], cwd=repo, capture_output=True, text=True).stdout.split()
    fallback = {"examples": {"examples/README.md", "examples/fsdp2_train.py", "examples/c/host_all_gather.c",
                             "examples/c/Makefile"},
                "docs": {"docs/env.md", "docs/fsdp.md", "docs/usage.md"}}
    wanted = set(tracked) or fallback[folder]
    assert wanted <= names, wanted - names
    assert "examples/c/host_all_gather" not in names


@pytest.mark.parametrize("variant", ["cu12", "cu13", "cpu", ""])
def test_variant_is_the_distribution_name(sdist, tmp_path, variant):
    # TIDE_CUDA picks the build and its name (nccl-tide-cu13, as NVIDIA's wheels); the version stays VERSION's.
    with tarfile.open(sdist) as t:
        t.extractall(tmp_path)
    (src,) = tmp_path.iterdir()
    code = "import sys; from setuptools import build_meta as b; print(b.prepare_metadata_for_build_wheel(sys.argv[1]))"
    env = dict(os.environ, TIDE_CUDA=variant)
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=src, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    meta = (tmp_path / r.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    version = (src / "VERSION").read_text().strip()
    name = "nccl-tide" + (f"-{variant}" if variant else "")
    assert f"Name: {name}\n" in meta and f"Version: {version}\n" in meta, meta[:300]
    env["TIDE_CUDA"] = "cuda13"
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=src, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0 and "TIDE_CUDA must be one of cu12, cu13, cpu" in r.stdout + r.stderr


def test_wheel_contents(wheel, repo):
    version = (repo / "VERSION").read_text().strip()
    # PyPI takes no local version (+cu13): a variant is a distribution name (setup.py, TIDE_CUDA), the version plain.
    m = re.match(rf"nccl_tide(_cu\d+|_cpu)?-{re.escape(version)}-", wheel.name)
    assert m, wheel.name
    assert not wheel.name.endswith("-none-any.whl"), "the wheel holds a native library: it must be platform-specific"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
        licenses = [z.read(n).decode() for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert "nccl_tide/lib/libnccl-tide.so" in names
    assert "nccl_tide/__init__.py" in names and "nccl_tide/perf/cli.py" in names
    assert "nccl_tide/py.typed" in names and "nccl_tide/__main__.py" in names
    # The C API header travels with the library (nccl_tide.include_dir(); error hints name it), as the repo's copy.
    assert "nccl_tide/include/tide.h" in names
    with zipfile.ZipFile(wheel) as z:
        assert z.read("nccl_tide/include/tide.h") == (repo / "include" / "tide.h").read_bytes()
    libs = [n for n in names if re.search(r"(^|/)libnccl", n)]
    assert libs == ["nccl_tide/lib/libnccl-tide.so"], libs
    assert not [n for n in names if re.search(r"(^|/)libnccl\.so", n)]
    name = "nccl-tide" + (m.group(1) or "").replace("_", "-")
    assert f"Name: {name}\n" in meta and f"Version: {version}\n" in meta, meta[:400]
    # License as an SPDX expression (PEP 639) with its texts inside the wheel; links and classifiers for PyPI.
    assert "License-Expression: Apache-2.0" in meta and "License-File: LICENSE" in meta, meta[:1500]
    assert len(licenses) == 1 and "Apache License" in licenses[0] and "Version 2.0" in licenses[0], names
    for classifier in ("Programming Language :: Python :: 3.11", "Operating System :: POSIX :: Linux",
                       "Environment :: GPU :: NVIDIA CUDA", "Topic :: System :: Distributed Computing"):
        assert f"Classifier: {classifier}\n" in meta, classifier
    assert "Requires-Dist: numpy" in meta
    torch_req = re.search(r"^Requires-Dist: torch([^;]*); extra == \"test\"$", meta, flags=re.M)
    assert torch_req and "==" not in torch_req.group(1) and "<" in torch_req.group(1), meta
    # No NCCL extras: an nvidia-nccl-cuXX wheel would overwrite torch's libnccl.so.2 (README, "How NCCL is found").
    deps = [ln for ln in meta.splitlines() if ln.startswith(("Requires-Dist:", "Provides-Extra:"))]
    assert not [ln for ln in deps if "nvidia-nccl" in ln or "cu12" in ln or "cu13" in ln], deps
    assert "tide-perf = nccl_tide.perf.cli:main" in entry


# What a manylinux_2_28 wheel may link (PEP 600 / auditwheel's policy for x86_64: the glibc libraries, libgcc_s).
MANYLINUX_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libgcc_s.so.1",
                  "ld-linux-x86-64.so.2"}


def test_wheel_tag_is_py3_none_manylinux(wheel, repo):
    # ctypes loads the library: no CPython ABI in the tag; glibc 2.28 symbols only: manylinux_2_28 (setup.py).
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("the manylinux link is implemented for x86_64")
    m = re.fullmatch(r"nccl_tide(?:_cu\d+|_cpu)?-([0-9.]+)-py3-none-manylinux_2_28_x86_64\.whl", wheel.name)
    assert m, wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        tags = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
    assert "Tag: py3-none-manylinux_2_28_x86_64" in tags and "Root-Is-Purelib: false" in tags, tags


def test_library_needs_glibc_2_28_at_most(wheel_lib):
    # Every imported symbol version (objdump -T) is one glibc 2.28 has; libstdc++ is static (no GLIBCXX_/CXXABI_
    # imports), and the NEEDED list holds only libraries every manylinux system has.
    dyn = subprocess.run(["objdump", "-T", str(wheel_lib)], capture_output=True, text=True, check=True).stdout
    glibc = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"\bGLIBC_([0-9.]+)\b", dyn)}
    assert glibc and max(glibc) <= (2, 28), sorted(glibc)
    assert not re.search(r"\b(GLIBCXX|CXXABI)_", dyn), "libstdc++ must be linked statically"
    for sym in ("arc4random", "_dl_find_object", "__libc_single_threaded", "pthread_cond_clockwait"):
        assert not re.search(rf"\*UND\*.*\s{sym}$", dyn, flags=re.M), sym  # glibc > 2.28: defined inside
    needed = set(re.findall(r"\(NEEDED\).*\[(.*)\]", subprocess.run(["readelf", "-d", str(wheel_lib)],
                                                                   capture_output=True, text=True).stdout))
    assert needed <= MANYLINUX_LIBS, needed - MANYLINUX_LIBS


def test_auditwheel_agrees(wheel):
    auditwheel = pytest.importorskip("auditwheel", reason="auditwheel is not installed (pip install auditwheel)")
    del auditwheel
    r = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r'platform tag:\s+"manylinux_(\d+)_(\d+)_x86_64"', " ".join(r.stdout.split()))
    assert m and (int(m.group(1)), int(m.group(2))) <= (2, 28), r.stdout


def test_rpath_is_relative(wheel_lib):
    dyn = subprocess.run(["readelf", "-d", str(wheel_lib)], capture_output=True, text=True, check=True).stdout
    paths = re.findall(r"\((?:RPATH|RUNPATH)\).*\[(.*)\]", dyn)
    for entry in ":".join(paths).split(":"):
        assert entry == "" or entry.startswith("$ORIGIN"), f"absolute or odd RPATH entry {entry!r}"
    needed = re.findall(r"\(NEEDED\).*\[(.*)\]", dyn)
    assert not [n for n in needed if n.startswith("libnccl")], needed  # NCCL is found at run time, never linked


def test_exports(wheel_lib, repo):
    r = subprocess.run(["bash", str(repo / "ci" / "check_exports.sh"), str(wheel_lib)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_fresh_venv_install_and_run(wheel, tmp_path, repo):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py, bin_ = venv / "bin" / "python", venv / "bin"
    # Without PYTHONPATH for pip too: a dev checkout's pytorch_glue/ on it (with the egg-info a wheel build leaves
    # there) would make pip believe nccl-tide is already installed and skip the wheel.
    clean = {k: v for k, v in os.environ.items() if k not in ("NCCL_TIDE_LIBRARY_PATH", "PYTHONPATH")}
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True,
                       timeout=900, env=clean)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NCCL_TIDE_LIBRARY_PATH", "PYTHONPATH", "TIDE_PERF_TEST_CORRUPT")
    }
    code = "import nccl_tide, sys; p = nccl_tide.library_path(); assert p.startswith(sys.prefix), p; print(p)"
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # The installed header: where include_dir() and `python -m nccl_tide` say, inside the venv, the repo's text.
    code = "import nccl_tide, sys; d = nccl_tide.include_dir(); assert d.startswith(sys.prefix), d; print(d)"
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    header = Path(r.stdout.strip()) / "tide.h"
    assert header.read_bytes() == (repo / "include" / "tide.h").read_bytes()
    r = subprocess.run([str(py), "-m", "nccl_tide"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert f"header: {header}" in r.stdout.splitlines(), r.stdout + r.stderr
    cmd = [
        str(bin_ / "tide-perf"),
        "all_gather",
        "--backend",
        "host",
        "--ranks",
        "4",
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "4",
        "-c",
        "1",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# Out of bounds values : 0 OK" in r.stdout
    assert len([ln for ln in r.stdout.splitlines() if ln and not ln.startswith("#")]) == 4
