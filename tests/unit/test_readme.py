# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""README's two set-up commands, that CI runs exactly the README's test command, and that README's supported-versions
table agrees with the package, the build and the FSDP2 adapters (the other documents point to it)."""

import re

import pytest


def readme_commands(repo):
    text = (repo / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    return [b.strip() for b in blocks]


def test_readme_has_exactly_two_setup_commands(repo):
    cmds = readme_commands(repo)
    assert len(cmds) == 2 and all("\n" not in c for c in cmds), cmds
    main_job, tests = cmds
    assert main_job.startswith("pip install . && tide-perf all_gather --backend host")
    assert "-c 1" in main_job
    assert tests.startswith('pip install ".[test]" && python -m pytest')


def test_ci_runs_the_readme_commands(repo):
    main_job, tests = readme_commands(repo)
    cpu = (repo / "ci" / "cpu.sh").read_text()
    live = [ln.strip() for ln in cpu.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert tests in live, "ci/cpu.sh must run the README test command verbatim"
    assert "exit 1" in cpu and "-eq 5" in cpu  # zero collected tests fails the job
    # The main job runs from the test command's install: its part after `pip install . && `, verbatim.
    install, _, job = main_job.partition(" && ")
    assert install == "pip install ." and job in live, main_job
    assert live.index(job) > live.index(tests)
    run = (repo / ".ci" / "run").read_text()
    assert "bash ci/cpu.sh" in run


def test_ci_installs_without_a_cuda_compiler(repo):
    # ci/cpu.sh hides what CMake's CUDA detection looks at (CUDACXX, nvcc on PATH, CUDA_PATH), then fails unless
    # the install is the host-only build.
    cpu = (repo / "ci" / "cpu.sh").read_text()
    for var in ("CUDACXX", "CUDA_PATH", "CMAKE_ARGS"):
        assert re.search(rf"^unset .*\b{var}\b", cpu, flags=re.M), var
    assert "command -v nvcc" in cpu and "python -m nccl_tide" in cpu and "CUDA build: no" in cpu


def test_readme_states_build_times_and_the_switch(repo):
    setup = (repo / "README.md").read_text().split("## Set-up", 1)[1].split("\n## ", 1)[0]
    assert "TIDE_BUILD_CUDA=OFF" in setup and "python -m nccl_tide" in setup
    assert re.search(r"test command takes about \d+ minutes", setup), setup


def supported_versions(repo) -> dict:
    """README's "Supported versions" table: {what: (supported, tested where)}."""
    text = (repo / "README.md").read_text()
    section = text.split("\n## Supported versions\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| what ")]
    table = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("| ").split(" | ")]
        assert len(cells) == 3, row  # a "|" inside a cell would split it
        table[cells[0]] = (cells[1], cells[2])
    return table


def test_supported_versions_has_one_row_per_dependency(repo):
    table = supported_versions(repo)
    assert list(table) == ["Python", "torch", "NCCL", "CUDA", "GPU", "glibc"], list(table)
    assert all(supported and tested for supported, tested in table.values()), table


def _minor(text: str) -> tuple:
    return tuple(int(x) for x in text.split("."))


def test_supported_torch_is_the_adapters_and_the_test_extra(repo):
    # The releases the table names are exactly those nccl_tide.fsdp has an adapter for, and the test extra's torch
    # requirement is quoted verbatim and asks for nothing outside them.
    pytest.importorskip("torch")
    from nccl_tide.fsdp import _adapter

    supported, tested = supported_versions(repo)["torch"]
    listed = re.match(r"((?:\d+\.\d+, )*\d+\.\d+):", supported)
    assert listed, supported
    releases = listed.group(1).split(", ")
    adapters = [a.name.removeprefix("torch-") for a in _adapter.ADAPTERS]
    assert sorted(releases, key=_minor) == sorted(adapters, key=_minor) and releases == sorted(releases, key=_minor)

    pyproject = (repo / "pyproject.toml").read_text()
    extra = re.search(r"^test = \[.*\"(torch[^\"]*)\".*\]$", pyproject, flags=re.M)
    assert extra, "pyproject.toml's test extra names no torch"
    requirement = extra.group(1)
    assert f"The test extra installs `{requirement}`" in supported, (requirement, supported)
    bounds = re.fullmatch(r"torch>=(\d+\.\d+),<(\d+\.\d+)", requirement)
    assert bounds, requirement
    low, high = _minor(bounds.group(1)), _minor(bounds.group(2))
    known = set(map(_minor, adapters))
    assert low == min(known), "the test extra's lowest torch must be the oldest supported one"
    assert low[0] == high[0] and low < high, requirement
    assert {(low[0], m) for m in range(low[1], high[1])} <= known, (requirement, adapters)  # no release without one
    # What CPU CI installs lies in the extra's range.
    ci = re.search(r"CPU CI: (\d+\.\d+)\.\d+\+cpu", tested)
    assert ci and low <= _minor(ci.group(1)) < high, tested


