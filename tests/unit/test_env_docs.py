# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""docs/env.md's tables equal what the library's parameter registry describes: the main table in every build, and
the table of "Test builds" too in a test build (-DTIDE_TEST_SWITCHES=ON), the only build that has the test-only
switches."""

import ctypes
import os
import re
import subprocess
import sys

import pytest
from fixtures import NO_TEST_SWITCHES, has_test_switches
from nccl_tide import _native as N

TEST_SWITCHES = ("NCCL_TIDE_SIGNAL_KERNELS", "NCCL_TIDE_MERGE_FLAG_BATCHES", "NCCL_TIDE_PAIR_TOKENS",
                 "NCCL_TIDE_AG_SIGNAL_KERNELS", "NCCL_TIDE_TEST_SWITCHES")


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


def table_rows(text):
    rows = []
    for line in text.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells and cells[0].startswith("NCCL_TIDE_"):
            rows.append(tuple(cells))
    return rows


def doc_rows(repo):
    """docs/env.md's parameter rows: (the main table's, the "Test builds" table's)."""
    main, _, test_builds = (repo / "docs" / "env.md").read_text().partition("\n## Test builds\n")
    return table_rows(main), table_rows(test_builds)


def test_env_md_matches_registry(native, repo):
    described = describe_all()
    assert len(described) >= 3 and all(r[0].startswith("NCCL_TIDE_") for r in described)
    main, test_builds = doc_rows(repo)
    assert sorted(r[0] for r in test_builds) == sorted(TEST_SWITCHES)
    docs = main + test_builds if has_test_switches() else main
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


def _params_in_subprocess(native, env_extra, names=TEST_SWITCHES):
    """The effective values of the parameters `names` (the test-only switches), and TIDE's log lines, in a fresh
    process with env_extra."""
    code = (
        "from nccl_tide import _native as N\n"
        f"for n in {tuple(names)!r}:\n"
        "    print(n, N.param_value(n))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(NCCL_TIDE_LIBRARY_PATH=native.library_path(), **env_extra)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    values = dict(line.split() for line in out.stdout.splitlines())
    warns = [x for x in out.stderr.splitlines() if " NCCL TIDE WARN " in x]
    return values, warns


@pytest.mark.skipif(not has_test_switches(), reason=NO_TEST_SWITCHES)
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


@pytest.mark.skipif(has_test_switches(), reason="a test build has the test-only switches")
def test_a_build_without_test_switches_has_none_of_them(native, rng):
    """Not in the registry, and each one set is reported as no TIDE parameter (one WARN), like a misspelt name."""
    described = [r[0] for r in describe_all()]
    assert not set(TEST_SWITCHES) & set(described)
    set_all = {n: str(rng.integers(2)) for n in TEST_SWITCHES}
    values, warns = _params_in_subprocess(native, set_all, names=("NCCL_TIDE_EAGER_GRAPHS",))
    assert values == {"NCCL_TIDE_EAGER_GRAPHS": "1"}
    assert len(warns) == len(TEST_SWITCHES), warns
    for name in TEST_SWITCHES:
        assert sum(f"Params: {name} is not a TIDE parameter and is ignored" in w for w in warns) == 1, warns


def test_a_removed_variable_is_reported_once_and_ignored(native):
    values, warns = _params_in_subprocess(native, {"NCCL_TIDE_AG_BATCH": "0"}, names=("NCCL_TIDE_EAGER_GRAPHS",))
    assert values["NCCL_TIDE_EAGER_GRAPHS"] == "1"
    assert len(warns) == 1, warns
    assert "Params: NCCL_TIDE_AG_BATCH was removed and is ignored: copies use cudaMemcpyBatchAsync" in warns[0]
    described = [r[0] for r in describe_all()]
    assert "NCCL_TIDE_AG_BATCH" not in described and "NCCL_TIDE_EAGER_GRAPHS" in described
