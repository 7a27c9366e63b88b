# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""What tideLayoutCreate must answer for any input: an independent model written from include/tide.h and
docs/architecture.md (never from plugin/core), on top of tests/tide_ref.py's offset math.

expect(case, env_chunk, env_pace) returns either ("error", why) when the input violates a documented rule
(every such rule is tideInvalidArgument), or ("ok", Expected) with every derived size the C API reports.
Python integers do not overflow, so "derived sizes that would overflow" is a comparison against 2**64 here.
"""

from typing import List, NamedTuple, Optional

from tide_ref import SLOT_ALIGN, ref_layout

U64 = 1 << 64
INT_MAX = (1 << 31) - 1
MAX_PARAMS = 1 << 20
MAX_WORLD = 65536
MAX_RPN = 64
MAX_NUMEL = 1 << 40
NUM_DTYPES = 7
DESC_SIZE = 56  # sizeof(tideLayoutDesc_t) on LP64 (checked against ctypes by the harness)
CONFIG_SIZE = 32
ELEM = [2, 2, 4, 1, 1, 1, 4]  # tideDataType_t -> bytes
DTYPE_NAMES = ["bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "int8", "int32"]
REDUCIBLE = (0, 1, 2)


class Expected(NamedTuple):
    n_params: int
    world: int
    rpn: int
    n_nodes: int
    rank: int
    shard: List[int]
    send_offset: List[int]
    slot_offset: List[int]
    rs_out_offset: List[int]
    send_bytes: int
    slot_bytes: int
    rs_out_numel: int
    chunk_bytes: int  # effective
    pace_bytes: int  # effective
    rs_chunk_numel: int
    rs_num_chunks: int
    rs_staging_bytes: int
    slot_reuse_fits: int
    pieces_per_block: int
    sched_len: int
    round_start: List[int]
    hash: Optional[int]  # None when too costly to model (huge nParams)


def expand(spec) -> Optional[list]:
    """A list, None, or the compact {"fill": v, "n": k} / {"runs": [[v, k], ...]} forms of the corpus."""
    if spec is None or isinstance(spec, list):
        return spec
    if "fill" in spec:
        return [spec["fill"]] * spec["n"]
    out = []
    for v, k in spec["runs"]:
        out.extend([v] * k)
    return out


def fnv1a_layout(numels, rows, dtypes, world, rpn, chunk, pace) -> int:
    """docs/architecture.md: FNV-1a 64 over tag, nParams, per param (numel, rowNumel, dtype), W, R, chunk, pace."""
    h = 0xCBF29CE484222325
    data = bytearray(b"nccl-tide/layout/v1")

    def u64(v):
        data.extend(int(v).to_bytes(8, "little"))

    u64(len(numels))
    for n, c, d in zip(numels, rows, dtypes):
        u64(n)
        u64(c)
        u64(d)
    for v in (world, rpn, chunk, pace):
        u64(v)
    for b in data:
        h = ((h ^ b) * 0x100000001B3) % U64
    return h


def expect(case: dict, env_chunk: int, env_pace: int):
    numels, rows, dtypes = expand(case["numels"]), expand(case.get("rows")), expand(case["dtypes"])
    n = case.get("n_params", len(numels) if numels is not None else 0)
    if case.get("desc_size", DESC_SIZE) < DESC_SIZE:
        return "error", "desc size"
    if not 1 <= case.get("desc_version", 1) <= 1:
        return "error", "desc version"
    if not 1 <= n <= MAX_PARAMS:
        return "error", "nParams"
    if numels is None or dtypes is None:
        return "error", "NULL array"
    W, R, rank = case["world"], case["rpn"], case.get("rank", 0)
    if not 1 <= W <= MAX_WORLD:
        return "error", "worldSize"
    if not 1 <= R <= min(W, MAX_RPN) or W % R:
        return "error", "ranksPerNode"
    if not 0 <= rank < W:
        return "error", "rank"
    numels, dtypes = numels[:n], dtypes[:n]
    rows = rows[:n] if rows is not None else [1] * n
    for i in range(n):
        if not 1 <= numels[i] <= MAX_NUMEL:
            return "error", f"numels[{i}]"
        if not 0 <= dtypes[i] < NUM_DTYPES:
            return "error", f"dtypes[{i}]"
        if rows[i] < 1 or rows[i] > numels[i] or numels[i] % rows[i]:
            return "error", f"rowNumels[{i}]"
    cfg = case.get("config")
    chunk, pace = 0, 0
    if cfg is not None:
        if cfg["size"] < CONFIG_SIZE or not 1 <= cfg["version"] <= 1:
            return "error", "config size/version"
        chunk, pace = cfg["chunk"], cfg["pace"]
    chunk = chunk or env_chunk
    pace = pace or env_pace

    ref = ref_layout(numels, rows, [DTYPE_NAMES[d] for d in dtypes], W, R)
    # Overflow: every running value of the C code (each shard's bytes, its unsharded bytes, each aligned offset and
    # end) must fit in 64 bits. ref's values only grow, so checking each offset, each end and the totals suffices.
    send = slot = 0
    for p in ref.params:
        shard_bytes = p.shard_numel * p.elem_size
        if shard_bytes * W >= U64:
            return "error", "overflow: shard bytes"
        if p.send_offset + shard_bytes >= U64 or send + p.elem_size - 1 >= U64:
            return "error", "overflow: send buffer"
        if p.slot_offset + shard_bytes * W >= U64 or slot + SLOT_ALIGN - 1 >= U64:
            return "error", "overflow: slot"
        send, slot = p.send_offset + shard_bytes, p.slot_offset + shard_bytes * W
    if ref.rs_out_numel >= U64:
        return "error", "overflow: RS output"
    N = ref.n_nodes
    # RS plan (docs/architecture.md): chunk = clamp(floor(max(1, bytes/4)/8)*8, 8, rsOutNumel).
    c = max(1, chunk // 4) // 8 * 8
    c = min(max(c, 8), ref.rs_out_numel)
    num_chunks = -(-ref.rs_out_numel // c)
    if num_chunks > INT_MAX:
        return "error", "RS chunks > INT_MAX"
    nbuf = 2 if num_chunks > 1 else 1
    max_elem = max(ELEM[d] for d in dtypes)
    staging = nbuf * (R * c * max_elem + (c * 4 if N > 1 else 0))
    if R * c * max_elem >= U64 or staging >= U64:
        return "error", "RS staging overflow"
    # Schedule (tide.h): round k sends min(2^k, N - 2^k) blocks, each cut into ceil(sendBytes / pace) pieces.
    pieces, round_start, total = 0, [0], 0
    if N > 1:
        pieces = -(-ref.send_end // pace)
        round_start = []
        k = 0
        while (1 << k) < N:
            round_start.append(total)
            total += min(1 << k, N - (1 << k)) * pieces
            if total > INT_MAX:
                return "error", "schedule > INT_MAX steps"
            k += 1
        round_start.append(total)
    h = fnv1a_layout(numels, rows, dtypes, W, R, chunk, pace) if n <= 2000 else None
    return "ok", Expected(
        n, W, R, N, rank,
        [p.shard_numel for p in ref.params],
        [p.send_offset for p in ref.params],
        [p.slot_offset for p in ref.params],
        [p.rs_out_offset for p in ref.params],
        ref.send_end, ref.slot_end, ref.rs_out_numel, chunk, pace,
        c, num_chunks, staging, int(staging <= ref.slot_end), pieces, total, round_start, h,
    )  # fmt: skip


def expected_step(e: Expected, node: int, index: int) -> tuple:
    """(round, sendTo, recvFrom, sendBlock, recvBlock, offset, bytes) of include/tide.h's schedule."""
    k = max(i for i in range(len(e.round_start) - 1) if e.round_start[i] <= index)
    within = index - e.round_start[k]
    block, piece = divmod(within, e.pieces_per_block)
    N, d = e.n_nodes, 1 << k
    off = piece * e.pace_bytes
    return (k, (node - d) % N, (node + d) % N, (node + block) % N, (node + d + block) % N, off,
            min(e.pace_bytes, e.send_bytes - off))  # fmt: skip
