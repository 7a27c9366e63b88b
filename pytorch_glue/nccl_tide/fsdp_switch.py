# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""A torchtitan-style switch for nccl_tide.fsdp: one config value with a scope, and an environment kill switch.

torchtitan turns FSDP2's symmetric-memory path on with `parallelism.fsdp_symm_mem_scope` ("all", "dense" or None,
`enable_fsdp_symm_mem(model, scope)`). The same shape for TIDE, so a training script wires it next to that one:

    from nccl_tide import fsdp_switch
    fully_shard(...)                                   # as before, every module
    handle = fsdp_switch.apply(model, cfg.parallelism.fsdp_tide_scope)   # None, "all" or "dense"

* scope None / "none" / "": nothing happens (stock FSDP2); returns None.
* "all": nccl_tide.fsdp.enable(model, **kwargs) for every FSDP module.
* "dense": every FSDP module except MoE experts, through enable(model, module_filter=dense_filter(model)). An
  expert module is one whose FSDP mesh differs from the root module's (torchtitan shards experts on their own edp
  mesh) or whose qualified name has an `experts` component. Expert parameters in a module that is not
  fully_shard'ed by itself belong to the parameter groups of the nearest FSDP module above it, which then keeps
  stock FSDP2 as well (FSDP2 cannot split a group; warned once): the experts never go through TIDE. With no expert
  module this is "all". A module_filter in the kwargs narrows "dense" further (both must keep a module). An
  enable_fn without a module_filter parameter is refused with UnsupportedError rather than silently taking the
  experts too.
* NCCL_TIDE_FSDP=0 in the environment wins over the config (a kill switch for a job that must run stock FSDP2
  without a code change); 1 or unset: the config decides. Anything else is an error naming the variable.
"""

import inspect
import os
from typing import Callable, Mapping, Optional

from ._log import get_logger
from .errors import InvalidArgumentError, UnsupportedError

SCOPES = ("all", "dense")
ENV = "NCCL_TIDE_FSDP"
_log = get_logger("fsdp")


def killed(env: Optional[Mapping[str, str]] = None) -> bool:
    """NCCL_TIDE_FSDP=0: True (stock FSDP2 whatever the config or the code asks; nccl_tide.fsdp.enable() reads it
    too); 1 or unset: False; anything else is an InvalidArgumentError."""
    env = os.environ if env is None else env
    kill = env.get(ENV)
    if kill is not None and kill not in ("0", "1"):
        raise InvalidArgumentError(f"{ENV}={kill!r}: use 0 (stock FSDP2 whatever the config says) or 1 (the config "
                                   "decides); unset is 1")
    return kill == "0"


def resolve_scope(scope: Optional[str], env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The effective scope: "all", "dense" or None (off), after the NCCL_TIDE_FSDP kill switch."""
    kill = killed(env)
    if scope is None or (isinstance(scope, str) and scope.strip().lower() in ("", "none")):
        return None
    if not isinstance(scope, str) or scope.strip().lower() not in SCOPES:
        raise InvalidArgumentError(f"TIDE FSDP scope {scope!r}: use 'all', 'dense' or None (off), as "
                                   "torchtitan's fsdp_symm_mem_scope")
    if kill:
        return None
    return scope.strip().lower()


def _fsdp_mesh(module):
    """The device mesh FSDP2 shards `module` over, or None (not an FSDP module, or a torch without the API)."""
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None:
        return None
    try:
        state = get_state()
        groups = getattr(state, "_fsdp_param_groups", None) or [getattr(state, "_fsdp_param_group", None)]
        for g in groups:
            if g is not None:
                return g.mesh_info.mesh
    except Exception:  # noqa: BLE001 - private FSDP2 state; an unknown layout means "no mesh information"
        return None
    return None


def is_expert(name: str, module, root_mesh=None) -> bool:
    """An MoE expert module: sharded on another mesh than the root's, or named ...experts...."""
    if "experts" in name.split("."):
        return True
    mesh = _fsdp_mesh(module)
    return root_mesh is not None and mesh is not None and mesh is not root_mesh and mesh != root_mesh


def _is_fsdp(module) -> bool:
    return hasattr(module, "_get_fsdp_state")


