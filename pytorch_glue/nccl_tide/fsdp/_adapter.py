# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Per-torch-version adapters for the private FSDP2 code that nccl_tide.fsdp patches.

TIDE replaces private functions of torch.distributed.fsdp._fully_shard and relies on the
behaviour of a few others (how FSDPParam frees and re-creates unsharded storage, how
post_backward calls foreach_reduce, ...). Private code changes between releases, so every
function in GUARDED is hashed (sha256 of inspect.getsource) and compared with the hashes
recorded for a supported release. Any mismatch: no adapter, stock FSDP2, one warning that
names the functions that differ.

Adding a torch release: read the diff of the GUARDED functions against a supported release
(docs/fsdp.md, "Supported torch versions"), adapt _patch.py if needed, then record
`python -m nccl_tide.fsdp._adapter` output in ADAPTERS.
"""

import hashlib
import inspect
from typing import Dict, List, NamedTuple, Optional

# "module:qualname" of every private function whose source TIDE patches or depends on.
GUARDED = (
    # patched (module globals that FSDPParamGroup / foreach_reduce look up at call time)
    "_fsdp_collectives:foreach_all_gather",
    "_fsdp_collectives:foreach_all_gather_copy_out",
    "_fsdp_collectives:foreach_reduce",
    "_fsdp_collectives:foreach_reduce_scatter_copy_in",
    # relied on: call sites and argument order of the patched functions
    "_fsdp_param_group:FSDPParamGroup.unshard",
    "_fsdp_param_group:FSDPParamGroup.wait_for_unshard",
    "_fsdp_param_group:FSDPParamGroup.post_backward",
    "_fsdp_collectives:_get_gradient_divide_factors",
    # relied on: unsharded storage lifetime (TIDE's per-parameter views share one slot)
    "_fsdp_param:FSDPParam.init_all_gather_outputs",
    "_fsdp_param:FSDPParam.init_unsharded_param",
    "_fsdp_param:FSDPParam.alloc_all_gather_outputs",
    "_fsdp_param:FSDPParam.free_unsharded_param",
    "_fsdp_param:FSDPParam.to_sharded",
    "_fsdp_param:FSDPParam.to_unsharded",
    "_fsdp_param:free_storage",
)

_PKG = "torch.distributed.fsdp._fully_shard"


class Adapter(NamedTuple):
    name: str  # e.g. "torch-2.13"
    hashes: Dict[str, str]


# Recorded from the published wheels' sources (python -m nccl_tide.fsdp._adapter).
ADAPTERS: List[Adapter] = [
    Adapter(
        # torch 2.13.0 (+cpu wheel: this CI machine).
        "torch-2.13",
        {
            "_fsdp_collectives:foreach_all_gather": "c7cfa65e269f630b",
            "_fsdp_collectives:foreach_all_gather_copy_out": "e0307941a9a3e970",
            "_fsdp_collectives:foreach_reduce": "2a4c1c0d3b3d120c",
            "_fsdp_collectives:foreach_reduce_scatter_copy_in": "2aa11853e4e61227",
            "_fsdp_param_group:FSDPParamGroup.unshard": "62d4f507686406a2",
            "_fsdp_param_group:FSDPParamGroup.wait_for_unshard": "adb0fd0b15a070a1",
            "_fsdp_param_group:FSDPParamGroup.post_backward": "0369bdb27b4f17a0",
            "_fsdp_collectives:_get_gradient_divide_factors": "81b4b5e377eda5a6",
            "_fsdp_param:FSDPParam.init_all_gather_outputs": "8b1a5d25c59fb79f",
            "_fsdp_param:FSDPParam.init_unsharded_param": "84184b634a168a45",
            "_fsdp_param:FSDPParam.alloc_all_gather_outputs": "a83a38318f3eaa59",
            "_fsdp_param:FSDPParam.free_unsharded_param": "37cbfc11ad5eed9d",
            "_fsdp_param:FSDPParam.to_sharded": "3e4cea41343b192d",
            "_fsdp_param:FSDPParam.to_unsharded": "7c698f7186613c18",
            "_fsdp_param:free_storage": "d483e17ff7a64e42",
        },
    ),
    Adapter(
        # The GPU test machine's torch (2.11.0+cu130). Same code path as 2.13: the differing
        # functions differ in compiled-autograd branches (refused: _group.static_reason and
        # GroupState.all_gather), comments, the RS-state bookkeeping after foreach_reduce and
        # PREMUL_SUM built by _make_nccl_premul_sum (TIDE recomputes 1/factor itself).
        "torch-2.11",
        {
            "_fsdp_collectives:foreach_all_gather": "c7cfa65e269f630b",
            "_fsdp_collectives:foreach_all_gather_copy_out": "f3dfe376b5c14e88",
            "_fsdp_collectives:foreach_reduce": "5db92806bc13e8fd",
            "_fsdp_collectives:foreach_reduce_scatter_copy_in": "2aa11853e4e61227",
            "_fsdp_param_group:FSDPParamGroup.unshard": "5b32cbf653caa7fa",
            "_fsdp_param_group:FSDPParamGroup.wait_for_unshard": "fdf099860c67a2c3",
            "_fsdp_param_group:FSDPParamGroup.post_backward": "4474a5020d8bde4f",
            "_fsdp_collectives:_get_gradient_divide_factors": "e118ec862d874f1e",
            "_fsdp_param:FSDPParam.init_all_gather_outputs": "a6072e0ee69ee93d",
            "_fsdp_param:FSDPParam.init_unsharded_param": "d760845ece84deb1",
            "_fsdp_param:FSDPParam.alloc_all_gather_outputs": "a83a38318f3eaa59",
            "_fsdp_param:FSDPParam.free_unsharded_param": "9ce5f6c2e4f9dac3",
            "_fsdp_param:FSDPParam.to_sharded": "3e4cea41343b192d",
            "_fsdp_param:FSDPParam.to_unsharded": "7c698f7186613c18",
            "_fsdp_param:free_storage": "d483e17ff7a64e42",
        },
    ),
    Adapter(
        # torch 2.12.0. The 2.11 code path without its compiled-autograd branches (copy-out,
        # foreach_reduce's hooks, init_unsharded_param, free_unsharded_param), post_backward
        # between 2.11 and 2.13 (foreach_reduce still returns six values, which TIDE passes
        # through); the patched call sites and unshard / wait_for_unshard are 2.11's.
        "torch-2.12",
        {
            "_fsdp_collectives:foreach_all_gather": "c7cfa65e269f630b",
            "_fsdp_collectives:foreach_all_gather_copy_out": "fed41a564b8d09e4",
            "_fsdp_collectives:foreach_reduce": "92991a5ffbfe555a",
            "_fsdp_collectives:foreach_reduce_scatter_copy_in": "2aa11853e4e61227",
            "_fsdp_param_group:FSDPParamGroup.unshard": "5b32cbf653caa7fa",
            "_fsdp_param_group:FSDPParamGroup.wait_for_unshard": "fdf099860c67a2c3",
            "_fsdp_param_group:FSDPParamGroup.post_backward": "9816199b5d17dd4f",
            "_fsdp_collectives:_get_gradient_divide_factors": "e118ec862d874f1e",
            "_fsdp_param:FSDPParam.init_all_gather_outputs": "a6072e0ee69ee93d",
            "_fsdp_param:FSDPParam.init_unsharded_param": "e4c5feafed5d2aad",
            "_fsdp_param:FSDPParam.alloc_all_gather_outputs": "a83a38318f3eaa59",
            "_fsdp_param:FSDPParam.free_unsharded_param": "37cbfc11ad5eed9d",
            "_fsdp_param:FSDPParam.to_sharded": "3e4cea41343b192d",
            "_fsdp_param:FSDPParam.to_unsharded": "7c698f7186613c18",
            "_fsdp_param:free_storage": "d483e17ff7a64e42",
        },
    ),
    Adapter(
        # torch 2.14.0. 2.13's code: post_backward only moved under `with _spmd_no_typecheck()`
        # (same foreach_reduce call), init_unsharded_param gained a spmd-types branch that TIDE
        # never reaches (it builds the unsharded parameter itself; spmd-types parameters are
        # refused: _group.static_reason).
        "torch-2.14",
        {
            "_fsdp_collectives:foreach_all_gather": "c7cfa65e269f630b",
            "_fsdp_collectives:foreach_all_gather_copy_out": "e0307941a9a3e970",
            "_fsdp_collectives:foreach_reduce": "2a4c1c0d3b3d120c",
            "_fsdp_collectives:foreach_reduce_scatter_copy_in": "2aa11853e4e61227",
            "_fsdp_param_group:FSDPParamGroup.unshard": "62d4f507686406a2",
            "_fsdp_param_group:FSDPParamGroup.wait_for_unshard": "adb0fd0b15a070a1",
            "_fsdp_param_group:FSDPParamGroup.post_backward": "c6f769729bdf6ce4",
            "_fsdp_collectives:_get_gradient_divide_factors": "81b4b5e377eda5a6",
            "_fsdp_param:FSDPParam.init_all_gather_outputs": "8b1a5d25c59fb79f",
            "_fsdp_param:FSDPParam.init_unsharded_param": "7904a610451787a8",
            "_fsdp_param:FSDPParam.alloc_all_gather_outputs": "a83a38318f3eaa59",
            "_fsdp_param:FSDPParam.free_unsharded_param": "37cbfc11ad5eed9d",
            "_fsdp_param:FSDPParam.to_sharded": "3e4cea41343b192d",
            "_fsdp_param:FSDPParam.to_unsharded": "7c698f7186613c18",
            "_fsdp_param:free_storage": "d483e17ff7a64e42",
        },
    ),
    Adapter(
        # torch 2.15.0. Copy-out is a per-group hook (FSDPParamGroup._all_gather_output_fn):
        # TIDE sets it for its groups instead of patching foreach_all_gather_copy_out;
        # foreach_reduce lost orig_dtype and takes a per-group prepare_reduce_scatter_inputs
        # (TIDE's wrapper binds by name and passes both through); the copy-in is
        # chunk_cat_mixed_dtype (still skipped for TIDE's placeholder); the AG-stream waits moved
        # to FSDPCommContext (the world-1 wrappers use it); mixed precision is per parameter
        # (FSDPParam.mp_policy) and the unsharded parameter carries grad_dtype (TIDE sets it
        # on the parameters it builds: with reduce_dtype=fp32 autograd hands TIDE-RS fp32
        # gradients); set_keep_unsharded_storage stops free_storage (pinned groups are not
        # pooled). Also guarded: the FSDPParamGroup/FSDPCommContext/FSDPParam members TIDE reads.
        "torch-2.15",
        {
            "_fsdp_collectives:foreach_all_gather": "c7cfa65e269f630b",
            "_fsdp_collectives:foreach_all_gather_copy_out": "2f7f1cc8d994549a",
            "_fsdp_collectives:foreach_reduce": "695de1c3158df7a0",
            "_fsdp_collectives:foreach_reduce_scatter_copy_in": "40de14afdb8e7a17",
            "_fsdp_param_group:FSDPParamGroup.unshard": "9e18e0d92f438ae1",
            "_fsdp_param_group:FSDPParamGroup.wait_for_unshard": "7ea722eb81f54b98",
            "_fsdp_param_group:FSDPParamGroup.post_backward": "6f6eec4d23f43bf9",
            "_fsdp_collectives:_get_gradient_divide_factors": "81b4b5e377eda5a6",
            "_fsdp_param:FSDPParam.init_all_gather_outputs": "8b1a5d25c59fb79f",
            "_fsdp_param:FSDPParam.init_unsharded_param": "a970cbf44d6b4232",
            "_fsdp_param:FSDPParam.alloc_all_gather_outputs": "a83a38318f3eaa59",
            "_fsdp_param:FSDPParam.free_unsharded_param": "554178c0d731f4f3",
            "_fsdp_param:FSDPParam.to_sharded": "3260c0efee916d30",
            "_fsdp_param:FSDPParam.to_unsharded": "7c698f7186613c18",
            "_fsdp_param:free_storage": "d483e17ff7a64e42",
            "_fsdp_param_group:FSDPParamGroup.__init__": "a7d00234a946936b",
            "_fsdp_param_group:FSDPCommContext": "8f2ce7e57eb2d2f0",
            "_fsdp_param:FSDPParam.unsharded_grad_dtype": "e1bb21504166f123",
            "_fsdp_param:FSDPParam.init_dtype_attrs": "9722da09ab03c518",
            "_fsdp_collectives:_default_reduce_scatter_input_fn": "346569ffec2f7fac",
            "_fsdp_param:FSDPParam.free_all_gather_outputs": "5d28c9551bfc1b1f",
        },
    ),
]


def extract(src: str, qual: str) -> str:
    """Source text of `qual` (e.g. "FSDPParam.to_sharded") in module source `src`, decorators
    included, exactly as the hash is taken."""
    import ast

    body = ast.parse(src).body
    node = None
    for part in qual.split("."):
        node = next(
            (n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part),
            None,
        )
        if node is None:
            raise AttributeError(qual)
        body = node.body
    lines = src.splitlines()
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "\n".join(lines[first - 1 : node.end_lineno])


def hash_source(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]  # 64 bits: a guard, not a signature


def _module_source(mod_name: str) -> str:
    """The installed torch's source of _fully_shard.<mod_name>, read from its .py file (not from
    the live attributes: a monkey-patch in this process, TIDE's own or a test's, does not change
    the hash)."""
    import importlib

    return inspect.getsource(importlib.import_module(f"{_PKG}.{mod_name}"))


def _source_of(spec: str, sources: Optional[Dict[str, str]] = None) -> str:
    mod_name, qual = spec.split(":")
    src = sources[mod_name] if sources is not None else _module_source(mod_name)
    return extract(src, qual)


def all_guarded() -> List[str]:
    """GUARDED plus every function any adapter guards in addition (in a stable order)."""
    out = list(GUARDED)
    for ad in ADAPTERS:
        out += [k for k in ad.hashes if k not in out]
    return out


def source_hashes(sources: Optional[Dict[str, str]] = None, specs=None) -> Dict[str, str]:
    """hash_source of every guarded function ("" if missing), from `sources` (module name ->
    source text, e.g. a release's files) or from the installed torch."""
    out = {}
    for spec in specs or all_guarded():
        try:
            src = _source_of(spec, sources)
        except (ImportError, AttributeError, OSError, TypeError, SyntaxError, KeyError):
            out[spec] = ""
            continue
        out[spec] = hash_source(src)
    return out


def match(have: Dict[str, str]) -> "Selection":
    """The adapter whose guarded hashes all equal `have`, or None and the reason."""
    best, best_diff = None, None
    for ad in ADAPTERS:
        diff = [k for k in ad.hashes if ad.hashes[k] != have.get(k)] if ad.hashes else list(GUARDED)
        if not diff:
            return Selection(ad, "")
        if best_diff is None or len(diff) < len(best_diff):
            best, best_diff = ad, diff
    names = ", ".join(k.split(":")[1] for k in (best_diff or GUARDED))
    missing = [k.split(":")[1] for k in (best.hashes if best else GUARDED) if not have.get(k)]
    return Selection(
        None,
        "the private FSDP2 source that nccl_tide.fsdp patches matches no supported release (closest "
        f"{best.name if best else 'none'}; differs in {names}" + (f"; missing {', '.join(missing)}" if missing else "")
        + "). Supported: " + ", ".join(a.name for a in ADAPTERS) + "; see docs/fsdp.md (in the sources and the sdist), \"Supported torch versions\"",
    )


class Selection(NamedTuple):
    adapter: Optional[Adapter]
    reason: str  # why there is none ("" when there is one)


_cached: Optional[Selection] = None


def select(refresh: bool = False) -> Selection:
    """The adapter whose hashes all match the running torch, or None and the reason."""
    global _cached
    if _cached is not None and not refresh:
        return _cached
    import torch

    sel = match(source_hashes())
    _cached = sel if sel.adapter else Selection(None, f"torch {torch.__version__}: {sel.reason}")
    return _cached


def release_record(root: str, version: str) -> dict:
    """What tests/data/fsdp_sources keeps of one release: the sha256 of each _fully_shard/*.py
    file (provenance: compare with an unpacked wheel) and the source of every guarded function."""
    import os

    files, sources = {}, {}
    for name in sorted(os.listdir(root)):
        if name.endswith(".py"):
            with open(os.path.join(root, name), encoding="utf-8") as f:
                text = f.read()
            files[name] = hashlib.sha256(text.encode()).hexdigest()
            sources[name[:-3]] = text
    functions = {}
    for spec in all_guarded():
        try:
            functions[spec] = _source_of(spec, sources)
        except (AttributeError, KeyError):
            functions[spec] = None
    return {"torch": version, "files": files, "functions": functions}


if __name__ == "__main__":
    # python -m nccl_tide.fsdp._adapter                       table entry for the running torch
    # python -m nccl_tide.fsdp._adapter record ROOT VER OUT   ROOT = an unpacked wheel's
    #     torch/distributed/fsdp/_fully_shard; OUT = tests/data/fsdp_sources/torch-<VER>.json.gz
    import sys

    if len(sys.argv) == 5 and sys.argv[1] == "record":
        import gzip
        import json

        rec = release_record(sys.argv[2], sys.argv[3])
        with gzip.open(sys.argv[4], "wt", encoding="utf-8") as f:
            json.dump(rec, f, indent=0, sort_keys=True)
        sys.exit(0)
    import torch

    print(f'Adapter("torch-{torch.__version__.split("+")[0]}", {{')
    for k, v in source_hashes().items():
        print(f'    "{k}": "{v}",')
    print("}),")
