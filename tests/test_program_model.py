"""The step-program protocol on the CPU model (tests/c/program_model.cc; docs/architecture.md "Step programs").

The model runs the programs of every rank of a layout together (random interleavings of each rank's two lanes, many
seeds, counters that wrap around 2^32) for world sizes 2-64 and node splits 1xW, 2x4, 4x2, 3x2, 2x3, 5x1, 8x8, 6x8,
and checks termination, bit-exact results against the host executor, and read/overwrite hazards on staging and slots.
Eager calls on the token route (NCCL_TIDE_EAGER_GRAPHS) run mixed with epoch calls on one comm. The mutation cases
remove every wait on one flag word and require the model to fail: each wait protects something the model can see.
"""

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
        str(repo / "tests" / "c" / "program_model.cc"),
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
    """The loopback issue model (program_model --copy-queue; docs/notes/levers-after-session16.md): with the
    token protocol issued rank by rank and one queue entry per copy (a captured graph's memcpy nodes), a shared
    copy queue of 600 entries lets the 9-parameter W=8 all-gather through (576 entries in all) and hangs the
    64-parameter one (512 per rank), as the eager graph route did on the H200 in session 16."""
    r = _queue(model_exe, 600, "graph", "call", "token")
    assert r.returncode != 0, r.stdout[-2000:]
    assert "the host is blocked on a full copy queue" in r.stderr, r.stderr[-2000:]
    assert "queue case 2 W=8 P=9 cap 600 graph call token seed 2: ok" in r.stdout, r.stdout[-2000:]
    assert "W=8 P=64" not in r.stdout, r.stdout[-2000:]


def test_copy_queue_model_batched_copies_are_why_the_epoch_protocol_does_not_hang(model_exe):
    """The epoch protocol also waits for every rank's arrival before its copies; it passes with one entry per copy
    batch (cudaMemcpyBatchAsync) and a queue as small as the world, and hangs with one entry per copy."""
    ok = _queue(model_exe, 8, "batch", "call", "epoch")
    assert ok.returncode == 0 and "all cases passed" in ok.stdout, ok.stdout[-2000:] + ok.stderr[-2000:]
    bad = _queue(model_exe, 64, "graph", "call", "epoch")
    assert bad.returncode != 0 and "the host is blocked on a full copy queue" in bad.stderr, bad.stderr[-2000:]


@pytest.mark.parametrize("protocol", ["token", "token-mixed"])
@pytest.mark.parametrize("cap", [1, 64, 600])
def test_copy_queue_model_announce_first_never_hangs(model_exe, cap, protocol):
    """The loopback fix (BoundProgram::issueTokens on a deferring provider): every rank's announce (its first
    writes) at its call, the rest of every rank after the last call. No hang whatever the queue's size, for token
    all-gathers alone and mixed with token reduce-scatters (Slot-Reuse and own staging), bit-exact and hazard-free
    as every model run."""
    r = _queue(model_exe, cap, "graph", "announce", protocol)
    assert r.returncode == 0 and "all cases passed" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert "W=8 P=64" in r.stdout
