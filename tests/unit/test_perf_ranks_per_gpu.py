# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf's several-ranks-per-GPU mode and its real-NCCL rows, on the CPU: the --ranks-per-gpu flag, the shared-GPU
caveat from the device list to the header and the JSON, NCCL's refusal explained, the nccl-dtype row, and the fsdp2
row's FSDP2 copy-in (a one-rank gloo group stands in for NCCL; the GPU runs are tests/multirank/test_perf_nccl_world.py).
"""

import json

import pytest

torch = pytest.importorskip("torch")

from nccl_tide import devices  # noqa: E402
from nccl_tide.devices import SHARED_GPU_CAVEAT  # noqa: E402
from nccl_tide.errors import InvalidUsageError  # noqa: E402
from nccl_tide.perf import cli, fsdp2_ops, impls, options, runner, torchrun_backend  # noqa: E402
from test_perf_bench_logic import SHAPES, gloo1, no_cuda_sync, spec, torchrun_backend_on_cpu  # noqa: E402,F401


def resolve(argv):
    a = options.parser().parse_args(options.join_negative_values(argv))
    options.check_flags(a)
    return options.resolve(a, argv, gpu=lambda: True)


def test_ranks_per_gpu_flag(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert resolve(["all_gather", "--backend", "torchrun", "--ranks-per-gpu", "4"]).ranks_per_gpu == 4
    assert resolve(["all_gather", "--backend", "torchrun"]).ranks_per_gpu is None


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--backend", "torchrun", "--ranks-per-gpu", "0"], "must be >= 1"),
        (["--backend", "torchrun", "--ranks-per-gpu", "-2"], "must be >= 1"),
        (["--backend", "loopback", "--ranks-per-gpu", "2"], "one GPU already"),
        (["--backend", "host", "--ranks-per-gpu", "2"], "on no GPU"),
    ],
)
def test_ranks_per_gpu_flag_errors(monkeypatch, capsys, argv, says):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit) as e:
        resolve(["all_gather", *argv])
    assert e.value.code == options.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("tide-perf: error:") and says in err and len(err.strip().splitlines()) == 1


def entry(rank, host="h", hexid="0000:1b:00", device=0):
    return {"rank": rank, "group": 0, "pid": 100 + rank, "hostname": host, "device": device, "device_hex": hexid,
            "name": "gpu"}


def test_shared_gpus_from_the_device_list():
    assert torchrun_backend.shares_gpus([entry(0), entry(1)])  # one host, one bus id
    assert not torchrun_backend.shares_gpus([entry(0, hexid="0000:1b:00"), entry(1, hexid="0000:2c:00")])
    assert not torchrun_backend.shares_gpus([entry(0, host="a"), entry(1, host="b")])  # same bus id, two machines
    # CUDA_VISIBLE_DEVICES per rank: both see device 0, on different GPUs
    assert not torchrun_backend.shares_gpus([entry(0, hexid="0000:1b:00"), entry(1, hexid="0000:3d:00")])
    # a bus id torch does not know: the CUDA index decides
    assert torchrun_backend.shares_gpus([entry(0, hexid="unknown"), entry(1, hexid="unknown")])
    assert not torchrun_backend.shares_gpus([entry(0, hexid="unknown"), entry(1, hexid="unknown", device=1)])


def cpu_torchrun(dist, devs):
    class CpuTorchrun(torchrun_backend.TorchrunBackend):
        def __init__(self, average=1):
            self.dist, self.rank, self.W, self.device, self.average = dist, 0, 1, torch.device("cpu"), average
            self._comm, self._comm_error = None, "not run: no TIDE communicator on the CPU"
            self._devices = devs
            self.notes = [SHARED_GPU_CAVEAT] if torchrun_backend.shares_gpus(devs) else []

        def barrier(self):
            pass

        def close(self):
            pass

    return CpuTorchrun


@pytest.fixture
def fake_timing(monkeypatch):
    from nccl_tide.perf import gpu

    monkeypatch.setattr(gpu, "time_call_us", lambda call, iters, warmup: (call(), 40.0)[1])
    monkeypatch.setattr(gpu, "sm_time", lambda call, iters=3: (call(), {"sm_us": 5.0})[1])


@pytest.mark.parametrize("shared", [True, False])
def test_caveat_in_header_description_and_json(gloo1, monkeypatch, tmp_path, capsys, fake_timing, shared):
    devs = [entry(0), entry(1)] if shared else [entry(0)]
    made = []
    backend_class = cpu_torchrun(gloo1, devs)

    def make(average):
        made.append(dict(env=__import__("os").environ.get(devices.RANKS_PER_GPU_ENV)))
        return backend_class(average)

    monkeypatch.setattr(cli, "check_gpu_backend", lambda backend: None)
    monkeypatch.setattr(torchrun_backend, "make", make)
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv(devices.RANKS_PER_GPU_ENV, raising=False)
    js = tmp_path / "c.json"
    argv = ["all_gather", "--backend", "torchrun", "-b", "4K", "-e", "4K", "-n", "1", "--impl", "nccl,fsdp2", "-J",
            str(js), "--wide"]
    rc = cli.main(argv + (["--ranks-per-gpu", "2"] if shared else []))
    out = capsys.readouterr().out
    assert rc == 0, out
    header = out.split("# Using devices")[0]
    doc = json.loads(js.read_text())
    # the flag reaches the rank -> GPU mapping as NCCL_TIDE_RANKS_PER_GPU, and the JSON's env records it
    assert made == [{"env": "2" if shared else None}]
    assert ("NCCL_TIDE_RANKS_PER_GPU=2" in doc["env"]) == shared
    assert (f"# {SHARED_GPU_CAVEAT}\n" in header) == shared
    assert (SHARED_GPU_CAVEAT in doc["extras"]["notes"]) == shared
    assert ("1 GPU(s) shared by 2 ranks" in header) == shared and ("one GPU each" in header) != shared
    assert doc["config"]["devices"][0]["device_hex"] == "0000:1b:00"
    assert "stand-in" not in out


def test_nccl_refusal_is_explained(monkeypatch):
    import torch.distributed as dist

    def refuse(*a, **k):
        raise RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1\ninvalid usage, NCCL version 2.28.9\nDuplicate GPU "
                           "detected : rank 1 and rank 0 both on CUDA device 1b000")

    monkeypatch.setattr(devices, "from_environment", lambda k=None: (0, True))
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", refuse)
    with pytest.raises(InvalidUsageError) as e:
        devices.init_nccl_process_group()
    assert e.value.detail.startswith("NCCL refused ranks that share a GPU on one NCCL host (NCCL error in:")
    assert "NCCL_HOSTID" in e.value.detail and "NCCL_MULTI_RANK_GPU_ENABLE" in e.value.detail

    # tide-perf ends such a run with one line and exit status 2
    monkeypatch.setattr(torchrun_backend, "TorchrunBackend", lambda average: devices.init_nccl_process_group())
    with pytest.raises(SystemExit) as ex:
        torchrun_backend.make(1)
    assert ex.value.code == options.EXIT_USAGE


def test_other_init_failures_when_sharing_get_the_hint():
    e = RuntimeError("DistBackendError: NCCL error: unhandled system error\nmore")
    assert devices.explain_nccl_init_error(e) is None  # ranks on their own GPUs: NCCL's error as it is
    msg = devices.explain_nccl_init_error(e, shared=True)
    assert "unhandled system error" in msg and "NCCL_MULTI_RANK_GPU_ENABLE" in msg and "more" not in msg


def test_nccl_dtype_is_a_named_reduce_scatter_row():
    assert "nccl-dtype" not in impls.parse_impls("all")
    assert impls.parse_impls("tide,nccl-dtype") == ["tide", "nccl-dtype"]
    assert impls.static_reason("torchrun", "nccl-dtype", "reduce_scatter") is None
    assert "reduce-scatter row" in impls.static_reason("torchrun", "nccl-dtype", "all_gather")
    assert "torchrun" in impls.static_reason("loopback", "nccl-dtype", "reduce_scatter")
    assert impls.static_reason("host", "nccl-dtype", "reduce_scatter").startswith("not run: host backend")
    assert impls.impl_table("torchrun", ["nccl", "nccl-dtype"], "reduce_scatter")["nccl"]["measured_as"] is None


def test_torchrun_nccl_dtype_row_on_gloo(gloo1):
    b = torchrun_backend_on_cpu(gloo1)
    try:
        bench = b.bench("nccl-dtype", spec("reduce_scatter", SHAPES, "bf16", "fp32"))
        wrong = bench.check()
    except (RuntimeError, ValueError) as e:  # gloo without a bf16 reduce_scatter_tensor in this torch
        pytest.skip(f"gloo bf16 reduce_scatter unavailable: {e}")
    assert wrong == 0 and bench.note.startswith("reduce type bf16;")
    with pytest.raises(runner.Unavailable, match="already reduces"):
        b.bench("nccl-dtype", spec("reduce_scatter", SHAPES, "fp32", "fp32"))
    with pytest.raises(runner.Unavailable, match="reduce-scatter row"):
        b.bench("nccl-dtype", spec("all_gather", SHAPES, "bf16"))


def test_fsdp2_all_gather_row_uses_fsdp2_copy_in(gloo1, monkeypatch):
    b = torchrun_backend_on_cpu(gloo1)
    bench = b.bench("fsdp2", spec("all_gather", SHAPES, "bf16"))
    assert bench.check() == 0
    assert "all_gather_copy_in" in bench.note and "split_with_sizes_copy" in bench.note
    name, copy_in = fsdp2_ops.all_gather_copy_in_impl()

    def corrupt(shards, out, sizes, n, rank):  # one element of the copied-in block wrong: the check must see it
        block = copy_in(shards, out, sizes, n, rank)
        block[:1].neg_()  # the sign bit flipped: a different bit pattern whatever the value
        return block

    monkeypatch.setattr(fsdp2_ops, "all_gather_copy_in_impl", lambda: (name, corrupt))
    assert b.bench("fsdp2", spec("all_gather", SHAPES, "bf16")).check() == 1
    monkeypatch.setattr(fsdp2_ops, "all_gather_copy_in_impl", lambda: None)  # a torch without the op
    bench = b.bench("fsdp2", spec("all_gather", SHAPES, "fp32"))
    assert bench.check() == 0 and "no torch.ops.fsdp.all_gather_copy_in" in bench.note
