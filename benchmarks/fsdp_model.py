# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""A Llama-style decoder (RMSNorm, grouped-query attention, SwiGLU MLP) of configurable size, for the FSDP2 step
benchmark. Same structure as the tiny model of tests/fsdp_llama.py (a copy: the tests keep their own), sized by
arguments; parameter order per block matches nccl_tide.models (attention projections, MLP, then norms).
"""

from typing import NamedTuple


class LlamaConfig(NamedTuple):
    layers: int = 4
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 14336
    vocab: int = 32000

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def n_params(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        block = h * h * 2 + 2 * h * kv + 3 * h * self.ffn + 2 * h
        return self.layers * block + 2 * self.vocab * h + h


def build(cfg: LlamaConfig, seed: int = 0, device=None):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self, dim, eps=1e-5):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            hd = cfg.head_dim
            self.q_proj = nn.Linear(cfg.hidden, cfg.heads * hd, bias=False)
            self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=False)
            self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * hd, bias=False)
            self.o_proj = nn.Linear(cfg.heads * hd, cfg.hidden, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            hd = cfg.head_dim
            q = self.q_proj(x).view(b, t, cfg.heads, hd).transpose(1, 2)
            k = self.k_proj(x).view(b, t, cfg.kv_heads, hd).transpose(1, 2)
            v = self.v_proj(x).view(b, t, cfg.kv_heads, hd).transpose(1, 2)
            if cfg.kv_heads != cfg.heads:
                rep = cfg.heads // cfg.kv_heads
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(y.transpose(1, 2).reshape(b, t, cfg.heads * hd))

    class MLP(nn.Module):  # SwiGLU
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
            self.up_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
            self.down_proj = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn, self.mlp = Attention(), MLP()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(cfg.hidden), RMSNorm(cfg.hidden)

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
            self.layers = nn.ModuleList(Block() for _ in range(cfg.layers))
            self.norm = RMSNorm(cfg.hidden)
            self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

        def forward(self, tokens):
            x = self.tok(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.out(self.norm(x))

    torch.manual_seed(seed)
    if device is not None:
        with torch.device(device):
            model = Llama()
    else:
        model = Llama()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    return model
