"""The Python package: imports without torch, binds every tide.h function, typed errors, models."""

import ctypes
import os
import re
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
               "tideNcclInfo_t", "tideBootstrap_t"]
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
    # VERSION, plus +cuXX for a CUDA build (setup.py): the local part names the CUDA major
    base, _, local = nccl_tide.version.partition("+")
    assert base == (repo / "VERSION").read_text().strip()
    assert local == "" or re.fullmatch(r"cu\d+", local), nccl_tide.version
    assert nccl_tide.library_version() == base


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
