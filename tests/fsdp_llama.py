# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Shared by the FSDP2 tests: a tiny Llama-style model and the body of their gloo workers (started by
multirank.harness.run_script).

Sizes are chosen so that no dim-0 divides the world sizes used (2, 4), and one parameter
has fewer rows than ranks (trailing ranks hold only padding).
"""

import json
import os
import sys

# free_port: for benchmarks/tests/test_fsdp_memory_probe.py.
from multirank.harness import free_port, init_gloo  # noqa: F401

VOCAB, DIM, HEADS, HIDDEN, LAYERS = 37, 26, 2, 45, 2


def init_worker(rank: int, world: int, port: int):
    import torch

    torch.set_num_threads(1)
    return init_gloo(rank, world, port, timeout_s=None)


def run_worker(rank: int, world: int, port: int, cases: str, run_case, counter) -> None:
    """The body of every FSDP2 test worker: init gloo, run_case(rank, case, counter) for each of the ';'-separated
    cases, then print one JSON line (rank, results, whether TIDE's FSDP patch is still installed) and leave."""
    dist = init_worker(rank, world, port)
    results = [run_case(rank, case, counter) for case in cases.split(";")]
    from nccl_tide.fsdp import _patch

    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "results": results, "patched_at_exit": _patch.installed()}))
    # The result is out; skip interpreter teardown, where torch's gloo threads occasionally abort the process
    # ("terminate called without an active exception") under CPU load, after the work under test is done.
    sys.stdout.flush()
    os._exit(0)


def build_model(seed: int = 0, tied: bool = False, layers: int = LAYERS):
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
            self.wq = nn.Linear(DIM, DIM, bias=False)
            self.wk = nn.Linear(DIM, DIM, bias=False)
            self.wv = nn.Linear(DIM, DIM, bias=False)
            self.wo = nn.Linear(DIM, DIM, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            hd = DIM // HEADS
            q, k, v = (w(x).view(b, t, HEADS, hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(y.transpose(1, 2).reshape(b, t, DIM))

    class MLP(nn.Module):  # SwiGLU
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
            self.w3 = nn.Linear(DIM, HIDDEN, bias=False)
            self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.attn = RMSNorm(DIM), Attention()
            self.mlp_norm, self.mlp = RMSNorm(DIM), MLP()
            self.gate = nn.Parameter(torch.ones(3))  # 3 rows: rank 3 of 4 holds only padding

        def forward(self, x):
            x = x + self.gate[0] * self.attn(self.attn_norm(x))
            return x + self.gate[1] * self.mlp(self.mlp_norm(x)) + 0 * self.gate[2]

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(VOCAB, DIM)
            self.layers = nn.ModuleList(Block() for _ in range(layers))
            self.norm = RMSNorm(DIM)
            self.out = nn.Linear(DIM, VOCAB, bias=False)
            if tied:
                self.out.weight = self.tok.weight

        def forward(self, tokens):
            x = self.tok(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.out(self.norm(x))

    torch.manual_seed(seed)
    model = Llama()
    with torch.no_grad():  # non-trivial norms and gates, so their gradients are not symmetric
        for m in model.modules():
            if isinstance(m, RMSNorm):
                m.weight.uniform_(0.5, 1.5)
        for layer in model.layers:
            layer.gate.uniform_(0.5, 1.5)
    return model


def batch(step: int, rank: int, b: int = 2, t: int = 7):
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, VOCAB, (b, t + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
