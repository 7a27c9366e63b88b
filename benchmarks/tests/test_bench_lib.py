# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/bench_lib.py, the binding of libnccl-tide-bench.so, on the CPU: tide_bench.h bound and laid out as C
sees it, where the library is looked for and the error when it is absent, the pacer's argument checks, and the
reduce kernel's shape rule through the library (a host-side query; it needs a CUDA build, not a GPU).
"""

import ctypes
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import bench_lib as B
import pytest
from nccl_tide.errors import InvalidArgumentError, LibraryNotFoundError

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "benchmarks" / "native" / "tide_bench.h"


def _bench_lib_or_skip():
    if not B.available():
        pytest.skip("no libnccl-tide-bench.so (built only with the CUDA data path)")
    return B.lib()


def _bench_header_functions():
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    protos = {}
    for m in re.finditer(r"^[\w\s\*]*?\b(tide[A-Z]\w*)\s*\(([^;{]*?)\)\s*;", text, flags=re.MULTILINE | re.DOTALL):
        args = m.group(2).strip()
        protos[m.group(1)] = 0 if args in ("", "void") else args.count(",") + 1
    return protos


def test_bench_header_matches_the_signatures():
    from nccl_tide import _native

    protos = _bench_header_functions()
    assert len(protos) == 9
    assert set(protos) == set(B.SIGNATURES)
    for name, nargs in protos.items():
        assert len(B.SIGNATURES[name][1]) == nargs, name
    # The bench names are kept out of the public header and its binding.
    assert not set(protos) & set(_native.SIGNATURES)


def test_bench_library_is_bound():
    handle = _bench_lib_or_skip()
    for name, (_, args) in B.SIGNATURES.items():
        assert getattr(handle, name).argtypes == args


def test_bench_struct_layout_matches_c(tmp_path):
    cls = B.tideBenchReduceArgs_t
    lines = ["#include <cstdio>", "#include <cstddef>", '#include "tide_bench.h"', "int main() {",
             '  printf("SIZEOF %zu\\n", sizeof(tideBenchReduceArgs_t));']
    lines += [f'  printf("{f} %zu\\n", offsetof(tideBenchReduceArgs_t, {f}));' for f, _ in cls._fields_]
    lines += ["  return 0;", "}"]
    src = tmp_path / "l.cc"
    src.write_text("\n".join(lines))
    subprocess.run(["g++", "-std=c++17", f"-I{REPO / 'include'}", f"-I{HEADER.parent}", str(src), "-o", str(tmp_path / "l")], check=True)
    out = subprocess.run([str(tmp_path / "l")], capture_output=True, text=True, check=True).stdout.split("\n")
    seen = 0
    for line in filter(None, out):
        field, value = line.split()
        got = ctypes.sizeof(cls) if field == "SIZEOF" else getattr(cls, field).offset
        assert int(value) == got, line
        seen += 1
    assert seen == len(cls._fields_) + 1


def _rule_ctas(n_src, in_size, out_size, prev, link_gbps=370.0, sms=132, cta_gbps=66.0, max_paced=32, headroom=1.2):
    """reduce_kernel.h's CTA cap, restated: paced to the link (with headroom) when anything arrives, else the whole
    GPU."""
    per, incoming = n_src * in_size + out_size + (4 if prev else 0), (n_src - 1) * in_size + (4 if prev else 0)
    if incoming == 0:
        return sms
    return min(max(1, math.ceil(headroom * link_gbps * per / incoming / cta_gbps)), max_paced, sms)


def test_reduce_shape_rule():
    _bench_lib_or_skip()
    W, n = 8, 8 << 20
    sh = B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096))
    traffic = n * (2 * W + 4)
    assert sh["bytes"] == traffic and sh["vector"] and sh["threads"] == 512
    # 8 bf16 inputs -> fp32 at 370 GB/s: 529 GB/s of reduce traffic, x 1.2 headroom = 634 GB/s, 10 CTAs of
    # kReduceCtaGBps = 66 GB/s (a CTA's rate beside the arrivals).
    assert sh["ctas"] == _rule_ctas(W, 2, 4, False) == 10
    units, per_cta = n // 8, (8 << 20) // (8 * 20)  # 8-element vectors; whole vectors in about 8 MiB
    assert sh["launches"] == math.ceil(math.ceil(units / per_cta) / 10) == 3  # 21 CTAs of <= 8 MiB, 10 at a time
    # Huge: the launches per chunk are capped at 16 (CTAs then move more than 8 MiB each).
    sh = B.reduce_shape(B.reduce_args(256, (64 << 20) * 2, W, 64 << 20, 4096))
    assert (sh["ctas"], sh["launches"]) == (10, 16)
    # A small chunk: one CTA, one launch.
    sh = B.reduce_shape(B.reduce_args(256, 4096 * 2, W, 4096, 4096))
    assert (sh["ctas"], sh["launches"]) == (1, 1)
    # Medium (20 MB of traffic, under 10 CTAs x 8 MiB): the paced grid all the same, in one launch; ceil(T / 8 MiB)
    # = 3 CTAs would fall behind the arrivals.
    n = 1_000_000
    sh = B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096))
    assert (sh["ctas"], sh["launches"]) == (10, 1)
    # Small (4 MB): one CTA per MiB (kReduceCtaMinBytes), under the paced cap.
    n = 200_000
    sh = B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096))
    assert (sh["ctas"], sh["launches"]) == (math.ceil(n // 8 / ((1 << 20) // 160)), 1) == (4, 1)
    # World size 1, a 48 MiB cast (bf16 -> fp32): one CTA per MiB on as many SMs, not 6 CTAs of 8 MiB.
    n = 8 << 20
    sh = B.reduce_shape(B.reduce_args(256, n * 2, 1, n, 4096))
    worth = math.ceil(n // 8 / ((1 << 20) // 48))  # whole 48-byte vectors per MiB: 49 CTAs
    assert worth == 49 and sh["ctas"] == min(worth, _sm_count()) and sh["ctas"] * sh["launches"] >= 6
    # Two inputs: more reduce traffic per incoming byte (fp32 output), so more CTAs; a running sum (prev) arrives too
    # (a chunk large enough for 20 CTAs of 8 MiB).
    n = 32 << 20
    assert B.reduce_shape(B.reduce_args(256, n * 2, 2, n, 4096))["ctas"] == _rule_ctas(2, 2, 4, False) == 27
    assert B.reduce_shape(B.reduce_args(256, n * 2, 2, n, 4096, prev=8192))["ctas"] == _rule_ctas(2, 2, 4, True) == 14
    # One input, no running sum (world size 1): nothing arrives, nothing paces it: the whole GPU (a chunk of 1.5 GiB
    # of traffic: 192 CTAs of 8 MiB).
    n = 256 << 20
    sh = B.reduce_shape(B.reduce_args(256, n * 2, 1, n, 4096))
    assert sh["ctas"] == _sm_count() and sh["ctas"] > 32
    # Unaligned bases: the element path. Overrides: maxCtas and bytes per CTA.
    n = 200_000
    assert not B.reduce_shape(B.reduce_args(258, n * 2, W, n, 4096))["vector"]
    sh = B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096, max_ctas=16, cta_bytes=1 << 16))
    assert sh["ctas"] == 16
    with pytest.raises(InvalidArgumentError):
        B.reduce_shape(B.reduce_args(256, 16, 0, 8, 256))
    with pytest.raises(InvalidArgumentError):
        B.reduce_shape(B.reduce_args(256, 16, 1, 8, 256, max_ctas=-1))
    with pytest.raises(ValueError):
        B.reduce_args(256, 16, 1, 8, 256, in_type="int8")


def test_reduce_shape_deadline_and_drain():
    """The next chunk's arrival is a reduce's deadline (following_bytes); the last reduce is a drain."""
    _bench_lib_or_skip()
    W, n = 8, 32 << 20  # 640 MiB of traffic: 80 CTAs of 8 MiB, so the pace, not the chunk, bounds the grid
    own_incoming = n * 2 * (W - 1)
    base = B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096))["ctas"]
    assert B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096, following_bytes=own_incoming))["ctas"] == base == 10
    # A next chunk of a third of the size arrives three times sooner: three times the rate, 29 CTAs.
    short = B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096, following_bytes=own_incoming // 3))["ctas"]
    assert short == math.ceil(1.2 * 370 * n * 20 / (own_incoming // 3) / 66) == 29
    # Tiny next chunk: capped at the paced maximum; nothing after it: the drain, the same cap.
    assert B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096, following_bytes=4096))["ctas"] == min(32, _sm_count())
    assert B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096, following_bytes=0))["ctas"] == min(32, _sm_count())
    # A drain of a chunk under 32 x 8 MiB of traffic (a Llama-8B layer's last chunk, about 6.8 M elements per rank:
    # 136 MB) still gets the 32 CTAs, not 17 of 8 MiB each.
    m = 6_815_744
    sh = B.reduce_shape(B.reduce_args(256, m * 2, W, m, 4096, following_bytes=0))
    assert (sh["ctas"], sh["launches"]) == (min(32, _sm_count()), 1)
    # A larger next chunk leaves more time: fewer CTAs.
    assert B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096, following_bytes=own_incoming * 4))["ctas"] == 3
    # A world of one rank stays unpaced whatever follows (a chunk of more than one CTA of 8 MiB per SM).
    big = 256 << 20
    for following in (0, 4096, big * 8):
        assert B.reduce_shape(B.reduce_args(256, big * 2, 1, big, 4096, following_bytes=following))["ctas"] == (
            _sm_count())
    with pytest.raises(InvalidArgumentError):
        B.reduce_args(256, n * 2, W, n, 4096, following_bytes=-2)


def test_reduce_shape_kernel_choice():
    """The 16-byte path's kernel: the library's (the register kernel), or the staged one on the same grid with one
    producer warp more, where its stage holds 32 vectors of every source and prev (else the register kernel); the
    element path for unaligned bases whatever is asked."""
    _bench_lib_or_skip()
    W, n = 8, 8 << 20
    lib = B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096))
    loads = B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096, kernel="loads"))
    staged = B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096, kernel="staged"))
    assert lib == loads and lib["kernel"] == "loads" and lib["threads"] == 512
    assert staged["kernel"] == "staged" and staged["threads"] == 544
    assert {k: v for k, v in staged.items() if k not in ("kernel", "threads")} == (
        {k: v for k, v in loads.items() if k not in ("kernel", "threads")})
    # a stage of 64 KiB: 32 vectors of 128 bf16 sources (16 bytes each) fit, of 129 not; with prev 32 bytes more each
    n = 1 << 16
    for n_src, prev, want in ((128, None, "staged"), (129, None, "loads"), (126, 8192, "staged"),
                              (127, 8192, "loads")):
        sh = B.reduce_shape(B.reduce_args(256, n * 2, n_src, n, 4096, prev=prev, kernel="staged"))
        assert sh["kernel"] == want, (n_src, prev, sh)
    assert B.reduce_shape(B.reduce_args(258, n * 2, W, n, 4096, kernel="staged"))["kernel"] is None
    with pytest.raises(ValueError, match="kernel"):
        B.reduce_args(256, 16, 1, 8, 256, kernel="tma")
    bad = B.reduce_args(256, 16, 1, 8, 256)
    bad.kernel = 3
    with pytest.raises(InvalidArgumentError, match="kernel 3"):
        B.reduce_shape(bad)


def test_reduce_shape_follows_a_given_cta_rate():
    """ctaGBps replaces the rule's per-CTA rate: 8 bf16 inputs -> fp32 at 370 GB/s need 634 GB/s with the headroom,
    10 CTAs at the library's 66 GB/s, 6 at 110, 20 at 33; a drain keeps its cap. A rate that is not a positive
    number is refused."""
    _bench_lib_or_skip()
    W, n = 8, 32 << 20
    for rate in (0.0, 66.0, 110.0, 33.0):
        sh = B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096, cta_gbps=rate, kernel="staged"))
        assert sh["ctas"] == _rule_ctas(W, 2, 4, False, cta_gbps=rate or 66.0), rate
    assert _rule_ctas(W, 2, 4, False, cta_gbps=110.0) == 6
    drain = B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096, following_bytes=0, cta_gbps=500.0))
    assert drain["ctas"] == min(32, _sm_count())
    for rate in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidArgumentError, match="ctaGBps"):
            B.reduce_shape(B.reduce_args(256, n * 2, W, n, 4096, cta_gbps=rate))


def _sm_count():
    """The SM count the rule uses: the current device's, or 132 (an H200) where the process sees no GPU."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).multi_processor_count
    except ImportError:
        pass
    return 132


