# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tide.h where a user can find it: nccl_tide.include_dir() (the wheel's copy, or a source checkout's include/),
`python -m nccl_tide` printing its path, and error hints that name it that way instead of a repository path.

The wheel itself (the header inside it, and include_dir() in a fresh venv) is checked in test_packaging.py.
"""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nccl_tide
import pytest
from nccl_tide import errors


def _run(code_or_module, cwd, env, module=False):
    cmd = [sys.executable, "-m", code_or_module] if module else [sys.executable, "-c", code_or_module]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def test_include_dir_holds_the_repository_header(repo):
    # Whatever the layout under test (installed wheel or PYTHONPATH=pytorch_glue): the header is the repo's text.
    header = Path(nccl_tide.include_dir()) / "tide.h"
    assert header.read_bytes() == (repo / "include" / "tide.h").read_bytes()


def test_source_checkout_uses_the_repository_include(repo, tmp_path):
    # PYTHONPATH=pytorch_glue without installing: no nccl_tide/include copy, so the checkout's include/ it is.
    env = dict(os.environ, PYTHONPATH=str(repo / "pytorch_glue"))
    r = _run("import nccl_tide; print(nccl_tide.__file__); print(nccl_tide.include_dir())", tmp_path, env)
    assert r.returncode == 0, r.stderr
    package_file, folder = r.stdout.split()
    assert Path(package_file).parent == repo / "pytorch_glue" / "nccl_tide"
    assert Path(folder) == repo / "include"
    r = _run("nccl_tide", tmp_path, env, module=True)
    assert f"header: {repo / 'include' / 'tide.h'}" in r.stdout.splitlines(), r.stdout + r.stderr


def test_missing_header_is_said_clearly(repo, tmp_path, native):
    # A package copy with neither its own include/ nor a checkout around it: a FileNotFoundError naming where it
    # looked, and `python -m nccl_tide` says "not found" but still reports the rest (exit status 0).
    site = tmp_path / "site"
    shutil.copytree(repo / "pytorch_glue" / "nccl_tide", site / "nccl_tide",
                    ignore=shutil.ignore_patterns("__pycache__", "include", "lib"))
    env = dict(os.environ, PYTHONPATH=str(site), NCCL_TIDE_LIBRARY_PATH=native.library_path())
    code = (
        "import nccl_tide\n"
        "try:\n    nccl_tide.include_dir()\nexcept FileNotFoundError as e:\n    print('raised:', e)\n"
    )
    r = _run(code, tmp_path, env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("raised: tide.h not found in ") and str(site / "nccl_tide" / "include") in r.stdout
    assert "reinstall" in r.stdout, r.stdout
    r = _run("nccl_tide", tmp_path, env, module=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert any(ln.startswith("header: not found: tide.h not found in ") for ln in r.stdout.splitlines()), r.stdout


def test_argument_error_hint_points_to_the_shipped_header(native):
    with pytest.raises(errors.InvalidArgumentError) as info:
        nccl_tide.Layout([7], "fp32", 3, ranks_per_node=2)
    text = str(info.value)
    assert "tide.h" in text and "python -m nccl_tide" in text and "include/tide.h" not in text, text


@pytest.mark.parametrize("cls", sorted(errors.BY_CODE.values(), key=lambda c: c.code) + [errors.LibraryNotFoundError],
                         ids=lambda c: c.__name__)
def test_hints_name_no_repository_header_path(cls):
    hints = [getattr(cls, k, "") for k in ("hint", "env_hint", "closed_hint")]
    assert cls.hint and not [h for h in hints if "include/" in h], hints
    if "tide.h" in cls.hint:
        assert "python -m nccl_tide" in cls.hint, cls.hint


def _user_strings(path: Path):
    """String literals of a module that are not docstrings (comments are not in the tree at all)."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_no_message_names_the_repository_header(repo):
    # Messages reach users of an installed wheel, which has no include/ folder: they name tide.h (which
    # `python -m nccl_tide` locates). Comments and docstrings, read by developers in the checkout, may keep the path.
    found = [
        f"{path.relative_to(repo)}:{line}: {text!r}"
        for path in sorted((repo / "pytorch_glue" / "nccl_tide").rglob("*.py"))
        for line, text in _user_strings(path)
        if "include/tide.h" in text
    ]
    assert not found, found
