# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""TIDE's log lines read like NCCL's and obey NCCL_DEBUG / NCCL_DEBUG_SUBSYS / NCCL_DEBUG_FILE (docs/env.md, Logging),
with the NCCL_TIDE_DEBUG* overrides; the Python glue's status lines go through `logging` under nccl_tide.*."""

import os
import re
import socket
import subprocess
import sys

import pytest

# host:pid:tid [dev] NCCL TIDE LEVEL Component: message (dev is "-" without a CUDA device).
LINE = re.compile(r"^[^:\s]+:\d+:\d+ \[(-|\d+)\] NCCL TIDE (WARN|INFO|TRACE) ([A-Za-z_.]+): \S")

# A rejected layout (an error the caller hears about), then a valid one (a TRACE line from Layout, INFO lines from
# Params for the variables set below).
PROG = r"""
import nccl_tide as t
try:
    t.Layout([0], "fp32", 2)
except t.InvalidArgumentError:
    print("REJECTED")
t.Layout([4096, 4096], "fp32", 2).close()
"""


def run(native, extra, prog=PROG, args=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(NCCL_TIDE_LIBRARY_PATH=native.library_path(), NCCL_TIDE_RS_CHUNK_BYTES="64K")
    env.update(extra)
    p = subprocess.run([sys.executable, "-c", prog, *args], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def tide_lines(text):
    return [x for x in text.splitlines() if " NCCL TIDE " in x]


def test_default_is_silent_for_errors_the_caller_gets(native):
    p = run(native, {})
    assert "REJECTED" in p.stdout  # the error reached the caller, with its message
    assert tide_lines(p.stderr) == [], p.stderr


def test_default_still_prints_faults_nobody_is_told_about(native):
    # An invalid value of a parameter is replaced by its default: no call fails, so the WARN is printed anyway.
    p = run(native, {"NCCL_TIDE_NVLS": "yes"})
    lines = tide_lines(p.stderr)
    assert len(lines) == 1 and LINE.match(lines[0]), p.stderr
    assert "WARN Params: NCCL_TIDE_NVLS='yes' is not valid" in lines[0]


def test_an_unknown_nccl_tide_variable_is_reported_once(native):
    # A name nobody reads (a removed switch, a typo) gets one WARN by default; the names the Python package and the
    # benchmarks read (NCCL_TIDE_LIBRARY_PATH is set by run(), NCCL_TIDE_FSDP and NCCL_TIDE_BENCH_LIBRARY_PATH here)
    # and the registry's do not.
    p = run(native, {"NCCL_TIDE_FENCE_ONCE": "1", "NCCL_TIDE_AG_BACTH": "0", "NCCL_TIDE_FSDP": "1",
                     "NCCL_TIDE_NVLS": "0", "NCCL_TIDE_BENCH_LIBRARY_PATH": "/nonexistent.so"})
    lines = tide_lines(p.stderr)
    assert len(lines) == 2 and all(LINE.match(x) for x in lines), p.stderr
    for name in ("NCCL_TIDE_FENCE_ONCE", "NCCL_TIDE_AG_BACTH"):
        assert sum(f"WARN Params: {name} is not a TIDE parameter and is ignored" in x for x in lines) == 1, p.stderr


def test_nccl_debug_warn_prints_returned_errors_in_nccls_shape(native):
    p = run(native, {"NCCL_DEBUG": "WARN"})
    lines = tide_lines(p.stderr)
    assert len(lines) == 1, p.stderr
    m = LINE.match(lines[0])
    assert m and m.group(2) == "WARN" and m.group(3) == "Layout", lines[0]
    host, pid = lines[0].split(":")[:2]
    assert host == socket.gethostname().split(".")[0] and int(pid) > 0
    assert "numels[0] is 0" in lines[0]


def test_nccl_debug_info_uses_nccls_default_subsystems(native):
    # NCCL's default mask is INIT,BOOTSTRAP,ENV: Params (ENV) lines show, and no TRACE at INFO.
    p = run(native, {"NCCL_DEBUG": "INFO"})
    lines = tide_lines(p.stderr)
    assert all(LINE.match(x) for x in lines), p.stderr
    assert any("INFO Params: NCCL_TIDE_RS_CHUNK_BYTES=65536 (from the environment)" in x for x in lines), p.stderr
    assert not any(" TRACE " in x for x in lines)


@pytest.mark.parametrize(
    "extra, params_shown",
    [
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL"}, False),  # Params maps to ENV only
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ENV"}, True),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^ENV"}, False),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL", "NCCL_TIDE_DEBUG_SUBSYS": "params"}, True),  # override
        ({"NCCL_TIDE_DEBUG": "INFO", "NCCL_TIDE_DEBUG_SUBSYS": "^Params"}, False),
        ({"NCCL_TIDE_DEBUG": "INFO"}, True),  # TIDE's own level: every component
    ],
)
def test_subsystem_masks(native, extra, params_shown):
    p = run(native, extra)
    lines = tide_lines(p.stderr)
    assert any("INFO Params:" in x for x in lines) == params_shown, p.stderr
    assert any("WARN Layout:" in x for x in lines), p.stderr  # WARN lines are never masked


