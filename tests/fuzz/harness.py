# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Runs one fuzz case through the C API (ctypes, nccl_tide._native) and checks it against model.py and, for small
layouts, the numpy reference (nccl_tide.reference). check_case() raises CaseFailure with a readable reason on any
disagreement; a crash or sanitizer report ends the process (the fuzzer saved the case first).

Checked for every case:
  * tideLayoutCreate returns exactly what the model expects: tideSuccess, or tideInvalidArgument with a non-empty
    tideGetLastError() and *layout set to NULL; never another code (tideOutOfMemory included: no valid layout
    needs more than O(nParams) host memory);
  * it returns quickly and its peak-RSS growth stays within O(nParams) (no allocation sized by numel, world size,
    chunk or pacing cap);
  * every derived value (info, every or a sample of the parameters, schedule lengths and steps, the hash)
    matches the model; out-of-range queries and bad out-struct sizes/versions fail cleanly;
  * when small: host AG byte-exact and host RS bit-exact against the numpy reference, outputs poisoned first;
    bad executor arguments (NULL entries, overlapping buffers, unknown op/outType, non-finite scale, a
    non-reducible dtype) return tideInvalidArgument and leave every output untouched.
"""

import ctypes
import os
import random
import time

import numpy as np

import lifetimes as L  # noqa: E402
import model as M
from nccl_tide import _native as N
from nccl_tide import reference as ref

SMALL_BYTES = 1 << 21  # host executors run when all ranks' buffers together stay under this
CREATE_SECONDS = 5.0  # even the largest valid layout (2^20 params) is created well within this under ASan
RSS_SLACK = 48 << 20  # allocator/ASan noise on top of the O(nParams) bound


class CaseFailure(AssertionError):
    pass


def _fail(msg):
    raise CaseFailure(msg)


def _last_error() -> str:
    return N.last_error()


def _peak_rss_reset() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def env_defaults():
    """Effective NCCL_TIDE_RS_CHUNK_BYTES / NCCL_TIDE_PACE_BYTES as the library reports them."""
    lib, vals = N.lib(), {}
    count = ctypes.c_int()
    N.check(lib.tideParamCount(ctypes.byref(count)))
    for i in range(count.value):
        name, value = ctypes.c_char_p(), ctypes.c_char_p()
        N.check(lib.tideParamDescribe(i, ctypes.byref(name), None, None, None, ctypes.byref(value)))
        vals[name.value.decode()] = value.value.decode()
    return int(vals["NCCL_TIDE_RS_CHUNK_BYTES"]), int(vals["NCCL_TIDE_PACE_BYTES"])


def _u64_array(values):
    return (ctypes.c_uint64 * max(len(values), 1))(*[v % M.U64 for v in values])


def _int_array(values):
    return (ctypes.c_int * max(len(values), 1))(*[((v + (1 << 31)) % (1 << 32)) - (1 << 31) for v in values])


def _wrap_int(v):
    return ((v + (1 << 31)) % (1 << 32)) - (1 << 31)


def create(case):
    """Calls tideLayoutCreate exactly as the case says; returns (rc, handle, seconds, rss_growth_bytes)."""
    numels, rows, dtypes = M.expand(case["numels"]), M.expand(case.get("rows")), M.expand(case["dtypes"])
    c_numels = None if numels is None else _u64_array(numels)
    c_rows = None if rows is None else _u64_array(rows)
    c_dtypes = None if dtypes is None else _int_array(dtypes)
    n = case.get("n_params", len(numels) if numels is not None else 0)
    d = N.tideLayoutDesc_t()
    d.size = case.get("desc_size", ctypes.sizeof(d)) % M.U64
    d.version = case.get("desc_version", 1) % (1 << 32)
    d.nParams = _wrap_int(n)
    d.numels = ctypes.cast(c_numels, ctypes.POINTER(ctypes.c_uint64)) if c_numels is not None else None
    d.rowNumels = ctypes.cast(c_rows, ctypes.POINTER(ctypes.c_uint64)) if c_rows is not None else None
    d.dtypes = ctypes.cast(c_dtypes, ctypes.POINTER(N.tideDataType_t)) if c_dtypes is not None else None
    d.worldSize, d.ranksPerNode, d.rank = (_wrap_int(case[k]) for k in ("world", "rpn", "rank"))
    cfg = case.get("config")
    c_cfg = None
    if cfg is not None:
        c_cfg = N.tideConfig_t(cfg["size"] % M.U64, cfg["version"] % (1 << 32), cfg["chunk"] % M.U64,
                               cfg["pace"] % M.U64)  # fmt: skip
    out = N.tideLayout_t(0xBAD)
    measure = _peak_rss_reset()
    before = _status_kb("VmRSS")
    t0 = time.monotonic()
    rc = N.lib().tideLayoutCreate(ctypes.byref(d), ctypes.byref(c_cfg) if c_cfg is not None else None,
                                  ctypes.byref(out))  # fmt: skip
    dt = time.monotonic() - t0
    growth = (_status_kb("VmHWM") - before) * 1024 if measure else 0
    return rc, out, dt, growth


def _info(h, size=None, version=1):
    info = N.tideLayoutInfo_t()
    info.size, info.version = ctypes.sizeof(info) if size is None else size, version
    return N.lib().tideLayoutGetInfo(h, ctypes.byref(info)), info


def _param(h, i, size=None, version=1):
    p = N.tideParamInfo_t()
    p.size, p.version = ctypes.sizeof(p) if size is None else size, version
    return N.lib().tideLayoutGetParam(h, i, ctypes.byref(p)), p


def _step(h, node, i, size=None, version=1):
    s = N.tideScheduleStep_t()
    s.size, s.version = ctypes.sizeof(s) if size is None else size, version
    return N.lib().tideLayoutGetScheduleStep(h, node, i, ctypes.byref(s)), s


def _expect_invalid(rc, what):
    if rc != N.tideInvalidArgument:
        _fail(f"{what}: expected tideInvalidArgument, got {rc}")
    if not _last_error():
        _fail(f"{what}: tideInvalidArgument with an empty tideGetLastError()")


def check_queries(h, e: M.Expected, rnd: random.Random):
    lib = N.lib()
    rc, info = _info(h)
    if rc:
        _fail(f"tideLayoutGetInfo -> {rc}: {_last_error()}")
    got = (info.nParams, info.worldSize, info.ranksPerNode, info.nNodes, info.rank, info.sendBytes, info.slotBytes,
           info.rsOutNumel, info.rsChunkNumel, info.rsNumChunks, info.rsStagingBytes, info.slotReuseFits,
           info.paceBytes)  # fmt: skip
    want = (e.n_params, e.world, e.rpn, e.n_nodes, e.rank, e.send_bytes, e.slot_bytes, e.rs_out_numel,
            e.rs_chunk_numel, e.rs_num_chunks, e.rs_staging_bytes, e.slot_reuse_fits, e.pace_bytes)  # fmt: skip
    if got != want:
        names = "nParams world rpn nNodes rank sendBytes slotBytes rsOutNumel rsChunkNumel rsNumChunks " \
                "rsStagingBytes slotReuseFits paceBytes".split()  # fmt: skip
        diff = {k: (g, w) for k, g, w in zip(names, got, want) if g != w}
        _fail(f"layout info differs from the model (got, want): {diff}")
    if e.hash is not None and info.hash != e.hash:
        _fail(f"hash {info.hash:016x} != model {e.hash:016x}")
    # Parameters: all of them when few, else the ends and a sample.
    idx = range(e.n_params) if e.n_params <= 512 else sorted(
        {0, 1, e.n_params - 1} | {rnd.randrange(e.n_params) for _ in range(64)})  # fmt: skip
    for i in idx:
        rc, p = _param(h, i)
        if rc:
            _fail(f"tideLayoutGetParam({i}) -> {rc}")
        got = (p.shardNumel, p.sendOffset, p.slotOffset, p.rsOutOffset)
        want = (e.shard[i], e.send_offset[i], e.slot_offset[i], e.rs_out_offset[i])
        if got != want:
            _fail(f"param {i} (shard, sendOff, slotOff, rsOff) = {got}, model {want}")
        if p.slotOffset % M.SLOT_ALIGN or p.sendOffset % p.elemSize:
            _fail(f"param {i}: misaligned offsets {p.sendOffset} / {p.slotOffset}")
    # Out-of-range and malformed queries fail cleanly.
    for i in (-1, e.n_params, rnd.choice([-(1 << 31), (1 << 31) - 1])):
        _expect_invalid(_param(h, i)[0], f"tideLayoutGetParam({i})")
    for bad in ((0, 1), (8, 1), (None, 0), (None, 2), (None, 1 << 31)):
        _expect_invalid(_info(h, *bad)[0], f"tideLayoutGetInfo size/version {bad}")
        _expect_invalid(_param(h, 0, *bad)[0], f"tideLayoutGetParam size/version {bad}")
    # Schedule: lengths of a few nodes, a sample of steps, and the out-of-range ones.
    count = ctypes.c_int(-7)
    nodes = {0, e.n_nodes - 1, rnd.randrange(e.n_nodes)}
    for node in nodes:
        rc = lib.tideLayoutGetScheduleLength(h, node, ctypes.byref(count))
        if rc or count.value != e.sched_len:
            _fail(f"schedule length of node {node}: rc {rc}, {count.value}, model {e.sched_len}")
        steps = range(e.sched_len) if e.sched_len <= 64 else sorted(
            {0, e.sched_len - 1} | {rnd.randrange(e.sched_len) for _ in range(32)})  # fmt: skip
        for i in steps:
            rc, s = _step(h, node, i)
            got = (s.round, s.sendToNode, s.recvFromNode, s.sendBlockNode, s.recvBlockNode, s.offset, s.bytes)
            want = M.expected_step(e, node, i)
            if rc or got != want:
                _fail(f"step {i} of node {node}: rc {rc} {got}, model {want}")
        for i in (-1, e.sched_len):
            _expect_invalid(_step(h, node, i)[0], f"tideLayoutGetScheduleStep(node {node}, {i})")
        if e.sched_len:
            _expect_invalid(_step(h, node, 0, 4)[0], "tideLayoutGetScheduleStep size 4")
    for node in (-1, e.n_nodes):
        _expect_invalid(lib.tideLayoutGetScheduleLength(h, node, ctypes.byref(count)), f"length of node {node}")
    _expect_invalid(lib.tideLayoutGetScheduleLength(h, 0, None), "length into NULL")


# -- host executors on small layouts ---------------------------------------------------------------------------------


def _random_grad(rng: np.random.Generator, n: int, dt: int) -> np.ndarray:
    x = rng.standard_normal(n).astype(np.float32) * np.float32(rng.choice([1e-3, 1.0, 1e4]))
    if n and rng.random() < 0.3:  # specials: +-0, inf, nan, subnormal, huge (overflows fp16/bf16 sums)
        k = rng.integers(0, n, size=max(1, n // 8))
        x[k] = rng.choice(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 6.0e4, 3.0e38], np.float32), k.size)
    name = M.DTYPE_NAMES[dt]
    out = ref.from_f32(x, name).copy()
    if n and rng.random() < 0.3:  # NaN inputs of both signs and with payloads (from_f32 writes canonical ones)
        k = rng.integers(0, n, size=max(1, n // 8))
        bits = out.view(np.uint32 if name == "fp32" else np.uint16)
        pool = {"fp32": [0xFFC00000, 0x7FA00001, 0xFFE12345, 0x7F800001], "bf16": [0xFFC0, 0x7FA1, 0xFF81, 0x7F81],
                "fp16": [0xFE00, 0x7D01, 0xFC01, 0x7E55]}[name]  # fmt: skip
        bits[k] = rng.choice(np.array(pool, bits.dtype), k.size)
    return out


def _same_bits(a: np.ndarray, b: np.ndarray, dt: str) -> bool:
    """Bit for bit, NaNs included: every executor writes the canonical NaN (include/tide.h "NaN results")."""
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def small_enough(e: M.Expected) -> bool:
    return e.world * e.slot_bytes * 3 <= SMALL_BYTES and e.world * e.n_params <= 4096


def run_executors(h, e: M.Expected, dtypes, numels, rows, rng: np.random.Generator, rnd: random.Random):
    lib, W, P = N.lib(), e.world, e.n_params
    # All-gather: random shard bytes, poisoned outputs.
    shards = [[rng.integers(0, 256, e.shard[i] * M.ELEM[dtypes[i]], dtype=np.uint8) for i in range(P)]
              for _ in range(W)]  # fmt: skip
    params = [[np.full(e.shard[i] * M.ELEM[dtypes[i]] * W, 0xA5, np.uint8) for i in range(P)] for _ in range(W)]
    src = [a.ctypes.data for r in shards for a in r]
    dst = [a.ctypes.data for r in params for a in r]
    # Bad calls first: each must fail and leave the poison in place.
    bad = []
    if W * P > 0:
        k = rnd.randrange(W * P)
        bad.append(("NULL shard", src[:k] + [None] + src[k + 1 :], dst))
        bad.append(("NULL param", src, dst[:k] + [None] + dst[k + 1 :]))
        if M.ELEM[dtypes[k % P]] > 1:  # an odd address for a multi-byte element type (tide.h "Buffer alignment")
            bad.append(("misaligned shard", src[:k] + [src[k] + 1] + src[k + 1 :], dst))
            bad.append(("misaligned param", src, dst[:k] + [dst[k] + 1] + dst[k + 1 :]))
        if W * P > 1:
            j = rnd.choice([x for x in range(W * P) if x != k])
            bad.append(("overlapping outputs", src, [dst[j] if x == k else v for x, v in enumerate(dst)]))
            bad.append(("output over an input", src, [src[j] if x == k else v for x, v in enumerate(dst)]))
    for what, s, d in bad:
        rc = lib.tideHostAllGather(h, N.pointer_table(s), N.pointer_table(d))
        if what == "output over an input" and rc == 0:
            # legal only when the shard is exactly that rank's own segment; our buffers are distinct, so never
            _fail("host AG accepted an output on top of another rank's input")
        _expect_invalid(rc, f"host AG with {what}")
        if any(np.any(a != 0xA5) for r in params for a in r):
            _fail(f"host AG wrote output before failing ({what})")
    rc = lib.tideHostAllGather(h, N.pointer_table(src), N.pointer_table(dst))
    if rc:
        _fail(f"host AG -> {rc}: {_last_error()}")
    for r in range(W):
        for i in range(P):
            want = ref.all_gather_param([shards[s][i] for s in range(W)])
            if not np.array_equal(params[r][i], want):
                _fail(f"host AG: rank {r} param {i} differs from the reference")

    # Reduce-scatter.
    reducible = all(d in M.REDUCIBLE for d in dtypes)
    names = [M.DTYPE_NAMES[d] for d in dtypes]
    grads = [[_random_grad(rng, numels[i], dtypes[i]) if dtypes[i] in M.REDUCIBLE
              else rng.integers(0, 256, numels[i] * M.ELEM[dtypes[i]], dtype=np.uint8) for i in range(P)]
             for _ in range(W)]  # fmt: skip
    out_code = rnd.choice([0, 1, 2])
    out_name = M.DTYPE_NAMES[out_code]
    op = rnd.choice([0, 1, 2])
    scale = rnd.choice([1.0, -0.5, 0.37, 3.0e38, 1e-30, 0.0])
    odt = ref.to_dtype(out_name)
    outs = [np.empty(e.rs_out_numel, odt.storage) for _ in range(W)]
    for o in outs:
        o.view(np.uint8)[...] = 0x7B
    gsrc = [a.ctypes.data for r in grads for a in r]
    odst = [o.ctypes.data for o in outs]

    def untouched():
        return all(np.all(o.view(np.uint8) == 0x7B) for o in outs)

    bad_rs = [("op", out_code, rnd.choice([-1, 3, 1 << 30, -(1 << 31)]), 1.0),
              ("outType", rnd.choice([-1, 3, 6, 7, 99, -(1 << 31)]), op, 1.0),
              ("scale", out_code, op, rnd.choice([float("nan"), float("inf"), float("-inf")]))]  # fmt: skip
    for what, oc, o, sc in bad_rs:
        _expect_invalid(lib.tideHostReduceScatter(h, N.pointer_table(gsrc), N.pointer_table(odst), oc, o, sc),
                        f"host RS with bad {what}")  # fmt: skip
    if reducible and gsrc and M.ELEM[dtypes[0]] > 1:
        _expect_invalid(lib.tideHostReduceScatter(h, N.pointer_table([gsrc[0] + 1] + gsrc[1:]), N.pointer_table(odst),
                                                  out_code, op, scale), "RS with a misaligned gradient")  # fmt: skip
    if W > 1:
        k = rnd.randrange(W)
        _expect_invalid(lib.tideHostReduceScatter(h, N.pointer_table(gsrc), N.pointer_table(
            [odst[(k + 1) % W] if x == k else v for x, v in enumerate(odst)]), out_code, op, scale), "RS overlap")
    if not untouched():
        _fail("host RS wrote output before failing")
    rc = lib.tideHostReduceScatter(h, N.pointer_table(gsrc), N.pointer_table(odst), out_code, op, scale)
    if not reducible:
        _expect_invalid(rc, "host RS over a non-reducible dtype")
        if not untouched():
            _fail("host RS wrote output before rejecting a non-reducible dtype")
        return
    if rc:
        _fail(f"host RS -> {rc}: {_last_error()}")
    opname = ["sum", "avg", "premul"][op]
    want = ref.rs_reference(grads, numels, rows, names, e.rpn, out_name, opname, scale)
    for r in range(W):
        if not _same_bits(outs[r], want[r], out_name):
            bad_at = int(np.flatnonzero(outs[r].view(odt.storage) != want[r])[0])
            _fail(f"host RS rank {r} ({opname}, out {out_name}, scale {scale}) differs from the reference at "
                  f"element {bad_at}: {outs[r][bad_at]!r} vs {want[r][bad_at]!r}")  # fmt: skip


def check_case(case: dict, env_chunk: int, env_pace: int):
    """Runs one case; returns "ok", "error" or "exec" (ok and the host executors ran). Raises CaseFailure."""
    kind = case.get("kind")
    if kind in ("lifetime", "pyint"):
        try:
            return L.check_lifetime(case) if kind == "lifetime" else L.check_pyint(case)
        except L.LifetimeFailure as e:
            raise CaseFailure(str(e)) from None
    with np.errstate(all="ignore"):  # inf/NaN inputs are on purpose; the reference folds them like the library
        return _check_case(case, env_chunk, env_pace)


def _check_case(case: dict, env_chunk: int, env_pace: int):
    kind, e = M.expect(case, env_chunk, env_pace)
    rc, h, seconds, growth = create(case)
    try:
        if seconds > CREATE_SECONDS:
            _fail(f"tideLayoutCreate took {seconds:.1f} s")
        if kind == "error":
            _expect_invalid(rc, f"tideLayoutCreate ({e})")
            if h.value is not None:
                _fail("failed tideLayoutCreate left *layout non-NULL")
            return "error"
        if rc != N.tideSuccess:
            _fail(f"tideLayoutCreate -> {rc} ({_last_error()}); the model expects success")
        if not h.value:
            _fail("tideLayoutCreate succeeded with a NULL layout")
        bound = 200 * e.n_params + RSS_SLACK  # ~72 B per parameter plus ASan shadow/redzones
        if growth > bound:
            _fail(f"tideLayoutCreate grew peak RSS by {growth >> 20} MiB for {e.n_params} params "
                  f"(bound {bound >> 20} MiB)")  # fmt: skip
        seed = case.get("data_seed", 0)
        rnd = random.Random(seed)
        check_queries(h, e, rnd)
        if small_enough(e):
            numels = M.expand(case["numels"])[: e.n_params]
            rows = (M.expand(case.get("rows")) or [1] * e.n_params)[: e.n_params]
            dtypes = M.expand(case["dtypes"])[: e.n_params]
            run_executors(h, e, dtypes, numels, rows, np.random.default_rng(seed), rnd)
            return "exec"
        return "ok"
    finally:
        if h.value and rc == N.tideSuccess:
            if N.lib().tideLayoutDestroy(h) != N.tideSuccess:
                raise CaseFailure("tideLayoutDestroy failed")


def check_sizes():
    """The model's struct sizes are the ABI's."""
    if ctypes.sizeof(N.tideLayoutDesc_t) != M.DESC_SIZE or ctypes.sizeof(N.tideConfig_t) != M.CONFIG_SIZE:
        raise CaseFailure("model.DESC_SIZE / CONFIG_SIZE do not match the ctypes structs")


if os.environ.get("TIDE_FUZZ_DEBUG"):
    print("harness: library", N.library_path())
