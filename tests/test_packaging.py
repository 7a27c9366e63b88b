"""The wheel: library inside, no libnccl, relative RPATH, clean exports, installs into a fresh venv.

Builds a wheel from this checkout (offline, incremental CMake), or uses $TIDE_TEST_WHEEL.
"""

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(repo, tmp_path_factory) -> Path:
    given = os.environ.get("TIDE_TEST_WHEEL")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(out), str(repo)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = out.glob("nccl_tide-*.whl")
    return whl


@pytest.fixture(scope="module")
def wheel_lib(wheel, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("unzipped")
    with zipfile.ZipFile(wheel) as z:
        z.extract("nccl_tide/lib/libnccl-tide.so", out)
    return out / "nccl_tide" / "lib" / "libnccl-tide.so"


def test_wheel_contents(wheel, repo):
    version = (repo / "VERSION").read_text().strip()
    assert wheel.name.startswith(f"nccl_tide-{version}-")
    assert not wheel.name.endswith("-none-any.whl"), "the wheel holds a native library: it must be platform-specific"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "nccl_tide/lib/libnccl-tide.so" in names
    assert "nccl_tide/__init__.py" in names and "nccl_tide/perf/cli.py" in names
    libs = [n for n in names if re.search(r"(^|/)libnccl", n)]
    assert libs == ["nccl_tide/lib/libnccl-tide.so"], libs
    assert not [n for n in names if re.search(r"(^|/)libnccl\.so", n)]
    assert "Requires-Dist: numpy" in meta
    assert re.search(r"Requires-Dist: torch==2\.13\.0.*extra == \"test\"", meta), meta
    # No NCCL extras: an nvidia-nccl-cuXX wheel would overwrite torch's libnccl.so.2 (README, "How NCCL is found").
    assert "nvidia-nccl" not in meta and 'extra == "cu12"' not in meta and 'extra == "cu13"' not in meta, meta
    assert "tide-perf = nccl_tide.perf.cli:main" in entry


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


def test_fresh_venv_install_and_run(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py, bin_ = venv / "bin" / "python", venv / "bin"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NCCL_TIDE_LIBRARY_PATH", "PYTHONPATH", "TIDE_PERF_TEST_CORRUPT")
    }
    code = "import nccl_tide, sys; p = nccl_tide.library_path(); assert p.startswith(sys.prefix), p; print(p)"
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
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
