# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The window provider's NCCL side on CPU (plugin/nccl/window_memory, plugin/nccl/provider_choice) against the
recording stub libnccl (tests/native/stub_nccl/recording_stub_nccl.c), through tests/native/nccl_windows_test.cc.

The program drives one rank's windows through their life with a stand-in exchange and prints every line the stub
must log; the log must equal it, call for call (ncclMemAlloc, ncclCommWindowRegister, ncclGetPeerDevicePointer,
ncclCommWindowDeregister, ncclMemFree, ncclCommSplit, ncclCommDestroy / ncclCommAbort). On top, the log itself is
checked for what must hold whatever the order: nothing leaks, a window goes before its memory, registration is plain
(NCCL_WIN_DEFAULT), peer addresses are asked only for the rank's own TIDE node, and the multicast pointer is never
asked for (the stub aborts if it is).

Where NCCL says no (registration fails or gives no window, a peer address query fails or gives NULL; on this rank or,
through the agreement, on another), the windows are unavailable on every rank with a reason naming the NCCL call and
its result, and the program prints what tideCommCreate makes of it: the fallback to IPC (auto) and the refusal
(NCCL_TIDE_PROVIDER=window).
"""

import os
import random
import re
import shutil
import subprocess

import pytest

WINDOW_VERSIONS = (23007, 23203)  # 2.30.7 (the one the GPU tests build) and a 2.32
tideSuccess, tideOutOfMemory, tideUnsupported, tideMismatch = 0, 4, 3, 8


@pytest.fixture(scope="module")
def build(repo, tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc) to build the stub libnccl")
    root = tmp_path_factory.mktemp("nccl_windows")
    exe = root / "nccl_windows_test"
    core = sorted(str(p) for p in (repo / "plugin" / "core").glob("*.cc"))
    nccl = [str(repo / "plugin" / "nccl" / n) for n in ("nccl_lib.cc", "window_memory.cc", "provider_choice.cc")]
    subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{repo / 'include'}",
                    f"-I{repo / 'plugin' / 'core'}", f"-I{repo / 'plugin'}",
                    str(repo / "tests" / "native" / "nccl_windows_test.cc"), *nccl, *core, "-ldl", "-pthread",
                    "-o", str(exe)], check=True, capture_output=True, text=True)
    stubs = {}

    def stub(code):
        if code not in stubs:
            d = root / f"stub_{code}"
            d.mkdir()
            src = repo / "tests" / "native" / "stub_nccl" / "recording_stub_nccl.c"
            subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", f"-DSTUB_VERSION={code}",
                            "-DSTUB_BASE_QUERIES", str(src), "-o", str(d / "libnccl.so.2")], check=True)
            stubs[code] = d / "libnccl.so.2"
        return stubs[code]

    return exe, stub


def run(build, tmp_path, code, *args, env=None):
    exe, stub = build
    log = tmp_path / "stub.log"
    if log.exists():
        log.unlink()
    e = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_TIDE_", "STUB_"))}
    e.update({"STUB_NCCL_LOG": str(log), "NCCL_TIDE_DEBUG": "NONE", **(env or {})})
    p = subprocess.run([str(exe), str(stub(code)), *map(str, args)], capture_output=True, text=True, env=e,
                       timeout=120)
    assert p.returncode == 0 and "FAIL:" not in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    expected = [x[len("EXPECT "):] for x in p.stdout.splitlines() if x.startswith("EXPECT ")]
    logged = log.read_text().splitlines() if log.exists() else []
    result = next(x for x in p.stdout.splitlines() if x.startswith("RESULT ")).split(" ", 2)
    return p.stdout, expected, logged, int(result[1]), result[2] if len(result) > 2 else ""


def check_balanced(logged):
    """No leak and the right order: every allocation freed once, every window deregistered once before its memory
    is freed; plain registrations; the multicast and LSA-rank queries never made."""
    assert not any(x.startswith(("MULTIMEM", "LSA")) for x in logged), logged
    allocated, freed, windows, gone = {}, {}, {}, {}
    for i, x in enumerate(logged):
        f = x.split()
        if f[0] == "MA" and f[2] != "FAIL":
            assert f[2] not in allocated or f[2] in freed, f"{f[2]} allocated twice while live"
            allocated[f[2]] = i
            freed.pop(f[2], None)
        elif f[0] == "MF":
            assert f[1] in allocated and f[1] not in freed, f"free of {f[1]} that is not live"
            freed[f[1]] = i
        elif f[0] == "WR":
            assert f[4] == "0", f"registration with winFlags {f[4]} (expected NCCL_WIN_DEFAULT)"
            assert f[2] in allocated and f[2] not in freed, "registration of memory that is not live"
            if f[5] != "(nil)":
                windows[f[5]] = f[2]
        elif f[0] == "WD":
            assert f[2] in windows and f[2] not in gone, f"deregistration of {f[2]} that is not registered"
            assert windows[f[2]] not in freed, "a window's memory was freed before the window"
            gone[f[2]] = i
    assert set(freed) == set(allocated), f"leaked: {set(allocated) - set(freed)}"
    assert set(gone) == set(windows), f"never deregistered: {set(windows) - set(gone)}"


@pytest.mark.parametrize("code", WINDOW_VERSIONS)
@pytest.mark.parametrize("world,node,rank", [(1, 1, 0), (2, 2, 1), (4, 4, 2), (4, 2, 3), (8, 4, 5), (6, 1, 4)])
def test_window_life_is_the_expected_nccl_calls(build, tmp_path, code, world, node, rank):
    seed = random.Random(f"{code}-{world}-{node}-{rank}").randrange(1, 2**63)
    out, expected, logged, result, msg = run(build, tmp_path, code, "life", world, node, rank, seed)
    assert result == tideSuccess, msg
    assert logged == expected
    check_balanced(logged)
    splits = [x for x in logged if x.startswith("SPLIT ")]
    if node < world:
        # One communicator per TIDE node, split off the parent by node (color) in rank order (key), blocking, and
        # destroyed last; every window lives on it.
        assert len(splits) == 1 and splits[0].split()[2:4] == [str(rank // node), str(rank)], splits
        child = splits[0].split()[-1]
        assert logged[-1] == f"CD {child}"
        assert all(x.split()[1] == child for x in logged if x.startswith(("WR ", "WD ")))
    else:
        assert not splits and not any(x.startswith(("CD ", "CA ")) for x in logged)
    # Peer addresses only of the other ranks of the node, in the windows' communicator's numbering.
    peers = {int(x.split()[3]) for x in logged if x.startswith("PP ")}
    assert peers == {q - (rank // node * node if node < world else 0) for q in range(world)
                     if q // node == rank // node and q != rank}
    # The middle slot's window and memory went at the free, after the quiesce step and before anything else.
    q = logged.index("Q tideSlotFree")
    assert logged[q + 1].startswith("WD ") and logged[q + 2].startswith("MF ")


@pytest.mark.parametrize("world,node,rank", [(4, 2, 3), (2, 2, 0)])
def test_abort_releases_locally(build, tmp_path, world, node, rank):
    _, expected, logged, result, msg = run(build, tmp_path, 23007, "abort", world, node, rank, 7)
    assert result == tideSuccess, msg
    assert logged == expected
    # tideCommAbort never destroys a split communicator (a collective NCCL call): it aborts it.
    assert not any(x.startswith("CD ") for x in logged)
    assert sum(x.startswith("CA ") for x in logged) == (1 if node < world else 0)
    if node < world:
        check_balanced(logged)
    else:
        # The caller's communicator may be aborted and freed by its owner already: abort makes no NCCL call on it.
        assert not any(x.startswith(("WD ", "MF ")) for x in logged), logged


COMM, SPLIT = "the comm's NCCL communicator", "a communicator split off per TIDE node"
NO_WINDOW = "returned no window on rank {q} (ncclSuccess, window NULL): NCCL has no symmetric memory there"
NO_ADDRESS = "returned no address on rank {q} for rank {p}'s window (ncclSuccess, pointer NULL)"
INVALID_ARGUMENT = "stub: invalid argument (NCCL error 4)"


def check_fallbacks(out, reason):
    """The reason open() gave starts with `reason`, and what tideCommCreate makes of it: auto falls back to IPC
    saying it, a forced window is refused with it and with what to change."""
    why = re.search(r"^WHY (.*)$", out, re.M).group(1)
    assert why.startswith(reason), (why, reason)
    assert f"FALLBACK auto ipc NCCL has no windows for this comm's TIDE nodes: {why}\n" in out, out
    assert (f"FALLBACK forced ERROR {tideUnsupported} NCCL_TIDE_PROVIDER=window: {why}; unset NCCL_TIDE_PROVIDER "
            "(auto) to use CUDA IPC there, or set ipc\n") in out, out


# Each way NCCL says no, on the rank simulated. STUB_WINDOWS=none on a world of 4 ranks as one node is what NCCL 2.30.7
# answers for a TIDE node declared across two NCCL hosts without GIN (no symmetric memory on that communicator).
@pytest.mark.parametrize("env,world,node,rank,why", [
    ({"STUB_WINDOWS": "none"}, 2, 2, 1, f"ncclCommWindowRegister on {COMM} " + NO_WINDOW.format(q=1)),
    ({"STUB_WINDOWS": "none"}, 4, 4, 3, f"ncclCommWindowRegister on {COMM} " + NO_WINDOW.format(q=3)),
    ({"STUB_WINDOWS": "none"}, 4, 2, 2, f"ncclCommWindowRegister on {SPLIT} " + NO_WINDOW.format(q=2)),
    ({"STUB_REGISTER_FAIL": "5"}, 4, 4, 2,
     f"ncclCommWindowRegister on {COMM} failed on rank 2: stub: invalid usage (NCCL error 5)"),
    ({"STUB_REGISTER_FAIL": "1"}, 4, 2, 3,
     f"ncclCommWindowRegister on {SPLIT} failed on rank 3: stub: unhandled cuda error (NCCL error 1)"),
    ({"STUB_UNREACHABLE_PEER": "2"}, 4, 4, 0, f"ncclGetPeerDevicePointer on {COMM} " + NO_ADDRESS.format(q=0, p=2)),
    ({"STUB_UNREACHABLE_PEER": "1"}, 8, 2, 0, f"ncclGetPeerDevicePointer on {SPLIT} " + NO_ADDRESS.format(q=0, p=1)),
    # Addresses for the ranks of the own NCCL host only (a window on a GIN network: the LSA team is the host).
    ({"STUB_LSA_TEAM": "0:2"}, 4, 4, 1, f"ncclGetPeerDevicePointer on {COMM} " + NO_ADDRESS.format(q=1, p=2)),
    ({"STUB_LSA_TEAM": "2:2"}, 4, 4, 3, f"ncclGetPeerDevicePointer on {COMM} " + NO_ADDRESS.format(q=3, p=0)),
    ({"STUB_PEER_FAIL": "4"}, 4, 4, 1,
     f"ncclGetPeerDevicePointer on {COMM} failed on rank 1 for rank 0's window: " + INVALID_ARGUMENT),
    ({"STUB_PEER_FAIL": "4"}, 4, 2, 2,
     f"ncclGetPeerDevicePointer on {SPLIT} failed on rank 2 for rank 3's window: " + INVALID_ARGUMENT),
], ids=["no-window", "no-window-node-across-hosts", "no-window-split", "register-fails", "register-fails-split",
        "peer-null", "peer-null-split", "lsa-team-host0", "lsa-team-host1", "peer-fails", "peer-fails-split"])
def test_no_window_for_the_node_falls_back_and_leaves_nothing_behind(build, tmp_path, env, world, node, rank, why):
    out, expected, logged, result, msg = run(build, tmp_path, 23007, "unavailable", world, node, rank, env=env)
    assert result == tideSuccess, msg
    check_fallbacks(out, why)
    # Peer addresses are asked in rank order up to the first refusal, and none after a refused registration.
    assert logged == expected
    check_balanced(logged)


@pytest.mark.parametrize("world,node,rank", [(4, 4, 1), (4, 2, 2), (4, 2, 3)])
@pytest.mark.parametrize("refusal,text", [
    (1, "ncclCommWindowRegister on {where} failed on rank {q}: stub: invalid usage (NCCL error 5)"),
    (2, "ncclCommWindowRegister on {where} " + NO_WINDOW),
    (3, "ncclGetPeerDevicePointer on {where} failed on rank {q} for rank {p}'s window: stub: invalid usage "
        "(NCCL error 5)"),
    (4, "ncclGetPeerDevicePointer on {where} " + NO_ADDRESS),
], ids=["register-fails", "no-window", "peer-fails", "peer-null"])
def test_another_ranks_refusal_makes_every_rank_fall_back(build, tmp_path, world, node, rank, refusal, text):
    """NCCL gave this rank everything, the next rank reports a refusal over the agreement: this rank falls back too,
    naming the other rank's NCCL call and result, and releases its own window locally."""
    out, expected, logged, result, msg = run(build, tmp_path, 23007, "refusedby", world, node, rank, refusal)
    assert result == tideSuccess, msg
    why = text.format(where=SPLIT if node < world else COMM, q=(rank + 1) % world, p=rank)
    check_fallbacks(out, why)
    assert logged == expected
    check_balanced(logged)
    assert sum(x.startswith("WD ") for x in logged) == 1


