# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The LD_PRELOAD interposer (plugin/api/interposer.cc), on CPU against a recording stub libnccl.so.2.

tests/native/interposer_test.c makes NCCL calls (grouped and not, every argument distinct) with libnccl-tide.so preloaded,
two ways: an executable linked with the stub (global scope), and a library linked with the stub that the executable
dlopen()s RTLD_LOCAL (the stub is then invisible to RTLD_NEXT, as NCCL is under torch). The stub
(tests/native/stub_nccl/recording_stub_nccl.c) appends each call with all its arguments to a log; the program prints the
lines it expects. Equal lists = every call reached NCCL unchanged and in order. No GPU anywhere: nothing skips.
"""

import os
import re
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
STUB_SRC = os.path.join(HERE, "..", "native", "stub_nccl", "recording_stub_nccl.c")
TEST_SRC = os.path.join(HERE, "..", "native", "interposer_test.c")
NCCL_NAMES = {"ncclAllGather", "ncclReduceScatter", "ncclAllGatherConfig", "ncclReduceScatterConfig",
              "ncclGroupStart", "ncclGroupEnd", "ncclGroupSimulateEnd", "ncclRedOpCreatePreMulSum", "ncclRedOpDestroy",
              "ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort", "ncclCommWindowRegister",
              "ncclCommWindowDeregister", "ncclCommRegister", "ncclCommDeregister"}
# With NCCL_TIDE_ENABLE=1 the first eligible call tries to create a TIDE comm over the stub, which cannot work (no
# GPU, and the stub is not a usable NCCL): TIDE turns itself off for that communicator, once, and NCCL gets the call.
OFF_WARN = "TIDE is off for NCCL communicator 0xc0ffee00 from now on"
# A library built without CUDA (TIDE_BUILD_CUDA=OFF) says that instead, once, and classifies eligible calls so.
NO_CUDA = "this libnccl-tide.so is not a CUDA build"
ELIGIBLE = "eligible: run by TIDE"


def cuda_build(stderr):
    return NO_CUDA not in stderr


def _cc():
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc) to build the interposer test")
    return cc


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """{stub version: {"linked": exe, "dlopen": exe, "caller": libcaller.so}}, plus "dlopen" for no NCCL."""
    cc = _cc()
    root = tmp_path_factory.mktemp("interposer")
    built = {}
    for code in (23203, 22809):
        d = root / str(code)
        d.mkdir()
        run = lambda *a: subprocess.run([cc, *map(str, a)], check=True)  # noqa: E731
        run("-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", f"-DSTUB_VERSION={code}", STUB_SRC, "-o", d / "libnccl.so.2")
        link = ["-L", d, "-l:libnccl.so.2", f"-Wl,-rpath,{d}", "-ldl"]
        run("-Wall", "-Wextra", "-Werror", TEST_SRC, *link, "-o", d / "linked")
        run("-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-DTIDE_TEST_CALLER_LIB", TEST_SRC, *link,
            "-o", d / "libcaller.so")
        built[code] = {"linked": d / "linked", "caller": d / "libcaller.so"}
    dlopen_exe = root / "dlopen"
    subprocess.run([cc, "-Wall", "-Wextra", "-Werror", "-DTIDE_TEST_DLOPEN", TEST_SRC, "-ldl", "-o", str(dlopen_exe)],
                   check=True)
    built["dlopen"] = dlopen_exe
    return built


def run_prog(native, tmp_path, argv, enable, debug="WARN", extra=None):
    log = tmp_path / "stub.log"
    if log.exists():
        log.unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_TIDE_")}
    env.update(LD_PRELOAD=native.library_path(), STUB_NCCL_LOG=str(log), NCCL_TIDE_DEBUG=debug)
    if enable is not None:
        env["NCCL_TIDE_ENABLE"] = enable
    env.update(extra or {})
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, timeout=60)
    logged = log.read_text().splitlines() if log.exists() else []
    return p, logged


def expect_pass_through(p, logged, lib):
    assert p.returncode == 0, f"rc {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert "FAIL" not in p.stdout, p.stdout
    expected = [line[len("EXPECT "):] for line in p.stdout.splitlines() if line.startswith("EXPECT ")]
    assert len(expected) >= 10
    assert logged == expected  # same calls, same arguments, same order (groups included)
    bound = dict(line.split(" ", 2)[1:] for line in p.stdout.splitlines() if line.startswith("BOUND "))
    assert set(bound) == NCCL_NAMES
    # The caller's references really went through the interposer (else this test would prove nothing).
    for name, where in bound.items():
        assert os.path.realpath(where) == os.path.realpath(lib), (name, where)


@pytest.mark.parametrize("enable", [None, "0", "1"])
@pytest.mark.parametrize("how", ["linked", "dlopen-local"])
def test_calls_reach_nccl_unchanged(native, programs, tmp_path, enable, how):
    code = 23203
    if how == "linked":
        argv = [programs[code]["linked"], "0"]
    else:
        argv = [programs["dlopen"], "0", programs[code]["caller"]]
    p, logged = run_prog(native, tmp_path, argv, enable)
    expect_pass_through(p, logged, native.library_path())
    if how == "dlopen-local":
        # The stub is not in the global scope: RTLD_NEXT could not have found it; RTLD_NOLOAD did.
        assert "GLOBAL pncclAllGather hidden" in p.stdout
    tide_lines = [x for x in p.stderr.splitlines() if "NCCL TIDE " in x]
    if enable == "1":
        # Every call still reaches NCCL; the user is told once, for the one communicator with an eligible call.
        interposer = [x for x in tide_lines if "Interposer:" in x]
        assert len(interposer) == 1, p.stderr
        if cuda_build(p.stderr):
            assert OFF_WARN in interposer[0] and "tideCommCreate failed" in interposer[0], p.stderr
        else:
            assert NO_CUDA in interposer[0] and "WARN" in interposer[0], p.stderr
    else:
        assert tide_lines == [], p.stderr  # pass-through says nothing


def test_enabled_classifies_each_reason_once(native, programs, tmp_path):
    p, logged = run_prog(native, tmp_path, [programs[23203]["linked"], "0"], "1", debug="INFO")
    expect_pass_through(p, logged, native.library_path())
    info = [x for x in p.stderr.splitlines() if "NCCL TIDE INFO Interposer:" in x and " call " in x]
    info += [x for x in p.stderr.splitlines() if "NCCL TIDE WARN Interposer:" in x and NO_CUDA in x]  # said at WARN
    for reason in ["smaller than NCCL_TIDE_ENABLE_MIN_BYTES", ELIGIBLE if cuda_build(p.stderr) else NO_CUDA,
                   "an op TIDE does not run", "type other than fp32/fp16/bf16", "unknown ncclDataType_t",
                   "a ...Config call", "without NCCL_TIDE_RS_ACCUM=FP32"]:
        assert sum(reason in x for x in info) == 1, (reason, p.stderr)
    # TRACE: one line per collective call.
    p, logged = run_prog(native, tmp_path, [programs[23203]["linked"], "0"], "1", debug="TRACE")
    expect_pass_through(p, logged, native.library_path())
    trace = [x for x in p.stderr.splitlines() if "NCCL TIDE TRACE Interposer:" in x and " comm 0x" in x]
    assert len(trace) == len([x for x in logged if x.split()[0] in ("AG", "RS", "AGC", "RSC")]), p.stderr


# "<name> comm <ptr> count <n> dtype <d> op <o>: <reason>" (plugin/api/interposer.cc classify)
TRACE_CALL = re.compile(r"TRACE Interposer: (ncclAllGather|ncclReduceScatter)(Config)? comm \S+ count (\d+) "
                        r"dtype (\d+) op (-?\d+): (.*)$")
NCCL_SIZES = {2: 4, 6: 2, 7: 4, 9: 2, 42: 0}  # the datatypes interposer_test.c uses


def test_premul_ops_resolve_by_their_scalar(native, programs, tmp_path):
    # ncclRedOpCreatePreMulSum / ncclRedOpDestroy reach NCCL unchanged (expect_pass_through); what the interposer
    # makes of each op shows in the TRACE line of the call that uses it: host scalars 1.0 and 0.25 are TIDE's (a
    # sum, a premultiplied sum), a device scalar stays with NCCL, saying why.
    p, logged = run_prog(native, tmp_path, [programs[23203]["linked"], "0"], "1", debug="TRACE")
    expect_pass_through(p, logged, native.library_path())
    ops = {int(x.split()[1]): x for x in logged if x.startswith("PMS ")}
    assert sorted(ops) == [5, 6, 7], logged
    assert "0x3f800000 7 1" in ops[5] and "0x3e800000 7 1" in ops[6] and " 7 0 " in ops[7], logged
    calls = {}
    for m in filter(None, map(TRACE_CALL.search, p.stderr.splitlines())):
        calls[int(m.group(5))] = m.group(6)  # the last call of each op
    assert all(calls[op].startswith(("eligible", NO_CUDA)) for op in (5, 6)), calls
    assert calls[7].startswith("reduce-scatter with an op TIDE does not run: a PREMUL_SUM op with a device scalar")
    assert calls[4].startswith(("eligible", NO_CUDA)), calls  # ncclAvg: a premultiply by 1/W, TIDE's too


def test_counters_match_every_call(native, programs, tmp_path):
    """tideInterposerGetCounters(NULL): every all-gather and reduce-scatter counted once, under the reason its TRACE
    line gives, with count times the element size as its bytes."""
    p, logged = run_prog(native, tmp_path, [programs[23203]["linked"], "0"], "1", debug="TRACE")
    expect_pass_through(p, logged, native.library_path())
    from nccl_tide import _native as N

    lib = N.lib()
    index = {lib.tideInterposerReasonString(r).decode(): r for r in range(1, N.TIDE_INTERPOSER_MAX_REASONS)
             if lib.tideInterposerReasonString(r)}
    assert lib.tideInterposerReasonString(0) is None and len(index) >= 10
    # In a CUDA build an eligible call reaches NCCL because the stub's communicator turns TIDE off, or, inside the
    # group over two communicators or the simulated group, because that group goes to NCCL whole: all count as
    # "eligible" here.
    eligible = {r for t, r in index.items()
                if t.startswith(("TIDE is off", "inside a group that spans", "inside a group ended by"))}
    want = {}
    for m in filter(None, map(TRACE_CALL.search, p.stderr.splitlines())):
        coll = 0 if m.group(1) == "ncclAllGather" else 1
        text = m.group(6)
        reason = "eligible" if text.startswith("eligible") else next(r for t, r in index.items() if text.startswith(t))
        calls, nbytes = want.get((coll, reason), (0, 0))
        want[(coll, reason)] = (calls + 1, nbytes + int(m.group(3)) * NCCL_SIZES[int(m.group(4))])
    got = {}
    for line in p.stdout.splitlines():
        if line.startswith("COUNT "):
            coll, reason, calls, nbytes = map(int, line.split()[1:])
            key = (coll, "eligible" if reason in eligible else reason)
            if calls:
                have = got.get(key, (0, 0))
                got[key] = (have[0] + calls, have[1] + nbytes)
    assert got == want, (got, want)
    assert len(want) >= 6  # below the threshold, type, op, Config, no CUDA (or off), unknown dtype, half without FP32


def test_min_bytes_param(native, programs, tmp_path):
    # Threshold 0: no call is too small (all are still passed through).
    p, logged = run_prog(native, tmp_path, [programs[23203]["linked"], "0"], "1", debug="INFO",
                         extra={"NCCL_TIDE_ENABLE_MIN_BYTES": "0"})
    expect_pass_through(p, logged, native.library_path())
    assert "min bytes 0" in p.stderr
    assert "smaller than NCCL_TIDE_ENABLE_MIN_BYTES" not in p.stderr
    # 4G: even the 2 GiB fp16 reduce-scatter is too small; nothing is eligible.
    p, logged = run_prog(native, tmp_path, [programs[23203]["linked"], "0"], "1", debug="INFO",
                         extra={"NCCL_TIDE_ENABLE_MIN_BYTES": "4G"})
    expect_pass_through(p, logged, native.library_path())
    assert "min bytes 4294967296" in p.stderr
    assert ELIGIBLE not in p.stderr and NO_CUDA not in p.stderr
    assert OFF_WARN not in p.stderr  # nothing eligible: no TIDE comm is ever attempted


RS_BF16_TRACE = "TRACE Interposer: ncclReduceScatter comm 0xc0ffee00 count 1048576 dtype 9"


def test_rs_accum_fp32_makes_half_precision_reduce_scatter_eligible(native, programs, tmp_path):
    # The 2 MiB bf16 sum is the first call above the threshold: without NCCL_TIDE_RS_ACCUM=FP32 it is left to NCCL
    # (reason logged), with it it is eligible and is the call that tries (and fails, on the stub) to create the TIDE
    # comm. Either way NCCL gets every call unchanged.
    argv = [programs[23203]["linked"], "0"]
    p, logged = run_prog(native, tmp_path, argv, "1", debug="TRACE")
    expect_pass_through(p, logged, native.library_path())
    rs_trace = [x for x in p.stderr.splitlines() if RS_BF16_TRACE in x]
    assert len(rs_trace) == 1 and "without NCCL_TIDE_RS_ACCUM=FP32" in rs_trace[0], p.stderr
    p, logged = run_prog(native, tmp_path, argv, "1", debug="TRACE", extra={"NCCL_TIDE_RS_ACCUM": "fp32"})
    expect_pass_through(p, logged, native.library_path())
    rs_trace = [x for x in p.stderr.splitlines() if RS_BF16_TRACE in x]
    if not cuda_build(p.stderr):
        assert len(rs_trace) == 1 and NO_CUDA in rs_trace[0], p.stderr
        return
    assert len(rs_trace) == 1 and ELIGIBLE in rs_trace[0], p.stderr
    lines = p.stderr.splitlines()
    off = [i for i, x in enumerate(lines) if OFF_WARN in x]
    assert len(off) == 1 and lines.index(rs_trace[0]) < off[0], p.stderr  # this call was the first attempt
    assert "with fp32 accumulation (NCCL_TIDE_RS_ACCUM=FP32)" in p.stderr


@pytest.mark.parametrize("enable", [None, "1"])
def test_nccl_without_config_collectives(native, programs, tmp_path, enable):
    # NCCL 2.28.9 has no pncclAllGatherConfig: the Config entry points refuse (ncclInvalidUsage = 5) with one WARN
    # each; the plain collectives still pass through.
    p, logged = run_prog(native, tmp_path, [programs[22809]["linked"], "5"], enable)
    expect_pass_through(p, logged, native.library_path())
    warns = [x for x in p.stderr.splitlines() if "NCCL TIDE WARN Interposer:" in x and "cannot forward" in x]
    assert len(warns) == 2, p.stderr
    assert all("NCCL >= 2.31.2" in x and "ncclInvalidUsage" in x for x in warns), p.stderr


@pytest.mark.parametrize("enable", [None, "1"])
def test_no_nccl_loaded_is_an_error_not_a_crash(native, programs, tmp_path, enable):
    p, logged = run_prog(native, tmp_path, [programs["dlopen"], "0", "nonccl"], enable)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "NONCCL 2 2" in p.stdout  # ncclSystemError, both times
    warns = [x for x in p.stderr.splitlines() if "no NCCL library (libnccl.so.2) is loaded" in x]
    assert len(warns) == 1, p.stderr  # once
    assert logged == []


def test_invalid_enable_value_is_pass_through(native, programs, tmp_path):
    p, logged = run_prog(native, tmp_path, [programs[23203]["linked"], "0"], "yes")
    expect_pass_through(p, logged, native.library_path())
    assert "NCCL_TIDE_ENABLE='yes' is not valid" in p.stderr
    assert OFF_WARN not in p.stderr


def test_exports_only_the_interposer_names(native, repo):
    lib = native.library_path()
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    names = {re.sub(r"@.*", "", f[2]) for f in (line.split() for line in out.splitlines()) if len(f) >= 3}
    assert {n for n in names if n.startswith("nccl") or n.startswith("pnccl")} == NCCL_NAMES
    assert all(n.startswith("tide") or n in NCCL_NAMES for n in names), sorted(names)
    r = subprocess.run(["bash", str(repo / "ci" / "check_exports.sh"), lib], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_attach_layout_api(native):
    """tideAttachLayout / tideDetachLayout (layout-aware interposed calls): argument checks, replace, detach. The
    calls that use an attachment need a GPU and NCCL (tests/gpu/test_interposer_gpu.py)."""
    import ctypes

    import nccl_tide
    import nccl_tide.interposer
    from nccl_tide import _native as N
    from nccl_tide.errors import InvalidArgumentError, UnsupportedError

    lib = N.lib()
    L = nccl_tide.Layout([1000, 3, 64 * 5], "bf16", 4, rank=1, row_numels=[1, 1, 64])
    comm, buf = ctypes.c_void_p(0xC0FFEE00), ctypes.c_void_p(0x7F0000001000)
    assert lib.tideAttachLayout(None, buf, L.handle) == N.tideInvalidArgument
    assert "ncclComm is NULL" in N.last_error()
    assert lib.tideAttachLayout(comm, None, L.handle) == N.tideInvalidArgument
    assert lib.tideAttachLayout(comm, buf, None) == N.tideInvalidArgument
    assert lib.tideDetachLayout(comm, None) == N.tideInvalidArgument
    rc = lib.tideAttachLayout(comm, buf, L.handle)
    if rc == N.tideUnsupported:  # a build without CUDA: nothing to attach to
        assert "not a CUDA build" in N.last_error()
        with pytest.raises(UnsupportedError):
            nccl_tide.interposer.attach_layout(0xC0FFEE00, 0x7F0000001000, L)
        return
    assert rc == N.tideSuccess, N.last_error()
    L2 = nccl_tide.Layout([77], "fp32", 4, rank=1)
    assert lib.tideAttachLayout(comm, buf, L2.handle) == N.tideSuccess  # replaces
    assert lib.tideDetachLayout(comm, buf) == N.tideSuccess
    assert lib.tideDetachLayout(comm, buf) == N.tideInvalidArgument  # nothing attached any more
    assert "no layout is attached" in N.last_error()
    # The Python wrapper takes addresses (or tensors / process groups) and raises typed errors.
    nccl_tide.interposer.attach_layout(0xC0FFEE00, 0x7F0000002000, L)
    nccl_tide.interposer.detach_layout(0xC0FFEE00, 0x7F0000002000)
    with pytest.raises(InvalidArgumentError, match="no layout is attached"):
        nccl_tide.interposer.detach_layout(0xC0FFEE00, 0x7F0000002000)


COUNTERS_SCRIPT = """
import ctypes, json, sys
stub = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)   # the process's NCCL
me = ctypes.CDLL(None)                                     # global scope: the preloaded interposer first
ag, rs = me.ncclAllGather, me.ncclReduceScatter
ag.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
rs.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
               ctypes.c_void_p]
