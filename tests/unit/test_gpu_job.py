# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""ci/gpu.sh's scheduling, on the CPU: its `tests` part over small stand-in test files (each sleeps, then passes),
with a stand-in library (the job only checks that the file exists) and a stand-in NCCL build (the `nccl` part in the
background). Checked from the job's own steps.tsv, summary.txt and gpu_durations.tsv: every file runs once, on
concurrent workers; a file that needs the second NCCL starts only after that build ended; the deadline skips what
it leaves no time for."""

import os
import shutil
import subprocess

import pytest

SLEEPING_TEST = "import time\n\n\ndef test_sleeps():\n    time.sleep({seconds})\n"


def gpu_job(repo, tmp_path, files, *parts, **env):
    """Runs `bash ci/gpu.sh PARTS` over the test files `files` ({name: source}); returns (exit status, stdout,
    {step: (result, passed, seconds, start second)}, $OUT)."""
    lib = tmp_path / "build"
    lib.mkdir()
    (lib / "libnccl-tide.so").touch()
    tests = tmp_path / "stand_in"
    tests.mkdir()
    for name, text in files.items():
        (tests / name).write_text(text)
    out = tmp_path / "out"
    run_env = dict(os.environ, OUT=str(out), TIDE_GPU_BUILD=str(lib),
                   TIDE_GPU_TESTS=" ".join(str(tests / n) for n in files), **env)
    p = subprocess.run(["bash", str(repo / "ci" / "gpu.sh"), *parts], capture_output=True, text=True, env=run_env,
                       timeout=300)
    steps = {}
    for line in (out / "steps.tsv").read_text().splitlines():
        name, result, passed, _failed, _skipped, seconds, at = line.split("\t")
        assert name not in steps, f"{name} ran twice:\n{p.stdout}"
        steps[name] = (result, passed, int(seconds), int(at))
    return p.returncode, p.stdout, steps, out


def test_workers_run_each_file_once_concurrently_and_wait_for_the_nccl_build(repo, tmp_path):
    nccl_build = tmp_path / "nccl_build.sh"
    nccl_build.write_text("sleep 4\n")
    files = {
        # first in the queue's order (every stand-in counts the default seconds; ties go by name), but it waits
        "test_a_gated.py": "# needs_multi_rank_nccl\n" + SLEEPING_TEST.format(seconds=0),
        "test_b.py": SLEEPING_TEST.format(seconds=2),
        "test_c.py": SLEEPING_TEST.format(seconds=2),
    }
    rc, stdout, steps, out = gpu_job(repo, tmp_path, files, "nccl", "tests", TIDE_GPU_STREAMS="2",
                                     TIDE_NCCL_BUILD=str(nccl_build))
    assert rc == 0, stdout
    names = [f"stand_in-{n[:-3]}" for n in files]
    assert set(steps) == {"nccl", *names}, steps
    assert all(steps[n][:2] == ("ok", "1") for n in names), steps
    gated, b, c = (steps[n] for n in names)
    # b and c ran at the same time, on the two workers
    assert b[3] < c[3] + c[2] and c[3] < b[3] + b[2], steps
    nccl = steps["nccl"]
    assert gated[3] >= nccl[3] + nccl[2], steps
    summary = (out / "summary.txt").read_text()
    for n in names:
        assert any(line.split()[:3] == [n, "ok", "1"] for line in summary.splitlines()), summary
    # the repository's table with this run's queued steps added
    table = dict(line.split("\t") for line in (out / "gpu_durations.tsv").read_text().splitlines()
                 if not line.startswith("#"))
    assert "multirank-test_frameworks" in table and "nccl" not in table, table
    assert all(int(table[n]) == steps[n][2] for n in names), (table, steps)


def test_deadline_skips_every_step_it_leaves_no_time_for(repo, tmp_path):
    files = {"test_x.py": SLEEPING_TEST.format(seconds=0), "test_y.py": SLEEPING_TEST.format(seconds=0)}
    rc, stdout, steps, out = gpu_job(repo, tmp_path, files, "tests", TIDE_GPU_DEADLINE_S="1")
    assert rc == 1, stdout
    assert set(steps) == {"stand_in-test_x", "stand_in-test_y"}, steps
    assert all(s[0] == "SKIPPED (deadline)" for s in steps.values()), steps
    assert "ci/gpu.sh: exit 1" in stdout


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_finds_nothing(repo):
    p = subprocess.run(["shellcheck", "ci/gpu.sh"], cwd=repo, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout
