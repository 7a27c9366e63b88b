# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide-perf's rough edges and its nccl-tests compatibility: every bad flag gets a one-line `tide-perf: error:`
before any work, exit status 2 (a bad value) or 255 (bad sizes, an option tide-perf cannot honour: nccl-tests' -1);
rows and JSON read like nccl-tests'."""

import json
import subprocess
import sys

import pytest
from nccl_tide.perf.cli import main as perf_main

HOST = ["--backend", "host", "--ranks", "4"]


def run_inproc(capsys, *args):
    with pytest.raises(SystemExit) as e:
        perf_main(list(args))
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


def expect_usage_error(capsys, args, words, status=2):
    code, out, err = run_inproc(capsys, *args)
    assert code == status, (args, out, err)
    assert out == "", out  # before any work: not even the header
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("tide-perf: error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize(
    "args, words",
    [
        (["-n", "0"], ["-n", ">= 1", "got 0"]),
        (["-n", "-3"], ["-n", "got -3"]),
        (["-w", "-5"], ["-w", ">= 0", "got -5"]),
        (["-b", "0", "-e", "4K", "-f", "2"], ["-b 0 with -f never grows"]),  # else no end
        (["-b", "5", "-e", "5"], ["every size from -b 5 to -e 5 is below 16 bytes per rank"]),  # not a silent 0
        (["-b", "1", "-e", "15", "-f", "2"], ["below 16 bytes per rank", "nothing to run"]),
        (["-f", "0"], ["-f", "got 0"]),
        (["-f", "-2"], ["-f", "got -2"]),
        (["-b", "1K", "-e", "4K", "-f", "1"], ["-f 1 does not grow"]),
        (["-b", "1K", "-e", "4K", "-i", "0"], ["-i 0 never grows"]),
        (["-m", "0"], ["-m (calls per iteration) must be >= 1, got 0"]),
        (["-N", "-1"], ["-N (run cycles) must be >= 0"]),
        (["--seed", "-1"], ["--seed must be in 0..", "got -1"]),  # not a ValueError traceback
        (["--scale", "nan", "-o", "premul"], ["--scale must be a finite number"]),
        (["--scale", "inf"], ["--scale must be a finite number"]),
        (["--min-busbw", "-1"], ["--min-busbw"]),
        (["--impl", "nccl"], ["measures nothing on the host backend"]),
        (["--impl", "nccl,fsdp2"], ["measures nothing on the host backend"]),
        (["-c", "2"], ["invalid choice"]),
        (["--bogus"], ["unrecognized arguments"]),
        (["-J", "/nonexistent/dir/x.json"], ["-J /nonexistent/dir/x.json", "does not exist"]),
        (["-J", ""], ["-J ''", "empty path"]),  # not ignored
        (["--plot", ""], ["--plot ''", "empty path"]),
        (["-J", "/dev/full"], ["-J /dev/full", "not a regular file"]),  # before the run, not a traceback after it
        (["-J", "/proc/x.json"], ["-J /proc/x.json", "is not writable"]),
        (["--plot", "/proc/x.png"], ["--plot /proc/x.png", "is not writable"]),
        (["--plot", "x.xyz"], ["--plot x.xyz", "unsupported figure format .xyz"]),
        (["--plot", "/nonexistent/d/x.png"], ["does not exist"]),
    ],
)
def test_bad_flags_fail_fast_with_one_line(capsys, args, words):
    expect_usage_error(capsys, ["all_gather", *HOST, *args], words)


@pytest.mark.parametrize(
    "args, words",
    [
        (["-b", "1G", "-e", "1K"], ["-b 1073741824 is larger than -e 1024"]),
        (["-b", "-1K"], ["invalid size '-1K'", ">= 0"]),  # not argparse's "expected one argument"
        (["-e", "-4"], ["invalid size '-4'"]),
        (["-t", "2"], ["-t 2 is not supported by tide-perf"]),
        (["-g", "2"], ["-g 2 is not supported by tide-perf"]),
        (["-G", "1"], ["-G 1 is not supported by tide-perf"]),
        (["-R", "1"], ["-R 1 is not supported by tide-perf"]),
        (["-R", "2"], ["-R 2 is not supported by tide-perf"]),
        (["-x", "0"], ["-x (NCCL CTA policy) is not supported by tide-perf"]),
        (["-D", "1"], ["-D 1 is not supported by tide-perf", "device-API"]),
        (["-y", "1"], ["-y 1 is not supported by tide-perf", "stream"]),
        (["-T", "30"], ["-T 30 is not supported by tide-perf", "timeout"]),
        (["-u", "1"], ["-u 1 is not supported by tide-perf"]),
    ],
)
def test_bad_sizes_and_unsupported_options_exit_255(capsys, args, words):
    """nccl-tests ends with -1 (255) on sizes it cannot run and on options its build cannot honour (-D, -V)."""
    expect_usage_error(capsys, ["all_gather", *HOST, *args], words, status=255)


def test_json_path_that_is_a_directory(capsys, tmp_path):
    expect_usage_error(capsys, ["all_gather", *HOST, "-J", str(tmp_path)], ["is a directory"])


def test_gpu_backends_without_cuda_torch(capsys):
    # The CI machine has the CPU build of torch: a clear error, not an AttributeError traceback with status 1.
    import torch

    if torch.version.cuda:
        pytest.skip("this torch has CUDA")
    for backend in ("loopback", "torchrun"):
        expect_usage_error(capsys, ["all_gather", "--backend", backend, "--ranks", "2", "-b", "1M", "-e", "1M"],
                           [f"--backend {backend} needs a CUDA build of PyTorch", torch.__version__])


def test_gpu_backends_without_torch():
    prog = ("import sys; sys.modules['torch'] = None\n"
            "from nccl_tide.perf.cli import main\n"
            "sys.exit(main(['reduce_scatter', '--backend', 'loopback', '--ranks', '2', '-b', '1M', '-e', '1M']))")
    p = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "", p.stdout + p.stderr
    assert p.stderr.strip() == ("tide-perf: error: --backend loopback needs PyTorch with CUDA: pip install torch "
                                "(or use --backend host)"), p.stderr


def test_plot_subcommand_rejects_unknown_format(tmp_path, capsys):
    js = tmp_path / "a.json"
    js.write_text(json.dumps({"results": []}))
    assert perf_main(["plot", str(js), str(tmp_path / "out.xyz")]) == 2
    err = capsys.readouterr().err
    assert "unsupported figure format .xyz" in err and "Traceback" not in err


def test_help_has_a_line_and_default_for_every_flag(capsys):
    with pytest.raises(SystemExit) as e:
        perf_main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    from nccl_tide.perf.options import parser

    p = parser()
    fmt = p._get_formatter()
    for action in p._actions:
        if not action.option_strings or action.dest in ("help", "version"):
            continue
        assert action.help, action.option_strings  # every flag says what it does
        shown = fmt._get_help_string(action)  # what --help prints for it
        assert "(default" in shown, (action.option_strings, shown)
    assert "(default: 32M)" in text and "(default: 1)" in text  # -b and -c show their defaults


def test_version(capsys):
    from nccl_tide import __version__

    with pytest.raises(SystemExit) as e:
        perf_main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"tide-perf {__version__}"


def test_layout_header_shows_the_layout_size(capsys):
    from nccl_tide.dtypes import dtype
    from nccl_tide.perf.collectives import model_bytes

    from nccl_tide.models import MODELS

    model = sorted(MODELS, key=lambda m: model_bytes(m, 4, dtype("bf16")))[0]  # the smallest: a quick run
    rc = perf_main(["all_gather", *HOST, "--layout", model, "-d", "bf16"])
    out = capsys.readouterr().out
    assert rc == 0, out
    size = model_bytes(model, 4, dtype("bf16"))
    assert f"minBytes {size} maxBytes {size}" in out, out
    rows = [x for x in out.splitlines() if x and not x.startswith("#")]
    assert len(rows) == 1 and int(rows[0].split()[0]) == size


# --------------------------------------------------------------------------------------------------------------
# nccl-tests compatibility: a parser written for nccl-tests' output reads tide-perf's.
# --------------------------------------------------------------------------------------------------------------


def nccl_tests_parse(stdout):
    """What the usual nccl-tests scrapers do: data rows are the lines that do not start with '#'; fields split on
    whitespace; size=0, count=1, type=2, redop=3, root=4, then out-of-place time=5 algbw=6 busbw=7 #wrong=8 and
    in-place time=9 algbw=10 busbw=11 #wrong=12; the footer's '# Avg bus bandwidth : X'."""
    rows = []
    for line in stdout.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        f = line.split()
        rows.append({"size": int(f[0]), "count": int(f[1]), "type": f[2], "redop": f[3], "root": int(f[4]),
                     "time": float(f[5]), "algbw": float(f[6]), "busbw": float(f[7]), "wrong": f[8],
                     "ip_busbw": None if f[11] == "N/A" else float(f[11]), "ip_wrong": f[12], "rest": f[13:]})
    avg = None
    for line in stdout.splitlines():
        if line.startswith("# Avg bus bandwidth"):
            avg = float(line.split(":")[1].split()[0])
    return rows, avg


@pytest.mark.parametrize("coll, world", [("all_gather", 8), ("reduce_scatter", 4)])
def test_rows_parse_at_nccl_tests_positions(capsys, tmp_path, coll, world):
    js = tmp_path / "r.json"
    rc = perf_main([coll, "--backend", "host", "--ranks", str(world), "-b", "4K", "-e", "64K", "-f", "4",
                    "-d", "bf16", "-J", str(js)])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows, avg = nccl_tests_parse(out)
    assert [r["size"] for r in rows] == [4096, 16384, 65536]
    for r in rows:
        assert r["type"] == "bfloat16" and r["redop"] == ("none" if coll == "all_gather" else "sum")
        assert r["root"] == -1 and r["count"] * 2 * world == r["size"] and r["wrong"] == "0"
        # busbw sits where nccl-tests puts it: algbw x (W-1)/W, to the printed precision
        assert abs(r["busbw"] - r["algbw"] * (world - 1) / world) <= 0.011, r
        assert r["time"] > 0 and r["rest"] == []  # exactly nccl-tests' 13 columns by default
    # nccl-tests' average runs over the out-of-place and in-place figures of every row
    vals = [r["busbw"] for r in rows] + [r["ip_busbw"] for r in rows if r["ip_busbw"] is not None]
    assert avg is not None and avg == pytest.approx(sum(vals) / len(vals), abs=0.02)

    doc = json.loads(js.read_text())
    # nccl-tests' JSON (file version 3) keys, with its value forms
    assert doc["version"] == 3 and isinstance(doc["start_time"], str) and isinstance(doc["end_time"], str)
    assert doc["args"][0] == "tide-perf" and all(isinstance(x, str) and "=" in x for x in doc["env"])
    assert "nccl_version" in doc and doc["errors"] == []
    c = doc["config"]
    for key in ("nthreads", "ngpus", "minimum_bytes", "maximum_bytes", "step_factor", "warmup_iters", "iterations",
                "aggregated_iterations", "validation", "graph", "blocking_collectives", "per_iter_timing",
                "per_iter_skip", "parallel_init", "devices"):
        assert key in c, key
    assert (c["minimum_bytes"], c["maximum_bytes"], c["step_factor"]) == (4096, 65536, 4)
    assert doc["out_of_bounds"] == {"count": 0, "okay": "true"}
    assert doc["average_bus_bandwidth"]["okay"] == "unchecked"
    assert doc["average_bus_bandwidth"]["bandwidth"] == pytest.approx(avg, abs=0.02)
    for res, row in zip(doc["results"], rows):
        assert (res["size"], res["count"], res["type"], res["redop"]) == (row["size"], row["count"], row["type"],
                                                                          row["redop"])
        assert res["root"].strip() == "-1" and res["actual_iterations"] == 20
        assert res["experiment_name"] == f"{coll}_perf"
        assert set(res["out_of_place"]) == {"time", "alg_bw", "bus_bw", "nwrong"}
        assert res["out_of_place"]["bus_bw"] == pytest.approx(row["busbw"], abs=0.006)


def test_json_env_keeps_only_run_variables(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "VERSION")
    monkeypatch.setenv("SOME_API_TOKEN", "secret")
    js = tmp_path / "e.json"
    assert perf_main(["all_gather", *HOST, "-b", "4K", "-e", "4K", "-J", str(js)]) == 0
    capsys.readouterr()
    env = json.loads(js.read_text())["env"]
    assert "NCCL_DEBUG=VERSION" in env and not any("SECRET" in x.upper() or "TOKEN" in x for x in env)


def test_min_busbw_okay_words(capsys, tmp_path):
    js = tmp_path / "g.json"
    base = ["all_gather", *HOST, "-b", "4K", "-e", "4K", "-J", str(js), "--overwrite"]
    assert perf_main(base + ["--min-busbw", "1e-9"]) == 0
    assert json.loads(js.read_text())["average_bus_bandwidth"]["okay"] == "true"
    assert perf_main(base + ["--min-busbw", "1e9"]) == 7  # nccl-tests' testNumResults
    assert json.loads(js.read_text())["average_bus_bandwidth"]["okay"] == "false"
    capsys.readouterr()


def test_negative_size_long_form(capsys):
    expect_usage_error(capsys, ["all_gather", *HOST, "--minbytes", "-2M"], ["invalid size '-2M'"], status=255)


def test_share_is_not_a_tide_perf_command(capsys):
    """One rank's share is a benchmark of the repository: `tide-perf share` says where it went, exit status 2."""
    with pytest.raises(SystemExit) as e:
        perf_main(["share", "both", "--ranks", "8"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tide-perf: error:") and "python benchmarks/share" in err and len(err.splitlines()) == 1
