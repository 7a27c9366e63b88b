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
]


def _source_of(spec: str) -> str:
    """Source text of `module:qualname` as shipped in torch's .py file (decorators included).

    Read from the module's file, not from the live attribute, so a monkey-patch in the
    running process (TIDE's own, or a test's) does not change the hash."""
    import ast
    import importlib

    mod_name, qual = spec.split(":")
    module = importlib.import_module(f"{_PKG}.{mod_name}")
    src = inspect.getsource(module)
    body = ast.parse(src).body
    node = None
    for part in qual.split("."):
        node = next(
            (n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part),
            None,
        )
        if node is None:
            raise AttributeError(spec)
        body = node.body
    lines = src.splitlines()
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "\n".join(lines[first - 1 : node.end_lineno])


def source_hashes() -> Dict[str, str]:
    """First 16 hex digits of sha256(source) of every GUARDED function in this torch ("" if missing)."""
    out = {}
    for spec in GUARDED:
        try:
            src = _source_of(spec)
        except (ImportError, AttributeError, OSError, TypeError, SyntaxError):
            out[spec] = ""
            continue
        out[spec] = hashlib.sha256(src.encode()).hexdigest()[:16]  # 64 bits: a guard, not a signature
    return out


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

    have = source_hashes()
    best, best_diff = None, None
    for ad in ADAPTERS:
        diff = [k for k in GUARDED if ad.hashes.get(k) != have[k]]
        if not diff:
            _cached = Selection(ad, "")
            return _cached
        if best_diff is None or len(diff) < len(best_diff):
            best, best_diff = ad, diff
    names = ", ".join(k.split(":")[1] for k in (best_diff or GUARDED))
    missing = [k.split(":")[1] for k in GUARDED if not have[k]]
    reason = (
        f"torch {torch.__version__}: the private FSDP2 source that nccl_tide.fsdp patches matches no "
        f"supported release (closest {best.name if best else 'none'}; differs in {names}"
        + (f"; missing {', '.join(missing)}" if missing else "")
        + "). Supported: "
        + ", ".join(a.name for a in ADAPTERS)
        + "; see docs/fsdp.md"
    )
    _cached = Selection(None, reason)
    return _cached


if __name__ == "__main__":  # print the table entry for the running torch
    import torch

    print(f'Adapter("torch-{torch.__version__.split("+")[0]}", {{')
    for k, v in source_hashes().items():
        print(f'    "{k}": "{v}",')
    print("}),")
