# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""A few-layer Llama 3 trained the torchtitan way: its JobConfig (parsed by its ConfigManager), its ParallelDims
and device mesh, its model, its parallelize function (FSDP2 over the whole world, bf16 parameters, fp32
reduction), its optimizer builder, loss and gradient clipping. torchtitan's Trainer itself also wants a tokenizer
and a dataset from the Hugging Face hub; this loop feeds synthetic tokens (common.batch) instead.

    torchrun --nproc-per-node=8 examples/frameworks/torchtitan_train.py --steps 20
    torchrun --nproc-per-node=8 examples/frameworks/torchtitan_train.py --tide fsdp        # nccl_tide.fsdp
    torchrun --nproc-per-node=8 examples/frameworks/torchtitan_train.py --tide interposer  # LD_PRELOAD

`--tide fsdp` turns nccl_tide.fsdp on with nccl_tide.fsdp_switch.apply(model, "all") right after torchtitan's
parallelize function, where torchtitan wires its own fsdp_symm_mem switch, and prints one `TIDE_FSDP {json}` line
per rank with the handle's call counts at the end.
"""

import json
import sys

from common import batch, init_distributed, parse_args, report_loss

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 512, 128, 4, 3, 64, 4


def job_config(seed: int):
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args([
        "--model.name", "llama3",
        "--training.local_batch_size", str(BATCH),
        "--training.seq_len", str(SEQ),
        "--training.mixed_precision_param", "bfloat16",
        "--training.mixed_precision_reduce", "float32",
        "--training.max_norm", "1.0",
        "--parallelism.data_parallel_shard_degree", "-1",
        "--activation_checkpoint.mode", "none",
        "--optimizer.lr", "3e-3",
        "--optimizer.weight_decay", "0.0",
        "--optimizer.implementation", "foreach",
        "--debug.seed", str(seed),
        "--debug.deterministic",
    ])


def tide_fsdp_stats(handle) -> dict:
    stats = handle.stats()
    groups = stats.get("tide_groups", [])
    return {"executor": stats.get("executor"), "ag_calls": sum(g["ag_calls"] for g in groups),
            "rs_calls": sum(g["rs_calls"] for g in groups), "stock_groups": len(stats.get("stock_groups", []))}


def main(argv=None) -> None:
    args = parse_args(__doc__.splitlines()[0], ("fsdp", "interposer"), argv)
    dist, device = init_distributed(args.tide)
    import torch
    import torchtitan.distributed.parallel_dims as titan_dims
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.llama3.model.args import TransformerModelArgs
    from torchtitan.protocols.train_spec import get_train_spec

    cfg = job_config(args.seed)
    spec = get_train_spec(cfg.model.name)
    p = cfg.parallelism
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree,
                        world_size=dist.get_world_size())
    if titan_dims.device_type != device.type:
        # torchtitan names "cuda" when torch sees no accelerator (it has no CPU switch): a CPU-only run says "cpu"
        titan_dims.device_type = device.type
    dims.build_mesh()
    dist_utils.set_determinism(dims, device, cfg.debug, distinct_seed_mesh_dims=["pp"])

    model_args = TransformerModelArgs(dim=DIM, n_layers=LAYERS, n_heads=HEADS, vocab_size=VOCAB, rope_theta=500000)
    model_args.update_from_config(cfg)
    with torch.device("meta"):
        model = spec.model_cls(model_args)
    model = spec.parallelize_fn(model, dims, cfg)
    if dist.get_backend() == "gloo":
        # torchtitan sets FSDP2's gradient divide factor to 1, which FSDP2 sends as PREMUL_SUM(1.0): NCCL has it,
        # gloo does not. A plain sum with no division gives the same values (what torchtitan's symmetric-memory
        # path asks for too).
        from torch.distributed.fsdp import FSDPModule

        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()

    handle = None
    if args.tide == "fsdp":
        from nccl_tide import fsdp_switch

        handle = fsdp_switch.apply(model, "all")
    optimizers = spec.build_optimizers_fn([model], cfg.optimizer, dims)
    loss_fn = spec.build_loss_fn(cfg)

    rank, world = dist.get_rank(), dist.get_world_size()
    local_tokens = BATCH * SEQ
    for step in range(args.steps):
        tokens, labels = batch(step, rank, BATCH, SEQ, VOCAB, device)
        optimizers.zero_grad()
        # torchtitan turns FSDP2's gradient division off and divides the summed loss by the global token count
        loss_sum = loss_fn(model(tokens), labels)
        (loss_sum / (local_tokens * world)).backward()
        dist_utils.clip_grad_norm_([p for p in model.parameters()], cfg.training.max_norm, foreach=True)
        optimizers.step()
        report_loss(rank, step, loss_sum.item() / local_tokens)
    if handle is not None:
        print("TIDE_FSDP " + json.dumps(tide_fsdp_stats(handle)), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
