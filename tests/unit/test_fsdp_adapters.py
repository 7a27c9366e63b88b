# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The FSDP2 adapters' source hashes against the published sources of every supported torch.

nccl_tide.fsdp._adapter guards the private FSDP2 functions it patches or relies on by hashing
their source. CI has one torch installed (2.13 CPU), so the other releases' guarded functions are
kept, small, in tests/data/fsdp_sources/torch-<ver>.json.gz (recorded from each release's wheel:
`python -m nccl_tide.fsdp._adapter record <unpacked wheel>/torch/distributed/fsdp/_fully_shard
<ver> <out>`; each record also keeps the sha256 of every _fully_shard/*.py file, which ties it to
the wheel). These tests recompute the hashes from the stored sources with the adapter's own
extraction and check that each release selects its own adapter and no other, that a release
with an edited guarded function selects none, and that the record of the installed torch is
what the installed torch ships.
"""

import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")

DATA = Path(__file__).resolve().parents[1] / "data" / "fsdp_sources"
RELEASES = ["2.11", "2.12", "2.13", "2.14", "2.15"]  # each has an adapter (ADAPTERS)
UNSUPPORTED = []  # recorded releases without an adapter (stock FSDP2 with a warning)


def _record(ver):
    with gzip.open(DATA / f"torch-{ver}.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)


def _hashes(rec):
    from nccl_tide.fsdp import _adapter

    return {k: (_adapter.hash_source(t) if t is not None else "") for k, t in rec["functions"].items()}


def test_every_adapter_has_a_record():
    from nccl_tide.fsdp import _adapter

    names = sorted(a.name for a in _adapter.ADAPTERS)
    assert names == sorted(f"torch-{v}" for v in RELEASES), names
    for v in RELEASES + UNSUPPORTED:
        rec = _record(v)
        assert rec["torch"] == v and rec["files"] and rec["functions"], v
        assert set(_adapter.all_guarded()) <= set(rec["functions"]), (v, set(_adapter.all_guarded()) - set(rec["functions"]))


@pytest.mark.parametrize("ver", RELEASES)
def test_release_selects_its_adapter(ver):
    from nccl_tide.fsdp import _adapter

    have = _hashes(_record(ver))
    sel = _adapter.match(have)
    assert sel.adapter is not None and sel.adapter.name == f"torch-{ver}", sel.reason
    ad = sel.adapter
    assert set(ad.hashes) >= set(_adapter.GUARDED), ad.name
    for k, v in ad.hashes.items():
        assert have[k] == v, (ver, k)
    # one edited guarded function: no adapter, the reason names it
    for spec in (_adapter.GUARDED[0], "_fsdp_param:free_storage"):
        edited = dict(have, **{spec: "0" * 16})
        none = _adapter.match(edited)
        assert none.adapter is None and spec.split(":")[1] in none.reason, none


def test_missing_function_gets_no_adapter():
    """A release where a guarded function is gone (renamed, moved): no adapter, the reason says so."""
    from nccl_tide.fsdp import _adapter

    rec = _record("2.15")
    rec["functions"]["_fsdp_param:free_storage"] = None
    sel = _adapter.match(_hashes(rec))
    assert sel.adapter is None and "missing free_storage" in sel.reason and "closest torch-2.15" in sel.reason, sel
    for ver in UNSUPPORTED:
        assert _adapter.match(_hashes(_record(ver))).adapter is None, ver


def test_installed_torch_matches_its_record():
    import torch
    from nccl_tide.fsdp import _adapter

    ver = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if ver not in RELEASES + UNSUPPORTED:
        pytest.skip(f"no record for torch {torch.__version__}")
    rec = _record(ver)
    root = Path(torch.__file__).resolve().parent / "distributed" / "fsdp" / "_fully_shard"
    for name, digest in rec["files"].items():
        assert hashlib.sha256((root / name).read_text(encoding="utf-8").encode()).hexdigest() == digest, name
    assert _adapter.source_hashes() == _hashes(rec)
    assert (_adapter.select(refresh=True).adapter is not None) == (ver in RELEASES)


def test_record_roundtrip(tmp_path):
    """release_record of the installed torch's files reproduces the stored record."""
    import torch
    from nccl_tide.fsdp import _adapter

    root = Path(torch.__file__).resolve().parent / "distributed" / "fsdp" / "_fully_shard"
    ver = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    rec = _adapter.release_record(str(root), ver)
    assert rec["functions"] and all(os.path.exists(root / n) for n in rec["files"])
    if (DATA / f"torch-{ver}.json.gz").exists():
        assert rec == _record(ver)
