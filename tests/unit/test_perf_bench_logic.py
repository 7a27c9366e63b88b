# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The GPU backends' bench logic on the CPU: the loopback backend against a torch model of LoopbackWorld (the
documented semantics), the torchrun backend's nccl/fsdp2 rows on a one-rank gloo group. What runs here is the code the
GPU runs (layouts, stand-ins, copy-out/copy-in, checks), minus CUDA; a corrupted result must be counted."""

import pytest

torch = pytest.importorskip("torch")

from nccl_tide.dtypes import dtype as to_dtype  # noqa: E402
from nccl_tide.perf import collectives, loopback_backend, runner  # noqa: E402

SHAPES = [(5, 3), (7,), (2, 4), (9, 2)]  # 2 of 4 ranks hold padding rows; one parameter has fewer rows than ranks


class ModelWorld:
    """CPU model of nccl_tide.cuda.LoopbackWorld (same call signatures): AG copies every rank's shards to every
    rank's slot; RS sums in fp32 left to right, zero in the padding. corrupt=True flips one output element."""

    def __init__(self, n, corrupt=False):
        self.n, self.corrupt = n, corrupt
        self.freed = 0

    def alloc_slot(self, nbytes):
        return [torch.empty(int(nbytes), dtype=torch.uint8) for _ in range(self.n)]

    def free_slot(self, slots):
        self.freed += 1

    def join(self, stream=None):
        pass

    def synchronize(self, streams=None, timeout=None):
        assert timeout is not None  # the benches never wait without a timeout

    def all_gather(self, layouts, slots, sendbufs=None, shards=None, streams=None):
        for s in range(self.n):
            for p in layouts[s].params:
                nb = p.shard_numel * p.elem_size
                for d in range(self.n):
                    slots[d][p.slot_offset + s * nb : p.slot_offset + (s + 1) * nb] = sendbufs[s][
                        p.send_offset : p.send_offset + nb
                    ]
        if self.corrupt:
            slots[-1][layouts[0].params[-1].slot_offset] ^= 1

    def reduce_scatter(self, layouts, grads, outs, op="sum", scale=1.0, staging=None, streams=None):
        for r in range(self.n):
            outs[r].zero_()
            for i, p in enumerate(layouts[r].params):
                k = p.shard_numel
                lo, hi = r * k, min((r + 1) * k, p.numel)
                if hi <= lo:
                    continue
                acc = torch.zeros(hi - lo, dtype=torch.float32)
                for s in range(self.n):
                    x = grads[s][i].reshape(-1)[lo:hi].float()
                    acc += x * scale if op == "premul" else x
                if op == "avg":
                    acc /= self.n
                outs[r][p.rs_out_offset : p.rs_out_offset + hi - lo] = acc.to(outs[r].dtype)
        if self.corrupt:
            outs[0][0] += 1.0


@pytest.fixture(autouse=True)
def no_cuda_sync(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)


def backend(W, corrupt=False):
    b = loopback_backend.LoopbackBackend.__new__(loopback_backend.LoopbackBackend)
    b.W, b.device, b.world = W, torch.device("cpu"), ModelWorld(W, corrupt)
    return b


def spec(coll, shapes, dt="bf16", out="fp32", op="sum", scale=1.0):
    numels = [int(torch.Size(s).numel()) for s in shapes]
    rows = [int(torch.Size(s[1:]).numel()) for s in shapes]
    return runner.CaseSpec(collectives.by_name(coll), numels, rows, shapes, to_dtype(dt), to_dtype(out), op, scale, 7)


@pytest.mark.parametrize("impl", ["tide", "nccl", "fsdp2"])
@pytest.mark.parametrize("shapes", [SHAPES, [(4 * 24,)]], ids=["model", "flat"])
@pytest.mark.parametrize("dt", ["bf16", "fp32", "fp8_e4m3"])
def test_loopback_all_gather_benches(impl, shapes, dt):
    b = backend(4)
    bench = b.bench(impl, spec("all_gather", shapes, dt))
    assert bench.check() == 0
    bench.call()  # the timed call runs as well
    if impl != "tide":
        assert "stand-in" in bench.note and ("flat copy-engine all-gather" in bench.note)
    if impl == "fsdp2":
        assert "split_with_sizes_copy" in bench.note
    bad = backend(4, corrupt=True).bench(impl, spec("all_gather", shapes, dt))
    assert bad.check() == 1  # one flipped element in one rank's output