def test_allocation_failure_registers_nothing(build, tmp_path):
    _, expected, logged, result, msg = run(build, tmp_path, 23203, "memfail", 4, 2, 1,
                                           env={"STUB_MEMALLOC_FAIL": "1"})
    assert result == tideOutOfMemory and "could not allocate 4096 bytes with ncclMemAlloc" in msg, msg
    assert logged == expected
    assert not any(x.startswith("WR ") for x in logged)  # no rank enters NCCL's registration


@pytest.mark.parametrize("world,node,rank", [(2, 2, 0), (4, 2, 3)])
def test_size_disagreement_is_refused_before_registration(build, tmp_path, world, node, rank):
    _, expected, logged, result, msg = run(build, tmp_path, 23007, "mismatch", world, node, rank)
    assert result == tideMismatch, msg
    assert f"rank {(rank + 1) % world} allocates 4104 bytes but rank {rank} allocates 4096" in msg, msg
    assert logged == expected
    check_balanced(logged)
    assert sum(x.startswith("WR ") for x in logged) == 1  # the flags only


def choices(build, tmp_path, code):
    out = run(build, tmp_path, code, "choice")[0]
    return {tuple(m.group(1, 2)): m.group(3) for m in re.finditer(r"^CHOICE (\S+) (\S+) (.*)$", out, re.M)}


