# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""ci/check_exports.sh: the export rules of libnccl-tide.so (the tide* C API and the interposer's nine NCCL names,
never a tideBench* benchmark entry point) and, with --bench, of libnccl-tide-bench.so (tideBench* only), checked
on small libraries built here with exactly the names under test."""

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "ci" / "check_exports.sh"
NCCL_NAMES = ["ncclAllGather", "ncclReduceScatter", "ncclAllGatherConfig", "ncclReduceScatterConfig",
              "ncclGroupStart", "ncclGroupEnd", "ncclGroupSimulateEnd", "ncclRedOpCreatePreMulSum", "ncclRedOpDestroy",
              "ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort", "ncclCommWindowRegister",
              "ncclCommWindowDeregister", "ncclCommRegister", "ncclCommDeregister"]


def _library(tmp_path, names):
    src = tmp_path / "names.c"
    src.write_text("".join(f"int {n}(void) {{ return {i}; }}\n" for i, n in enumerate(names)))
    lib = tmp_path / "libnames.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    return str(lib)


def _check(*args):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True)


def test_the_product_rule_accepts_the_api_and_the_interposer_names(tmp_path):
    r = _check(_library(tmp_path, ["tideGetVersion", "tideAllGather"] + NCCL_NAMES))
    assert r.returncode == 0, r.stderr
    assert f"({2 + len(NCCL_NAMES)})" in r.stdout


@pytest.mark.parametrize("extra", ["tideBenchReduce", "tideBenchGetLastError"])
def test_the_product_rule_refuses_benchmark_entry_points(tmp_path, extra):
    r = _check(_library(tmp_path, ["tideGetVersion"] + NCCL_NAMES + [extra]))
    assert r.returncode == 1
    assert extra in r.stderr and "libnccl-tide-bench.so" in r.stderr


def test_the_product_rule_refuses_other_names_and_missing_interposer_names(tmp_path):
    r = _check(_library(tmp_path, ["tideGetVersion", "helper"] + NCCL_NAMES[1:]))
    assert r.returncode == 1
    assert "helper" in r.stderr and f"{NCCL_NAMES[0]} (missing" in r.stderr


def test_the_bench_rule_accepts_only_benchmark_entry_points(tmp_path):
    ok = _check("--bench", _library(tmp_path, ["tideBenchReduce", "tideBenchCopy"]))
    assert ok.returncode == 0, ok.stderr
    assert "(2)" in ok.stdout
    bad = _check("--bench", _library(tmp_path, ["tideBenchReduce", "tideGetVersion", "ncclAllGather"]))
    assert bad.returncode == 1
    assert "tideGetVersion" in bad.stderr and "ncclAllGather" in bad.stderr and "tideBenchReduce" not in bad.stderr


def test_usage_errors(tmp_path):
    assert _check().returncode == 2
    assert _check("--bench").returncode == 2
    assert _check(str(tmp_path / "absent.so")).returncode == 2
