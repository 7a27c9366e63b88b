# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf --interfere gemm on one GPU (marker gpu; skipped without CUDA): the GEMM slowdown column and the
interference method's coverage. Both are speed measurements that another process on the card would distort, so
ci/gpu.sh runs this file in its quiet phase, with nothing else on the GPU. A subprocess with a timeout, as in
test_perf_gpu.py."""

import json

import pytest
from test_perf_gpu import perf, rows, run

pytestmark = pytest.mark.gpu


def test_loopback_interfere_gemm(tmp_path):
    js = tmp_path / "inter.json"
    r = run(
        perf(
            "all_gather --backend loopback --ranks 8 -b 1M -e 64M -f 64 -n 3 -c 1 -d bf16 --impl tide,fsdp2 "
            f"--interfere gemm --interfere-runs 5 -J {js}"
        )
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    got = rows(r.stdout)
    assert [x["impl"] for x in got] == ["tide", "fsdp2"] * 2
    for x in got:
        assert x["wrong"] == "0" and 0.5 < float(x["gemm"]) < 50, x
    # The interference method: the side work spans the GEMM in every run, host-bound loopback calls included (8 ranks
    # at 1 MiB issue for longer than the GPU runs them)
    inter = [d["interference"] for d in json.loads(js.read_text())["extras"]["detail"] if "interference" in d]
    assert len(inter) == 4 and all(i["covered_runs"] == i["runs"] == 5 for i in inter), inter