def test_tide_debug_overrides_nccl_debug(native):
    assert tide_lines(run(native, {"NCCL_DEBUG": "INFO", "NCCL_TIDE_DEBUG": "NONE"}).stderr) == []
    p = run(native, {"NCCL_DEBUG": "WARN", "NCCL_TIDE_DEBUG": "TRACE", "NCCL_TIDE_DEBUG_SUBSYS": "Layout"})
    lines = tide_lines(p.stderr)
    assert any("TRACE Layout: layout: 2 params" in x for x in lines), p.stderr
    assert not any("INFO Params:" in x for x in lines)


def test_unknown_component_is_reported(native):
    p = run(native, {"NCCL_TIDE_DEBUG": "INFO", "NCCL_TIDE_DEBUG_SUBSYS": "Layout,Bogus"})
    assert any("NCCL_TIDE_DEBUG_SUBSYS: unknown component 'Bogus' ignored" in x for x in tide_lines(p.stderr))


def test_nccl_debug_file_gets_a_tide_sibling(native, tmp_path):
    pattern = str(tmp_path / "nccl.%h.%p.log")
    p = run(native, {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": pattern})
    assert tide_lines(p.stderr) == [], p.stderr
    files = list(tmp_path.iterdir())
    assert len(files) == 1, files
    name = files[0].name
    host = socket.gethostname().split(".")[0]
    assert re.fullmatch(rf"nccl\.{re.escape(host)}\.\d+\.log\.tide", name), name
    lines = tide_lines(files[0].read_text())
    assert len(lines) == 1 and "WARN Layout:" in lines[0]
    pid = int(name.split(".")[-3])
    assert lines[0].split(":")[1] == str(pid)


def test_tide_debug_file_overrides(native, tmp_path):
    own = tmp_path / "tide-%p.txt"
    extra = {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": str(tmp_path / "n.log"), "NCCL_TIDE_DEBUG_FILE": str(own)}
    p = run(native, extra)
    assert tide_lines(p.stderr) == []
    files = [f.name for f in tmp_path.iterdir()]
    assert len(files) == 1 and re.fullmatch(r"tide-\d+\.txt", files[0]), files


def test_unwritable_debug_file_falls_back_to_stderr(native, tmp_path):
    p = run(native, {"NCCL_DEBUG": "WARN", "NCCL_TIDE_DEBUG_FILE": str(tmp_path / "missing" / "x.log")})
    lines = tide_lines(p.stderr)
    assert any("cannot open the log file" in x for x in lines), p.stderr
    assert any("WARN Layout:" in x for x in lines), p.stderr


PY_PROG = r"""
import nccl_tide
from nccl_tide._log import get_logger
get_logger("comm").info("status line")
get_logger("comm").warning("a fault")
"""


@pytest.mark.parametrize(
    "extra, info_shown, warn_shown",
    [({}, False, True), ({"NCCL_DEBUG": "INFO"}, True, True), ({"NCCL_TIDE_DEBUG": "NONE"}, False, False)],
)
def test_python_glue_logs_under_nccl_tide(native, extra, info_shown, warn_shown):
    p = run(native, extra, prog=PY_PROG)
    assert ("status line" in p.stderr) == info_shown, p.stderr
    assert ("a fault" in p.stderr) == warn_shown, p.stderr
    if info_shown:
        line = [x for x in p.stderr.splitlines() if "status line" in x][0]
        assert LINE.match(line) and " INFO nccl_tide.comm: status line" in line, line


def test_tide_perf_probes_log_no_warn(native):
    # tide-perf calls the in-place reduce-scatter only in TIDE's in-place form instead of probing it with a call the
    # library refuses (a WARN line "overlapping buffers" under NCCL_DEBUG=WARN).
    prog = "import sys; from nccl_tide.perf.cli import main; sys.exit(main(sys.argv[1:]))"
    for coll in ("all_gather", "reduce_scatter"):
        p = run(native, {"NCCL_DEBUG": "WARN"}, prog=prog,
                args=(coll, "--backend", "host", "--ranks", "4", "-b", "4K", "-e", "16K", "-f", "2", "-c", "1"))
        assert tide_lines(p.stderr) == [] and "WARN" not in p.stdout + p.stderr, p.stdout + p.stderr


# The glue's lines follow the library's rule as component "Python" (NCCL subsystem INIT, as Layout): a Python TRACE
# line and the library's Layout TRACE line are shown together or not at all, whatever the variables say.
BOTH_PROG = r"""
from nccl_tide._log import get_logger
get_logger("probe").info("python info")
get_logger("probe").debug("python trace")
import nccl_tide as t
t.Layout([4096, 4096], "fp32", 2).close()
"""


@pytest.mark.parametrize(
    "extra, shown",
    [
        ({"NCCL_DEBUG": "TRACE"}, True),  # NCCL's default INIT,BOOTSTRAP,ENV
        ({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "COLL"}, False),
        ({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "^init"}, False),
        ({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "ENV,INIT"}, True),
        ({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "^COLL"}, True),
        ({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "ALL"}, True),
        ({"NCCL_TIDE_DEBUG": "TRACE"}, True),  # TIDE's own level: every component
        ({"NCCL_TIDE_DEBUG": "TRACE", "NCCL_TIDE_DEBUG_SUBSYS": "python,Layout"}, True),
        ({"NCCL_TIDE_DEBUG": "TRACE", "NCCL_TIDE_DEBUG_SUBSYS": "^Python,Layout"}, False),
        ({"NCCL_TIDE_DEBUG": "TRACE", "NCCL_TIDE_DEBUG_SUBSYS": "Params"}, False),
        ({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "COLL", "NCCL_TIDE_DEBUG_SUBSYS": "Layout,Python"}, True),
        ({"NCCL_DEBUG": "TRACE", "NCCL_TIDE_DEBUG_SUBSYS": "NCCL", "NCCL_DEBUG_SUBSYS": "P2P"}, False),  # follow
        ({"NCCL_DEBUG": "TRACE", "NCCL_TIDE_DEBUG": "WARN"}, False),  # TIDE's level wins
    ],
)
def test_python_and_library_apply_one_component_rule(native, extra, shown):
    p = run(native, extra, prog=BOTH_PROG)
    lines = tide_lines(p.stderr)
    library = any("TRACE Layout: layout: 2 params" in x for x in lines)
    python = [x for x in lines if " nccl_tide.probe: " in x]
    assert library == shown, p.stderr
    assert (" TRACE nccl_tide.probe: python trace" in "\n".join(python)) == shown, p.stderr
    assert (" INFO nccl_tide.probe: python info" in "\n".join(python)) == shown, p.stderr
    assert all(LINE.match(x) for x in lines), p.stderr
    assert not any("unknown component" in x for x in lines), p.stderr  # "Python" is a component of the library's


def test_python_lines_go_to_the_librarys_file(native, tmp_path):
    # NCCL_DEBUG_FILE's .tide sibling holds both sides' lines (same %h/%p expansion); Python writes first, so a library
    # that truncated the file on opening it would lose the Python line.
    pattern = str(tmp_path / "nccl.%h.%p.log")
    p = run(native, {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": pattern}, prog=BOTH_PROG)
    assert tide_lines(p.stderr) == [], p.stderr
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].name.endswith(".log.tide"), files
    lines = tide_lines(files[0].read_text())
    assert all(LINE.match(x) for x in lines), lines
    assert " INFO nccl_tide.probe: python info" in lines[0], lines
    assert any(" INFO Params: NCCL_TIDE_RS_CHUNK_BYTES=65536" in x for x in lines), lines
    assert not any("python trace" in x for x in lines)  # INFO, not TRACE
    assert len({x.split(":")[1] for x in lines}) == 1  # one pid, the one in the file name
    assert files[0].name.split(".")[-3] == lines[0].split(":")[1]


def test_the_log_file_is_appended_to(native, tmp_path):
    # Both sides append: lines already in the file (another rank, an earlier run) stay, and a Python WARNING reaches
    # the file at the default level, like the library's faults.
    path = tmp_path / "tide.log"
    path.write_text("earlier line\n")
    prog = PY_PROG + "import nccl_tide as t\ntry:\n    t.Layout([0], 'fp32', 2)\nexcept t.InvalidArgumentError:\n    pass\n"
    p = run(native, {"NCCL_DEBUG": "WARN", "NCCL_TIDE_DEBUG_FILE": str(path)}, prog=prog)
    assert tide_lines(p.stderr) == [] and "a fault" not in p.stderr, p.stderr
    text = path.read_text().splitlines()
    assert text[0] == "earlier line", text
    assert " WARN nccl_tide.comm: a fault" in text[1], text
    assert any(" WARN Layout: " in x for x in text[2:]), text
    assert not any("status line" in x for x in text)
