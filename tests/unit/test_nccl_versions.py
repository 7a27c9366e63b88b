"""NCCL symbol resolution by runtime version, against stub libnccl.so.2 builds (tests/native/stub_nccl, no GPU).

Each case runs in a fresh process: the stub is loaded first (RTLD_GLOBAL, soname libnccl.so.2, as torch would load
the real one), then libnccl-tide.so finds it with RTLD_NOLOAD. Every stub function except ncclGetVersion aborts, so a
clean exit proves resolution called nothing else, and the reported features prove which symbols were found.
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
    # The window provider is not built: tideCommCreate uses IPC on every NCCL, and nccl_info() says so.
    22902: (sorted(V229), "ipc", "sendrecv"),
    23203: (sorted(V231), "ipc", "sendrecv"),
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

    def build(code):
        d = root / str(code)
        if not (d / "libnccl.so.2").exists():
            d.mkdir(exist_ok=True)
            subprocess.run(
                [
                    cc,
                    "-shared",
                    "-fPIC",
                    "-Wl,-soname,libnccl.so.2",
                    f"-DSTUB_VERSION={code}",
                    STUB_SRC,
                    "-o",
                    str(d / "libnccl.so.2"),
                ],
                check=True,
            )
        return str(d / "libnccl.so.2")

    return build


def probe(native, stub, debug="WARN"):
    env = dict(os.environ, NCCL_TIDE_LIBRARY_PATH=native.library_path(), NCCL_TIDE_DEBUG=debug)
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
    assert f"(code {code})" in msg


def test_newer_minor_warns_and_behaves_as_2_32(native, stub_dir):
    kind, info, err = probe(native, stub_dir(23301))
    assert kind == "RESULT", info
    assert info["runtime_version"] == 23301
    assert info["effective_version"] == 23299
    assert info["features"] == sorted(V231)
    assert info["provider"] == "ipc" and info["transport"] == "sendrecv"
    assert "newer than the newest version TIDE knows" in err


def test_major_3_is_refused(native, stub_dir):
    kind, msg, _ = probe(native, stub_dir(30001))
    assert kind == "ERROR" and "supports NCCL 2.28.x through 2.32.x" in msg


def test_get_info_bad_struct(native):
    lib = native.lib()
    assert lib.tideNcclGetInfo(None) == N.tideInvalidArgument
    info = N.tideNcclInfo_t(ctypes.sizeof(N.tideNcclInfo_t) - 8, N.TIDE_NCCL_INFO_VERSION)
    assert lib.tideNcclGetInfo(ctypes.byref(info)) == N.tideInvalidArgument
    assert "tideNcclInfo_t" in native.last_error()
