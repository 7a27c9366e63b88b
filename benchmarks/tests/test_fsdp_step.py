# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/fsdp_step.py and its parts on the CPU: the trace's kernel classes and SM time, the model against the
layer layouts, the layout-cost checks, the step table, the watchdog of a hung variant, and the one-line failure
without CUDA."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1]


def test_fsdp_step_kernel_classes():
    from fsdp_step import classify_kernel, summarize_trace

    assert classify_kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "ag"
    assert classify_kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL") == "rs"
    assert classify_kernel("ncclDevKernel_Generic") == "comm"
    assert classify_kernel("void at::native::split_with_sizes_copy_out_contiguous_no_cast_kernel<...>") == "layout"
    assert (
        classify_kernel("void at::native::(anonymous namespace)::chunk_cat_cuda_kernel<float, c10::BFloat16>")
        == "layout"
    )
    assert classify_kernel("sm90_xmma_gemm_bf16bf16_bf16f32") == "compute"
    assert classify_kernel("tide::reduceKernel<__nv_bfloat16, float>") == "tide"
    ev = [
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "dur": 30.0},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_ReduceScatter_Sum_f32", "dur": 50.0},
        {"ph": "X", "cat": "kernel", "name": "chunk_cat_cuda_kernel", "dur": 20.0},
        {"ph": "X", "cat": "kernel", "name": "tide_rs_reduce", "dur": 4.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy PtoP", "dur": 16.0},
    ]
    s = summarize_trace(ev, steps=2)
    assert s["ag_us"] == 15.0 and s["rs_us"] == 25.0 and s["layout_us"] == 10.0 and s["memcpy_us"] == 8.0
    assert s["comm_sm_us"] == 15.0 + 25.0 + 2.0
    assert "comm_sm_weighted_us" not in s  # no SM count given


def test_fsdp_step_comm_sm_time_weighted_by_grid():
    """comm_sm_weighted_us: each communication kernel's duration x min(1, CTAs / SMs), the grid read from the trace;
    compute and layout kernels do not count; a kernel without a grid counts as holding every SM."""
    import random

    from fsdp_step import summarize_trace

    rng = random.Random(2417)
    sms, steps = 132, 3
    ev, expect = [], 0.0
    for _ in range(40):
        name = rng.choice(["tide::reduceKernel<bf16, float>", "ncclDevKernel_ReduceScatter_Sum_f32", "gemm_bf16",
                           "chunk_cat_cuda_kernel"])
        dur = rng.uniform(1.0, 500.0)
        grid = [rng.randint(1, 300), rng.choice([1, 2]), 1]
        ev.append({"ph": "X", "cat": "kernel", "name": name, "dur": dur, "args": {"grid": grid}})
        if "gemm" not in name and "chunk_cat" not in name:
            expect += dur * min(1.0, grid[0] * grid[1] / sms)
    ev.append({"ph": "X", "cat": "kernel", "name": "tide_no_grid", "dur": 7.0})
    expect += 7.0
    s = summarize_trace(ev, steps=steps, sm_count=sms)
    assert abs(s["comm_sm_weighted_us"] - expect / steps) < 1e-9 * max(1.0, expect)
    assert s["comm_sm_weighted_us"] < s["comm_sm_us"]  # some grids hold fewer than every SM
    # 32 CTAs for 4x as long hold the same weighted SM time as 128 CTAs: the measure a world-1 cast shape is judged by
    a = summarize_trace([{"ph": "X", "cat": "kernel", "name": "tide_k", "dur": 400.0, "args": {"grid": [32, 1, 1]}}],
                        1, sm_count=128)
    b = summarize_trace([{"ph": "X", "cat": "kernel", "name": "tide_k", "dur": 100.0, "args": {"grid": [128, 1, 1]}}],
                        1, sm_count=128)
    assert a["comm_sm_weighted_us"] == b["comm_sm_weighted_us"] == 100.0 and a["comm_sm_us"] == 4 * b["comm_sm_us"]


