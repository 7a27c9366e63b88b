# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The Llama-style decoder (RMSNorm, grouped-query attention, SwiGLU MLP) of the FSDP2 benchmarks and tests.

The benchmarks build it sized by LlamaConfig, with the parameter names and per-block order of nccl_tide.models
(attention projections, MLP, then norms) and N(0, 0.02) matrices. The FSDP2 tests (tests/fsdp_llama.py) build a
tiny one from the same definition with their own names and order (each norm before its sublayer), a gate per
block, and torch's default initialisation; examples/fsdp2_train.py keeps a standalone copy for users to start from.
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


# Attribute names of the parts: attention (q, k, v, o), MLP (gate, up, down), and a block's four parts in the order
# they are built and registered, which is FSDP2's parameter order and the order of the random draws.
NAMES = {
    "hf": {
        "attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
        "mlp": ("gate_proj", "up_proj", "down_proj"),
        "block": (("attn", "self_attn"), ("mlp", "mlp"), ("attn_norm", "input_layernorm"),
                  ("mlp_norm", "post_attention_layernorm")),
    },
    "short": {
        "attn": ("wq", "wk", "wv", "wo"),
        "mlp": ("w1", "w3", "w2"),
        "block": (("attn_norm", "attn_norm"), ("attn", "attn"), ("mlp_norm", "mlp_norm"), ("mlp", "mlp")),
    },
}


def build(cfg: LlamaConfig, seed: int = 0, device=None, *, names: str = "hf", gates: bool = False,
          tied: bool = False, init: str = "normal"):
    """The model, its random draws seeded with `seed`, built under `device` when given.

    names: a key of NAMES. gates: each block gets a 3-row `gate` parameter (after its parts) scaling its attention
    and MLP outputs; the third row only joins the graph times 0 (a parameter whose rows can be fewer than the ranks).
    tied: the output projection shares the embedding's weight. init: "normal", every parameter of two or more
    dimensions drawn from N(0, 0.02) after construction; "torch", torch's default initialisation, then the norms'
    weights and the gates drawn from U(0.5, 1.5) so that their gradients are not symmetric."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if init not in ("normal", "torch"):
        raise ValueError(f"init must be 'normal' or 'torch', got {init!r}")
    attn_names, mlp_names, block_names = NAMES[names]["attn"], NAMES[names]["mlp"], NAMES[names]["block"]

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
            shapes = ((cfg.hidden, cfg.heads * hd), (cfg.hidden, cfg.kv_heads * hd), (cfg.hidden, cfg.kv_heads * hd),
                      (cfg.heads * hd, cfg.hidden))
            for name, (n_in, n_out) in zip(attn_names, shapes):
                setattr(self, name, nn.Linear(n_in, n_out, bias=False))

        def forward(self, x):
            b, t, _ = x.shape
            hd = cfg.head_dim
            wq, wk, wv, wo = (getattr(self, name) for name in attn_names)
            q = wq(x).view(b, t, cfg.heads, hd).transpose(1, 2)
            k = wk(x).view(b, t, cfg.kv_heads, hd).transpose(1, 2)
            v = wv(x).view(b, t, cfg.kv_heads, hd).transpose(1, 2)
            if cfg.kv_heads != cfg.heads:
                rep = cfg.heads // cfg.kv_heads
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return wo(y.transpose(1, 2).reshape(b, t, cfg.heads * hd))

    class MLP(nn.Module):  # SwiGLU
        def __init__(self):
            super().__init__()
            shapes = ((cfg.hidden, cfg.ffn), (cfg.hidden, cfg.ffn), (cfg.ffn, cfg.hidden))
            for name, (n_in, n_out) in zip(mlp_names, shapes):
                setattr(self, name, nn.Linear(n_in, n_out, bias=False))

        def forward(self, x):
            gate, up, down = (getattr(self, name) for name in mlp_names)
            return down(F.silu(gate(x)) * up(x))

    parts = {"attn": Attention, "mlp": MLP, "attn_norm": lambda: RMSNorm(cfg.hidden),
             "mlp_norm": lambda: RMSNorm(cfg.hidden)}

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            for role, name in block_names:
                setattr(self, name, parts[role]())
            if gates:
                self.gate = nn.Parameter(torch.ones(3))

        def forward(self, x):
            p = {role: getattr(self, name) for role, name in block_names}
            if gates:
                x = x + self.gate[0] * p["attn"](p["attn_norm"](x))
                return x + self.gate[1] * p["mlp"](p["mlp_norm"](x)) + 0 * self.gate[2]
            x = x + p["attn"](p["attn_norm"](x))
            return x + p["mlp"](p["mlp_norm"](x))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
            self.layers = nn.ModuleList(Block() for _ in range(cfg.layers))
            self.norm = RMSNorm(cfg.hidden)
            self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
            if tied:
                self.out.weight = self.tok.weight

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
        if init == "normal":
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.02)
        else:
            for m in model.modules():
                if isinstance(m, RMSNorm):
                    m.weight.uniform_(0.5, 1.5)
            if gates:
                for layer in model.layers:
                    layer.gate.uniform_(0.5, 1.5)
    return model