@pytest.mark.parametrize("impl", ["tide", "nccl", "fsdp2"])
@pytest.mark.parametrize("op,scale", [("sum", 1.0), ("avg", 1.0), ("premul", 0.3)])
@pytest.mark.parametrize("out", ["fp32", "bf16"])
def test_loopback_reduce_scatter_benches(impl, op, scale, out):
    b = backend(4)
    bench = b.bench(impl, spec("reduce_scatter", SHAPES, "bf16", out, op, scale))
    assert bench.check() == 0
    bench.call()
    if impl != "tide":
        assert "SM reduction" in bench.note and out in bench.note
    bad = backend(4, corrupt=True)
    if impl == "tide":
        assert bad.bench(impl, spec("reduce_scatter", SHAPES, "bf16", out, op, scale)).check() >= 1


def test_loopback_virtual_node_benches():
    """--ranks 4 --ranks-per-node 2: the benches build multi-node layouts (R = 2, the pacing cap) and check them; the
    AG stand-ins run over the same virtual nodes and say so; the RS stand-ins are not run (no node structure)."""
    b = backend(4)
    b._topology(4, 2, 1024)
    lays = b.layouts(spec("all_gather", SHAPES), [15, 7, 8, 18], [3, 1, 4, 2])
    assert all((x.ranks_per_node, x.n_nodes, x.pace_bytes) == (2, 2, 1024) for x in lays)
    for impl in ("tide", "nccl", "fsdp2"):
        bench = b.bench(impl, spec("all_gather", SHAPES, "bf16"))
        assert bench.check() == 0
        bench.call()
        assert (impl == "tide") == ("over the same virtual nodes" not in bench.note)
    for op in ("sum", "avg"):
        bench = b.bench("tide", spec("reduce_scatter", SHAPES, "bf16", "fp32", op))
        assert bench.check() == 0
    for impl in ("nccl", "fsdp2"):
        with pytest.raises(runner.Unavailable, match="no node structure"):
            b.bench(impl, spec("reduce_scatter", SHAPES, "bf16"))


def test_loopback_stand_in_reduce_detects_a_wrong_result():
    """The stand-in's check is real: one wrong element of the SM reduction's output is counted."""
    b = backend(2)
    bench = b.bench("fsdp2", spec("reduce_scatter", [(8 * 2,)], "fp32", "fp32"))
    assert bench.check() == 0
    orig = torch.sum

    def wrong_sum(x, dim=None, out=None):
        r = orig(x, dim=dim, out=out)
        out.view(-1)[0] += 5.0
        return r

    torch.sum, saved = wrong_sum, torch.sum
    try:
        assert bench.check() == 1
    finally:
        torch.sum = saved


def test_measure_does_not_touch_the_device_after_a_timeout(monkeypatch):
    from nccl_tide.errors import TideTimeoutError

    synced, cleaned = [], []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: synced.append(1))

    class Hangs:
        def bench(self, impl, case):
            def check():
                raise TideTimeoutError("streams not done")

            return runner.Bench(lambda: None, check, cleanup=lambda: cleaned.append(1))

    extras = {}
    r = runner.measure(
        Hangs(), "tide", None, 64, 8, "float", "none", 4, runner.MeasureOpts(1, 0, 1, False, None), extras
    )
    assert not r.ok and r.note.startswith("failed: TideTimeoutError") and not synced and not cleaned


def test_measure_reports_setup_failures_as_rows():
    class Broken:
        def bench(self, impl, case):
            if impl == "nccl":
                raise runner.Unavailable("not run: because")
            raise RuntimeError("boom")

    o = runner.MeasureOpts(1, 0, 1, False, None)
    extras = {}
    r1 = runner.measure(Broken(), "nccl", None, 64, 8, "float", "none", 4, o, extras)
    r2 = runner.measure(Broken(), "tide", None, 64, 8, "float", "none", 4, o, extras)
    assert (r1.ok, r1.note, r1.oop.time_us) == (False, "not run: because", None)
    assert not r2.ok and r2.note == "not run: RuntimeError: boom" and extras["errors"][0]["impl"] == "tide"


