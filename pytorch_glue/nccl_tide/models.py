# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Parameter lists of one decoder layer of well-known models, in FSDP2 parameter order.

FSDP2 groups a layer's parameters in module.parameters() order, which for the Hugging Face
implementations is: attention projections (and Qwen3's q/k norms), the MLP (router before
experts for MoE), then the two RMSNorm weights. Shapes are (out_features, in_features).
"""

from math import prod
from typing import Dict, List, Tuple

Param = Tuple[str, Tuple[int, ...]]


def _llama_layer(hidden: int, intermediate: int, q_heads: int, kv_heads: int, head_dim: int = 128) -> List[Param]:
    q, kv = q_heads * head_dim, kv_heads * head_dim
    return [
        ("self_attn.q_proj.weight", (q, hidden)),
        ("self_attn.k_proj.weight", (kv, hidden)),
        ("self_attn.v_proj.weight", (kv, hidden)),
        ("self_attn.o_proj.weight", (hidden, q)),
        ("mlp.gate_proj.weight", (intermediate, hidden)),
        ("mlp.up_proj.weight", (intermediate, hidden)),
        ("mlp.down_proj.weight", (hidden, intermediate)),
        ("input_layernorm.weight", (hidden,)),
        ("post_attention_layernorm.weight", (hidden,)),
    ]


def _qwen3_moe_layer(
    hidden: int = 2048,
    q_heads: int = 32,
    kv_heads: int = 4,
    head_dim: int = 128,
    experts: int = 128,
    moe_inter: int = 768,
) -> List[Param]:
    q, kv = q_heads * head_dim, kv_heads * head_dim
    params: List[Param] = [
        ("self_attn.q_proj.weight", (q, hidden)),
        ("self_attn.k_proj.weight", (kv, hidden)),
        ("self_attn.v_proj.weight", (kv, hidden)),
        ("self_attn.o_proj.weight", (hidden, q)),
        ("self_attn.q_norm.weight", (head_dim,)),
        ("self_attn.k_norm.weight", (head_dim,)),
        ("mlp.gate.weight", (experts, hidden)),  # the router
    ]
    for e in range(experts):
        params += [
            (f"mlp.experts.{e}.gate_proj.weight", (moe_inter, hidden)),
            (f"mlp.experts.{e}.up_proj.weight", (moe_inter, hidden)),
            (f"mlp.experts.{e}.down_proj.weight", (hidden, moe_inter)),
        ]
    params += [("input_layernorm.weight", (hidden,)), ("post_attention_layernorm.weight", (hidden,))]
    return params


MODELS: Dict[str, List[Param]] = {
    "llama3-8b-layer": _llama_layer(4096, 14336, 32, 8),
    "llama3-70b-layer": _llama_layer(8192, 28672, 64, 8),
    "qwen3-30b-a3b-layer": _qwen3_moe_layer(),
}


def model_params(name: str) -> List[Param]:
    if name not in MODELS:
        raise KeyError(f"unknown model layout {name!r}; choose from {', '.join(MODELS)}")
    return list(MODELS[name])


def numels_and_rows(params: List[Param]) -> Tuple[List[int], List[int]]:
    """numel and elements per dim-0 row (product of the dims after dim 0) of each parameter."""
    return [prod(s) for _, s in params], [prod(s[1:]) for _, s in params]
