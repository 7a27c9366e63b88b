# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf's output edges: a -J/--plot name the write after the run would fail on is refused before the run (one
line, exit 2), a name that is neither free nor taken never spins, and NCCL_TESTS_MIN_BW takes only what
--min-busbw takes (nan would switch the gate off and put NaN, which is not JSON, in the -J file)."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from nccl_tide.perf import output
from nccl_tide.perf.cli import main as perf_main

HOST = ["--backend", "host", "--ranks", "2", "-b", "1K", "-e", "4K", "-f", "2", "-n", "1", "-w", "0"]
GLUE = str(Path(__file__).resolve().parents[2] / "pytorch_glue")


def run(capsys, *args):
    try:
        rc = perf_main(list(args))
    except SystemExit as e:  # a usage error: die() exits
        rc = e.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def perf_process(*args, cwd, timeout=120, env=None):
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([GLUE, os.environ.get("PYTHONPATH", "")]), **(env or {}))
    return subprocess.run([sys.executable, "-m", "nccl_tide.perf", *args], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=timeout)


def test_a_json_name_behind_a_file_is_refused_before_the_run(tmp_path):
    (tmp_path / "x.json").write_text("kept")
    r = perf_process("all_gather", *HOST, "-J", "x.json/", cwd=tmp_path)  # used to spin after the table
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "-J x.json/: ends with a path separator" in r.stderr
    assert (tmp_path / "x.json").read_text() == "kept"


def test_write_whole_never_spins_on_a_name_it_cannot_create(tmp_path):
    (tmp_path / "x.json").write_text("kept")
    result = []

    def write():
        try:
            result.append(output.write_whole(str(tmp_path / "x.json") + "/", b"{}", overwrite=False))
        except OSError as e:
            result.append(e)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "write_whole spins"
    assert isinstance(result[0], OSError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]  # no temporary file left


@pytest.mark.parametrize("flag,name", [("-J", "newdir/"), ("--plot", "newdir/"), ("-J", "sub/newdir/")])
def test_a_directory_name_is_refused_before_the_run(capsys, tmp_path, flag, name):
    rc, out, err = run(capsys, "all_gather", *HOST, flag, str(tmp_path) + "/" + name)
    assert rc == 2 and out == "" and "ends with a path separator" in err
    assert list(tmp_path.iterdir()) == []


def test_a_legal_long_name_is_written(capsys, tmp_path):
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    name = "r" * (limit - len(".json")) + ".json"  # the longest legal name: its temporary file must fit too
    rc, out, err = run(capsys, "all_gather", *HOST, "-J", str(tmp_path / name))
    assert rc == 0, err
    assert json.loads((tmp_path / name).read_text())["version"] == 3
    # taken now: the next free name (NAME.0) would be too long, which is said before the run
    rc, out, err = run(capsys, "all_gather", *HOST, "-J", str(tmp_path / name))
    assert rc == 2 and out == "" and f"takes {limit}" in err
    rc, out, err = run(capsys, "all_gather", *HOST, "-J", str(tmp_path / name), "--overwrite")
    assert rc == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "-1", "NaN"])
