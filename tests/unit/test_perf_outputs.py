# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf's result files, signals and long runs: -J never truncates or replaces a file it should not, a file that
cannot be written is said in one line with its own exit status, `tide-perf plot` rejects malformed JSON in one
line, SIGINT/SIGTERM end with 128 + the signal, a host run beyond memory is refused up front, and a long run shows
its progress on a terminal."""

import errno
import io
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time

import pytest
from nccl_tide.perf import output
from nccl_tide.perf.cli import main as perf_main
from nccl_tide.perf.progress import Progress

HOST = ["--backend", "host", "--ranks", "4", "-b", "4K", "-e", "4K", "-n", "1"]


def run(capsys, *args):
    rc = perf_main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_existing_json_is_kept_and_the_next_name_written(capsys, tmp_path):
    js = tmp_path / "r.json"
    js.write_text("previous")
    rc, out, _ = run(capsys, "all_gather", *HOST, "-J", str(js))
    assert rc == 0 and js.read_text() == "previous"  # never replaced
    assert out.splitlines()[0] == f"# Writing JSON output to {js}.0"  # nccl-tests' suffix
    assert json.loads((tmp_path / "r.json.0").read_text())["version"] == 3
    rc, out, _ = run(capsys, "all_gather", *HOST, "-J", str(js), "--overwrite")
    assert rc == 0 and json.loads(js.read_text())["version"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.json.0"]  # no temporary file left


def test_a_name_taken_during_the_run_is_not_overwritten(tmp_path):
    path = str(tmp_path / "r.json")
    assert output.free_name(path) == path
    with open(path, "w") as f:  # another run finished first
        f.write("other run")
    assert output.write_whole(path, b"mine", overwrite=False) == path + ".0"
    assert open(path).read() == "other run" and open(path + ".0").read() == "mine"


def test_a_failed_write_keeps_the_previous_file_and_exits_74(capsys, tmp_path, monkeypatch):
    js = tmp_path / "r.json"
    js.write_text("previous")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(output.os, "fsync", full)
    rc, out, err = run(capsys, "all_gather", *HOST, "-J", str(js), "--overwrite")
    assert rc == 74  # not 1 ("wrong results"), and no traceback
    assert err.strip() == f"tide-perf: error: -J {js}: the JSON could not be written: No space left on device"
    assert "Collective test concluded" in out and js.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


@pytest.mark.parametrize("kind", ["fifo", "dangling"])
def test_paths_that_would_block_or_fail_are_refused_before_the_run(capsys, tmp_path, kind):
    path = tmp_path / "x.json"
    if kind == "fifo":
        os.mkfifo(path)  # writing the JSON would block forever after the run
    else:
        os.symlink(tmp_path / "missing" / "x.json", path)
    with pytest.raises(SystemExit) as e:
        perf_main(["all_gather", *HOST, "-J", str(path)])
    cap = capsys.readouterr()
    assert e.value.code == 2 and cap.out == ""
    assert ("not a regular file" if kind == "fifo" else "dangling symbolic link") in cap.err


@pytest.mark.parametrize("doc", ['{"results": [{}]}', '{"results": "abc"}', "null", '{"results": [1]}',
                                 '{"results": [{"size": 1, "out_of_place": {"bus_bw": "x"}}]}',
                                 "[" * 100000 + "]" * 100000])
def test_plot_rejects_malformed_json_in_one_line(capsys, tmp_path, doc):
    js = tmp_path / "bad.json"
    js.write_text(doc)
    assert perf_main(["plot", str(js), str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tide-perf plot: error: {js} is not a tide-perf or nccl-tests JSON: ")
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def _long_run(*extra):
    args = [sys.executable, "-m", "nccl_tide.perf", "all_gather", "--backend", "host", "--ranks", "8",
            "-b", "32M", "-e", "32M", "-n", "100000", "-c", "0", *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig, status, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_signal_ends_the_run_with_one_line(tmp_path, sig, status, word):
    p = _long_run("-J", str(tmp_path / "r.json"))
    deadline = time.time() + 60
    while "Collective test starting" not in (p.stdout.readline() or "") and time.time() < deadline:
        pass
    time.sleep(1.0)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == status, err
    assert err.strip() == f"tide-perf: {word}" and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no JSON, no temporary file


def _cap_address_space():
    # Should the check ever be lost, the child fails with MemoryError instead of driving this machine out of memory.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_a_host_run_beyond_memory_is_refused_up_front():
    cmd = [sys.executable, "-m", "nccl_tide.perf", "all_gather", "--backend", "host", "-b", "1M", "-e", "64G",
           "-f", "2"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, preexec_fn=_cap_address_space)
    assert p.returncode == 255 and p.stdout == "", p.stdout + p.stderr  # before the header: nothing measured
    # 8 ranks of 64 GiB: the inputs, the gathered outputs and the reference (host_peak_bytes, perf/all_gather.py)
    need = re.search(r"tide-perf all_gather --backend host needs about ([0-9.]+) GiB of host memory", p.stderr)
    assert need and float(need.group(1)) >= 640.0, p.stderr
    assert "GiB are available" in p.stderr and len(p.stderr.splitlines()) == 1
    assert time.time() - t0 < 60


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_line_on_a_terminal_only():
    tty = _Tty()
    p = Progress(tty, delay_s=0.0, interval_s=0.02)
    p.stage("row 1/1: tide, 4096 bytes")
    time.sleep(0.3)
    p.close()
    text = tty.getvalue()
    assert "tide-perf: row 1/1: tide, 4096 bytes (0 s)" in text and text.endswith("\r\033[K")  # erased at the end
    log = io.StringIO()  # a file or a pipe: nothing
    q = Progress(log, delay_s=0.0, interval_s=0.02)
    q.stage("row 1/1")
    time.sleep(0.1)
    q.close()
    assert log.getvalue() == ""