def test_fsdp_step_without_cuda_fails_clearly():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    for args in ([], ["--mode", "layout-cost"]):
        r = subprocess.run(
            [sys.executable, str(BENCHMARKS / "fsdp_step.py"), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert r.returncode == 2, r.stdout + r.stderr
        assert "needs a CUDA GPU" in r.stderr and "Traceback" not in r.stderr


def test_fsdp_step_model_matches_the_layer_layouts():
    """The benchmark's Llama blocks have exactly the parameters (order and shapes) of nccl_tide.models' layers."""
    torch = pytest.importorskip("torch")
    from fsdp_model import LlamaConfig, build
    from nccl_tide.models import _llama_layer

    cfg = LlamaConfig(layers=2, hidden=64, heads=4, kv_heads=2, ffn=96, vocab=50)
    m = build(cfg, device="meta")
    got = [(n, tuple(p.shape)) for n, p in m.layers[0].named_parameters()]
    assert got == [(n, tuple(s)) for n, s in _llama_layer(64, 96, 4, 2, 16)]
    assert sum(p.numel() for p in m.parameters()) == cfg.n_params()
    small = build(cfg)
    out = small(torch.randint(0, 50, (2, 5)))
    assert out.shape == (2, 5, 50) and torch.isfinite(out).all()


def test_layout_cost_copy_out_and_copy_in_are_checked(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)  # CPU tensors: nothing to wait for
    import fsdp_layout_cost as layout_cost

    monkeypatch.setattr(
        layout_cost, "_time_ms", lambda fn, iters, warmup=3: (fn(), {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1})[1]
    )
    params = [("a", (5, 3)), ("b", (7,)), ("c", (2, 4)), ("d", (9, 2))]
    r = layout_cost.measure("tiny", 4, iters=1, sm_time=False, device="cpu", params=params)
    assert r["wrong_params"] == 0 and r["numel"] == 15 + 7 + 8 + 18
    assert r["padded_numel"] == 4 * (2 * 3 + 2 + 1 * 4 + 3 * 2)  # dim 0 padded to a multiple of 4 ranks
    assert r["copy_out_bytes"] == 2 * 2 * r["padded_numel"] and r["tide_ms"] == 0.0

    # a copy-in that ignores the padding (a wrong op) is caught
    (_, good_out), (name, good_in) = layout_cost._ops()

    def bad_in(ts, n, out):
        good_in(ts, n, out)
        out[-1, -1] += 1.0

    monkeypatch.setattr(layout_cost, "_ops", lambda: (("o", good_out), ("i", bad_in)))
    assert layout_cost.measure("tiny", 4, iters=1, sm_time=False, device="cpu", params=params)["wrong_params"] == 1
    table = layout_cost.table([dict(r, model="llama3-70b-layer", anchor=layout_cost.ANCHOR["llama3-70b-layer"])])
    assert "0.9 / 2.3-2.6 ms (H200)" in table and "0 (none)" in table


def test_fsdp_step_table_shows_reasons():
    from fsdp_step import step_table

    rows = [
        {
            "variant": "stock",
            "ran": True,
            "step_ms": {"median": 10.0, "min": 9.5, "max": 11.0},
            "share": {"ag_rs": 0.25, "layout": 0.05, "ce_memcpy": 0.0},
            "profile": {"comm_sm_us": 1234.0, "layout_us": 567.0},
            "peak_mem_GiB": 3.5,
            "note": "",
        },
        {
            "variant": "tide",
            "ran": True,
            "step_ms": {"median": 9.0, "min": 8.5, "max": 9.5},
            "profile": {"comm_sm_us": 99.0, "comm_sm_weighted_us": 24.75, "layout_us": 0.0},
            "peak_mem_GiB": 3.25,
            "slot_GiB": 0.75,
            "peak_total_GiB": 3.375,
            "start_allocated_GiB": 0.004,  # below 0.01 GiB: no warning
            "note": "",
        },
        {
            "variant": "tide-dedicated",
            "ran": True,
            "step_ms": {"median": 9.0, "min": 8.5, "max": 9.5},
            "peak_mem_GiB": 7.5,
            "start_allocated_GiB": 4.23,  # an earlier variant's model still allocated
            "note": "n",
        },
        {"variant": "tide", "ran": False, "reason": "unavailable: nccl_tide.fsdp.enable(executor='native'): X"},
    ]
    t = step_table(rows)
    assert "| stock" in t and "10.00" in t and "25.0" in t and "1234" in t and "3.50" in t and "567" in t
    tide = next(line for line in t.splitlines() if line.startswith("| tide ") and "9.00" in line)
    assert "3.25" in tide and "0.75" in tide and "3.38" in tide and "| 99 " in tide and "| 25 " in tide, tide
    for col in ("layout us/step", "comm SM us/step", "occ.-weighted", "torch peak GiB", "TIDE slots GiB",
                "peak total GiB"):
        assert col in t.splitlines()[0], col
    assert "unavailable: nccl_tide.fsdp.enable" in t
    assert "started with" not in tide
    ded = next(line for line in t.splitlines() if line.startswith("| tide-dedicated"))
    assert "[started with 4.23 GiB allocated by earlier variants: in its torch peak] n" in ded, ded


def test_fsdp_step_watchdog_reports_a_hung_variant(tmp_path):
    js = tmp_path / "w.json"
    code = (
        f"import sys, time; sys.path.insert(0, {str(BENCHMARKS)!r})\n"
        "from fsdp_step import _Watchdog\n"
        "rows = [{'variant': 'stock', 'ran': True}]\n"
        "with _Watchdog(30, 'tide', rows, {'mode': 'step'}, None):\n"
        "    pass\n"  # finishes in time: no exit
        f"with _Watchdog(0.5, 'symm', rows, {{'mode': 'step'}}, {str(js)!r}):\n"
        "    time.sleep(20)\n"
        "print('not reached')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "not reached" not in r.stdout
    assert "variant symm did not finish" in r.stderr
    doc = json.loads(js.read_text())
    assert [x["variant"] for x in doc["results"]] == ["stock", "symm"]
    assert doc["results"][1]["reason"].startswith("hung:")
