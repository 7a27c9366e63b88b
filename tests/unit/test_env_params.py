# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The NCCL_TIDE_* variables read outside the library's registry, and the Python reader of the registry's values:
NCCL_TIDE_RANKS_PER_GPU is known to the library (no "not a TIDE parameter" warning), documented in docs/env.md and
parsed strictly; param_value() names the asked variable's own parse error whichever of several invalid ones it is."""

import os
import subprocess
import sys

import pytest
from nccl_tide import devices
from nccl_tide.errors import InvalidArgumentError


def _in_subprocess(native, env_extra, code):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(NCCL_TIDE_LIBRARY_PATH=native.library_path(), **env_extra)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout, [x for x in out.stderr.splitlines() if " NCCL TIDE WARN " in x]


def test_ranks_per_gpu_is_no_unknown_parameter_and_is_documented(native, repo):
    _, warns = _in_subprocess(native, {"NCCL_TIDE_RANKS_PER_GPU": "2", "NCCL_TIDE_DEBUG": "WARN"},
                              "from nccl_tide import _native as N\nN.param_value('NCCL_TIDE_TIMEOUT_MS')\n")
    assert not [w for w in warns if "RANKS_PER_GPU" in w], warns
    assert "`NCCL_TIDE_RANKS_PER_GPU`" in (repo / "docs" / "env.md").read_text()


@pytest.mark.parametrize("text", ["1_6", "+2", "\uff12", "\u0662", "2.0", "0x2", "0", "-1", " 2 3"])
def test_ranks_per_gpu_takes_ascii_digits_only(monkeypatch, text):
    monkeypatch.setenv(devices.RANKS_PER_GPU_ENV, text)
    with pytest.raises(InvalidArgumentError, match=r"NCCL_TIDE_RANKS_PER_GPU=.*whole number >= 1"):
        devices.ranks_per_gpu()


@pytest.mark.parametrize("text,want", [("16", 16), (" 3 ", 3), ("", 1), ("007", 7)])
def test_ranks_per_gpu_accepts_plain_counts(monkeypatch, text, want):
    monkeypatch.setenv(devices.RANKS_PER_GPU_ENV, text)
    assert devices.ranks_per_gpu() == want


def test_every_invalid_parameter_is_named_when_asked_for(native):
    code = (
        "from nccl_tide import _native as N\n"
        "for n in ('NCCL_TIDE_PACE_BYTES', 'NCCL_TIDE_TIMEOUT_MS', 'NCCL_TIDE_EAGER_GRAPHS', 'NCCL_TIDE_NOPE'):\n"
        "    try:\n"
        "        print(n, 'value', N.param_value(n))\n"
        "    except Exception as e:\n"
        "        print(n, type(e).__name__, str(e).replace(chr(10), ' '))\n"
    )
    out, _ = _in_subprocess(native, {"NCCL_TIDE_PACE_BYTES": "junk", "NCCL_TIDE_TIMEOUT_MS": "soon"}, code)
    got = {line.split()[0]: line.split(" ", 2)[1:] for line in out.splitlines()}
    for name in ("NCCL_TIDE_PACE_BYTES", "NCCL_TIDE_TIMEOUT_MS"):
        kind, text = got[name]
        assert kind == "InvalidArgumentError" and name in text, got
    assert got["NCCL_TIDE_EAGER_GRAPHS"] == ["value", "1"]
    assert got["NCCL_TIDE_NOPE"][0] == "KeyError"
