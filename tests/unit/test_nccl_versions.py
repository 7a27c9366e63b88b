# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""NCCL symbol resolution by runtime version, against stub libnccl.so.2 builds (tests/native/stub_nccl, no GPU).

Each case runs in a fresh process: the stub is loaded first (RTLD_GLOBAL, soname libnccl.so.2, as torch would load
the real one), then libnccl-tide.so finds it with RTLD_NOLOAD. Every stub function except ncclGetVersion aborts, so a
clean exit proves resolution called nothing else, and the reported features prove which symbols were found. The
provider reported is the one tideCommCreate tries under NCCL_TIDE_PROVIDER: the window provider from 2.29.2 (where
the window entry points are there), CUDA IPC before; a forced window where NCCL cannot is refused.
"""

import ctypes
import json
import os
import shutil
import subprocess
import sys

import pytest
from nccl_tide import _native as N

STUB_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "native", "stub_nccl", "stub_nccl.c")

BASE = ["mem_alloc", "window_register"]
V229 = BASE + ["lsa_multimem", "lsa_pointers", "put_signal", "query_properties", "win_get_user_ptr"]
V231 = V229 + ["coll_config"]

# version code: (features, provider, transport)
EXPECTED = {
    22809: (sorted(BASE), "ipc", "sendrecv"),
    22902: (sorted(V229), "window", "sendrecv"),
    23007: (sorted(V229), "window", "sendrecv"),
    23203: (sorted(V231), "window", "sendrecv"),
}

PROBE = r"""
import ctypes, json, sys
stub = sys.argv[1]
if stub != "none":
    ctypes.CDLL(stub, mode=ctypes.RTLD_GLOBAL)
from nccl_tide import comm, errors
try:
    print("RESULT " + json.dumps(comm.nccl_info()))
except errors.TideError as e:
    print("ERROR " + type(e).__name__ + " " + str(e))