@pytest.fixture(scope="module")
def gloo1():
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def torchrun_backend_on_cpu(dist):
    from nccl_tide.perf import torchrun_backend

    b = torchrun_backend.TorchrunBackend.__new__(torchrun_backend.TorchrunBackend)
    b.dist, b.rank, b.W, b.device, b.average = dist, 0, 1, torch.device("cpu"), 1
    b._comm, b._comm_error = None, None
    return b


@pytest.mark.parametrize("impl", ["nccl", "fsdp2"])
def test_torchrun_all_gather_benches_on_gloo(gloo1, impl):
    b = torchrun_backend_on_cpu(gloo1)
    bench = b.bench(impl, spec("all_gather", SHAPES, "bf16"))
    assert bench.check() == 0
    with pytest.raises(runner.Unavailable, match="world size 1"):
        b.bench("nccl-ce", spec("all_gather", SHAPES, "bf16"))
    with pytest.raises(runner.Unavailable, match="no reduce-scatter"):
        b.bench("nccl-ce", spec("reduce_scatter", SHAPES, "bf16"))


@pytest.mark.parametrize("impl", ["nccl", "fsdp2"])
def test_torchrun_reduce_scatter_benches_on_gloo(gloo1, impl):
    b = torchrun_backend_on_cpu(gloo1)
    try:
        bench = b.bench(impl, spec("reduce_scatter", SHAPES, "bf16", "fp32"))
        wrong = bench.check()
    except (RuntimeError, ValueError) as e:  # gloo without reduce_scatter_tensor in this torch
        pytest.skip(f"gloo reduce_scatter_tensor unavailable: {e}")
    assert wrong == 0
    assert b.reduce_wrong(3) == 3 and b.reduce_time(2.0) == 2.0


# ------------------------------------------------------------------------------------------------
# The CLI end to end on a GPU backend, with CUDA timing and profiling replaced (what the GPU run prints and writes)
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def fake_gpu_timing(monkeypatch):
    from nccl_tide.perf import gpu

    calls = []

    def time_call_us(call, iters, warmup):
        call()
        calls.append("time")
        return 50.0

    def sm_time(call, iters=3):
        call()
        calls.append("sm")
        return {"n_kernels": 1.0, "kernel_us": 7.5, "n_memcpy": 0.0, "memcpy_us": 0.0, "local_copy_us": 0.0,
                "sm_us": 7.5, "kernel_names": {"k": 1}}

    monkeypatch.setattr(gpu, "time_call_us", time_call_us)
    monkeypatch.setattr(gpu, "sm_time", sm_time)
    return calls


