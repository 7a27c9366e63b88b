# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The NCCL binding of two-sided p2p groups (plugin/nccl/p2p_group.h), on CPU against the recording stub libnccl
(tests/native/stub_nccl/recording_stub_nccl.c), through tests/native/nccl_p2p_binding_test.cc.

No C API path reaches the binding without a GPU (a TIDE communicator needs one), so the program calls the binding
directly: it loads the stub as a framework loads NCCL (RTLD_GLOBAL), resolves it by version with nccl::resolve(),
and issues every p2p group of a rank's two-sided AG and RS programs. The stub logs each ncclGroupStart / ncclSend /
ncclRecv / ncclGroupEnd with all its arguments; the log must equal what the program expects, call for call.
"""

import os
import shutil
import subprocess

import pytest

STUB_VERSIONS = (22809, 23203)  # the oldest supported NCCL (2.28.9) and a 2.32


@pytest.fixture(scope="module")
def build(repo, tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc) to build the stub libnccl")
    root = tmp_path_factory.mktemp("nccl_p2p_binding")
    exe = root / "nccl_p2p_binding_test"
    core = sorted(str(p) for p in (repo / "plugin" / "core").glob("*.cc"))
    nccl = [str(repo / "plugin" / "nccl" / n) for n in ("nccl_lib.cc", "p2p_group.cc")]
    subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{repo / 'include'}",
                    f"-I{repo / 'plugin' / 'core'}", f"-I{repo / 'plugin'}",
                    str(repo / "tests" / "native" / "nccl_p2p_binding_test.cc"), *nccl, *core, "-ldl", "-pthread",
                    "-o", str(exe)], check=True, capture_output=True, text=True)
    stubs = {}

    def stub(code, fail_peer=None):
        key = (code, fail_peer)
        if key not in stubs:
            d = root / f"stub_{code}_{fail_peer}"
            d.mkdir()
            extra = [] if fail_peer is None else [f"-DSTUB_FAIL_PEER={fail_peer}"]
            subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", f"-DSTUB_VERSION={code}",
                            "-DSTUB_BASE_QUERIES", *extra, str(repo / "tests" / "native" / "stub_nccl" / "recording_stub_nccl.c"),
                            "-o", str(d / "libnccl.so.2")], check=True)
            stubs[key] = d / "libnccl.so.2"
        return stubs[key]

    return exe, stub


def run(exe, stub, tmp_path, *args):
    log = tmp_path / "stub.log"
    if log.exists():
        log.unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_TIDE_")}
    env["STUB_NCCL_LOG"] = str(log)
    p = subprocess.run([str(exe), str(stub), *map(str, args)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and "FAIL" not in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    expected = [x[len("EXPECT "):] for x in p.stdout.splitlines() if x.startswith("EXPECT ")]
    logged = log.read_text().splitlines() if log.exists() else []
    result = next(x for x in p.stdout.splitlines() if x.startswith("RESULT ")).split(" ", 2)
    return p.stdout, expected, logged, int(result[1]), result[2] if len(result) > 2 else ""


@pytest.mark.parametrize("code", STUB_VERSIONS)
@pytest.mark.parametrize("nodes,per_node,rank", [(2, 2, 0), (2, 2, 3), (3, 2, 4), (4, 1, 2)])
def test_every_p2p_group_of_a_program_reaches_nccl_as_one_group(build, tmp_path, code, nodes, per_node, rank):
    exe, stub = build
    out, expected, logged, result, msg = run(exe, stub(code), tmp_path, "programs", nodes, per_node, rank)
    assert result == 0, msg
    assert f"resolved NCCL 2.{code // 100 % 100}." in out
    assert "transport sendrecv" in out  # the recording stub exports no ncclPutSignal: two-sided is what it offers
    groups = int(out.split("groups ")[1].split()[0])
    assert groups > 2 and expected.count("GS") == groups == expected.count("GE")
    assert any(x.startswith("SEND ") for x in expected) and any(x.startswith("RECV ") for x in expected)
    assert logged == expected  # the same calls with the same arguments (pointer, bytes, uint8, peer), in order


def test_a_failed_send_closes_the_group_and_reports_the_nccl_error(build, tmp_path):
    exe, stub = build
    _, expected, logged, result, msg = run(exe, stub(22809, fail_peer=3), tmp_path, "fail", 3)
    assert logged == expected and logged[-1] == "GE" and not any(x.startswith("RECV ") for x in logged)
    assert result == 6  # tideNcclError
    assert "ncclSend failed: stub: invalid argument (NCCL error 4)" in msg
