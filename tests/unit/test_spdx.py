# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Every source file names its license in one SPDX line at its top, with the project's copyright line (NOTICE), so
that a file copied out of the tree still says under which terms it came."""

import os
import re

from fixtures import repo_files

SUFFIXES = (".c", ".cc", ".h", ".cu", ".cuh", ".py", ".sh", ".cmake")
NAMES = ("CMakeLists.txt", "Makefile")
# Data the tests read back byte for byte (recorded torch sources, fuzz cases) carries no header.
SKIP_PREFIXES = ("tests/data/", "tests/fuzz/corpus/")
HEAD_LINES = 4  # a shebang, the copyright line, the SPDX line, and room for a C comment's opening


def license_id(repo):
    m = re.search(r'^license = "([^"]+)"$', (repo / "pyproject.toml").read_text(), flags=re.M)
    assert m, "pyproject.toml has no SPDX license string"
    return m.group(1)


def copyright_line(repo):
    lines = [ln for ln in (repo / "NOTICE").read_text().splitlines() if ln.startswith("Copyright ")]
    assert len(lines) == 1, lines
    return lines[0]


def source_files(repo):
    for name in repo_files(repo):
        if name.startswith(SKIP_PREFIXES):
            continue
        if name.endswith(SUFFIXES) or os.path.basename(name) in NAMES:
            yield name
        else:
            with open(repo / name, "rb") as f:
                if f.read(2) == b"#!":  # a script without a suffix (.ci/run)
                    yield name


def test_the_license_is_the_license_file(repo):
    text = (repo / "LICENSE").read_text()
    assert license_id(repo) == "Apache-2.0" and "Apache License" in text and "Version 2.0" in text


def test_every_source_file_has_the_spdx_header(repo):
    spdx = f"SPDX-License-Identifier: {license_id(repo)}"
    owner = copyright_line(repo)
    files = list(source_files(repo))
    assert "CMakeLists.txt" in files and "include/tide.h" in files and "ci/cpu.sh" in files, files[:20]
    missing = []
    for name in files:
        head = (repo / name).read_text(errors="replace").splitlines()[:HEAD_LINES]
        if not any(spdx in ln for ln in head) or not any(owner in ln for ln in head):
            missing.append(name)
    assert not missing, f"{len(missing)} of {len(files)} files lack '{owner}' / '{spdx}' at the top: {missing}"
