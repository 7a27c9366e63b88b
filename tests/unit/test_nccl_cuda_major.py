# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The warning for a libnccl built for another CUDA major than torch's (a stray nvidia-nccl-cuXX wheel)."""

import logging

import numpy as np
import pytest
from nccl_tide import nccl_cuda


def fake_lib(tmp_path, line: bytes, rng) -> str:
    # The build line sits among random bytes, as in a real library's .rodata.
    p = tmp_path / "libnccl.so.2"
    noise = rng.integers(0, 256, size=200_000, dtype=np.uint8).tobytes().replace(b"NCCL", b"nccl")
    p.write_bytes(noise[:150_000] + line + b"\x00" + noise[150_000:])
    return str(p)


def test_reads_the_build_line(tmp_path, rng):
    path = fake_lib(tmp_path, b"NCCL version 2.32.3+cuda12.9", rng)
    assert nccl_cuda.libnccl_build(path) == ("2.32.3", 12, 9)
    assert nccl_cuda.libnccl_build(fake_lib(tmp_path, b"no build line here", rng)) is None


def test_warns_once_on_a_different_major(tmp_path, rng, caplog):
    nccl_cuda._reset_for_tests()
    path = fake_lib(tmp_path, b"NCCL version 2.32.3+cuda12.9", rng)
    with caplog.at_level(logging.WARNING, logger="nccl_tide.nccl"):
        first = nccl_cuda.check_cuda_major(path, torch_major=13)
        second = nccl_cuda.check_cuda_major(path, torch_major=13)
    assert first and first == second
    assert "CUDA 12.9" in first and "torch's CUDA 13" in first and "nvidia-nccl-cu13" in first
    said = [r for r in caplog.records if r.name == "nccl_tide.nccl"]
    assert len(said) == 1 and said[0].levelno == logging.WARNING


@pytest.mark.parametrize("line", [b"NCCL version 2.28.9+cuda12.9", b"a stub without a build line"])
def test_silent_when_matching_or_unknown(tmp_path, rng, caplog, line):
    nccl_cuda._reset_for_tests()
    path = fake_lib(tmp_path, line, rng)
    with caplog.at_level(logging.WARNING, logger="nccl_tide.nccl"):
        assert nccl_cuda.check_cuda_major(path, torch_major=12) is None
    assert not [r for r in caplog.records if r.name == "nccl_tide.nccl"]


def test_finds_the_mapped_library(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f0000000000-7f0000001000 r--p 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f0000100000-7f0000200000 r-xp 00000000 08:01 456 /venv/lib/python3.11/site-packages/nvidia/nccl/lib/"
        "libnccl.so.2\n"
    )
    assert nccl_cuda.loaded_libnccl_path(str(maps)).endswith("nvidia/nccl/lib/libnccl.so.2")
    maps.write_text("7f0000000000-7f0000001000 r--p 00000000 08:01 123 /usr/lib/libc.so.6\n")
    assert nccl_cuda.loaded_libnccl_path(str(maps)) is None
