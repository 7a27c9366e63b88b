# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The examples of examples/README.md, run as a user runs them.

* examples/fsdp2_train.py on CPU: under torchrun with 2 gloo ranks, with TIDE (the reference executor) and without;
  the losses must be equal bit for bit (docs/fsdp.md: at 2 ranks the reference executor's fp32 sums are exact in
  either order and the all-gather is a byte copy), and TIDE must have run every all-gather and reduce-scatter. Then
  without a launcher at world size 1, the same comparison.
* examples/c/host_all_gather.c: built with its Makefile against the header and library of the nccl_tide that this
  Python imports (nccl_tide.include_dir(), nccl_tide.library_path(): NCCL_TIDE_LIBRARY_PATH or the installed copy),
  run, its output and exit status checked, and its failure path (a TIDE error: exit status 1).
"""

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TRAIN = EXAMPLES / "fsdp2_train.py"
STEPS, LAYERS = 4, 2


def _train(tmp_path, nproc, *flags):
    """The FSDP2 example's stdout: under torchrun with nproc ranks, or plain `python` for nproc None."""
    pytest.importorskip("torch")
    args = [str(TRAIN), "--device", "cpu", "--steps", str(STEPS), "--layers", str(LAYERS), *flags]
    if nproc is None:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # 2 ranks on 2 cores
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-6000:]
    return r.stdout


def _losses(out: str) -> list:
    found = re.findall(r"^step (\d+) loss (\S+)$", out, flags=re.M)
    assert [int(s) for s, _ in found] == list(range(STEPS)), out
    return [float(x) for _, x in found]  # repr of a float: float() gives the same bits back


def _check_pair(tide: str, stock: str, world: int) -> None:
    assert tide.startswith(f"fsdp2_train: world size {world}, cpu, gloo, TIDE (reference executor)\n"), tide
    assert stock.startswith(f"fsdp2_train: world size {world}, cpu, gloo, stock FSDP2\n"), stock
    with_tide, without = _losses(tide), _losses(stock)
    assert with_tide == without, (with_tide, without)
    assert all(math.isfinite(x) for x in with_tide) and with_tide[-1] < with_tide[0], with_tide  # it trains
    # Every collective through TIDE: per step one all-gather of the root group and two of each block (forward and
    # backward), one reduce-scatter per group; none fell back to stock FSDP2.
    groups = LAYERS + 1
    summary = (f"TIDE: {groups} parameter groups on TIDE, 0 stock; {STEPS * (1 + 2 * LAYERS)} all-gathers, "
               f"{STEPS * groups} reduce-scatters, 0 fallbacks")
    assert summary in tide.splitlines(), tide
    assert "TIDE:" not in stock


def test_fsdp2_example_with_tide_equals_stock_on_two_ranks(tmp_path, native):
    _check_pair(_train(tmp_path, 2, "--tide"), _train(tmp_path, 2, "--no-tide"), world=2)


def test_fsdp2_example_runs_without_a_launcher(tmp_path, native):
    _check_pair(_train(tmp_path, None), _train(tmp_path, None, "--no-tide"), world=1)


@pytest.fixture(scope="module")
def c_example(tmp_path_factory, native) -> Path:
    """examples/c/host_all_gather, built once with examples/c/Makefile into a temporary folder."""
    if shutil.which("cc") is None or shutil.which("make") is None:
        pytest.skip("building examples/c needs a C compiler (cc) and make on PATH")
    program = tmp_path_factory.mktemp("c_example") / "host_all_gather"
    cmd = ["make", "-C", str(EXAMPLES / "c"), f"PYTHON={sys.executable}", f"OUT={program}",
           "CFLAGS=-std=c11 -O2 -Wall -Wextra -Werror"]  # warnings fail here: users build it with their compilers
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return program


def test_c_example_checks_every_element(c_example, native):
    program = c_example
    # It is linked against the library nccl_tide uses, and finds it without LD_LIBRARY_PATH (RPATH).
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    ldd = subprocess.run(["ldd", str(program)], capture_output=True, text=True, env=env).stdout
    assert f"=> {native.library_path()} " in ldd, ldd
    r = subprocess.run([str(program)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    # Expected, computed here: W = 8 ranks each receive every rank's padded shard (ceil(rows / W) rows) of the
    # three parameters: [37 x 26] and [45 x 26] bf16, [26] fp32.
    world, shapes = 8, [(37, 26), (26, 1), (45, 26)]
    elements = world * world * sum(math.ceil(rows / world) * row for rows, row in shapes)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("layout: 3 parameters, 8 ranks in 2 nodes of 4; "), lines
    assert lines[1:] == [f"all-gather: {elements} elements checked on 8 ranks, 0 wrong", "OK"], lines


def test_c_example_fails_with_status_1_on_a_tide_error(c_example):
    program = c_example
    # tideLayoutCreate reads NCCL_TIDE_RS_CHUNK_BYTES (the config leaves it 0): a bad value makes it fail.
    r = subprocess.run([str(program)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, NCCL_TIDE_RS_CHUNK_BYTES="banana"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "tideLayoutCreate(&desc, &config, &layout) failed: tideInvalidArgument" in r.stderr, r.stderr
    assert "NCCL_TIDE_RS_CHUNK_BYTES" in r.stderr and "OK" not in r.stdout


@pytest.mark.parametrize("flags,words", [
    (["--steps", "-3"], "argument --steps: -3 is not a count >= 1"),
    (["--steps", "0"], "argument --steps: 0 is not a count >= 1"),
    (["--layers", "-1"], "argument --layers: -1 is not a count >= 1"),
    (["--device", "cuda"], "--device cuda: "),
])
def test_train_example_refuses_arguments_it_cannot_honour(flags, words):
    torch = pytest.importorskip("torch")
    if flags[0] == "--device" and torch.cuda.is_available():
        pytest.skip("a GPU is there: --device cuda is honoured")
    r = subprocess.run([sys.executable, str(TRAIN), "--device", "cpu", *flags], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and words in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
