# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The command-line entry points end quietly where a user expects them to: a reader that left the pipe (`| head`)
ends the command with 128 + SIGPIPE and no traceback, and `python -m nccl_tide` reports a torch that is installed but
fails to import with something other than ImportError (a missing CUDA runtime raises OSError) as one line."""

import os
import signal
import subprocess
import sys

import pytest

def _env(*front):
    # The nccl_tide under test is whichever this interpreter imports (the installed package, or PYTHONPATH's).
    return dict(os.environ, PYTHONPATH=os.pathsep.join([*front, os.environ.get("PYTHONPATH", "")]))


def _closed_pipe_run(argv):
    """Runs argv with its stdout a pipe whose reader has already gone: its first write meets the closed pipe."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(argv, stdout=w, stderr=subprocess.PIPE, text=True, env=_env(), timeout=120)
    finally:
        os.close(w)
    return p


@pytest.mark.parametrize("argv", [
    ["-m", "nccl_tide"],
    ["-m", "nccl_tide.perf", "all_gather", "--backend", "host", "--ranks", "2", "-b", "1K", "-e", "4K", "-n", "1"],
])
def test_a_closed_pipe_ends_quietly(argv):
    p = _closed_pipe_run([sys.executable, *argv])
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
    assert p.returncode == 128 + signal.SIGPIPE, p.stderr


def test_head_reads_the_first_lines_and_the_command_ends_quietly():
    cmd = (f"{sys.executable} -m nccl_tide.perf all_gather --backend host --ranks 2 -b 1K -e 1M -f 2 -n 1 "
           "| head -2 >/dev/null; echo ${PIPESTATUS[0]}")
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=_env(), timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.stdout.strip() in ("0", str(128 + signal.SIGPIPE))  # 0 if it wrote everything before head left


def test_a_torch_that_fails_to_import_is_reported(tmp_path):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise OSError('libcudart.so.12: cannot open shared object file: No such file or directory')\n")
    p = subprocess.run([sys.executable, "-m", "nccl_tide"], capture_output=True, text=True, env=_env(str(tmp_path)),
                       timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 0
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("torch:")]
    assert line and "OSError: libcudart.so.12" in line[0] and "cannot be imported" in line[0]
