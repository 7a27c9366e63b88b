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
