# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The step-program protocol on the CPU model (tests/native/program_model.cc; docs/architecture.md "Step programs").

The model runs the programs of every rank of a layout together (random interleavings of each rank's two lanes, many
seeds, counters that wrap around 2^32) for world sizes 2-64 and node splits 1xW, 2x4, 4x2, 3x2, 2x3, 5x1, 8x8, 6x8,
and checks termination, bit-exact results against the host executor, and read/overwrite hazards on staging and slots.
Eager calls on the token route (NCCL_TIDE_EAGER_GRAPHS) run mixed with epoch calls on one comm. The mutation cases
remove every wait on one flag word and require the model to fail: each wait protects something the model can see.
Multi-node layouts compiled for the two-sided transport (p2p groups, plugin/core/p2p_plan.h) run with NCCL's p2p
semantics (tests/native/nccl_p2p_model.h), and their mutants (wrong order, missing receive, ungrouped cycle) fail.
NCCL's in-place reduce-scatter form (the output in the rank's own gradient block) runs under every issue model with
output writes and gradient reads sharing shadow tags; its mutants (wrong block, mirrored output chunks) fail.
"""

import re
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def model_exe(repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("program_model") / "program_model"
    core = sorted(str(p) for p in (repo / "plugin" / "core").glob("*.cc"))
    cmd = [
        "g++",
        "-std=c++17",
        "-O2",
        "-ffp-contract=off",  # the host core's arithmetic is the contract (as in CMakeLists.txt)
        f"-I{repo / 'include'}",
        f"-I{repo / 'plugin' / 'core'}",
        f"-I{repo / 'plugin'}",
        f"-I{repo / 'tests' / 'native'}",
        str(repo / "tests" / "native" / "program_model.cc"),
        *core,
        "-ldl",
        "-lpthread",
        "-o",
        str(out),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return Path(out)


def test_programs_run_to_completion_bit_exact_without_hazards(model_exe):
    r = subprocess.run([str(model_exe), "6"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "all cases passed" in r.stdout
    lines = [x for x in r.stdout.splitlines() if x.startswith("case ")]
    # 13 layouts x 2 issue modes x 6 seeds, plus the captured runs of the single-node layouts that can capture.
    assert len(lines) >= 13 * 2 * 6
    assert any("W=64 R=8" in x for x in lines) and any("start fffffff0" in x for x in lines)
    assert any("captured" in x for x in lines)
    # Eager epoch and token-route calls mixed on one comm (docs/architecture.md "Eager calls as graph replays"):
    # RS on tokens (<= 2 chunks, own and slot staging) and RS on epochs beside token AGs (more chunks), both modes.
    mixed = [x for x in lines if "mixed eager/token" in x]
    assert any("RS epoch only" in x for x in mixed) and any("RS epoch only" not in x for x in mixed)
    assert any("mode 0" in x for x in mixed) and any("mode 1" in x for x in mixed)


def test_token_rs_of_more_chunks_than_buffers(model_exe):
    """NCCL_TIDE_TOKEN_RS_CHUNKS above 2 (program_model --token-rs-chunks 64): token reduce-scatters of 3, 5 and 21
    chunks over 2 staging buffers (the consumed-token pipeline, program_rs.cc capturedPipelined), captured and as
    eager token calls mixed with epoch calls, at W = 2, 4, 6 and 8: bit-exact, hazard-free, no deadlock."""
    r = subprocess.run([str(model_exe), "--token-rs-chunks", "64", "6"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [x for x in r.stdout.splitlines() if x.startswith("case ")]
    captured = [x for x in lines if " captured chunks=" in x]
    pipelined = {(x.split()[2], int(x.split()[4][7:])) for x in captured if int(x.split()[4][7:]) > 2}
    assert {("W=2", 21), ("W=4", 21), ("W=6", 3), ("W=8", 5)} <= pipelined, pipelined
    mixed = [x for x in lines if "mixed eager/token" in x]
    assert mixed and not any("RS epoch only" in x for x in mixed)
    assert any("chunks=21" in x for x in mixed) and any("chunks=5" in x for x in mixed)


@pytest.mark.parametrize("chunks", ["2", "64"])
def test_token_pairs(model_exe, chunks):
    """Options::pairTokens (the library's default; a test build's NCCL_TIDE_PAIR_TOKENS=0 turns it off): the barrier
    tokens (AG ready and done, RS enter) waited for and reset two words per operation, each pair run as one operation
    whose wait needs both words EQUAL to their values (the GPU's 64-bit equality wait): every case bit-exact and
    hazard-free, no deadlock, no word ever seen past its value when its pair's wait passes, and pairs actually run
    (without the option none do)."""
    r = subprocess.run([str(model_exe), "--token-rs-chunks", chunks, "--pair-tokens", "4"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    pairs = int(r.stdout.split("token pair operations: ")[1].split()[0])
    assert pairs > 1000, pairs
    assert any(" captured " in x for x in r.stdout.splitlines() if x.startswith("case "))
    plain = subprocess.run([str(model_exe), "--token-rs-chunks", chunks, "2"], capture_output=True, text=True,
                           timeout=600)
    assert plain.returncode == 0 and "token pair operations: 0\n" in plain.stdout, plain.stdout[-1500:]


def test_token_pairs_need_the_parity_banks(model_exe):
    """The RS full and consumed tokens of chunk k live in the bank of k's parity, so that a word holds only 0 or the
    value its waiter waits for. With one bank (the mutant), a pusher's token of chunk k + 1 can overwrite chunk k's
    before the owner's wait reads it: the model must report the equality wait that would never pass."""
    r = subprocess.run([str(model_exe), "--token-rs-chunks", "64", "--pair-tokens", "--single-rs-banks", "4"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "an equality wait would never pass" in r.stderr, r.stdout[-1500:] + r.stderr[-1500:]


@pytest.mark.parametrize("chunks", ["2", "64"])
def test_kernel_tails_in_any_order_past_their_prefix(model_exe, chunks):
    """In graphs a flag batch's trailing writes (prog::kernelTail) may run as a signal kernel, whose stores land in
    no order beyond the ordered prefix (the rank's own words: the batch's token resets). Stored so (each part in
    reverse program order, with pairs and without), every case still completes bit-exact; stored with the rest
    before the prefix (the mutant), a peer's next-call token can land before the reset that would erase it, and the
    model must fail."""
    for pairs in ([], ["--pair-tokens"]):
        r = subprocess.run([str(model_exe), "--token-rs-chunks", chunks, *pairs, "--kernel-order", "3"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
        moved = int(r.stdout.split("kernel tail flags reordered: ")[1].split()[0])
        assert moved > 1000, moved
    bad = subprocess.run([str(model_exe), "--token-rs-chunks", chunks, "--pair-tokens", "--kernel-order-swapped", "4"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "FAIL:" in bad.stderr, bad.stdout[-1500:] + bad.stderr[-1500:]


def test_pipelined_token_rs_runs_forked_and_on_one_stream(model_exe):
    """The token RS of more chunks than buffers runs on two lanes (pushes on the internal lane, reductions on the
    caller's: a captured graph's two branches) and, folded onto the caller's lane, on one stream (direct issue):
    both pass for the captured and the mixed eager/token sequences."""
    r = subprocess.run([str(model_exe), "--token-rs-chunks", "64", "4"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [x for x in r.stdout.splitlines() if x.startswith("case ") and "chunks=" in x]
    deep = [x for x in lines if int(x.split("chunks=")[1].split()[0]) > 2]
    for kind in (" captured ", " mixed eager/token "):
        assert any(kind in x and "folded" in x for x in deep), kind
        assert any(kind in x and "folded" not in x for x in deep), kind


@pytest.mark.parametrize("mutation", ["--drop-own-token-waits", "--no-fork"])
def test_model_detects_a_two_lane_token_rs_without_its_meeting_points(model_exe, mutation):
    """A rank's two lanes meet only at its own full / consumed tokens, and its internal lane starts at the fork:
    without either the model must fail (a reduce before the rank's own push landed, a push into a buffer not yet
    reduced, or a push of gradients the caller has not produced). At the default limit (no such programs) the
    same mutation changes nothing."""
    bad = subprocess.run([str(model_exe), "--token-rs-chunks", "64", mutation, "6"], capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode != 0 and "FAIL:" in bad.stderr, bad.stdout[-1500:] + bad.stderr[-1500:]
    ok = subprocess.run([str(model_exe), mutation, "3"], capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0 and "all cases passed" in ok.stdout, ok.stdout[-1500:] + ok.stderr[-1500:]


@pytest.mark.parametrize("word", [512, 641, 576, 577])
def test_model_detects_a_missing_consumed_token_wait(model_exe, word):
    """The consumed tokens (words 512 + owner, and 640 + owner for odd chunks) are waited on only by token RSs of
    more than 2 chunks: dropping those waits must fail (a push overwrites a staging buffer not yet reduced). So must
    dropping the full tokens of odd chunks (576 + writer), which those RSs exercise."""
    r = subprocess.run([str(model_exe), "--token-rs-chunks", "64", "--drop-wait", str(word), "8"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "FAIL:" in r.stderr, r.stdout[-1500:] + r.stderr[-1500:]


# nodes x ranks per node of the two-sided model's layouts (program_model --two-sided)
TWO_SIDED_SPLITS = {"2x4", "4x2", "3x2", "2x3", "5x1", "2x1", "8x8", "16x8"}


def test_two_sided_programs_run_bit_exact_over_nccl_p2p_semantics(model_exe):
    """Options::transport = kTwoSided (plugin/core/p2p_plan.h): every cross-node transfer of the multi-node AG and RS
    is a p2p group, run with NCCL's semantics (per-pair matching in issue order, rendezvous, a group's transfers
    posted together, random lane order). Every node split, both issue modes, AG and RS (sum, avg, premul) back to
    back: bit-exact with the host executor, hazard-free, no deadlock, never more than the pace cap in flight per
    peer, no program touching another node's memory or flags, and the receives (sends) covering exactly the bytes
    the one-sided puts write (read)."""
    r = subprocess.run([str(model_exe), "--two-sided", "2"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    land = [x for x in r.stdout.splitlines() if "transfers land where the puts land" in x]
    lines = [x for x in r.stdout.splitlines() if x.startswith("two-sided case ") and x not in land]
    assert len(land) == len({x.split()[2] for x in lines})  # receives write where the puts wrote, every layout
    assert {x.split()[3] for x in lines} == TWO_SIDED_SPLITS
    assert any("mode 0" in x for x in lines) and any("mode 1" in x for x in lines)
    # pieces: a schedule step below a block, an RS of several chunks, every dtype
    assert any(int(x.split("steps=")[1].split()[0]) > 50 for x in lines)
    assert any(int(x.split("chunks=")[1].split()[0]) > 10 for x in lines)
    assert {"bf16", "fp16", "fp32"} <= {x.split()[5] for x in lines}
    issued, matched = map(int, re.search(r"p2p transfers issued (\d+), matched (\d+)", r.stdout).groups())
    assert matched > 10000 and issued == 2 * matched, (issued, matched)


@pytest.mark.parametrize("mutant,symptom", [("--p2p-swap", ""), ("--p2p-drop-recv", "p2p match"),
                                            ("--p2p-split", "deadlock: no lane can run")])
def test_two_sided_model_detects_a_wrong_order_a_missing_receive_and_ungrouped_cycles(model_exe, mutant, symptom):
    """Two adjacent p2p groups of a step swapped, each program's first receive dropped, or each group's receives
    posted as a group of their own after its sends (a rendezvous cycle of the ring: why a step's send and receive
    are one group): the model must fail (a wrong result, mismatched transfers, or a deadlock)."""
    r = subprocess.run([str(model_exe), "--two-sided", mutant, "1"], capture_output=True, text=True, timeout=900)
    assert r.returncode != 0 and "FAIL:" in r.stderr and symptom in r.stderr, r.stdout[-1500:] + r.stderr[-1500:]


# Every flag word a program waits on: AG ready/done/rail/finish, RS enter/consumed/pushDone/full/prev/final, and the
# captured token words.
WORDS = [0, 1, 2, 3, 4, 5, 6, 16, 17, 64, 65, 128, 129, 256, 320, 384, 448]


@pytest.mark.parametrize("word", WORDS)
def test_model_detects_a_missing_wait(model_exe, word):
    r = subprocess.run([str(model_exe), "--drop-wait", str(word), "8"], capture_output=True, text=True, timeout=600)
    assert r.returncode != 0, f"dropping the waits on word {word} went unnoticed:\n" + r.stdout[-1500:]
    assert "FAIL:" in r.stderr, r.stderr[-1500:]


def _queue(model_exe, cap, entries, issue, protocol, seeds=3):
    return subprocess.run([str(model_exe), "--copy-queue", str(cap), entries, issue, protocol, str(seeds)],
                          capture_output=True, text=True, timeout=600)


def test_copy_queue_model_reproduces_the_eager_graph_hang(model_exe):
    """The loopback issue model (program_model --copy-queue; docs/protocol.md, "Shared hardware queues"): with the
    token protocol issued rank by rank and one queue entry per copy (a captured graph's memcpy nodes), a shared
    copy queue of 600 entries lets the 9-parameter W=8 all-gather through (576 entries in all) and hangs the
    64-parameter one (512 per rank), as the eager graph route did on an H200."""
    r = _queue(model_exe, 600, "graph", "call", "token")
    assert r.returncode != 0, r.stdout[-2000:]
    assert "the host is blocked on a full copy queue" in r.stderr, r.stderr[-2000:]
    assert "queue case 2 W=8 P=9 chunks=1 cap 600 graph call token seed 2: ok" in r.stdout, r.stdout[-2000:]
    assert "W=8 P=64" not in r.stdout, r.stdout[-2000:]


def test_copy_queue_model_batched_copies_are_why_the_epoch_protocol_does_not_hang(model_exe):
    """The epoch protocol also waits for every rank's arrival before its copies; it passes with one entry per copy
    batch (cudaMemcpyBatchAsync) and a queue as small as the world, and hangs with one entry per copy."""
    ok = _queue(model_exe, 8, "batch", "call", "epoch")
    assert ok.returncode == 0 and "all cases passed" in ok.stdout, ok.stdout[-2000:] + ok.stderr[-2000:]
    bad = _queue(model_exe, 64, "graph", "call", "epoch")
    assert bad.returncode != 0 and "the host is blocked on a full copy queue" in bad.stderr, bad.stderr[-2000:]


@pytest.mark.parametrize("issue", ["announce", "rounds"])
@pytest.mark.parametrize("protocol", ["token", "token-mixed"])
@pytest.mark.parametrize("cap", [1, 64, 600])
def test_copy_queue_model_announce_first_never_hangs(model_exe, cap, protocol, issue):
    """The loopback fix (BoundProgram::issueTokens on a deferring provider): every rank's announce (its first
    writes) at its call, the rest of every rank after the last call. No hang whatever the queue's size, for token
    all-gathers alone and mixed with token reduce-scatters (Slot-Reuse and own staging), bit-exact and hazard-free
    as every model run. The rounds order (below) passes the copy-queue model as well."""
    r = _queue(model_exe, cap, "graph", issue, protocol)
    assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert "W=8 P=64" in r.stdout


# The shared-channel model (program_model --channels K MAP C ISSUE PROTOCOL [seeds]; docs/protocol.md,
# "Shared hardware queues"): every operation, waits included, enters one of K FIFO channels, so a wait
# at a channel's head blocks whatever is queued behind it. A hypothesis (H2) about the H200, not a measurement.
# Exit 3 when some run hung (every run is reported), 1 on any other failure (a hazard, a wrong result).
# (W, parameters, RS chunks): the --copy-queue layouts, the 5 parameters at W = 8 that hung on an H200, RSs of 2 chunks.
CHANNEL_CASES = {(2, 64, 1), (4, 16, 1), (8, 9, 1), (8, 64, 1), (8, 5, 1),
                 (2, 64, 2), (4, 16, 2), (8, 64, 2), (8, 5, 2)}


def _channels(model_exe, k, mapping, cap, issue, protocol, seeds=2):
    r = subprocess.run([str(model_exe), "--channels", str(k), mapping, str(cap), issue, protocol, str(seeds)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 3), r.stdout[-2000:] + r.stderr[-2000:]  # no hazard, no wrong result
    runs = {}
    for line in r.stdout.splitlines():
        if not line.startswith("channel case "):
            continue
        f = line.split()
        key = (int(f[3][2:]), int(f[4][2:]), int(f[5][7:]))  # W=.., P=.., chunks=..
        runs.setdefault(key, []).append(line)
    assert set(runs) == CHANNEL_CASES and all(len(v) == seeds for v in runs.values()), r.stdout[-2000:]
    assert (r.returncode == 3) == any("HANG" in x for v in runs.values() for x in v), r.stdout[-2000:]
    return r, runs


def _hangs(lines):
    assert all(": ok (" in x or ": HANG (" in x for x in lines), lines
    return [": HANG (" in x for x in lines]


@pytest.mark.parametrize("protocol", ["token", "token-mixed"])
@pytest.mark.parametrize("issue", ["call", "announce"])
def test_channel_model_one_channel_hangs_call_and_announce_at_every_world_size(model_exe, issue, protocol):
    """K = 1 (every operation of every rank in one FIFO): both the whole program at each call and announce-first
    hang at W = 2, 4 and 8. Announce-first's hang is the one H2 describes: rank 0's rest waits for rank 1's AG done
    token, which is in rank 1's rest, queued behind that wait; the whole-program order already stops at the ready
    wait (rank 1's announce is behind it)."""
    r, runs = _channels(model_exe, 1, "rank", 0, issue, protocol)
    assert r.returncode == 3
    for key, lines in runs.items():
        assert all(_hangs(lines)), (key, lines)
        assert all("no lane can run" in x for x in lines), lines
    blocked = "captured AG done from rank 1" if issue == "announce" else "captured AG ready of rank 1"
    head = "ch0 [rank 0 lane 0 call 0: wait rank 0 word"
    assert all(head in x and blocked in x for x in runs[(2, 64, 1)]), runs[(2, 64, 1)]


@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("issue", ["call", "announce"])
def test_channel_model_rank_channels_hang_exactly_when_two_ranks_share_one(model_exe, issue, k):
    """Rank r's operations in channel r % K, channels unbounded: a run hangs if and only if K < W, the same for the
    whole program at each call and for announce-first. So if H2 held with this mapping, the H200's passes at W = 2
    and 4 and its announce-first hang at W = 8 would need 4 <= K <= 7, and then the whole-program order, which
    passed small layouts at W = 8 on an H200, would have hung there too: this mapping cannot explain both."""
    r, runs = _channels(model_exe, k, "rank", 0, issue, "token")
    for key, lines in runs.items():
        assert _hangs(lines) == [k < key[0]] * len(lines), (key, lines)


def test_channel_model_random_channels_hang_announce_first(model_exe):
    """Each operation in a seeded random one of 8 channels (stream order kept): announce-first hangs, at every
    world size, even with as many channels as ranks."""
    r, runs = _channels(model_exe, 8, "random", 0, "announce", "token")
    assert r.returncode == 3
    for key, lines in runs.items():
        assert any(_hangs(lines)), (key, lines)


def test_channel_model_bounded_channel_per_rank_hangs_announce_first(model_exe):
    """A channel per rank (no sharing) of 16 entries, the host blocking while one is full: announce-first hangs the
    8-rank token reduce-scatters (what queues behind a rank's first blocked RS full wait exceeds 16 entries) and
    passes at W = 2 and 4; the same channels pass the 8-rank all-gathers alone."""
    r, runs = _channels(model_exe, 8, "rank", 16, "announce", "token-mixed")
    for key, lines in runs.items():
        assert _hangs(lines) == [key[0] == 8] * len(lines), (key, lines)
        if key[0] == 8:
            assert all("the host is blocked on a full channel" in x and "captured RS full" in x for x in lines), lines
    r, runs = _channels(model_exe, 8, "rank", 16, "announce", "token")
    assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-2000:]


@pytest.mark.parametrize("protocol", ["token", "token-mixed"])
@pytest.mark.parametrize("k,mapping,cap", [(1, "rank", 0), (1, "rank", 1), (3, "rank", 16), (4, "rank", 0),
                                           (8, "rank", 16), (2, "random", 0), (8, "random", 1), (3, "random", 16)])
def test_channel_model_rounds_never_hang(model_exe, k, mapping, cap, protocol):
    """The rounds order: each rank's token program split at every wait that follows a non-wait; round 0 (the
    announce) of each rank at its call, then round 1 of every rank, round 2 of every rank, ... after the last call.
    Every wait's producers are issued before it, so no assignment of operations to FIFO channels and no channel
    capacity can hang it: no hang at W = 2, 4, 8, for token all-gathers alone and mixed with token reduce-scatters,
    with one channel for everything, channels per rank modulo K, random channels, bounded or not, each run bit-exact
    with the host executor and hazard-free."""
    r, runs = _channels(model_exe, k, mapping, cap, "rounds", protocol, seeds=3)
    assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-2000:]
    for key, lines in runs.items():
        assert not any(_hangs(lines)), (key, lines)


# Token RSs of more chunks than staging buffers on the loopback models (--token-rs-chunks 64): the channel cases above
# plus layouts of 7 chunks at W = 4 and 2 and 4 chunks at W = 8.
PIPELINED_CASES = CHANNEL_CASES | {(4, 16, 7), (8, 64, 4), (8, 5, 4), (2, 64, 7)}


@pytest.mark.parametrize("issue", ["rounds", "groups"])
@pytest.mark.parametrize("k,mapping,cap", [(1, "rank", 0), (1, "rank", 1), (8, "random", 1), (3, "rank", 16)])
def test_channel_model_token_rs_pipeline_never_hangs_in_rounds(model_exe, k, mapping, cap, issue):
    """The consumed-token pipeline's issue rounds (round r pushes chunk r - 1 after the consumed tokens of chunk r - 3
    and reduces chunk r - 2; program_rs.cc capturedPipelined) keep the rounds argument: every wait's producers are in
    earlier rounds of other ranks. Issued in the model's rounds and in the programs' own groups (what
    BoundProgram::issueTokens does on loopback), under one channel for everything, bounded, random and per-rank
    channels: no hang, bit-exact, hazard-free."""
    r = subprocess.run([str(model_exe), "--token-rs-chunks", "64", "--channels", str(k), mapping, str(cap), issue,
                        "token-mixed", "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    keys = set()
    for line in r.stdout.splitlines():
        if line.startswith("channel case "):
            f = line.split()
            keys.add((int(f[3][2:]), int(f[4][2:]), int(f[5][7:])))
            assert ": ok (" in line, line
    assert keys == PIPELINED_CASES, keys


@pytest.mark.parametrize("order", [[], ["--caller-first"], ["--fold"]])
def test_one_fifo_takes_each_round_in_any_lane_order(model_exe, order):
    """A captured round forks its two lanes into two graph branches, and the graph executor may queue either branch
    first: with one FIFO channel for everything (a wait at its head blocks all), each round's items issued with the
    internal lane first (program order), the caller lane first, or folded onto one lane, never hang. So no wait of a
    round needs a write of the same round, which is what lets the library fork per round without relying on the
    branches running concurrently (program_exec.cc issueTokenRange)."""
    r = subprocess.run([str(model_exe), "--token-rs-chunks", "64", *order, "--channels", "1", "rank", "0", "groups",
                        "token-mixed", "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert sum(1 for x in r.stdout.splitlines() if x.startswith("channel case ") and ": ok (" in x) == \
        2 * len(PIPELINED_CASES)


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("cap", [1, 600])
def test_copy_queue_model_token_rs_pipeline_in_groups(model_exe, cap, fold):
    """The library's loopback issue order (each program's groups, round-major over the ranks) with one queue entry
    per copy, for token all-gathers mixed with token reduce-scatters of up to 7 chunks: no hang, with the two lanes
    of a graph replay and folded onto one stream (direct issue, a binding's first call)."""
    r = subprocess.run([str(model_exe), "--token-rs-chunks", "64", *(["--fold"] if fold else []), "--copy-queue",
                        str(cap), "graph", "groups", "token-mixed", "3"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    ran = {(x.split()[3], int(x.split()[5][7:])) for x in r.stdout.splitlines() if x.startswith("queue case ")}
    assert {("W=4", 7), ("W=8", 4)} <= ran, ran  # the pipelined layouts ran, not only the 1-chunk ones


@pytest.mark.parametrize("k,mapping,cap", [(1, "rank", 0), (8, "random", 1)])
def test_channel_model_groups_never_hang_at_the_default_limit(model_exe, k, mapping, cap):
    """The programs' own groups (the library's order) for the default token protocols (RS of at most 2 chunks)."""
    r, runs = _channels(model_exe, k, mapping, cap, "groups", "token-mixed", seeds=2)
    assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-2000:]
    for key, lines in runs.items():
        assert not any(_hangs(lines)), (key, lines)


def test_copy_queue_model_whole_program_issue_of_a_pipelined_rs_hangs(model_exe):
    """Why a user capture of an RS of more chunks than buffers is refused on loopback (rs_executor.cc): a rank's
    whole program issued at its call (a user graph's launch) with one shared copy queue, even unbounded, deadlocks
    once a push waits for consumed tokens (a later rank's own pushes sit behind the blocked copies), while the same
    order passes the default token protocols (RS of at most 2 chunks)."""
    bad = subprocess.run([str(model_exe), "--token-rs-chunks", "64", "--copy-queue", "100000", "graph", "call",
                          "token-mixed", "2"], capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "deadlock: no lane can run" in bad.stderr, bad.stdout[-1500:] + bad.stderr[-1500:]
    assert "captured RS full" in bad.stderr, bad.stderr[-1500:]
    ok = _queue(model_exe, 100000, "graph", "call", "token-mixed", seeds=2)
    assert ok.returncode == 0 and "all cases passed" in ok.stdout, ok.stdout[-1500:] + ok.stderr[-1500:]


# Every node split of W = 2, 3, 4, 8 that the in-place model runs (program_model --in-place).
IN_PLACE_SPLITS = {("W=2", "R=2"), ("W=2", "R=1"), ("W=3", "R=3"), ("W=3", "R=1"), ("W=4", "R=4"), ("W=4", "R=2"),
                   ("W=4", "R=1"), ("W=8", "R=8"), ("W=8", "R=4"), ("W=8", "R=2"), ("W=8", "R=1")}
IN_PLACE_MODES = {"in-order", "deferred", "two-sided in-order", "two-sided deferred", "captured", "captured folded",
                  "mixed eager/token in-order", "mixed eager/token deferred", "copy-queue groups cap 1",
                  "channels 1 rank groups"}


def test_in_place_reduce_scatter_reads_every_own_gradient_byte_before_its_output_write(model_exe):
    """NCCL's in-place form (one parameter of W * shardNumel elements, output type = gradient type, rank r's output
    = its own block r of its own gradient): outputs and gradients share bytes and shadow tags, so a gradient byte
    read after the output was written there is a hazard. Random odd sizes of 1 to about 40 chunks, every node split
    of W = 2, 3, 4, 8, bf16 / fp16 / fp32, sum / avg / premul, under every issue model (in order, deferred,
    two-sided, captured on two lanes and folded, eager token calls, one shared copy queue, one FIFO channel):
    bit-exact with the host executor, hazard-free, no deadlock."""
    r = subprocess.run([str(model_exe), "--in-place", "4"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [x for x in r.stdout.splitlines() if x.startswith("in-place case ")]
    assert all(": ok (" in x for x in lines)
    assert {(x.split()[3], x.split()[4]) for x in lines} == IN_PLACE_SPLITS
    assert {x.split()[5] for x in lines} == {"bf16", "fp16", "fp32"}
    modes = {x.split(" chunks=")[1].split(" seed ")[0].split(" ", 1)[1] for x in lines}
    assert modes == IN_PLACE_MODES, modes
    chunks = {int(x.split(" chunks=")[1].split()[0]) for x in lines}
    assert {1, 2} <= chunks and max(chunks) > 20, chunks
    # the consumed-token pipeline (more chunks than buffers) ran in place on tokens
    assert any(" captured " in x and int(x.split(" chunks=")[1].split()[0]) > 2 for x in lines)
    assert any(int(x.split(" shard=")[1].split()[0]) % 2 == 1 for x in lines)  # odd sizes
    assert int(r.stdout.split("output bytes written in place: ")[1].split()[0]) > 10**6


@pytest.mark.parametrize("mutant,symptom", [
    ("--in-place-other-block", "RS output byte not written by this call"),
    ("--in-place-mirror", "gradient read after an output write"),
])
def test_in_place_model_detects_an_output_over_gradient_still_to_be_read(model_exe, mutant, symptom):
    """The in-place checks can fail: outputs resolved into the next rank's block (the own block never written), and
    programs whose reduce of chunk k writes where a later chunk's gradient is still to be pushed (the output chunks
    mirrored), which the model must report as a gradient read after an output write."""
    r = subprocess.run([str(model_exe), "--in-place", mutant, "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "FAIL:" in r.stderr and symptom in r.stderr, r.stdout[-1500:] + r.stderr[-1500:]