for count, dtype in json.loads(sys.argv[2]):
    assert ag(0x1000, 0x2000, count, dtype, 0xC0FFEE00, 0) == 0
for count, dtype, op in json.loads(sys.argv[3]):
    assert rs(0x3000, 0x4000, count, dtype, op, 0xC0FFEE00, 0) == 0
from nccl_tide import interposer
print(json.dumps({"all": interposer.counters(), "comm": interposer.counters(0xC0FFEE00),
                  "other": interposer.counters(0xC0FFEE01), "share": interposer.taken_share()}))
"""


def test_python_counters(native, programs, tmp_path, rng):
    """nccl_tide.interposer.counters(): per reason, calls and per-rank bytes, for the process and per communicator;
    random calls through the interposer into the stub, each either below the size threshold or of a type TIDE does
    not reduce, so the expected tally is known without a GPU."""
    stub = programs[23203]["linked"].parent / "libnccl.so.2"
    ags = [[int(rng.integers(1, 1000)), int(rng.choice([0, 7, 9]))] for _ in range(int(rng.integers(1, 6)))]
    rss = [[int(rng.integers(1 << 19, 1 << 20)), 2, 0] for _ in range(int(rng.integers(1, 6)))]  # int32 sums
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_TIDE_")}
    env.update(LD_PRELOAD=native.library_path(), NCCL_TIDE_ENABLE="1", NCCL_TIDE_LIBRARY_PATH=native.library_path(),
               STUB_NCCL_LOG=str(tmp_path / "stub.log"))
    import json
    import sys

    p = subprocess.run([sys.executable, "-c", COUNTERS_SCRIPT, str(stub), json.dumps(ags), json.dumps(rss)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    got = json.loads(p.stdout.splitlines()[-1])
    size = {0: 1, 2: 4, 7: 4, 9: 2}
    ag_bytes = sum(c * size[d] for c, d in ags)
    rs_bytes = sum(c * size[d] for c, d, _ in rss)
    for scope in ("all", "comm"):
        c = got[scope]
        assert c["all_gather"]["taken"] == c["all_gather"]["copy_out"] == {"calls": 0, "bytes": 0}, c
        assert c["all_gather"]["to_nccl"] == {"smaller than NCCL_TIDE_ENABLE_MIN_BYTES":
                                              {"calls": len(ags), "bytes": ag_bytes}}, c
        assert c["reduce_scatter"]["to_nccl"] == {"reduce-scatter in a type other than fp32/fp16/bf16":
                                                  {"calls": len(rss), "bytes": rs_bytes}}, c
    assert got["other"]["all_gather"] == {"taken": {"calls": 0, "bytes": 0}, "to_nccl": {},
                                          "copy_out": {"calls": 0, "bytes": 0}}, got["other"]
    assert got["share"] == {"all_gather": 0.0, "reduce_scatter": 0.0}


def test_counters_struct_size_and_version_are_checked(native):
    import ctypes

    from nccl_tide import _native as N

    lib = N.lib()
    c = N.tideInterposerCounters_t()
    assert lib.tideInterposerGetCounters(None, None) == N.tideInvalidArgument
    assert lib.tideInterposerGetCounters(None, ctypes.byref(c)) == N.tideInvalidArgument  # size 0: not set
    assert "set both before the call" in N.last_error()
    c.size, c.version = ctypes.sizeof(c), N.TIDE_INTERPOSER_COUNTERS_VERSION + 1
    assert lib.tideInterposerGetCounters(None, ctypes.byref(c)) == N.tideInvalidArgument
    c.version = N.TIDE_INTERPOSER_COUNTERS_VERSION
    assert lib.tideInterposerGetCounters(None, ctypes.byref(c)) == N.tideSuccess
