# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The Python package: imports without torch, binds every tide.h function, typed errors, models."""

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nccl_tide
import pytest
from nccl_tide import _native as N
from nccl_tide import errors
from nccl_tide.models import MODELS, model_params, numels_and_rows


def header_functions(repo):
    text = (repo / "include" / "tide.h").read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    protos = {}
    for m in re.finditer(r"^[\w\s\*]*?\b(tide[A-Z]\w*)\s*\(([^;{]*?)\)\s*;", text, flags=re.MULTILINE | re.DOTALL):
        args = m.group(2).strip()
        protos[m.group(1)] = 0 if args in ("", "void") else args.count(",") + 1
    return protos


def test_every_header_function_is_bound(native, repo):
    protos = header_functions(repo)
    assert len(protos) >= 20
    assert set(protos) == set(N.SIGNATURES), set(protos) ^ set(N.SIGNATURES)
    for name, nargs in protos.items():
        assert len(N.SIGNATURES[name][1]) == nargs, name
        fn = getattr(N.lib(), name)
        assert fn.argtypes == N.SIGNATURES[name][1]


def test_struct_layouts_match_the_c_compiler(tmp_path, repo):
    """sizeof/offsetof of every tide.h struct, as g++ sees it, equals the ctypes mirror."""
    structs = ["tideConfig_t", "tideLayoutDesc_t", "tideLayoutInfo_t", "tideParamInfo_t", "tideScheduleStep_t",
               "tideNcclInfo_t", "tideBootstrap_t", "tideInterposerCounters_t"]
    lines = ["#include <cstdio>", "#include <cstddef>", '#include "tide.h"', "int main() {"]
    for s in structs:
        lines.append(f'  printf("{s} SIZEOF %zu\\n", sizeof({s}));')
        for field, _ in getattr(N, s)._fields_:
            lines.append(f'  printf("{s} {field} %zu\\n", offsetof({s}, {field}));')
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.cc"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["g++", "-std=c++17", f"-I{repo / 'include'}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    n = 0
    for line in filter(None, out):
        s, field, value = line.split()
        cls = getattr(N, s)
        got = ctypes.sizeof(cls) if field == "SIZEOF" else getattr(cls, field).offset
        assert int(value) == got, line
        n += 1
    assert n == len(structs) + sum(len(getattr(N, s)._fields_) for s in structs)
    assert any(line.startswith("tideLayoutInfo_t paceBytes") for line in out)


def test_import_without_torch_and_library_path(native):
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import nccl_tide, os\n"
        "p = nccl_tide.library_path(); assert os.path.isabs(p) and p.endswith('libnccl-tide.so'), p\n"
        "with nccl_tide.Layout([10, 20], 'bf16', 4) as l: assert l.send_bytes == 2 * (3 + 5)\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print(nccl_tide.version)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == nccl_tide.version


def test_missing_library_error_says_what_to_do(tmp_path):
    env = dict(os.environ, NCCL_TIDE_LIBRARY_PATH=str(tmp_path / "nope.so"))
    code = (
        "import nccl_tide\n"
        "try:\n    nccl_tide.Layout([1], 'fp32', 1)\n"
        "except nccl_tide.LibraryNotFoundError as e:\n    print(e)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "nope.so" in out.stdout and "pip install" in out.stdout and "NCCL_TIDE_LIBRARY_PATH" in out.stdout


def test_version_matches_repo(native, repo):
    # VERSION, plain in every build (PyPI takes no local versions): the CUDA major is in the distribution name.
    assert nccl_tide.version == (repo / "VERSION").read_text().strip()
    assert nccl_tide.library_version() == nccl_tide.version
    assert nccl_tide._distribution in (None, *nccl_tide._DISTRIBUTIONS)


def test_error_classes_cover_every_result_code(native):
    assert sorted(errors.BY_CODE) == list(range(1, N.tideNumResults))
    for code, cls in errors.BY_CODE.items():
        assert cls.code == code and issubclass(cls, errors.TideError)
        e = errors.error_for(code, "boom")
        assert isinstance(e, cls) and "boom" in str(e) and cls.hint in str(e)
    with pytest.raises(errors.InvalidArgumentError) as info:
        nccl_tide.Layout([7], "fp32", 3, ranks_per_node=2)
    assert info.value.code == N.tideInvalidArgument
    assert "ranksPerNode" in str(info.value) or "ranks" in str(info.value).lower()
    assert isinstance(info.value, ValueError)  # pythonic catch also works


def test_models():
    n8, _ = numels_and_rows(model_params("llama3-8b-layer"))
    assert sum(n8) == 218_112_000
    n70, r70 = numels_and_rows(model_params("llama3-70b-layer"))
    assert round(sum(n70) / 1e6) == 856
    assert r70 == [8192, 8192, 8192, 8192, 8192, 8192, 28672, 1, 1]
    q = model_params("qwen3-30b-a3b-layer")
    assert len(q) == 7 + 128 * 3 + 2
    assert q[6] == ("mlp.gate.weight", (128, 2048))
    assert q[7] == ("mlp.experts.0.gate_proj.weight", (768, 2048)) and q[9][1] == (2048, 768)
    assert q[4][1] == (128,) and q[-1][0] == "post_attention_layernorm.weight"
    nq, _ = numels_and_rows(q)
    assert sum(nq) == 4096 * 2048 * 2 + 512 * 2048 * 2 + 256 + 128 * 2048 + 128 * 3 * 768 * 2048 + 2 * 2048
    assert set(MODELS) == {"llama3-8b-layer", "llama3-70b-layer", "qwen3-30b-a3b-layer"}
    # FSDP2 order for HF Llama: q, k, v, o, gate, up, down, norms.
    assert [n.split(".")[-2] for n, _ in model_params("llama3-8b-layer")] == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
        "input_layernorm",
        "post_attention_layernorm",
    ]


