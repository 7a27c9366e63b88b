# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""A small causal language model trained with DeepSpeed ZeRO (stage 3 or 2), bf16 parameters, data parallel.

    torchrun --nproc-per-node=8 examples/frameworks/deepspeed_train.py --zero 3 --steps 20
    torchrun --nproc-per-node=8 examples/frameworks/deepspeed_train.py --zero 3 --tide interposer

`--tide interposer` preloads libnccl-tide.so with NCCL_TIDE_ENABLE=1 (common.py); which of ZeRO's collectives TIDE
then takes is in docs/usage.md ("DeepSpeed"). The optimizer is torch's AdamW, handed to DeepSpeed as a client
optimizer, so no DeepSpeed CUDA extension is built or loaded (DS_BUILD_OPS=0 installs are enough).
ZeRO-3's persistence threshold is 0 so that every parameter is gathered and released every step, as in a large
model, rather than kept whole because the model is small. DeepSpeed takes LOCAL_RANK as the rank's device index
(ZeRO-3's parameter init does too): ranks that share a GPU must each be local rank 0 of their own host.
"""

import argparse
import sys

from common import batch, init_distributed, parse_args, report_loss

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 512, 128, 4, 3, 64, 4


def build_model():
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        # Every weight is used through its own nn.Linear call: ZeRO-3 gathers a module's parameters around that
        # module's forward (nn.MultiheadAttention reads out_proj.weight without calling out_proj, for instance).
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
            self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
            self.proj = nn.Linear(DIM, DIM, bias=False)
            self.up = nn.Linear(DIM, 4 * DIM, bias=False)
            self.down = nn.Linear(4 * DIM, DIM, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, HEADS, DIM // HEADS).transpose(1, 3).unbind(2)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, s, DIM))
            return x + self.down(F.gelu(self.up(self.norm2(x))))

    class CausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, DIM)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.norm = nn.LayerNorm(DIM)
            self.head = nn.Linear(DIM, VOCAB, bias=False)

        def forward(self, tokens, labels):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.norm(x)).float()
            return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))

    return CausalLM()


def ds_config(stage: int) -> dict:
    zero = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
            "reduce_bucket_size": 200_000, "allgather_bucket_size": 200_000}
    if stage == 3:
        zero.update({"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 200_000,
                     "stage3_max_live_parameters": 1_000_000})
    return {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
            "bf16": {"enabled": True}, "zero_optimization": zero, "gradient_clipping": 1.0,
            "steps_per_print": 1 << 30, "wall_clock_breakdown": False}


def main(argv=None) -> None:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--zero", type=int, choices=(2, 3), default=3)
    zero_args, rest = extra.parse_known_args(argv)
    args = parse_args(__doc__.splitlines()[0], ("interposer",), rest)
    dist, device = init_distributed(args.tide)
    import deepspeed
    import torch

    torch.manual_seed(args.seed)  # the same initial model on every rank
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(zero_args.zero))
    rank = dist.get_rank()
    for step in range(args.steps):
        tokens, labels = batch(step, rank, BATCH, SEQ, VOCAB, device)
        loss = engine(tokens, labels)
        engine.backward(loss)
        engine.step()
        report_loss(rank, step, loss.item())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