def _fsdp_modules(model):
    return [(n, m) for n, m in model.named_modules() if _is_fsdp(m)]


def expert_owners(model, root_mesh=None) -> dict:
    """Non-expert FSDP modules that hold expert parameters: {owner name: [expert module names]}. A parameter
    belongs to the groups of the nearest FSDP module at or above its module; an `experts` module that is not
    fully_shard'ed by itself leaves its parameters to such an owner."""
    fsdp = dict(_fsdp_modules(model))
    owners = {}
    for pname, _ in model.named_parameters():
        parts = pname.split(".")[:-1]  # the module path
        if "experts" not in parts:
            continue
        owner = next((".".join(parts[:i]) for i in range(len(parts), -1, -1) if ".".join(parts[:i]) in fsdp), None)
        if owner is None or is_expert(owner, fsdp[owner], root_mesh):
            continue  # not sharded at all, or the expert module is an FSDP module (excluded itself)
        expert = ".".join(parts[: parts.index("experts") + 1])
        owners.setdefault(owner, [])
        if expert not in owners[owner]:
            owners[owner].append(expert)
    return owners


def dense_filter(model) -> Callable[[str, object], bool]:
    """The predicate of scope "dense" for `model` (True: TIDE may take the module): False for expert modules and
    for the FSDP modules whose groups hold expert parameters (expert_owners)."""
    root_mesh = _fsdp_mesh(model)
    owners = set(expert_owners(model, root_mesh))
    return lambda name, module: name not in owners and not is_expert(name, module, root_mesh)


def apply(model, scope: Optional[str] = "all", *, env: Optional[Mapping[str, str]] = None,
          enable_fn: Optional[Callable] = None, **enable_kwargs):
    """Applies the switch to `model` (after fully_shard, on every rank, with the same arguments). Returns the
    nccl_tide.fsdp handle, or None when the scope or NCCL_TIDE_FSDP=0 leaves stock FSDP2 in place.
    enable_fn: the enable() to call (default nccl_tide.fsdp.enable); kwargs go to it."""
    effective = resolve_scope(scope, env)
    if effective is None:
        why = f"{ENV}=0" if scope not in (None, "", "none") else f"scope {scope!r}"
        _log.info("stock FSDP2 (%s)", why)
        return None
    if enable_fn is None:
        from .fsdp import enable as enable_fn
    if effective == "all":
        return enable_fn(model, **enable_kwargs)
    dense = dense_filter(model)
    experts = [n for n, m in _fsdp_modules(model) if not dense(n, m)]
    if not experts:
        return enable_fn(model, **enable_kwargs)  # no expert module: "dense" is "all"
    if "module_filter" not in inspect.signature(enable_fn).parameters:
        raise UnsupportedError(
            f"TIDE FSDP scope 'dense' would leave {len(experts)} expert module(s) ({', '.join(experts[:3])}"
            f"{', ...' if len(experts) > 3 else ''}) to stock FSDP2, but this enable() takes no "
            "module_filter; use scope 'all', or None"
        )
    user = enable_kwargs.pop("module_filter", None)
    if user is not None and not callable(user):
        raise InvalidArgumentError(f"module_filter={user!r}: use a callable (qualified_name, module) -> bool, or None")
    from .fsdp._warn import warn_once  # loads torch, as enable() does

    for owner, held in expert_owners(model, _fsdp_mesh(model)).items():
        warn_once(
            f"nccl_tide.fsdp_switch: scope 'dense' keeps stock FSDP2 for {owner or '<root>'} too: it holds the "
            f"parameters of {', '.join(held[:3])}{', ...' if len(held) > 3 else ''}, which are not fully_shard'ed "
            "on their own (fully_shard each experts module to let TIDE take the rest)"
        )
    keep = dense if user is None else (lambda name, module: dense(name, module) and user(name, module))
    _log.info("scope dense: %d FSDP module(s) keep stock FSDP2 (%s%s)", len(experts), ", ".join(experts[:3]),
              ", ..." if len(experts) > 3 else "")
    return enable_fn(model, module_filter=keep, **enable_kwargs)


__all__ = ["ENV", "SCOPES", "apply", "dense_filter", "expert_owners", "is_expert", "killed", "resolve_scope"]