def test_reduce_shape_follows_nccl_tide_link_gbps():
    """NCCL_TIDE_LINK_GBPS sets the pace: twice the rate, about twice the CTAs (10 -> 20); an invalid value is
    refused by name."""
    _bench_lib_or_skip()
    code = ("import bench_lib as B; n = 8 << 20\n"
            "try:\n    print(B.reduce_shape(B.reduce_args(256, n * 2, 8, n, 4096))['ctas'])\n"
            "except Exception as e:\n    print('ERR', e)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "benchmarks"), os.environ.get("PYTHONPATH", "")]))
    got = {}
    for v in ("740", "20", "fast"):
        env["NCCL_TIDE_LINK_GBPS"] = v
        got[v] = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                timeout=120).stdout.strip()
    assert got["740"] == str(_rule_ctas(8, 2, 4, False, link_gbps=740)) == "20"
    assert got["20"] == "1"
    assert got["fast"].startswith("ERR") and "NCCL_TIDE_LINK_GBPS" in got["fast"], got["fast"]


@pytest.mark.parametrize("gbps,piece", [(0.0, 4096), (float("nan"), 4096), (float("inf"), 4096), (-1.0, 4096),
                                        (10.0, -1), (10.0, 2**64 + 4096), (10.0, 4095), (10.0, (1 << 30) + 1),
                                        (10.0, True), (10.0, 4096.0)])
