# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/fsdp_memory_probe.py on the CPU.

* The pure analysis on synthetic device traces (the entry format of torch.cuda.memory._snapshot()'s
  device_traces: action / addr / size / frames, frames innermost first): the live set at the peak,
  torch's counting rule (free_requested) vs active bytes (free_completed), a window, frees of
  addresses the trace never saw, markers, TIDE's bound pool slots (not in the device peak: the
  resident slot bytes are added once), the frame chosen for each group, the diff, the report.
* The child's plumbing on CPU/gloo at world size 1: the real VariantRun of fsdp_step (stock, and tide
  over the simulated tideComm) with torch.cuda's memory API replaced by fakes that hand back a
  synthetic trace holding the child's own markers. It checks the markers, the stats it reads, the JSON
  and the report; the real snapshot only runs on a GPU.
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SCRIPT = REPO / "benchmarks" / "fsdp_memory_probe.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load():
    spec = importlib.util.spec_from_file_location("fsdp_memory_probe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


probe = _load()
MiB = 1 << 20

# frames, innermost first (as torch records them)
F_MODEL = [
    {"filename": "/site/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
    {"filename": "/repo/benchmarks/fsdp_model.py", "line": 57, "name": "forward"},
    {"filename": "/site/torch/nn/modules/module.py", "line": 1750, "name": "_call_impl"},
]
FS = "/site/torch/distributed/fsdp/_fully_shard"
F_FSDP = [
    {"filename": f"{FS}/_fsdp_collectives.py", "line": 598, "name": "foreach_reduce"},
    {"filename": f"{FS}/_fsdp_param_group.py", "line": 700, "name": "post_backward"},
]
F_TIDE_RS = [
    {"filename": "/repo/pytorch_glue/nccl_tide/fsdp/_group.py", "line": 700, "name": "allocate"},
    {"filename": f"{FS}/_fsdp_collectives.py", "line": 590, "name": "foreach_reduce"},
]
F_BIND = [
    {"filename": "/repo/pytorch_glue/nccl_tide/fsdp/_slot_binders.py", "line": 240, "name": "bind"},
    {"filename": "/repo/pytorch_glue/nccl_tide/fsdp/_slot_pool.py", "line": 470, "name": "acquire"},
]
F_OPT = [
    {"filename": "/site/torch/optim/adam.py", "line": 600, "name": "_multi_tensor_adam"},
    {"filename": "/site/torch/optim/optimizer.py", "line": 500, "name": "wrapper"},
]
F_MARK = [
    {"filename": "/repo/benchmarks/fsdp_memory_probe.py", "line": 300, "name": "_probe_mark"},
    {"filename": "/repo/benchmarks/fsdp_memory_probe.py", "line": 340, "name": "_child"},
]


def group_of(frames):
    return probe.group_key(frames)


def alloc(addr, size, frames):
    return {"action": "alloc", "addr": addr, "size": size, "frames": frames, "stream": 0}


def free(addr, size, frames=(), completed=True, requested=True):
    out = []
    if requested:
        out.append({"action": "free_requested", "addr": addr, "size": size, "frames": list(frames)})
    if completed:
        out.append({"action": "free_completed", "addr": addr, "size": size, "frames": list(frames)})
    return out


def test_block_rounding_and_frame_choice():
    assert probe.block_bytes(1) == 512 and probe.block_bytes(512) == 512 and probe.block_bytes(513) == 1024
    assert probe.block_bytes(1000, rounding=0) == 1000
    # innermost frame in nccl_tide/ (the model file), not torch's nn.Linear frame
    assert probe.group_key(F_MODEL) == "benchmarks/fsdp_model.py:57:forward"
    assert probe.group_key(F_FSDP) == "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:598:foreach_reduce"
    assert probe.group_key(F_TIDE_RS) == "nccl_tide/fsdp/_group.py:700:allocate"
    assert probe.group_key(F_OPT) == "torch/optim/adam.py:600:_multi_tensor_adam"  # no focus frame: innermost .py
    assert probe.group_key([{"filename": "??", "line": 0, "name": "at::empty"}]) == "??:0:at::empty"
    assert probe.group_key([]) == probe.NO_FRAME
    assert probe.group_key(F_MARK) == "benchmarks/fsdp_memory_probe.py:340:_child"  # the marker frame is skipped
    assert probe.is_mark(alloc(1, 512, F_MARK)) and not probe.is_mark(alloc(1, 512, F_MODEL))
    assert probe.is_slot_bind(alloc(1, 512, F_BIND)) and not probe.is_slot_bind(alloc(1, 512, F_TIDE_RS))


def test_live_set_at_the_peak():
    ev = []
    ev.append(alloc(0x1000, 100 * MiB, F_MODEL))  # 0: activation A
    ev.append(alloc(0x2000, 50 * MiB, F_FSDP))  # 1: RS buffer B
    ev.append({"action": "segment_alloc", "addr": 0x9000, "size": 1 << 30, "frames": []})  # 2: no effect
    ev += free(0x2000, 50 * MiB, completed=False)  # 3: B freed (requested; a record_stream use defers completion)
    ev.append(alloc(0x3000, 60 * MiB, F_TIDE_RS))  # 4: C -> allocated A + C = 160 MiB: the peak
    ev += free(0x2000, 50 * MiB, requested=False)  # 5: B's free completes
    ev += free(0x1000, 100 * MiB)  # 6, 7
    ev.append(alloc(0x4000, 10 * MiB, []))  # 8
    res = probe.live_at_peak(ev)
    assert res["peak_bytes"] == 160 * MiB and res["peak_index"] == 4
    assert sorted(r["addr"] for r in res["live"]) == [0x1000, 0x3000]
    assert res["live"][0]["addr"] == 0x1000  # largest first
    assert res["unknown_frees"] == 0
    # active bytes: B stays until free_completed, so the peak is A + B + C
    act = probe.live_at_peak(ev, mode="active")
    assert act["peak_bytes"] == 210 * MiB and act["peak_index"] == 4
    assert sorted(r["addr"] for r in act["live"]) == [0x1000, 0x2000, 0x3000]
    # a window after the peak: the live set there
    late = probe.live_at_peak(ev, start=6, end=8)
    assert late["peak_bytes"] == 60 * MiB and late["peak_index"] == 6
    assert [r["addr"] for r in late["live"]] == [0x3000]
    assert probe.live_bytes_at(ev, 1) == 150 * MiB and probe.live_bytes_at(ev, 8) == 70 * MiB
    groups = probe.group_live(res["live"])
    assert [(g["group"], g["bytes"], g["count"]) for g in groups] == [
        ("benchmarks/fsdp_model.py:57:forward", 100 * MiB, 1),
        ("nccl_tide/fsdp/_group.py:700:allocate", 60 * MiB, 1),
    ]
    assert groups[0]["example"][0] == "torch/nn/modules/linear.py:125:forward"
    with pytest.raises(ValueError):
        probe.live_at_peak(ev, mode="reserved")
    assert probe.live_at_peak([])["peak_bytes"] == 0


def test_unknown_frees_rounding_and_requested_only_traces():
    ev = free(0x7000, 4096)  # allocated before the recording began: ignored, counted
    ev.append(alloc(0x1000, 1000, F_MODEL))  # rounds to 1024
    ev.append(alloc(0x1400, 1, F_MODEL))  # rounds to 512
    ev += free(0x1400, 1, requested=False)  # a trace without free_requested: ends at free_completed
    res = probe.live_at_peak(ev)
    assert res["unknown_frees"] == 1
    assert res["peak_bytes"] == 1536 and [r["addr"] for r in probe.live_at_peak(ev, start=4)["live"]] == [0x1000]
    exact = probe.live_at_peak(ev, weight=lambda e: e["size"])
    assert exact["peak_bytes"] == 1001
    # an alloc over a live address (a lost free when the ring buffer wrapped) replaces it
    ev2 = [alloc(0x1000, MiB, F_MODEL), alloc(0x1000, 2 * MiB, F_FSDP)]
    r2 = probe.live_at_peak(ev2)
    assert r2["peak_bytes"] == 2 * MiB and r2["unknown_frees"] == 1 and len(r2["live"]) == 1


def _trace(slot_frames=F_BIND):
    """A synthetic two-step run with markers: step 0 (warm-up) and step 1 (measured). The measured step binds a
    200 MiB pool slot in forward and peaks in backward."""
    ev, labels = [], []
    a = iter(range(0x100000, 0x10000000, 0x1000))

    def mark(label):
        labels.append(label)
        m = next(a)
        ev.append(alloc(m, 512, F_MARK))
        ev.extend(free(m, 512))

    params = next(a)
    mark("start")
    ev.append(alloc(params, 1000 * MiB, F_FSDP))  # lives throughout
    for k in range(2):
        if k == 1:
            mark("measure")
        mark(f"step{k}:forward")
        slot = next(a)
        ev.append(alloc(slot, 200 * MiB, slot_frames))
        act = next(a)
        ev.append(alloc(act, (300 if k == 1 else 100) * MiB, F_MODEL))
        mark(f"step{k}:backward")
        g = next(a)
        ev.append(alloc(g, 150 * MiB, F_TIDE_RS))  # the peak of step 1: 1000 + 200 + 300 + 150
        ev.extend(free(act, 0))
        ev.extend(free(slot, 0))  # the slot unbinds: the device peak (without it) comes later
        o = next(a)
        mark(f"step{k}:optimizer")
        ev.append(alloc(o, 400 * MiB, F_OPT))  # device peak: 1000 + 150 + 400 (+ resident slots)
        ev.extend(free(o, 0))
        ev.extend(free(g, 0))
    mark("end")
    return ev, labels


def test_live_at_peak_with_slot_timeline():
    """A trimming pool: the resident slot bytes change during the step ("slots:<bytes>" markers); the device peak is
    the peak of live + resident at each event, which may sit elsewhere than the torch peak."""
    ev = [alloc(0xA, 100, F_MODEL), alloc(0xB, 200, F_MODEL), *free(0xB, 200), alloc(0xC, 50, F_MODEL)]
    exact = lambda e: e["size"]  # noqa: E731
    plain = probe.live_at_peak(ev, weight=exact)
    assert plain["peak_bytes"] == 300 and plain["peak_index"] == 1 and plain["extra_at_peak"] == 0
    timed = probe.live_at_peak(ev, weight=exact, extra=(50, [(2, 0), (4, 300)]))  # 150, 350, 100, 100, 450
    assert timed["peak_bytes"] == 450 and timed["peak_index"] == 4 and timed["extra_at_peak"] == 300, timed
    assert sorted(r["addr"] for r in timed["live"]) == [0xA, 0xC]
    early = probe.live_at_peak(ev, weight=exact, extra=(50, [(2, 0), (4, 300)]), end=4)
    assert early["peak_bytes"] == 350 and early["extra_at_peak"] == 50, early
    assert probe.slot_timeline([3, 7, 9], ["measure", "slots:10", "slots:0"], 5) == (5, [(7, 10), (9, 0)])
    assert probe.phase_at(8, [3, 7], ["step1:backward", "slots:10"], ) == "step1:backward"


def test_analyze_windows_phases_and_slots():
    ev, labels = _trace()
    res = probe.analyze(ev, labels, resident_slot_bytes=400 * MiB)
    assert res["marks"] == len(labels)
    m = res["windows"]["measured"]
    assert m["torch_peak_bytes"] == (1000 + 200 + 300 + 150) * MiB
    assert m["torch_peak_phase"] == "step1:backward"
    assert m["torch_peak_bound_slots"] == 1 and m["torch_peak_bound_slot_bytes"] == 200 * MiB
    assert m["device_peak_bytes"] == (1000 + 150 + 400 + 400) * MiB
    assert m["device_peak_phase"] == "step1:optimizer"
    groups = {g["group"]: g["bytes"] for g in m["device_groups"]}
    assert groups == {
        "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:598:foreach_reduce": 1000 * MiB,
        "torch/optim/adam.py:600:_multi_tensor_adam": 400 * MiB,
        probe.SLOT_GROUP: 400 * MiB,
        "nccl_tide/fsdp/_group.py:700:allocate": 150 * MiB,
    }
    assert [g["group"] for g in m["device_groups"]][:3] == [  # largest first, ties by name
        "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:598:foreach_reduce",
        probe.SLOT_GROUP,
        "torch/optim/adam.py:600:_multi_tensor_adam",
    ]
    assert res["live_bytes_at_measure"] == 1000 * MiB
    # warm-up and measured steps: the same peaks here (step 0 is smaller)
    assert res["windows"]["all_steps"]["torch_peak_bytes"] == m["torch_peak_bytes"]
    # without slots (stock): the bind frames are ordinary allocations and nothing is added
    ev2, labels2 = _trace(slot_frames=F_MODEL)
    s = probe.analyze(ev2, labels2)["windows"]["measured"]
    assert s["device_peak_bytes"] == s["torch_peak_bytes"] == m["torch_peak_bytes"]
    assert s["torch_peak_bound_slots"] == 0
    with pytest.raises(probe.ProbeError):
        probe.analyze(ev, labels[:-1])


def test_diff_and_report():
    ev, labels = _trace()
    tide = probe.analyze(ev, labels, resident_slot_bytes=400 * MiB)
    ev2, labels2 = _trace(slot_frames=F_MODEL)
    stock = probe.analyze(ev2, labels2)
    d = probe.diff_groups(tide["windows"]["measured"]["device_groups"], stock["windows"]["measured"]["device_groups"])
    tm, sm = tide["windows"]["measured"], stock["windows"]["measured"]
    assert d["total"] == tm["device_peak_bytes"] - sm["device_peak_bytes"]
    more = {r["group"]: (r["delta"], r["only"]) for r in d["more"]}
    less = {r["group"]: (r["delta"], r["only"]) for r in d["less"]}
    # stock peaks in backward (the activations), tide in the optimizer step (its slots are resident)
    assert more == {probe.SLOT_GROUP: (400 * MiB, "tide"), group_of(F_OPT): (400 * MiB, "tide")}
    assert less == {"benchmarks/fsdp_model.py:57:forward": (-500 * MiB, "stock")}
    assert d["more"][0]["group"] == probe.SLOT_GROUP
    def var(a):
        return {"ok": True, "analysis": a, "torch_max_memory_allocated": 1, "allocated_at_measure": 1,
                "trace_entries": len(ev), "resident_slot_bytes": 0}

    doc = {"settings": {"torch": "x", "device": "y"}, "variants": {"stock": var(stock), "tide": var(tide),
           "tide-dedicated": {"ok": False, "error": "boom"}}, "diff": dict(d, tide_peak=1, stock_peak=1)}
    text = probe.report(doc, top=5)
    assert "FAILED" in text and "boom" in text
    assert probe.SLOT_GROUP in text and "step1:optimizer" in text and "[tide only]" in text and "[stock only]" in text
    json.dumps(doc)


def test_command_line_failures_are_one_line(tmp_path):
    """On a machine without CUDA (or with a bad variant) the probe exits 2 with one message, no traceback."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "pytorch_glue"), CUDA_VISIBLE_DEVICES="")
    for args, want in ((["--variants", "stock,nope"], "choose from"), ([], "CUDA")):
        p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json"), *args], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, p.stderr
        assert want in p.stderr and "Traceback" not in p.stderr, p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    p = subprocess.run([sys.executable, str(SCRIPT), "--show", str(bad)], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "cannot read" in p.stderr and "Traceback" not in p.stderr


# ------------------------------------------------------------------------------------------
# the child's plumbing on CPU, with a fake torch.cuda memory API
# ------------------------------------------------------------------------------------------
def _fake_child(variant, out_path, port, binder="alloc"):
    """Runs probe._child on CPU/gloo with torch.cuda's memory API faked (a synthetic trace with the child's own
    markers and one allocation per phase). `binder`: the pools' binder (None: the default, "torch" at world 1)."""
    import torch
    import torch.distributed as dist

    import fsdp_step

    sys.path.insert(0, str(REPO / "tests"))  # the suite's shared helpers (this child process ran no conftest)
    from forced_binder import force_binder

    # The markers' plumbing is about slots TIDE allocates (tideSlotAlloc, outside torch's trace): keep the trimming
    # pool on them. The default at world size 1 (binder "torch") puts the slots in torch's own trace, which this fake
    # trace does not have; tests/multirank/test_fsdp_slot_trim.py covers that path (and outside_torch_bytes / the
    # hook's bytes).
    force_binder(binder)
    from sim_comm import use_sim_native

    use_sim_native()
    cuda = torch.cuda
    first = iter([True])  # the child's own check sees a GPU; FSDP2's device choice later must not (CPU mesh)
    for name, fn in {
        "is_available": lambda: next(first, False), "set_device": lambda d: None, "synchronize": lambda *a: None,
        "memory_allocated": lambda *a: 123, "max_memory_allocated": lambda *a: 456,
        "reset_peak_memory_stats": lambda *a: None, "get_device_name": lambda *a: "fake",
    }.items():
        setattr(cuda, name, fn)
    calls = []
    cuda.memory._record_memory_history = lambda *a, **k: calls.append(k)

    def snapshot():  # per marker: the marker, then the previous phase's allocation freed and this phase's
        ev, a, prev = [], 0x10000, None
        for lab in probe._MARK_LABELS:
            a += 0x1000
            ev.append(alloc(a, 512, F_MARK))
            ev.extend(free(a, 512))
            if lab.startswith(probe.SLOT_MARK):  # a slot alloc/free of the pool: no torch allocation of its own
                continue
            if prev is not None:
                ev.extend(free(prev, 0))
            a += 0x1000
            prev = a
            ev.append(alloc(a, 3 * MiB if lab.endswith("backward") else MiB, F_MODEL))
        return {"segments": [], "device_traces": [ev]}

    cuda.memory._snapshot = snapshot

    def init_dist():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        return dist, 0, 1, torch.device("cpu")

    fsdp_step._init_dist = init_dist
    a = probe.parser().parse_args(["--child", variant, "--layers", "3", "--hidden", "64", "--heads", "4",
                                   "--kv-heads", "2", "--ffn", "96", "--vocab", "97", "--seq", "8", "--tokens", "16",
                                   "--warmup", "2", "--steps", "1"])
    doc = probe._child(a)
    doc["record_calls"] = calls
    doc["labels"] = list(probe._MARK_LABELS)
    with open(out_path, "w") as f:
        json.dump(doc, f)


def test_child_plumbing_on_cpu(tmp_path):
    # The child imports nccl_tide as this process does (CI: the installed package, whose library it needs; a dev
    # run: PYTHONPATH=pytorch_glue with NCCL_TIDE_LIBRARY_PATH), plus benchmarks/ and its tests/ for this module.
    import nccl_tide

    pkg_dir = str(Path(nccl_tide.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([pkg_dir, str(REPO / "benchmarks"), str(HERE)]), OMP_NUM_THREADS="1")
    docs = {}
    for variant in ("stock", "tide"):
        out = tmp_path / f"{variant}.json"
        code = (f"import sys; sys.path[:0] = [{str(REPO / 'benchmarks')!r}, {str(HERE)!r}]; import test_fsdp_memory_probe as t; "
                f"t._fake_child({variant!r}, {str(out)!r}, {free_port()})")
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
        docs[variant] = json.loads(out.read_text())
    for variant, d in docs.items():
        assert d["record_calls"][0]["max_entries"] == probe.MAX_ENTRIES and d["record_calls"][-1] == {"enabled": None}
        assert d["record_calls"][0]["stacks"] == "python"
        an = d["analysis"]
        # start, 3 steps x (forward, backward, optimizer), measure, end; tide: one "slots:" marker per slot event
        n_slot = sum(lab.startswith(probe.SLOT_MARK) for lab in d["labels"])
        assert an["marks"] == 1 + 3 * 3 + 2 + n_slot
        assert (n_slot > 0) == (variant == "tide"), d["labels"]
        m = an["windows"]["measured"]
        assert m["torch_peak_phase"] == "step2:backward"
        assert d["torch_max_memory_allocated"] == 456 and d["allocated_at_measure"] == 123
    t = docs["tide"]
    # --slot-pool 2 by default; the default trimming frees the pool's slots at the end of forward only, so at the end
    # of the last backward both slots the backward regrew are still allocated, with the root's dedicated slot
    assert 0 < t["resident_slot_bytes"] == t["max_resident_slot_bytes"] and t["tide"]["slot_pool"]["size"] == 2
    assert t["tide"]["total"]["ag_calls"] > 0 and t["tide"]["total"]["fallbacks"] == 0
    assert docs["stock"]["resident_slot_bytes"] == 0
    tm, sm = t["analysis"]["windows"]["measured"], docs["stock"]["analysis"]["windows"]["measured"]
    # world size 1: the pool trims, at the end of forward only (slot_trim=None: ["end of forward"]). Its markers: only
    # the root's dedicated slot is resident when backward starts (steps 1 and 2), both pool slots again during
    # backward (regrown) and still when the optimizer step starts (no end-of-backward trim)
    pool = t["tide"]["slot_pool"]
    ded = sum(p["slot_capacity"] for p in t["tide"]["slot_pools"] if p["solo"] or not p["shared"])
    assert pool["trim"] and pool["trims"] > 0 and pool["regrows"] > 0 and tm["slot_bytes_timed"], pool
    assert pool["trim_at"] == ["end of forward"], pool
    # 3 layers pooled, 3 steps: a trim at the end of forward of steps 1 and 2, both slots regrown in their backward
    assert pool["trims"] == 2 and pool["regrows"] == 2 * 2, pool
    resident, at, during, phase = 0, {}, {}, None
    for lab in t["labels"]:
        if lab.startswith(probe.SLOT_MARK):
            resident = int(lab[len(probe.SLOT_MARK):])
            during.setdefault(phase, []).append(resident)
        else:
            at[lab], phase = resident, lab
    in_bwd = during.get("step2:backward", [])
    full = ded + 2 * pool["slot_capacity"]
    assert at["step0:backward"] == full and ded > 0, at
    for k in (1, 2):
        assert at[f"step{k}:backward"] == ded and at[f"step{k}:optimizer"] == full, at
    assert at["step0:optimizer"] == full, at
    assert t["max_resident_slot_bytes"] == full, t
    # the fake trace's backward allocation spans the whole phase, so its device peak is where backward regrew both
    # slots: 3 MiB + the dedicated slot + 2 pool slots, the replay adding the bytes the markers gave at each event
    assert tm["device_peak_phase"] == "step2:backward", tm["device_peak_phase"]
    assert tm["slot_bytes_at_device_peak"] == max(at["step2:backward"], *in_bwd) == full, (tm, in_bwd)
    assert tm["device_peak_bytes"] - sm["device_peak_bytes"] == tm["slot_bytes_at_device_peak"]
    d = probe.diff_groups(tm["device_groups"], sm["device_groups"])
    assert [r["group"] for r in d["more"]] == [probe.SLOT_GROUP]
    doc = {"settings": {}, "variants": {k: dict(v, ok=True) for k, v in docs.items()},
           "diff": dict(d, tide_peak=tm["device_peak_bytes"], stock_peak=sm["device_peak_bytes"])}
    assert "diff at the device peak" in probe.report(doc)


def test_child_torch_binder_slot_bytes(tmp_path):
    """The default pool at world size 1 (binder "torch") is torch memory, in torch's own trace: the probe's TIDE slot
    bytes (resident and the max its table shows) are then the root's dedicated slot only, not the pool's slots."""

    import nccl_tide

    pkg_dir = str(Path(nccl_tide.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([pkg_dir, str(REPO / "benchmarks"), str(HERE)]), OMP_NUM_THREADS="1")
    out = tmp_path / "tide.json"
    code = (f"import sys; sys.path[:0] = [{str(REPO / 'benchmarks')!r}, {str(HERE)!r}]; import test_fsdp_memory_probe as t; "
            f"t._fake_child('tide', {str(out)!r}, {free_port()}, binder=None)")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    t = json.loads(out.read_text())
    pools = t["tide"]["slot_pools"]
    assert t["tide"]["slot_pool"]["binder"] == "torch" and any(q["torch_memory"] for q in pools), pools
    ded = sum(q["slot_capacity"] for q in pools if not q["shared"])
    assert ded > 0 and t["resident_slot_bytes"] == ded, (t["resident_slot_bytes"], ded)
    assert t["max_resident_slot_bytes"] == ded, (t["max_resident_slot_bytes"], ded)  # not + the pool's torch slots


def test_parent_reports_a_failing_child(tmp_path, monkeypatch, capsys):
    """The parent's subprocess plumbing: on this CPU machine the child itself finds no GPU; the parent prints that
    one message and the end of the child's log, keeps the JSON and exits 1 (the checks that stop it earlier, with
    status 2, are skipped here)."""
    monkeypatch.setattr(probe, "_checks", lambda variants: None)
    monkeypatch.setenv("PYTHONPATH", str(REPO / "pytorch_glue"))
    out = tmp_path / "probe.json"
    rc = probe.main(["--variants", "stock", "--out", str(out), "--layers", "1", "--timeout", "100"])
    assert rc == 1
    err = capsys.readouterr()
    assert "stock FAILED: no CUDA device visible in the child process" in err.err
    assert "Traceback" not in err.err and "FAILED" in err.out
    doc = json.loads(out.read_text())
    r = doc["variants"]["stock"]
    assert not r["ok"] and r["error"] == "no CUDA device visible in the child process"
    assert Path(r["log"]).name == "probe.json.stock.log" and Path(r["log"]).is_file()
    assert not list(tmp_path.glob("*.child.json"))
    assert doc["settings"]["layers"] == 1 and "diff" not in doc
