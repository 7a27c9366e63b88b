# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Train a small Llama-style model with FSDP2, its all-gathers and reduce-scatters run by TIDE.

    torchrun --nproc-per-node 2 examples/fsdp2_train.py --device cpu       # 2 ranks on CPU (gloo)
    torchrun --nproc-per-node 8 examples/fsdp2_train.py --device cuda      # one GPU per rank (NCCL)
    python examples/fsdp2_train.py --device cpu                            # world size 1, no launcher
    ... --no-tide                                                          # the same run on stock FSDP2

The model is sharded with fully_shard as usual; the one TIDE line is `nccl_tide.fsdp.enable(model, ...)` after it.
Which executor runs TIDE's collectives:
* CUDA (NCCL process group): "native", the copy-engine all-gather into each parameter's storage and the fp32
  reduce-scatter of the library. It needs a CUDA build of libnccl-tide.so (`python -m nccl_tide` says which build is
  installed); enable() raises UnsupportedError saying why where it cannot run.
* CPU (gloo process group): "reference", the same layout semantics on torch.distributed collectives. Not the fast
  path: it is how TIDE's FSDP2 integration runs, and is checked, without a GPU. At 1 or 2 ranks its losses equal
  stock FSDP2's bit for bit (the all-gather is a byte copy, and a two-term fp32 sum is exact in either order).

Rank 0 prints one line per step, "step N loss X" (X exact: Python's repr of the loss averaged over ranks), then
what TIDE ran (handle.stats()).
"""

import argparse
import gc
import os
import socket

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import nccl_tide.fsdp

VOCAB, DIM, HEADS, HIDDEN = 128, 64, 4, 172  # HIDDEN rows divide no small world size: FSDP2 pads the shards


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, HEADS, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, DIM))


class SwiGLU(nn.Module):
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
        self.mlp_norm, self.mlp = RMSNorm(DIM), SwiGLU()

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.norm = RMSNorm(DIM)
        self.out = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.tok(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.out(self.norm(x))


def batch(step: int, rank: int, device: torch.device, size: int = 4, length: int = 32):
    """Sequences of a fixed affine recurrence (t -> 5t + 3 mod VOCAB) from random starts: learnable, so the loss
    falls. Each rank draws its own batch (data parallel)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    start = torch.randint(0, VOCAB, (size, 1), generator=g)
    seq = [start]
    for _ in range(length):
        seq.append((5 * seq[-1] + 3) % VOCAB)
    tokens = torch.cat(seq, dim=1).to(device)
    return tokens[:, :-1], tokens[:, 1:]


def init_distributed(device_kind: str):
    """torch.distributed from torchrun's environment, or a world of one without a launcher."""
    backend = "nccl" if device_kind == "cuda" else "gloo"
    if "RANK" in os.environ:  # torchrun
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        init = {"init_method": "env://"}
    else:
        local_rank = 0
        with socket.socket() as s:  # a free port for the one-rank rendezvous
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        init = {"init_method": f"tcp://127.0.0.1:{port}", "rank": 0, "world_size": 1}
    if device_kind == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend, device_id=device, **init)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend, **init)
    return device


def train(args, device: torch.device) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank, as fully_shard expects
    model = Llama(args.layers).to(device)
    # bf16 parameters and compute, fp32 gradient reduction (TIDE's reduce-scatter accumulates in fp32).
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)

    handle = None
    if args.tide:
        executor = "native" if device.type == "cuda" else "reference"
        handle = nccl_tide.fsdp.enable(model, executor=executor)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if rank == 0:
        how = f"TIDE ({handle.executor} executor)" if handle else "stock FSDP2"
        print(f"fsdp2_train: world size {world}, {device.type}, {dist.get_backend()}, {how}", flush=True)
    for step in range(args.steps):
        x, y = batch(step, rank, device)
        loss = F.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # a sum (gloo has no average); divided below
        if rank == 0:
            print(f"step {step} loss {mean.item() / world!r}", flush=True)

    if handle is not None:
        if rank == 0:
            stats = handle.stats()
            total = stats["total"]
            print(f"TIDE: {len(stats['tide_groups'])} parameter groups on TIDE, {len(stats['stock_groups'])} stock; "
                  f"{total['ag_calls']} all-gathers, {total['rs_calls']} reduce-scatters, "
                  f"{total['fallbacks']} fallbacks", flush=True)
        nccl_tide.fsdp.disable(model)  # between steps, on every rank (frees the native executor's slots)


def _positive(text: str) -> int:
    """A count of at least 1: 0 or a negative count would train nothing and still exit 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a count >= 1")
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=_positive, default=10, help="training steps (>= 1)")
    ap.add_argument("--tide", action=argparse.BooleanOptionalAction, default=True,
                    help="route FSDP2's all-gathers and reduce-scatters through TIDE (default) or keep stock FSDP2")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=_positive, default=2, help="transformer blocks (>= 1)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        why = "this PyTorch is a CPU-only build" if not torch.version.cuda else "torch sees no CUDA GPU"
        ap.error(f"--device cuda: {why}; use --device cpu")

    device = init_distributed(args.device)
    train(args, device)
    # The model and its FSDP state (which holds the process group) are garbage by now: collect them before the
    # group is destroyed. Left to the interpreter's exit, gloo's objects occasionally abort the process there
    # ("terminate called without an active exception"), after the work is done, stock FSDP2 or not.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
