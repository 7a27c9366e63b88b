# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The eager graph route's host-side logic (docs/architecture.md "Eager calls as graph replays"): which
eager calls take the token protocol (a pure function of what every rank agrees on) and when a rank captures its
graph (second call with the same binding and values), through tests/native/eager_route_test.cc; and the switch
NCCL_TIDE_EAGER_GRAPHS in the parameter registry (default 1, strict: an invalid value is an error, never silently
the default, because it picks the wire protocol)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def route_exe(repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("eager_route") / "eager_route_test"
    core = repo / "plugin" / "core"
    cmd = ["g++", "-std=c++17", "-O1", f"-I{repo / 'include'}", f"-I{core}",
           str(repo / "tests" / "native" / "eager_route_test.cc"), str(core / "eager_route.cc"), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return Path(out)


def test_decision_and_amortizer(route_exe):
    r = subprocess.run([str(route_exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "all checks passed" in r.stdout


def _describe(env_value, name="NCCL_TIDE_EAGER_GRAPHS"):
    code = (
        "import ctypes; from nccl_tide import _native as N\n"
        "lib = N.lib(); c = ctypes.c_int(); lib.tideParamCount(ctypes.byref(c))\n"
        "for i in range(c.value):\n"
        "    n = ctypes.c_char_p(); d = ctypes.c_char_p(); v = ctypes.c_char_p()\n"
        "    rc = lib.tideParamDescribe(i, ctypes.byref(n), None, ctypes.byref(d), None, ctypes.byref(v))\n"
        f"    if rc == 0 and n.value == b'{name}':\n"
        "        print('ok', d.value.decode(), v.value.decode())\n"
        f"    elif rc != 0 and '{name}' in N.last_error():\n"
        "        print('bad', rc, N.last_error())\n"
    )
    env = dict(os.environ)
    env.pop(name, None)
    if env_value is not None:
        env[name] = env_value
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.mark.parametrize("value,expected", [(None, "1"), ("1", "1"), ("0", "0")])
def test_switch_parses(native, value, expected):
    out = _describe(value)
    assert out[:3] == ["ok", "1", expected], out  # default 1, then the value in force


@pytest.mark.parametrize("value", ["yes", "2", " 1", "01x", ""])
def test_switch_rejects_other_values(native, value):
    out = _describe(value)
    assert out and out[0] == "bad", out


@pytest.mark.parametrize("value,expected", [(None, "64"), ("2", "2"), ("3", "3"), ("64", "64"), ("4096", "4096")])
def test_token_rs_chunk_limit_parses(native, value, expected):
    """NCCL_TIDE_TOKEN_RS_CHUNKS: the most chunks of a token RS (default 64), an integer from 2 to
    4096."""
    out = _describe(value, "NCCL_TIDE_TOKEN_RS_CHUNKS")
    assert out[:3] == ["ok", "64", expected], out


@pytest.mark.parametrize("value", ["1", "0", "4097", "-3", "many", ""])
def test_token_rs_chunk_limit_rejects_other_values(native, value):
    """Strict like NCCL_TIDE_EAGER_GRAPHS: it picks the wire protocol, so a value that cannot be read is an error (a
    silent default could differ from another rank's setting)."""
    out = _describe(value, "NCCL_TIDE_TOKEN_RS_CHUNKS")
    assert out and out[0] == "bad", out
