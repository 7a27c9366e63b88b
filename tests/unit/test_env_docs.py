# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""docs/env.md's table equals what the library's parameter registry describes."""

import ctypes
import os
import re
import subprocess
import sys

from nccl_tide import _native as N


def describe_all():
    lib = N.lib()
    count = ctypes.c_int(-1)
    assert lib.tideParamCount(ctypes.byref(count)) == 0
    rows = []
    for i in range(count.value):
        f = [ctypes.c_char_p() for _ in range(5)]
        assert lib.tideParamDescribe(i, *[ctypes.byref(x) for x in f]) == 0, N.last_error()
        rows.append(tuple(x.value.decode() for x in f))
    return rows


def doc_rows(repo):
    rows = []
    for line in (repo / "docs" / "env.md").read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells and cells[0].startswith("NCCL_TIDE_"):
            rows.append(tuple(cells))
    return rows


def test_env_md_matches_registry(native, repo):
    described = describe_all()
    assert len(described) >= 3 and all(r[0].startswith("NCCL_TIDE_") for r in described)
    docs = doc_rows(repo)
    # name | type | default | description, in registry order.
    assert [d[:4] for d in docs] == [(n, t, dflt, doc) for n, t, dflt, doc, _ in described]


def test_describe_bounds_and_nulls(native):
    lib = N.lib()
    count = ctypes.c_int()
    lib.tideParamCount(ctypes.byref(count))
    assert lib.tideParamDescribe(count.value, None, None, None, None, None) == N.tideInvalidArgument
    assert lib.tideParamDescribe(-1, None, None, None, None, None) == N.tideInvalidArgument
    assert lib.tideParamDescribe(0, None, None, None, None, None) == N.tideSuccess
    assert lib.tideParamCount(None) == N.tideInvalidArgument


def test_unparsable_env_value_is_an_error():
    code = (
        "import ctypes; from nccl_tide import _native as N\n"
        "lib = N.lib(); c = ctypes.c_int(); lib.tideParamCount(ctypes.byref(c))\n"
        "names = []\n"
        "for i in range(c.value):\n"
        "    n = ctypes.c_char_p(); v = ctypes.c_char_p()\n"
        "    rc = lib.tideParamDescribe(i, ctypes.byref(n), None, None, None, ctypes.byref(v))\n"
        "    names.append((n.value.decode() if not rc else str(i), rc, N.last_error() if rc else v.value.decode()))\n"
        "print(repr(names))\n"
    )
    env = dict(os.environ, NCCL_TIDE_PACE_BYTES="12 MiB", NCCL_TIDE_RS_CHUNK_BYTES="64M")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = {n: (rc, text) for n, rc, text in eval(out.stdout)}
    failed = [(rc, text) for rc, text in got.values() if rc]
    assert len(failed) == 1, got  # only the unparsable variable fails, naming itself
    assert failed[0][0] == N.tideInvalidArgument and "NCCL_TIDE_PACE_BYTES" in failed[0][1]
    assert got["NCCL_TIDE_RS_CHUNK_BYTES"] == (0, str(64 << 20))
    assert re.fullmatch(r"\d+", got["NCCL_TIDE_RS_CHUNK_BYTES"][1])


def _params_in_subprocess(native, env_extra):
    """The effective values of the test-only switches, and TIDE's log lines, in a fresh process with env_extra."""
    code = (
        "from nccl_tide import _native as N\n"
        "for n in ('NCCL_TIDE_SIGNAL_KERNELS', 'NCCL_TIDE_MERGE_FLAG_BATCHES', 'NCCL_TIDE_PAIR_TOKENS',\n"
        "          'NCCL_TIDE_AG_SIGNAL_KERNELS', 'NCCL_TIDE_TEST_SWITCHES'):\n"
        "    print(n, N.param_value(n))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(NCCL_TIDE_LIBRARY_PATH=native.library_path(), **env_extra)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    values = dict(line.split() for line in out.stdout.splitlines())
    warns = [x for x in out.stderr.splitlines() if " NCCL TIDE WARN " in x]
    return values, warns


def test_test_only_switches_take_effect_only_behind_the_gate(native):
    flipped = {"NCCL_TIDE_SIGNAL_KERNELS": "0", "NCCL_TIDE_MERGE_FLAG_BATCHES": "0", "NCCL_TIDE_PAIR_TOKENS": "0",
               "NCCL_TIDE_AG_SIGNAL_KERNELS": "1"}
    defaults, warns = _params_in_subprocess(native, {})
    assert defaults == {"NCCL_TIDE_SIGNAL_KERNELS": "1", "NCCL_TIDE_MERGE_FLAG_BATCHES": "1",
                        "NCCL_TIDE_PAIR_TOKENS": "1", "NCCL_TIDE_AG_SIGNAL_KERNELS": "0",
                        "NCCL_TIDE_TEST_SWITCHES": "0"}
    assert warns == []
    # Without the gate: the defaults stay in force, one WARN per switch that is set.
    ignored, warns = _params_in_subprocess(native, flipped)
    assert ignored == defaults
    assert len(warns) == len(flipped), warns
    for name in flipped:
        assert sum(f"{name} is a test-only switch and is ignored without NCCL_TIDE_TEST_SWITCHES=1" in w
                   for w in warns) == 1, warns
    # Behind the gate: every value is taken, silently.
    taken, warns = _params_in_subprocess(native, dict(flipped, NCCL_TIDE_TEST_SWITCHES="1"))
    assert taken == dict(flipped, NCCL_TIDE_TEST_SWITCHES="1")
    assert warns == []


def test_a_removed_variable_is_reported_once_and_ignored(native):
    values, warns = _params_in_subprocess(native, {"NCCL_TIDE_AG_BATCH": "0"})
    assert values["NCCL_TIDE_TEST_SWITCHES"] == "0"
    assert len(warns) == 1, warns
    assert "Params: NCCL_TIDE_AG_BATCH was removed and is ignored: copies use cudaMemcpyBatchAsync" in warns[0]
    described = [r[0] for r in describe_all()]
    assert "NCCL_TIDE_AG_BATCH" not in described and "NCCL_TIDE_TEST_SWITCHES" in described
