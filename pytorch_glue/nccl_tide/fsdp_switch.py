"""A torchtitan-style switch for nccl_tide.fsdp: one config value with a scope, and an environment kill switch.

torchtitan turns FSDP2's symmetric-memory path on with `parallelism.fsdp_symm_mem_scope` ("all", "dense" or None,
`enable_fsdp_symm_mem(model, scope)`). The same shape for TIDE, so a training script wires it next to that one:

    from nccl_tide import fsdp_switch
    fully_shard(...)                                   # as before, every module
    handle = fsdp_switch.apply(model, cfg.parallelism.fsdp_tide_scope)   # None, "all" or "dense"

* scope None / "none" / "": nothing happens (stock FSDP2); returns None.
* "all": nccl_tide.fsdp.enable(model, **kwargs) for every FSDP module.
* "dense": every FSDP module except MoE experts. An expert module is one whose FSDP mesh differs from the root
  module's (torchtitan shards experts on their own edp mesh) or whose qualified name has an `experts` component.
  When the model has no expert module this is "all". When it has some, enable() must accept a module filter
  (`module_filter=callable(name, module) -> bool`); an enable() without one is refused with UnsupportedError
  rather than silently taking the experts too.
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


def resolve_scope(scope: Optional[str], env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The effective scope: "all", "dense" or None (off), after the NCCL_TIDE_FSDP kill switch."""
    env = os.environ if env is None else env
    kill = env.get(ENV)
    if kill is not None and kill not in ("0", "1"):
        raise InvalidArgumentError(f"{ENV}={kill!r}: use 0 (stock FSDP2 whatever the config says) or 1 (the config "
                                   "decides); unset is 1")
    if scope is None or (isinstance(scope, str) and scope.strip().lower() in ("", "none")):
        return None
    if not isinstance(scope, str) or scope.strip().lower() not in SCOPES:
        raise InvalidArgumentError(f"TIDE FSDP scope {scope!r}: use 'all', 'dense' or None (off), as "
                                   "torchtitan's fsdp_symm_mem_scope")
    if kill == "0":
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


def dense_filter(model) -> Callable[[str, object], bool]:
    """The predicate of scope "dense" for `model` (True: TIDE may take the module)."""
    root_mesh = _fsdp_mesh(model)
    return lambda name, module: not is_expert(name, module, root_mesh)


def _fsdp_modules(model):
    return [(n, m) for n, m in model.named_modules() if hasattr(m, "_get_fsdp_state") or "experts" in n.split(".")]


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
    keep = dense_filter(model)
    experts = [n for n, m in _fsdp_modules(model) if not keep(n, m)]
    if not experts:
        return enable_fn(model, **enable_kwargs)  # no expert module: "dense" is "all"
    if "module_filter" not in inspect.signature(enable_fn).parameters:
        raise UnsupportedError(
            f"TIDE FSDP scope 'dense' would leave {len(experts)} expert module(s) ({', '.join(experts[:3])}"
            f"{', ...' if len(experts) > 3 else ''}) to stock FSDP2, but this nccl_tide.fsdp.enable() takes no "
            "module_filter; use scope 'all', or None"
        )
    _log.info("scope dense: %d expert module(s) keep stock FSDP2", len(experts))
    return enable_fn(model, module_filter=keep, **enable_kwargs)


__all__ = ["ENV", "SCOPES", "apply", "dense_filter", "is_expert", "resolve_scope"]