def test_min_bw_variable_takes_what_the_flag_takes(capsys, tmp_path, monkeypatch, value):
    monkeypatch.setenv("NCCL_TESTS_MIN_BW", value)
    js = tmp_path / "r.json"
    rc, _, err = run(capsys, "all_gather", *HOST, "-J", str(js))
    assert rc == 2 and f"NCCL_TESTS_MIN_BW={value!r}" in err and "finite" in err
    assert not js.exists()
    monkeypatch.setenv("NCCL_TESTS_MIN_BW", "0.001")
    rc, _, _ = run(capsys, "all_gather", *HOST, "-J", str(js))
    assert rc == 0
    doc = json.loads(js.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert doc["extras"]["min_busbw"] == 0.001


def _row(**kw):
    r = {"impl": "tide", "size": 1024, "ran": True, "out_of_place": {"bus_bw": 1.5}, "sm_time_us": None}
    r.update(kw)
    return r


@pytest.mark.parametrize("doc,words", [
    ({"results": [_row(size=10**400)]}, "results[0].size is not a size in bytes"),
    ({"results": [_row(size=2**64)]}, "results[0].size is not a size in bytes"),
    ({"results": [_row(), _row(out_of_place={"bus_bw": 1e308})]}, "results[1].out_of_place.bus_bw is not a bandwidth"),
    ({"results": [_row(out_of_place={"bus_bw": -1.0})]}, "bus_bw is not a bandwidth"),
    ({"results": [_row(sm_time_us=1e300)]}, "sm_time_us is not a time"),
    ({"versions": "x", "devices": [5], "results": [_row()]}, "'versions' at the top level"),
    ({"extras": {"versions": "x"}, "results": [_row()]}, "'extras.versions' is not an object"),
    ({"config": {"devices": [5]}, "results": [_row()]}, "'config.devices' is not a list of objects"),
    ({"config": "gpu", "results": [_row()]}, "'config' is not an object"),
])
def test_plot_refuses_figures_it_cannot_draw_and_other_programs_json(capsys, tmp_path, doc, words):
    js = tmp_path / "in.json"
    js.write_text(json.dumps(doc))
    png = tmp_path / "x.png"
    rc, out, err = run(capsys, "plot", str(js), str(png))
    assert rc == 2 and out == "" and not png.exists()
    assert err.startswith(f"tide-perf plot: error: {js} is not a tide-perf or nccl-tests JSON: ") and words in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("spelling", ["same", "dot", "link"])
def test_plot_never_writes_over_its_input(capsys, tmp_path, monkeypatch, spelling):
    monkeypatch.chdir(tmp_path)
    doc = json.dumps({"results": [_row()]})
    (tmp_path / "same.svg").write_text(doc)
    other = {"same": "same.svg", "dot": "./same.svg", "link": "alias.svg"}[spelling]
    if spelling == "link":
        os.symlink("same.svg", tmp_path / "alias.svg")
    rc, out, err = run(capsys, "plot", "same.svg", other)
    assert rc == 2 and "is the input same.svg" in err and len(err.splitlines()) == 1
    assert (tmp_path / "same.svg").read_text() == doc


class _Terminal:
    """stdout and stderr of one terminal: what a user sees, in order. The footer's write waits a little, so that a
    ticker still running would draw its line after it."""

    def __init__(self):
        self.parts, self.lock = [], threading.Lock()

    def isatty(self):
        return True

    def write(self, text):
        with self.lock:
            self.parts.append(text)
        if "concluded" in text:
            time.sleep(0.2)
        return len(text)

    def flush(self):
        pass

    def text(self):
        return "".join(self.parts)


def test_the_progress_line_never_follows_the_footer(monkeypatch):
    from nccl_tide.perf import cli
    from nccl_tide.perf.progress import Progress

    term = _Terminal()
    monkeypatch.setattr(sys, "stdout", term)
    monkeypatch.setattr(cli, "Progress", lambda: Progress(term, delay_s=0.0, interval_s=0.005))
    assert perf_main(["all_gather", *HOST, "-e", "64K"]) == 0
    text = term.text()
    tail = text[text.index("# Collective test concluded"):]
    assert "tide-perf: row" not in tail, repr(tail[-300:])
    for line in text.split("\n"):  # every table row starts on a clean line (the ticker erased, not mid-row)
        if line.lstrip("\r\x1b[K").startswith(" ") and "float" in line:
            assert "tide-perf:" not in line, repr(line)


def test_a_host_run_under_torchrun_runs_once(capsys, tmp_path, monkeypatch):
    """torchrun --nproc-per-node 2 on a machine without a GPU: the auto backend is host, which simulates every rank
    in one process; the job runs once (rank 0): one table, one -J file."""
    js = tmp_path / "r.json"
    monkeypatch.setenv("WORLD_SIZE", "2")
    outs = []
    for rank in (1, 0):  # rank 1 first: it must neither print nor take the name
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        outs.append(run(capsys, "all_gather", *HOST, "-J", str(js)))
    (rc1, out1, err1), (rc0, out0, err0) = outs
    assert rc1 == 0 and out1 == "" and err1 == ""
    assert rc0 == 0 and out0.count("# Collective test concluded") == 1
    assert "rank 0 measures and the others exit" in err0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