def test_provider_choice_by_version_and_setting(build, tmp_path):
    old = choices(build, tmp_path, 22809)
    assert old[("auto", "nccl")].startswith("ipc forced=0 why=NCCL 2.28.9 is older than 2.29.2"), old
    assert old[("ipc", "nccl")] == "ipc forced=1 why=NCCL_TIDE_PROVIDER=ipc"
    assert old[("window", "nccl")].startswith(f"ERROR {tideUnsupported} NCCL_TIDE_PROVIDER=window"), old
    assert "NCCL 2.28.9 is older than 2.29.2" in old[("window", "nccl")]
    assert "unset NCCL_TIDE_PROVIDER (auto) or set ipc" in old[("window", "nccl")]
    for code in WINDOW_VERSIONS:
        new = choices(build, tmp_path, code)
        assert new[("auto", "nccl")].startswith("window forced=0 why=NCCL 2."), new
        assert new[("window", "nccl")] == "window forced=1 why=NCCL_TIDE_PROVIDER=window"
        assert new[("ipc", "nccl")].startswith("ipc forced=1")
        # A comm on a caller's bootstrap has no NCCL communicator: IPC, and a forced window is refused.
        assert new[("auto", "bootstrap")].startswith("ipc forced=0 why=a comm on a caller's bootstrap"), new
        assert new[("window", "bootstrap")].startswith(f"ERROR {tideUnsupported} NCCL_TIDE_PROVIDER=window")