"""


@pytest.fixture(scope="module")
def stub_dir(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc) to build the stub libnccl")
    root = tmp_path_factory.mktemp("stub_nccl")

    def build(code, *defines):
        d = root / "-".join([str(code), *defines])
        if not (d / "libnccl.so.2").exists():
            d.mkdir(exist_ok=True)
            subprocess.run(
                [
                    cc,
                    "-shared",
                    "-fPIC",
                    "-Wl,-soname,libnccl.so.2",
                    f"-DSTUB_VERSION={code}",
                    *[f"-D{x}" for x in defines],
                    STUB_SRC,
                    "-o",
                    str(d / "libnccl.so.2"),
                ],
                check=True,
            )
        return str(d / "libnccl.so.2")

    return build


def probe(native, stub, debug="WARN", provider=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_TIDE_")}
    env.update(NCCL_TIDE_LIBRARY_PATH=native.library_path(), NCCL_TIDE_DEBUG=debug)
    if provider is not None:
        env["NCCL_TIDE_PROVIDER"] = provider
    p = subprocess.run([sys.executable, "-c", PROBE, stub], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, f"probe died (a stub function was called?): rc {p.returncode}\n{p.stdout}\n{p.stderr}"
    line = [x for x in p.stdout.splitlines() if x.startswith(("RESULT ", "ERROR "))]
    assert len(line) == 1, p.stdout + p.stderr
    kind, _, rest = line[0].partition(" ")
    return kind, (json.loads(rest) if kind == "RESULT" else rest), p.stderr


@pytest.mark.parametrize("code", sorted(EXPECTED))
def test_version_features_provider_transport(native, stub_dir, code):
    kind, info, _ = probe(native, stub_dir(code))
    assert kind == "RESULT", info
    features, provider, transport = EXPECTED[code]
    assert info["runtime_version"] == code
    assert info["effective_version"] == code
    assert info["features"] == features
    assert info["provider"] == provider
    assert info["transport"] == transport


def test_init_logs_header_and_library_versions(native, stub_dir):
    kind, info, err = probe(native, stub_dir(22809), debug="INFO")
    assert kind == "RESULT"
    assert "NCCL library 2.28.9 (code 22809)" in err, err
    assert f"headers at build time {info['header_version']}" in err, err
    assert "provider ipc" in err and "inter-node transport sendrecv" in err


def test_no_nccl_loaded_is_a_clear_error(native):
    kind, msg, _ = probe(native, "none")
    assert kind == "ERROR"
    assert msg.startswith("UnsupportedError")
    assert "no NCCL library (libnccl.so.2) is loaded" in msg and "never loads a second copy" in msg


@pytest.mark.parametrize("code", [22703, 21903])
def test_too_old_version_is_refused(native, stub_dir, code):
    kind, msg, _ = probe(native, stub_dir(code))
    assert kind == "ERROR"
    assert msg.startswith("UnsupportedError")
    assert "supports NCCL 2.28.x through 2.32.x" in msg
    assert f"(code {code})" in msg and "upgrade NCCL" in msg


def test_newer_minor_warns_and_behaves_as_2_32(native, stub_dir):
    kind, info, err = probe(native, stub_dir(23301))
    assert kind == "RESULT", info
    assert info["runtime_version"] == 23301
    assert info["effective_version"] == 23299
    assert info["features"] == sorted(V231)
    assert info["provider"] == "window" and info["transport"] == "sendrecv"
    assert "newer than the newest version TIDE knows" in err


@pytest.mark.parametrize("code,setting,expected", [(22809, "ipc", "ipc"), (22809, "auto", "ipc"),
                                                   (23007, "ipc", "ipc"), (23007, "window", "window"),
                                                   (23203, "AUTO", "window")])
def test_provider_setting(native, stub_dir, code, setting, expected):
    kind, info, _ = probe(native, stub_dir(code), provider=setting)
    assert kind == "RESULT", info
    assert info["provider"] == expected


def test_forced_window_on_2_28_is_refused(native, stub_dir):
    kind, msg, _ = probe(native, stub_dir(22809), provider="window")
    assert kind == "ERROR" and msg.startswith("UnsupportedError"), msg
    assert "NCCL_TIDE_PROVIDER=window" in msg and "NCCL 2.28.9 is older than 2.29.2" in msg, msg
    assert "unset NCCL_TIDE_PROVIDER (auto) or set ipc" in msg, msg


def test_window_entry_point_missing_means_ipc(native, stub_dir):
    """A 2.29+ library without ncclGetPeerDevicePointer: auto stays on IPC; a forced window names what is missing."""
    stub = stub_dir(23007, "STUB_NO_PEER_POINTERS")
    kind, info, _ = probe(native, stub)
    assert kind == "RESULT", info
    assert "lsa_pointers" not in info["features"] and info["provider"] == "ipc"
    kind, msg, _ = probe(native, stub, provider="window")
    assert kind == "ERROR" and "does not export ncclGetPeerDevicePointer" in msg, msg


def test_invalid_provider_setting_is_an_error(native, stub_dir):
    kind, msg, _ = probe(native, stub_dir(23007), provider="nvshmem")
    assert kind == "ERROR" and msg.startswith("InvalidArgumentError"), msg
    assert "NCCL_TIDE_PROVIDER='nvshmem' is not valid: expected one of auto, ipc, window" in msg, msg


@pytest.mark.parametrize("code", [30000, 30001, 31205])
def test_major_3_is_refused_as_newer_than_tested(native, stub_dir, code):
    kind, msg, _ = probe(native, stub_dir(code))
    assert kind == "ERROR" and "supports NCCL 2.28.x through 2.32.x" in msg
    assert "newer than TIDE was tested with" in msg and "upgrade" not in msg.lower(), msg


def test_get_info_bad_struct(native):
    lib = native.lib()
    assert lib.tideNcclGetInfo(None) == N.tideInvalidArgument
    info = N.tideNcclInfo_t(ctypes.sizeof(N.tideNcclInfo_t) - 8, N.TIDE_NCCL_INFO_VERSION)
    assert lib.tideNcclGetInfo(ctypes.byref(info)) == N.tideInvalidArgument
    assert "tideNcclInfo_t" in native.last_error()