def test_c_smoke_program(native, repo, tmp_path):
    """Core's C++ self-check (tests/native/host_smoke.cc), built against the library under test."""
    src = repo / "tests" / "native" / "host_smoke.cc"
    if not src.exists():
        pytest.skip("tests/native/host_smoke.cc not present")
    lib = Path(N.library_path())
    exe = tmp_path / "host_smoke"
    build = [
        "g++",
        "-std=c++17",
        "-O2",
        f"-I{repo / 'include'}",
        f"-I{repo / 'plugin' / 'core'}",
        str(src),
        str(repo / "plugin" / "core" / "dtype.cc"),
        str(lib),
        f"-Wl,-rpath,{lib.parent}",
        "-o",
        str(exe),
    ]
    subprocess.run(build, check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def run_info(env_extra=None, block_torch=False, cwd=None):
    """`python -m nccl_tide` (through runpy with torch made unimportable when block_torch: a faster, torch-less run)."""
    env = dict(os.environ, **(env_extra or {}))
    if block_torch:
        cmd = [sys.executable, "-c", "import runpy, sys; sys.modules['torch'] = None; "
               "runpy.run_module('nccl_tide', run_name='__main__')"]
    else:
        cmd = [sys.executable, "-m", "nccl_tide"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, cwd=cwd)


def test_info_command_reports_version_library_and_build(native):
    p = run_info()
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith(f"nccl-tide {nccl_tide.version} ("), lines
    lib = N.library_path()
    assert f"library: {lib} ({nccl_tide.library_version()})" in lines
    # Oracle independent of the command's probe: only the host-only build holds cuda_stub.cc's message.
    host_only = b"was built without CUDA" in Path(lib).read_bytes()
    assert ("CUDA build: no" if host_only else "CUDA build: yes") in p.stdout, p.stdout
    assert any(ln.startswith("NCCL: ") for ln in lines) and any(ln.startswith("provider: ") for ln in lines)


def test_info_command_finds_nccl_on_the_library_path(native, tmp_path, rng, repo):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc) to build the stub libnccl")
    code = int(rng.choice([22809, 22902, 23203]))  # NCCL 2.28.9, 2.29.2, 2.32.3
    stub = tmp_path / "libnccl.so.2"
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", f"-DSTUB_VERSION={code}",
                    str(repo / "tests" / "native" / "stub_nccl" / "stub_nccl.c"), "-o", str(stub)], check=True, timeout=120)
    p = run_info({"LD_LIBRARY_PATH": str(tmp_path)}, block_torch=True)
    assert p.returncode == 0, p.stdout + p.stderr
    text = f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    assert f"NCCL: {text} at {stub}" in p.stdout, p.stdout
    assert "provider: ipc" in p.stdout, p.stdout


def test_info_command_without_nccl_or_library(native, tmp_path):
    p = run_info({"LD_LIBRARY_PATH": str(tmp_path)}, block_torch=True)
    assert p.returncode == 0, p.stdout + p.stderr
    if "NCCL: not found" not in p.stdout:  # a system libnccl.so.2 was found instead
        assert re.search(r"^NCCL: \d+\.\d+\.\d+ at /", p.stdout, flags=re.M), p.stdout
    missing = tmp_path / "missing" / "libnccl-tide.so"
    p = run_info({"NCCL_TIDE_LIBRARY_PATH": str(missing)}, block_torch=True)
    assert p.returncode == 1 and str(missing) in p.stderr, p.stdout + p.stderr
