# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""One rank's share (benchmarks/share/): the pure-Python logic on the CPU.

Pacing timeline (the mirror of benchmarks/native/bench_pacer.cc), piece cutting, occupancy-weighted SM time, the
link floor, argument validation and the command line; the AG and RS copy plans replayed on a byte arena and
reduced in the documented order, bit for bit against the host executor; the whole run with host stand-ins for the
benchmark library (bench_lib, tested in test_bench_lib.py).
"""

from types import SimpleNamespace

import numpy as np
import pytest
import share_stand_ins
from share import cli, method, plan, profile, timeline


def test_link_release_times_follow_the_rate_and_the_arrivals():
    rate = 100.0  # bytes per second
    rel = plan.link_release_times([[100, 100, 50], [100], [200]], rate, [0.0, 1.0, 10.0])
    assert rel[0] == pytest.approx([1.0, 2.0, 2.5])  # a piece lands once its bytes crossed the link
    assert rel[1] == pytest.approx([3.5])  # arrived at 1.0 while the link was busy until 2.5: no overlap
    assert rel[2] == pytest.approx([12.0])  # arrived late (10.0): the link idled, then 200 bytes at the rate
    # Never faster than the rate, whatever the arrivals.
    flat = [t for r in rel for t in r]
    assert all(b > a for a, b in zip(flat, flat[1:]))
    with pytest.raises(ValueError):
        plan.link_release_times([[1]], 0.0, [0.0])
    with pytest.raises(ValueError):
        plan.link_release_times([[1], [2]], 1.0, [0.0])
    with pytest.raises(ValueError):
        plan.link_release_times([[0]], 1.0, [0.0])


def test_cut_pieces_covers_the_transfer():
    assert plan.cut_pieces([10, 7, 3], 8) == [8, 8, 4]
    assert plan.cut_pieces([16], 8) == [8, 8]
    assert plan.cut_pieces([], 8) == []
    rng = np.random.default_rng(3)
    sizes = list(rng.integers(1, 10000, 50))
    pieces = plan.cut_pieces(sizes, 4096)
    assert sum(pieces) == sum(sizes) and all(0 < p <= 4096 for p in pieces)
    with pytest.raises(ValueError):
        plan.cut_pieces([1], 0)


def test_chunk_spans_assign_copies_by_bytes():
    ev = [(0.0, 2.0, 100), (5.0, 6.0, 50), (7.0, 9.0, 50), (20.0, 21.0, 30), (22.0, 30.0, 70)]
    sp = timeline.chunk_spans(ev, [200, 100])
    assert sp == [(0.0, 9.0, 3), (20.0, 30.0, 2)]
    assert timeline.chunk_spans(ev, [100, 100, 100])[0] == (0.0, 2.0, 1)
    empty = timeline.chunk_spans([(1.0, 2.0, 10)], [10, 0])
    assert empty[0] == (1.0, 2.0, 1) and empty[1][2] == 0
    with pytest.raises(ValueError, match="bytes"):
        timeline.chunk_spans(ev, [200, 99])
    # an empty copy after the last byte, and empty chunks at the end, stay in range
    assert timeline.chunk_spans(ev + [(40.0, 41.0, 0)], [200, 100, 0])[2] == (40.0, 41.0, 1)
    with pytest.raises(ValueError, match="no chunks"):
        timeline.chunk_spans([], [])


def test_streams_told_apart_by_bytes():
    timeline.check_streams_distinct(100, [700, 600])
    with pytest.raises(ValueError, match="told apart"):
        timeline.check_streams_distinct(100, [100])  # W = 2: own and incoming carry the same bytes


def test_gate_kernel_names():
    assert profile.is_gate_kernel("void at::cuda::(anonymous namespace)::spin_kernel(long)")
    assert profile.is_gate_kernel("sleep_kernel") and not profile.is_gate_kernel("reduceVecKernel<Bf16, float>")


def test_launch_spans_and_rows():
    ks = [(10.0, 20.0, 8), (21.0, 30.0, 8), (40.0, 45.0, 32)]
    red = timeline.launch_spans(ks, [2, 1])
    assert red == [(10.0, 30.0, 8), (40.0, 45.0, 32)]
    with pytest.raises(ValueError, match="kernels"):
        timeline.launch_spans(ks, [2, 2])
    rows = timeline.timeline_rows([(0.0, 9.0, 3), (12.5, 38.0, 2)], [(0.0, 1.0, 1), (11.0, 12.0, 1)], red, 47.0)
    assert rows[1]["gap_before_us"] == pytest.approx(3.5) and rows[1]["tail_us"] == pytest.approx(9.0)
    assert rows[0]["red_ctas"] == 8 and "tail_us" not in rows[0] and "gap_before_us" not in rows[0]
    lines = timeline.timeline_lines("TIDE-RS share", rows, 47.0, 40.0)
    assert "link floor 40.0" in lines[0] and "gap before    3.5" in lines[2] and "(32 CTAs)" in lines[2]


def test_occupancy_weighting():
    # 4 CTAs of 132 SMs for 100 us = 100 * 4/132; a full grid counts once; more CTAs than SMs count once.
    got = method.occupancy_weighted_us([(100.0, 4), (10.0, 132), (10.0, 264), (5.0, 0)], 132)
    assert got == pytest.approx(100 * 4 / 132 + 10 + 10)
    assert method.occupancy_weighted_us([], 132) == 0
    with pytest.raises(ValueError):
        method.occupancy_weighted_us([(1.0, 1)], 0)
    # The comparison: a 32-CTA persistent kernel over T against G CTAs over t.
    base = method.occupancy_weighted_us([(1000.0, 32)], 132)
    assert base == pytest.approx(1000 * 32 / 132)


def test_link_floor_and_side_ops():
    assert plan.link_floor_s("rs", 8, 8e9, 370e9) == pytest.approx(7 / 8 * 8e9 / 370e9)
    with pytest.raises(ValueError):
        plan.link_floor_s("x", 8, 1, 1)
    assert method.side_ops_for(1.0, 0.17) == 3
    assert method.side_ops_for(0.01, 0.17) == 152
    assert method.side_ops_for(0.0001, 0.17) == 200


def _args(**kw):
    a = cli.parser().parse_args([])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def test_validation_and_cli_hook(capsys):
    assert cli.validate(_args()) is None
    assert "--link-gbps" in cli.validate(_args(link_gbps=0.0))
    assert "--link-gbps" in cli.validate(_args(link_gbps=float("inf")))
    assert "--ranks" in cli.validate(_args(ranks=1))
    assert "--ranks" in cli.validate(_args(ranks=16))
    assert "--piece-bytes" in cli.validate(_args(piece_bytes=1000))
    assert "--runs" in cli.validate(_args(runs=0))
    assert "unknown --sides" in cli.validate(_args(sides=["rs-share", "bogus"]))
    # the drain-cap sides: a positive CTA count, written plainly
    assert cli.validate(_args(sides=["rs-share", "rs-share-drain64", "rs-share-drain1"])) is None
    # (non-ASCII digits too: "²" passes str.isdigit() but int() refuses it, "١٢" is int 12 written otherwise)
    for bad in ("rs-share-drain", "rs-share-drain0", "rs-share-drain064", "rs-share-drain2000", "rs-share-drainx",
                "rs-share-drain\u00b2", "rs-share-drain\u0661\u0662", "rs-share-drain\uff11"):
        assert "unknown --sides" in cli.validate(_args(sides=[bad])), bad
    assert "collective" in cli.validate(_args(collective="all_reduce"))
    a = cli.parser().parse_args(["reduce_scatter", "--link-gbps", "200", "--piece-bytes", "2MiB", "--sides",
                                   "rs-share,nccl-like-32"])
    assert a.piece_bytes == 2 << 20 and a.link_gbps == 200 and cli.wanted_sides(a) == ["rs-share", "nccl-like-32"]
    assert cli.wanted_sides(cli.parser().parse_args(["all_gather"])) == ["ag-share", "ag-share-unpaced",
                                                                       "ag-loopback"]
    assert plan.parse_bytes("4M") == 4 << 20 and plan.parse_bytes("64K") == 65536
    with pytest.raises(Exception):
        plan.parse_bytes("lots")
    # bad input exits 2 with the reason, before touching a GPU.
    assert cli.main(["--link-gbps", "-5"]) == 2
    assert "--link-gbps" in capsys.readouterr().err
    assert method.MIN_RUNS == 31 and cli.parser().parse_args([]).runs == 31


def test_summary_rows():
    res = {"sides": [
        {"side": "rs-share", "name": "TIDE-RS share", "slowdown": 1.04, "e2e_over_floor": 1.2,
         "sm": {"sm_weighted_us": 10.0}},
        {"side": "nccl-like-32", "name": "NCCL-like 32", "slowdown": 1.7, "sm": {"sm_weighted_us": 200.0}},
        {"side": "ag-share", "name": "TIDE-AG share", "slowdown": 1.05, "sm": {"sm_weighted_us": 0.0}},
    ]}
    rows = {r["metric"]: r for r in cli.summarize(res)}
    assert rows["GEMM slowdown beside TIDE-RS share"]["met"] is True
    assert rows["GEMM slowdown beside TIDE-AG share"]["met"] is False
    assert rows["RS share end to end / link floor"]["met"] is False
    r = rows["RS SM time (occupancy-weighted): 32-CTA baseline / TIDE share"]
    assert r["value"] == pytest.approx(20.0) and r["met"] is True


def _params(numels, rows, world, elem=2):
    """Layout params as tide.h computes them (tests/tide_ref.py's rules, one dtype)."""
    out, send, slot, rs = [], 0, 0, 0
    for n, c in zip(numels, rows):
        shard = -(-(n // c) // world) * c
        slot = -(-slot // 256) * 256
        out.append(SimpleNamespace(numel=n, shard_numel=shard, elem_size=elem, send_offset=send, slot_offset=slot,
                                   rs_out_offset=rs))
        send += shard * elem
        slot += shard * world * elem
        rs += shard
    return out, send, slot, rs


def test_ag_plan_fills_every_slot_position_once():
    W = 4
    params, send_bytes, slot_bytes, _ = _params([3000, 448, 1000, 15], [100, 64, 1, 3], W)
    arena = np.zeros(send_bytes * W + slot_bytes, dtype=np.uint8)
    rng = np.random.default_rng(5)
    arena[: send_bytes * W] = rng.integers(0, 256, send_bytes * W, dtype=np.uint8)
    slot0 = send_bytes * W
    own, inc = plan.ag_plan(params, W, lambda s: s * send_bytes, 0, slot0)
    assert len(own) == len(params) and len(inc) == len(params) * (W - 1)
    written = np.zeros(slot_bytes, dtype=np.int32)
    for dst, src, nb in own + inc:
        arena[dst:dst + nb] = arena[src:src + nb]
        written[dst - slot0:dst - slot0 + nb] += 1
    for p in params:
        sb = p.shard_numel * p.elem_size
        for s in range(W):
            got = arena[slot0 + p.slot_offset + s * sb: slot0 + p.slot_offset + (s + 1) * sb]
            want = arena[s * send_bytes + p.send_offset: s * send_bytes + p.send_offset + sb]
            assert np.array_equal(got, want)
            assert (written[p.slot_offset + s * sb: p.slot_offset + (s + 1) * sb] == 1).all()


def test_rs_chunk_plan_reduces_like_the_host_executor(native):
    torch = pytest.importorskip("torch")
    from nccl_tide import Layout, host_reduce_scatter

    W = 4
    numels, rows = [3000, 448, 1000, 15, 8192], [100, 64, 1, 3, 1]
    shapes = [(n // r, r) for n, r in zip(numels, rows)]
    with Layout(numels, "bf16", W, row_numels=rows, rs_chunk_bytes=4096) as lay:
        M, chunk = lay.rs_out_numel, lay.rs_chunk_numel
        assert lay.rs_num_chunks >= 3
        g = torch.Generator().manual_seed(7)
        grads = [[torch.randn(s, generator=g).bfloat16().reshape(-1) for s in shapes] for _ in range(W)]
        want = host_reduce_scatter(lay, grads, "fp32", "sum")[0]
        # Arena: rank 0's grads, the W-1 images (rank s's elements for rank 0, packed in output order), staging,
        # a small zero buffer (so that padding, where present, comes in several pieces).
        g_sizes = [x.numel() * 2 for x in grads[0]]
        g_off = np.cumsum([0] + g_sizes).tolist()
        img0 = g_off[-1]
        images = torch.zeros(W - 1, M, dtype=torch.bfloat16)
        for s in range(1, W):
            for p, x in zip(lay.params, grads[s]):
                k = min(p.shard_numel, p.numel)
                images[s - 1, p.rs_out_offset:p.rs_out_offset + k] = x[:k]
        stag0 = img0 + (W - 1) * M * 2
        nb_buf = 2 if lay.rs_num_chunks > 1 else 1
        zeros0 = stag0 + nb_buf * W * chunk * 2
        arena = np.full(zeros0 + 64, 0xAB, dtype=np.uint8)
        arena[zeros0:] = 0
        for x, o in zip(grads[0], g_off):
            arena[o:o + x.numel() * 2] = x.view(torch.uint8).numpy()
        arena[img0:stag0] = images.reshape(-1).view(torch.uint8).numpy()
        plans, nb = plan.rs_chunk_plan(lay.params, W, chunk, M, g_off[:-1], lambda s: img0 + (s - 1) * M * 2, stag0,
                                        zeros0, 64)
        assert nb == nb_buf and len(plans) == lay.rs_num_chunks
        out = torch.full((M,), float("nan"))
        for own, inc, (buf, n, c0) in plans:
            for dst, src, nbytes in own + inc:
                arena[dst:dst + nbytes] = arena[src:src + nbytes]
            x = torch.from_numpy(arena[buf:buf + W * chunk * 2].copy()).view(torch.bfloat16).view(W, chunk)
            acc = x[0, :n].float()
            for s in range(1, W):
                acc = acc + x[s, :n].float()
            out[c0:c0 + n] = acc
        want = torch.as_tensor(np.asarray(want, dtype=np.float32))
        assert not torch.isnan(out).any()
        assert torch.equal(out.view(torch.int32), want.view(torch.int32))  # bit for bit


# ---------------------------------------------------------------------------------------------------------------
# The whole share run on the CPU: the GPU pieces replaced by host stand-ins that really move and fold the bytes
# (share_stand_ins), so that every Python path of share.cli.run (sides, checks, timing, harness, summary, JSON)
# executes and the shares' own output checks pass.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("order,source", [("gemm-after-first", "device"), ("side-first", "host")])
def test_share_run_end_to_end_with_host_stand_ins(monkeypatch, tmp_path, native, order, source):
    torch = pytest.importorskip("torch")
    import json

    from nccl_tide import models

    fake = share_stand_ins.install(monkeypatch, torch)
    monkeypatch.setattr(cli, "Gpu", fake.Gpu)
    released, kernels = fake.released, fake.kernels
    out = tmp_path / "share.json"
    sides = ("ag-share,ag-share-unpaced,ag-share-incoming,rs-share,rs-share-unpaced,rs-share-serial,nccl-like-16,"
             "nccl-like-32")
    rc = cli.main(["both", "--ranks", "4", "--layout", "tiny-test-layer", "--runs", "3", "--sides", sides,
                     "--rs-chunk-bytes", "4096", "--order", order, "--incoming-source", source, "-J", str(out)])
    res = json.loads(out.read_text())
    assert not res["errors"], res["errors"]
    assert rc == 0
    assert res["rs_num_chunks"] >= 2  # the two-buffer pipeline and its buffer reuse were exercised
    by = {d["side"]: d for d in res["sides"]}
    assert set(by) == set(sides.split(","))
    for name, d in by.items():
        assert d["check"]["ok"], (name, d["check"])
        assert d["with_ms"]["n"] == 3 and d["k_units"] >= 3 and d["hbm_GBps"] > 0
        assert d["valid_runs"] == 3 and d["gemm_late_runs"] == 0 and d["order"] == order
    assert by["rs-share"]["link_floor_ms"] > 0 and "e2e_over_floor" in by["rs-share"]
    assert by["ag-share"]["sm"]["sm_weighted_us"] == pytest.approx(5.0 * 4 / 132 / 3)  # one stand-in kernel per 3 units
    assert released and kernels
    # the timeline found every chunk's copies and reduce on their streams, in the order the unit enqueued them
    # (rs-share: chunk k's incoming copies on stream k % 2, one per staging buffer; rs-share-serial: one stream)
    for side in ("rs-share", "rs-share-serial"):
        rows = by[side]["timeline"]["rows"]
        assert len(rows) == res["rs_num_chunks"]
        for r in rows:
            assert r["in_copies"] == 3 and r["in_start_us"] < r["in_end_us"] <= r["own_start_us"] < r["red_start_us"]
        assert rows[-1]["tail_us"] > 0 and [r["chunk"] for r in rows] == list(range(len(rows)))
    assert len(by["ag-share"]["timeline"]["rows"]) == 1 and "timeline" not in by["nccl-like-32"]
    assert res["order"] == order and res["incoming_source"] == source
    tag = ", incoming from host" if source == "host" else ""
    assert by["ag-share"]["name"] == "TIDE-AG share" + tag and by["rs-share"]["name"] == "TIDE-RS share" + tag
    # HBM model: incoming bytes count twice from device images (read + write), once from host images (write)
    from nccl_tide import Layout

    numels, rows = models.numels_and_rows(models.model_params("tiny-test-layer"))
    own = sum(p.shard_numel * p.elem_size for p in Layout(numels, "bf16", 4, rank=0, row_numels=rows).params)
    assert by["ag-share"]["hbm_bytes_per_unit"] == (2 * own + (2 if source == "device" else 1) * 3 * own)
    # ag-share-incoming: the same incoming copies, no own-shard copy (its slot position is not checked)
    inc = by["ag-share-incoming"]
    assert inc["name"] == "TIDE-AG share, incoming only" + tag
    assert inc["hbm_bytes_per_unit"] == (2 if source == "device" else 1) * 3 * own
    rows_in = inc["timeline"]["rows"]
    assert len(rows_in) == 1 and "own_end_us" not in rows_in[0] and rows_in[0]["in_copies"] > 0
    assert {r["metric"] for r in res["summary"]} >= {"GEMM slowdown beside TIDE-AG share",
                                                     "RS SM time (occupancy-weighted): 32-CTA baseline / TIDE share"}


def test_sm_summary_reports_same_device_copies_apart_from_weighted_kernel_time():
    from types import SimpleNamespace

    from share.profile import sm_summary

    g = SimpleNamespace(n_sm=132)
    kernels = [("tide_reduce", 10.0, 66, {}), ("sleep_kernel", 100.0, 1, {})]
    mem = [(4.0, True), (30.0, False), (2.0, True)]  # two same-device copies (on SMs), one peer copy
    s = sm_summary(g, kernels, mem, iters=2)
    assert s["kernel_us"] == 5.0 and s["sm_weighted_us"] == 2.5  # the sleep gate is excluded; 66/132 of 10 us / 2
    assert s["memcpy_us"] == 18.0 and s["local_copy_us"] == 3.0 and s["memcpy_per_unit"] == 1.5