def test_supported_python_nccl_cuda_gpu_glibc_match_the_build(repo):
    table = supported_versions(repo)
    pyproject = (repo / "pyproject.toml").read_text()
    oldest_python = re.search(r'^requires-python = ">=(\d+\.\d+)"$', pyproject, flags=re.M).group(1)
    assert table["Python"][0].startswith(f"{oldest_python} and newer"), table["Python"]

    # The NCCL range the library accepts (plugin/nccl/nccl_lib.cc): oldest 2.28.0, newest known minor.
    nccl_lib = (repo / "plugin" / "nccl" / "nccl_lib.cc").read_text()
    code = int(re.search(r"kMinVersion = (\d+);", nccl_lib).group(1))
    newest = int(re.search(r"kNewestKnownMinor = (\d+);", nccl_lib).group(1))
    assert table["NCCL"][0].startswith(f"{code // 10000}.{code // 100 % 100} through 2.{newest},"), table["NCCL"]

    # The CUDA majors setup.py builds wheels for (TIDE_CUDA variants).
    setup = (repo / "setup.py").read_text()
    majors = sorted(set(re.findall(r'"cu(\d+)": "\1"', setup)), key=int)
    assert table["CUDA"][0].startswith(" and ".join(majors) + ":"), (majors, table["CUDA"])
    for m in majors:
        assert f"TIDE_CUDA=cu{m}" in table["CUDA"][0] or f"`cu{m}`" in table["CUDA"][0], m

    # The oldest architecture CMake builds for by default.
    cmake = (repo / "CMakeLists.txt").read_text()
    archs = re.search(r'set\(CMAKE_CUDA_ARCHITECTURES "([0-9;]+)"\)', cmake).group(1).split(";")
    assert table["GPU"][0].startswith(f"NVIDIA sm_{min(archs, key=int)} and newer"), table["GPU"]
    for arch in archs:
        assert f"sm_{arch}" in table["GPU"][0], arch

    # The glibc setup.py links the wheel's library for, and its manylinux tag.
    glibc = re.search(r'"TIDE_GLIBC_COMPAT", "([0-9.]+)" if', setup).group(1)
    tag = glibc.replace(".", "_")
    assert table["glibc"][0].startswith(f"{glibc} and newer") and f"manylinux_{tag}_x86_64" in table["glibc"][0]
    assert f'glibc_compat() == "{glibc}"' in setup and f"manylinux_{tag}_x86_64" in setup


def test_other_documents_point_to_the_table(repo):
    # A version range written out elsewhere drifts from the table; those places name the table instead.
    pointer = '"Supported versions"'
    fsdp = (repo / "docs" / "fsdp.md").read_text().split("## Supported torch versions", 1)[1].split("\n## ", 1)[0]
    assert "README.md, " + pointer in fsdp
    assert "README.md, " + pointer in (repo / "pyproject.toml").read_text()
    status = (repo / "README.md").read_text().split("## Status", 1)[1].split("\n## ", 1)[0]
    assert pointer in status
    readme = (repo / "README.md").read_text()
    before, after = readme.split("\n## Supported versions\n", 1)
    texts = {"README.md outside the table": before + after.split("\n## ", 1)[1]}
    texts.update({str(d.relative_to(repo)): d.read_text() for d in sorted((repo / "docs").glob("*.md"))})
    texts["benchmarks/README.md"] = (repo / "benchmarks" / "README.md").read_text()
    for name, text in texts.items():
        ranges = re.findall(r"torch \d+\.\d+ ?(?:-|to|through) ?\d+\.\d+", text)
        assert not ranges, (name, ranges)
