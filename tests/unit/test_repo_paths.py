# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Every repository path that the docs, READMEs, scripts and comments name exists, so that a reader who follows one
finds the file (a move or a rename has to carry its references along).

A path is a token that starts with one of the tree's top-level folders (plugin/, tests/, docs/, ...) or with
nccl_tide/ (the package, under pytorch_glue/). Where a text means a pattern it says so: `*`, `?` and `[...]` are
globs within one name, and `<name>` or `{name}` stand for any part of one name; a pattern must match at least one
path. `{a,b}` is the shell's: each of its paths must exist. A name without a suffix (plugin/core/internode) stands
for the files it is the stem of (internode.h, internode.cc).

A path written from below the top (`cuda/comm.h`, `perf/harness.py`) means a file of this tree when its first folder
is the name of one of the tree's folders or its file name the name of one of the tree's files: it must be the end of
a path of the tree. A document named alone (`env.md`) must be one of the tree's. Other projects' paths (nccl-tests'
`src/util.cu`, torch's `torch/optim/adam.py`) share neither with this tree and are not read.
"""

import fnmatch
import re

from fixtures import repo_files

ROOTS = ("plugin", "pytorch_glue", "tests", "docs", "ci", "benchmarks", "examples", "include", "cmake", ".ci",
         "nccl_tide")
# The token starts where no other path character precedes it: `nccl-tests/...` or a URL's `.../docs/...` is no path
# of this tree.
TOKEN = re.compile(r"(?<![\w./-])(?:" + "|".join(re.escape(r) for r in ROOTS) + r")/(?:[\w./*?\[\]<>-]|\{[^{}\s/]*\})*")
PLACEHOLDER = re.compile(r"<[^<>/]*>|\{[^{},/]*\}")
ALTERNATIVES = re.compile(r"\{([^{}/]*,[^{}/]*)\}")

# Paths that a build, an install or a benchmark writes, named on purpose by the text that explains where they come
# from.
GENERATED = {
    "examples/c/host_all_gather",  # examples/c/Makefile's program
    "pytorch_glue/nccl_tide/lib",  # setup.py copies the built library and the header into the package
    "pytorch_glue/nccl_tide/lib/libnccl-tide.so",
    "pytorch_glue/nccl_tide/include",
    "pytorch_glue/nccl_tide/include/tide.h",
    "results.md",  # benchmarks/run_all.py writes it into its --out folder
}
# Not read: the changelog records the past, paths a change removed included; this file names dead paths on purpose
# (test_the_check_sees_a_dead_path); data files hold no prose.
SKIP_FILES = {"CHANGELOG.md", "tests/unit/test_repo_paths.py"}
SKIP_PREFIXES = ("tests/data/", "tests/fuzz/corpus/")
SKIP_SUFFIXES = (".png", ".json", ".gz", ".bin")


def text_files(repo):
    for name in repo_files(repo):
        if name in SKIP_FILES or name.startswith(SKIP_PREFIXES) or name.endswith(SKIP_SUFFIXES):
            continue
        try:
            yield name, (repo / name).read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue


def clean(token):
    """The token without what ends the sentence or the code around it: punctuation, an unmatched bracket."""
    while token and token[-1] in ".,:;'\"`)]}>":
        close = token[-1]
        opener = {"]": "[", "}": "{", ">": "<"}.get(close)
        if opener and token.count(opener) >= token.count(close):
            break
        token = token[:-1]
    token = "pytorch_glue/" + token if token.startswith("nccl_tide/") else token
    return token.rstrip("/")


def glob_matches(pattern, path):
    """pattern matches path, or a folder above it, name by name (a `*` never crosses a `/`)."""
    want, have = pattern.split("/"), path.split("/")
    return len(have) >= len(want) and all(fnmatch.fnmatchcase(h, w) for h, w in zip(have, want))


def resolves(repo, path, tracked):
    alternatives = ALTERNATIVES.search(path)
    if alternatives:
        head, tail = path[:alternatives.start()], path[alternatives.end():]
        return all(resolves(repo, head + a + tail, tracked) for a in alternatives.group(1).split(","))
    if path in GENERATED or (repo / path).exists():
        return True
    pattern = PLACEHOLDER.sub("*", path)
    if any(c in pattern for c in "*?["):
        return any(glob_matches(pattern, t) for t in tracked)
    parent, stem = (repo / path).parent, (repo / path).name
    return "." not in stem and parent.is_dir() and any(p.stem == stem for p in parent.iterdir())


def named_paths(repo):
    for name, text in text_files(repo):
        for number, line in enumerate(text.splitlines(), 1):
            for m in TOKEN.finditer(line):
                yield clean(m.group(0)), f"{name}:{number}"


class InnerPaths:
    """The paths of a text that start below the top and mean a file of this tree, and the documents it names alone
    (the rules in the docstring)."""

    def __init__(self, tracked):
        self.folders = {part for t in tracked for part in t.split("/")[:-1]}
        self.files = {t.rsplit("/", 1)[-1] for t in tracked}
        suffixes = sorted({n.rsplit(".", 1)[1] for n in self.files if "." in n.lstrip(".")}, key=len, reverse=True)
        # A file name with one of the tree's suffixes and the folders written before it, starting where no other
        # path character precedes it (so not inside `../core/log.h` or `$PWD/build/...`).
        self.token = re.compile(r"(?<![\w./$-])[\w-][\w.-]*(?:/[\w.-]+)*\.(?:" + "|".join(map(re.escape, suffixes))
                                + r")(?![\w/-])")

    def of(self, line):
        found = []
        for m in self.token.finditer(line):
            path = m.group(0)
            first, _, rest = path.partition("/")
            if first in ROOTS:
                continue  # TOKEN's
            if (first in self.folders or path.rsplit("/", 1)[-1] in self.files) if rest else path.endswith(".md"):
                found.append(path)
        return found


def ends_a_path(path, tracked):
    return path in GENERATED or any(t == path or t.endswith("/" + path) for t in tracked)


def inner_paths(repo, tracked):
    inner = InnerPaths(tracked)
    for name, text in text_files(repo):
        for number, line in enumerate(text.splitlines(), 1):
            for path in inner.of(line):
                yield path, f"{name}:{number}"


def test_every_named_path_exists(repo):
    tracked = set(repo_files(repo))
    assert {"README.md", "docs/env.md", "ci/cpu.sh"} <= tracked, sorted(tracked)[:20]
    dead = [f"{where}: {path}" for path, where in named_paths(repo) if not resolves(repo, path, tracked)]
    assert not dead, "\n".join(dead)


def test_every_path_from_below_the_top_and_every_named_document_exists(repo):
    tracked = set(repo_files(repo))
    named = list(inner_paths(repo, tracked))
    assert any(path == "env.md" for path, _ in named) and any(path == "perf/harness.py" for path, _ in named)
    dead = [f"{where}: {path}" for path, where in named if not ends_a_path(path, tracked)]
    assert not dead, "\n".join(dead)


def test_the_check_sees_a_dead_path(repo):
    # The rules themselves: a moved file is caught, a pattern must match something, a stem names its files.
    tracked = {"tests/unit/test_readme.py", "plugin/core/internode.h"}
    assert resolves(repo, clean("tests/unit/test_readme.py,"), tracked)
    assert not resolves(repo, clean("tests/test_readme.py"), tracked)
    assert resolves(repo, clean("tests/unit/test_*.py"), tracked)
    assert resolves(repo, clean("benchmarks/<script>.py"), tracked | {"benchmarks/rs.py"})
    assert not resolves(repo, clean("tests/nowhere/<name>.py"), tracked)
    assert resolves(repo, clean("plugin/core/internode:"), tracked)
    assert resolves(repo, clean("plugin/core/internode.{h,cc}"), tracked)
    assert not resolves(repo, clean("plugin/core/internode.{h,cu}"), tracked)
    assert not resolves(repo, clean("tests/*.py"), {"tests/unit/test_readme.py"})
    assert resolves(repo, clean("tests/*/"), {"tests/unit/test_readme.py"})
    assert not resolves(repo, clean("plugin/core/nowhere"), tracked)
    line = "see nccl-tests/src/x.cu, https://github.com/NVIDIA/nccl/tree/master/docs/x and `ci/cpu.sh`."
    assert [clean(m.group(0)) for m in TOKEN.finditer(line)] == ["ci/cpu.sh"]
    assert clean("nccl_tide/fsdp/") == "pytorch_glue/nccl_tide/fsdp"


def test_the_check_sees_a_dead_path_from_below_the_top():
    # Read: a path whose folder or file name is the tree's, a document alone. Not read: a path of another project, a
    # path inside a longer one, a file named alone that is not a document.
    tracked = {"plugin/core/c_enum.h", "pytorch_glue/nccl_tide/perf/harness.py", "docs/env.md"}
    line = ("c_enum.h (tide/c_enum.h, core/c_enum.h), perf/harness.py, perf/cli.py, ../core/errors.h, env.md and "
            "NOTES.md; nccl-tests' src/util.cu, torch/optim/adam.py, $PWD/build/x.py, docs/env.md")
    found = InnerPaths(tracked).of(line)
    assert found == ["tide/c_enum.h", "core/c_enum.h", "perf/harness.py", "perf/cli.py", "env.md", "NOTES.md"]
    assert [p for p in found if not ends_a_path(p, tracked)] == ["tide/c_enum.h", "perf/cli.py", "NOTES.md"]
    assert ends_a_path("results.md", tracked)  # written by a benchmark (GENERATED)
