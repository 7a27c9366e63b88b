# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Fuzz cases of the bad-input probe: handle lifetimes across threads, and integer edge values on the Python side.

* "lifetime": T threads share a pool of layout handles and run random operations on it in random order: create,
  use (tideLayoutGetInfo, a host all-gather that is checked element by element), destroy, reuse of a destroyed
  value, a second destroy, garbage values. The calls race for real (ctypes releases the GIL). Every call must
  succeed or return tideInvalidArgument naming the handle; a successful query must describe the layout created
  under that value (values are never reused); each value is destroyed successfully exactly once.
* "pyint": one integer argument of nccl_tide.Layout (or Layout.schedule) set to an edge value. A value outside the
  C type of its parameter must be refused with InvalidArgumentError showing the value (ctypes would wrap it); a
  value inside may be accepted, and then the layout must report exactly that value (no wrap), or be refused with
  InvalidArgumentError. Anything else (another exception, a wrapped value) fails the case.
"""

import ctypes
import random
import threading

import numpy as np

from nccl_tide import _native as N
from nccl_tide.errors import InvalidArgumentError
from nccl_tide.layout import Layout

U64 = (1 << 64) - 1
PY_EDGES = [0, 1, -1, 2, 3, 4, 8, 4096, 1 << 16, 65536, 65537, (1 << 31) - 1, 1 << 31, -(1 << 31), -(1 << 31) - 1,
            (1 << 32) + 3, (1 << 32) + 8, 1 << 40, (1 << 40) + 1, (1 << 63), U64, U64 + 1, U64 + 5, -(1 << 64), 1 << 80,
            2.0, 2.5, float("nan")]  # fmt: skip
FIELDS = {  # name: (C range of the parameter, how the layout reports it back or None)
    "world_size": ((-(1 << 31), (1 << 31) - 1), lambda l: l.world_size),
    "ranks_per_node": ((-(1 << 31), (1 << 31) - 1), lambda l: l.ranks_per_node),
    "rank": ((-(1 << 31), (1 << 31) - 1), lambda l: l.rank),
    "numel": ((0, U64), lambda l: l.params[0].numel),
    "row_numel": ((0, U64), lambda l: l.params[0].row_numel),
    "pace_bytes": ((0, U64), None),
    "rs_chunk_bytes": ((0, U64), None),
    "node": ((-(1 << 31), (1 << 31) - 1), None),
}


class LifetimeFailure(AssertionError):
    pass


def gen_lifetime(r: random.Random) -> dict:
    return {"kind": "lifetime", "seed": r.getrandbits(32), "threads": r.choice([2, 3, 4, 6]),
            "ops": r.choice([20, 40, 80])}  # fmt: skip


def gen_pyint(r: random.Random) -> dict:
    field = r.choice(sorted(FIELDS))
    value = r.choice(PY_EDGES) if r.random() < 0.8 else r.choice([1, -1]) * r.getrandbits(r.choice([8, 31, 33, 64, 65]))
    return {"kind": "pyint", "field": field, "value": value if not isinstance(value, float) else repr(value)}


def _info(h):
    i = N.tideLayoutInfo_t()
    i.size, i.version = ctypes.sizeof(i), N.TIDE_LAYOUT_INFO_VERSION
    return N.lib().tideLayoutGetInfo(h, ctypes.byref(i)), i


def check_lifetime(case: dict) -> str:
    lib = N.lib()
    W, n = 2, 64
    numels = (ctypes.c_uint64 * 1)(n)
    dts = (N.tideDataType_t * 1)(2)
    pool_lock = threading.Lock()
    pool = []  # handle values, live or destroyed
    created = {}  # value -> (world, rank) it was created with
    destroyed_ok = {}  # value -> successful destroys
    failures = []

    def fail(msg):
        failures.append(msg)

    def expect_refused(rc, what, *words):
        msg = N.last_error()
        if rc != N.tideInvalidArgument or not all(w in msg for w in words):
            fail(f"{what}: rc {rc}, message {msg!r} (want tideInvalidArgument naming {words})")

    def worker(t):
        rnd = random.Random(case["seed"] * 31 + t)
        shards = [np.full(n // W, 10 * t + s, np.float32) for s in range(W)]
        params = [np.zeros(n, np.float32) for _ in range(W)]
        src = N.pointer_table([a.ctypes.data for a in shards])
        dst = N.pointer_table([a.ctypes.data for a in params])
        for _ in range(case["ops"]):
            op = rnd.choices(["create", "info", "ag", "destroy", "garbage"], [3, 3, 2, 3, 1])[0]
            with pool_lock:
                h = rnd.choice(pool) if pool else None
            if op == "create" or h is None:
                rank = rnd.randrange(W)
                desc = N.tideLayoutDesc_t(ctypes.sizeof(N.tideLayoutDesc_t), 1, 1, numels, None, dts, W, W, rank)
                out = N.tideLayout_t()
                rc = lib.tideLayoutCreate(ctypes.byref(desc), None, ctypes.byref(out))
                if rc != 0:
                    fail(f"create: {rc} {N.last_error()}")
                    continue
                with pool_lock:
                    if out.value in created:
                        fail(f"handle value 0x{out.value:x} reused")
                    created[out.value] = (W, rank)
                    pool.append(out.value)
            elif op == "info":
                rc, i = _info(N.tideLayout_t(h))
                if rc == 0:
                    if (i.worldSize, i.rank) != created[h]:
                        fail(f"info of 0x{h:x}: world/rank {(i.worldSize, i.rank)}, created as {created[h]}")
                else:
                    expect_refused(rc, "info on a destroyed layout", "destroyed", "layout")
            elif op == "ag":
                for p in params:
                    p[...] = -1.0
                rc = lib.tideHostAllGather(N.tideLayout_t(h), src, dst)
                if rc == 0:
                    want = np.concatenate(shards)
                    if not all(np.array_equal(p, want) for p in params):
                        fail(f"host AG on 0x{h:x}: wrong output")
                else:
                    expect_refused(rc, "AG on a destroyed layout", "destroyed")
                    if not all((p == -1.0).all() for p in params):
                        fail("a refused AG wrote output")
            elif op == "destroy":
                rc = lib.tideLayoutDestroy(N.tideLayout_t(h))
                if rc == 0:
                    with pool_lock:
                        destroyed_ok[h] = destroyed_ok.get(h, 0) + 1
                else:
                    expect_refused(rc, "second destroy", "destroyed")
            else:
                # Never a value the library can hand out: tag-space values get a serial >= 2^40 (a live value XORed
                # with a low bit could be another thread's fresh handle).
                g = rnd.choice([0x1234560, 0x71DE000000000000 | (((1 << 40) + rnd.getrandbits(20)) << 4) | 1, 8,
                                U64 - 15, (h or 0) ^ (1 << 44), (h or 0) ^ 0x3])  # fmt: skip
                rc, _ = _info(N.tideLayout_t(g))
                expect_refused(rc, f"info on garbage 0x{g:x}", "not a live tideLayout_t")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(case["threads"])]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for h in pool:
        if destroyed_ok.get(h, 0) == 0:
            rc = lib.tideLayoutDestroy(N.tideLayout_t(h))
            if rc != 0:
                fail(f"final destroy of 0x{h:x}: {rc} {N.last_error()}")
            destroyed_ok[h] = 1
    twice = [h for h, k in destroyed_ok.items() if k != 1]
    if twice:
        fail(f"handles destroyed successfully more than once: {[hex(h) for h in twice]}")
    if failures:
        raise LifetimeFailure("; ".join(failures[:5]))
    return "exec"


def _value(case):
    v = case["value"]
    return float(v) if isinstance(v, str) else v


def check_pyint(case: dict) -> str:
    field, v = case["field"], _value(case)
    (lo, hi), echo = FIELDS[field]
    integral = isinstance(v, int) or (isinstance(v, float) and v == v and v.is_integer())
    representable = integral and lo <= int(v) <= hi
    kw = dict(numels=[4096], dtypes="fp32", world_size=4, ranks_per_node=2, rank=1)
    if field == "numel":
        kw["numels"] = [v]
    elif field == "row_numel":
        kw["row_numels"] = [v]
    elif field != "node":
        kw[field] = v
    try:
        lay = Layout(**kw)
        try:
            if field == "node":
                lay.schedule(v)
        finally:
            if field == "node" or echo is None:
                lay.close()
    except InvalidArgumentError as e:
        if not representable and str(v) not in str(e) and repr(v) not in str(e):
            raise LifetimeFailure(f"{field}={v!r}: refused, but the message does not show the value: {e}")
        return "error"
    except Exception as e:  # noqa: BLE001 - any other exception is the finding
        raise LifetimeFailure(f"{field}={v!r}: {type(e).__name__}: {e}")
    if not representable:
        raise LifetimeFailure(f"{field}={v!r} is outside its C type {lo}..{hi} but was accepted")
    if echo is not None:
        with lay:
            got = echo(lay)
        if got != int(v):
            raise LifetimeFailure(f"{field}={v!r} became {got}")
    return "ok"