def test_pacer_arguments_are_checked_before_the_library(gbps, piece):
    """Out-of-range link rates and piece sizes never reach tideBenchPacerCreate (a negative or >= 2**64 size would
    wrap in ctypes' size_t)."""
    with pytest.raises(ValueError, match="link rate|piece_bytes"):
        B.Pacer(gbps, piece)




def test_library_path_prefers_the_override(tmp_path, monkeypatch):
    lib = tmp_path / "custom" / B.LIB_NAME
    lib.parent.mkdir()
    lib.write_bytes(b"")
    monkeypatch.setenv(B.ENV_LIBRARY_PATH, str(lib))
    assert B.library_path() == str(lib.resolve())
    monkeypatch.setenv(B.ENV_LIBRARY_PATH, str(tmp_path / "missing.so"))
    with pytest.raises(LibraryNotFoundError, match=B.ENV_LIBRARY_PATH):
        B.library_path()


def test_library_path_defaults_to_the_product_librarys_directory(tmp_path, monkeypatch):
    from nccl_tide import _native

    product = tmp_path / _native.LIB_NAME
    product.write_bytes(b"")
    monkeypatch.delenv(B.ENV_LIBRARY_PATH, raising=False)
    monkeypatch.setenv(_native.ENV_LIBRARY_PATH, str(product))
    # Absent: the error names where it looked and how the library is built.
    with pytest.raises(LibraryNotFoundError, match="TIDE_BUILD_BENCHMARKS") as e:
        B.library_path()
    assert str(tmp_path / B.LIB_NAME) in str(e.value) and B.ENV_LIBRARY_PATH in str(e.value)
    (tmp_path / B.LIB_NAME).write_bytes(b"")
    assert B.library_path() == str((tmp_path / B.LIB_NAME).resolve())
    # No product library either: still a LibraryNotFoundError that names both variables.
    monkeypatch.setenv(_native.ENV_LIBRARY_PATH, str(tmp_path / "absent" / _native.LIB_NAME))
    with pytest.raises(LibraryNotFoundError, match=B.ENV_LIBRARY_PATH) as e:
        B.library_path()
    assert _native.ENV_LIBRARY_PATH in str(e.value)


def test_failures_carry_the_bench_librarys_message():
    """An invalid call fails with the message the benchmark library recorded (tideBenchGetLastError), typed."""
    _bench_lib_or_skip()
    with pytest.raises(InvalidArgumentError, match=r"tideBenchReduceShape: nSrc is 0"):
        B.reduce_shape(B.reduce_args(256, 16, 0, 8, 256))
    with pytest.raises(InvalidArgumentError, match=r"tideBenchPacerStats: NULL pacer"):
        B.check(B.lib().tideBenchPacerStats(None, None, 0), "tideBenchPacerStats")