class CpuLoopback(loopback_backend.LoopbackBackend):
    def __init__(self, world, device=0):
        self.W, self.device, self.world = world, torch.device("cpu"), ModelWorld(world)

    def devices(self):
        return [
            {"rank": r, "group": 0, "pid": 1, "hostname": "h", "device": 0, "name": "cpu model"} for r in range(self.W)
        ]

    def close(self):
        self.closed = True


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_cli_loopback_end_to_end_on_a_model_world(coll, monkeypatch, tmp_path, capsys, fake_gpu_timing):
    import json

    from nccl_tide.perf import cli
    from test_perf_cli import parse_full

    made = []
    monkeypatch.setattr(cli, "check_gpu_backend", lambda backend: None)  # CPU torch here
    monkeypatch.setattr(loopback_backend, "make", lambda w, d, **kw: made.append(CpuLoopback(w)) or made[-1])
    js = tmp_path / "lb.json"
    rc = cli.main(
        [
            coll,
            "--backend",
            "loopback",
            "--ranks",
            "4",
            "-b",
            "4K",
            "-e",
            "16K",
            "-f",
            "4",
            "-n",
            "2",
            "-d",
            "bf16",
            "--impl",
            "all",
            "-J",
            str(js),
            "--wide",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert made and made[0].closed
    rows = parse_full(out)
    assert [r[5] for r in rows] == ["tide", "nccl", "fsdp2", "nccl-ce"] * 2
    for r in rows:
        if r[5] == "nccl-ce":
            assert r[6:14] == ("N/A",) * 8 and r[16].startswith("not run")
        else:
            assert r[9] == "0" and r[6] == "50.00" and r[14] == "7.50" and r[15] == "N/A"
            assert r[10:14] == ("N/A",) * 4  # no in-place on GPU backends
            assert (r[5] == "tide") == (r[16] is None)
    assert "# impl nccl:" in out and "#   measured as stand-in" in out
    doc = json.loads(js.read_text())
    extras = doc["extras"]
    assert extras["backend"] == "loopback" and extras["config"]["sm_time"] is True and len(doc["config"]["devices"]) == 4
    assert {"torch", "nccl_header", "nccl_runtime"} <= set(extras["versions"])
    assert extras["results"][0]["sm_time_us"] == 7.5 and doc["extras"]["detail"][0]["profile"]["kernel_us"] == 7.5
    size = doc["results"][0]["size"]
    assert doc["results"][0]["out_of_place"]["alg_bw"] == pytest.approx(size / 1e3 / 50.0)
    assert fake_gpu_timing.count("time") == 6 and fake_gpu_timing.count("sm") == 6


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_cli_loopback_virtual_nodes_on_a_model_world(coll, monkeypatch, tmp_path, capsys, fake_gpu_timing):
    """The CLI with --ranks-per-node 2 of 4 end to end on the model world: the backend gets R and the pacing cap, its
    benches run on multi-node layouts and check clean, the stand-ins without node structure are not run."""
    import json

    from nccl_tide.perf import cli
    from test_perf_cli import parse_full

    made = []

    def make(w, d, ranks_per_node=None, pace_bytes=None):
        b = CpuLoopback(w)
        b._topology(w, ranks_per_node, pace_bytes)
        made.append(b)
        return b

    monkeypatch.setattr(cli, "check_gpu_backend", lambda backend: None)  # CPU torch here
    monkeypatch.setattr(loopback_backend, "make", make)
    js = tmp_path / "vn.json"
    args = [coll, "--backend", "loopback", "--ranks", "4", "--ranks-per-node", "2", "--pace-bytes", "2K"]
    rc = cli.main(args + ["-b", "16K", "-e", "64K", "-f", "4", "-n", "1", "-d", "bf16", "--impl", "all", "-J", str(js), "--wide"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert (made[0].R, made[0].pace, made[0].nodes) == (2, 2048, 2)
    rows = parse_full(out)
    assert [r[5] for r in rows] == ["tide", "nccl", "fsdp2", "nccl-ce"] * 2
    skipped = {"nccl-ce"} | ({"nccl", "fsdp2"} if coll == "reduce_scatter" else set())
    for r in rows:
        if r[5] in skipped:
            assert r[6:14] == ("N/A",) * 8 and r[16].startswith("not run"), r
        else:
            assert r[9] == "0" and r[6] == "50.00", r
    doc = json.loads(js.read_text())
    c = doc["extras"]["config"]
    assert (c["ranks_per_node"], c["nodes"], c["pace_bytes"]) == (2, 2, 2048)


def test_cli_loopback_counts_wrong_elements(monkeypatch, capsys, fake_gpu_timing):
    from nccl_tide.perf import cli
    from test_perf_cli import parse_full

    def make(w, d, **kw):
        b = CpuLoopback(w)
        b.world = ModelWorld(w, corrupt=True)
        return b

    monkeypatch.setattr(cli, "check_gpu_backend", lambda backend: None)  # CPU torch here
    monkeypatch.setattr(loopback_backend, "make", make)
    rc = cli.main(
        [
            "all_gather",
            "--backend",
            "loopback",
            "--ranks",
            "2",
            "-b",
            "4K",
            "-e",
            "4K",
            "-n",
            "1",
            "--impl",
            "tide,nccl",
            "--wide",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 7 and "Out of bounds values : 2 FAILED" in out
    assert [r[9] for r in parse_full(out)] == ["1", "1"]


def test_cli_torchrun_end_to_end_on_gloo(gloo1, monkeypatch, tmp_path, capsys, fake_gpu_timing):
    import json

    from nccl_tide.perf import cli, torchrun_backend
    from test_perf_cli import parse_full

    class CpuTorchrun(torchrun_backend.TorchrunBackend):
        def __init__(self, average=1):
            self.dist, self.rank, self.W, self.device, self.average = gloo1, 0, 1, torch.device("cpu"), average
            self._comm, self._comm_error = None, "not run: no TIDE communicator on the CPU"

        def devices(self):
            return [{"rank": 0, "group": 0, "pid": 1, "hostname": "h", "device": 0, "name": "cpu"}]

        def barrier(self):
            pass

        def close(self):
            pass

    monkeypatch.setattr(cli, "check_gpu_backend", lambda backend: None)  # CPU torch here
    monkeypatch.setattr(torchrun_backend, "make", lambda average: CpuTorchrun(average))
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(cli, "_gpu_present", lambda: True)
    js = tmp_path / "tr.json"
    rc = cli.main(
        [
            "all_gather",
            "-b",
            "4K",
            "-e",
            "4K",
            "-n",
            "1",
            "-d",
            "bf16",
            "--impl",
            "tide,nccl,fsdp2,nccl-ce",
            "-J",
            str(js),
            "--wide",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "(backend torchrun)" in out and "WORLD_SIZE=1" in out
    rows = {r[5]: r for r in parse_full(out)}
    assert rows["nccl"][9] == "0" and rows["fsdp2"][9] == "0"
    assert rows["tide"][16] == "not run: no TIDE communicator on the CPU" and "world size 1" in rows["nccl-ce"][16]
    assert rows["nccl"][8] == "0.00"  # busbw x (n-1)/n = 0 at world size 1, as nccl-tests
    assert json.loads(js.read_text())["extras"]["config"]["nranks"] == 1


def test_cli_backend_notes_are_header_lines_and_json_notes(monkeypatch, tmp_path, capsys, fake_gpu_timing):
    """A backend's `notes` (caveats on its timings) are printed as '# ' header lines and kept in extras.notes."""
    import json

    from nccl_tide.perf import cli

    class Shared(CpuLoopback):
        notes = ["ranks share GPUs: timings are not a node's"]

    assert loopback_backend.LoopbackBackend.notes == ()  # the default: none
    monkeypatch.setattr(cli, "check_gpu_backend", lambda backend: None)  # CPU torch here
    monkeypatch.setattr(loopback_backend, "make", lambda w, d, **kw: Shared(w))
    js = tmp_path / "n.json"
    rc = cli.main(["all_gather", "--backend", "loopback", "--ranks", "2", "-b", "4K", "-e", "4K", "-n", "1",
                   "-J", str(js)])
    out = capsys.readouterr().out
    assert rc == 0, out
    header = out.split("# Using devices")[0]
    assert "# ranks share GPUs: timings are not a node's\n" in header
    assert "ranks share GPUs: timings are not a node's" in json.loads(js.read_text())["extras"]["notes"]


@pytest.mark.parametrize("rank", [0, 1])
def test_cli_torchrun_only_rank_0_prints_and_writes(gloo1, monkeypatch, tmp_path, capsys, fake_gpu_timing, rank):
    """As nccl-tests: rank 0 prints the table and writes the JSON; the other ranks measure in silence."""
    from nccl_tide.perf import cli, torchrun_backend

    class CpuTorchrun(torchrun_backend.TorchrunBackend):
        def __init__(self, average=1):
            self.dist, self.rank, self.W, self.device, self.average = gloo1, rank, 1, torch.device("cpu"), average
            self._comm, self._comm_error = None, "not run: no TIDE communicator on the CPU"

        def devices(self):
            return [{"rank": 0, "group": 0, "pid": 1, "hostname": "h", "device": 0, "name": "cpu"}]

        def barrier(self):
            pass

        def close(self):
            pass

    monkeypatch.setattr(cli, "check_gpu_backend", lambda backend: None)  # CPU torch here
    monkeypatch.setattr(torchrun_backend, "make", lambda average: CpuTorchrun(average))
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(cli, "_gpu_present", lambda: True)
    js = tmp_path / "tr.json"
    rc = cli.main(["all_gather", "-b", "4K", "-e", "4K", "-n", "1", "--impl", "nccl", "-J", str(js)])
    cap = capsys.readouterr()
    assert rc == 0 and cap.err == ""
    if rank == 0:
        assert "# Collective test concluded: all_gather_perf" in cap.out and js.exists()
    else:
        assert cap.out == "" and not js.exists()
