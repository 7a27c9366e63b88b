# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""A small GPT trained with Megatron-Core: its GPTModel on the local (pure PyTorch) layer spec, bf16 parameters,
its DistributedDataParallel with the distributed optimizer (fp32 gradient reduction, ZeRO-1-style sharded
optimizer state), its no-pipelining forward/backward schedule. CUDA only: Megatron-Core allocates its gradient
buffers on the current CUDA device.

    torchrun --nproc-per-node=8 examples/frameworks/megatron_train.py --steps 20
    torchrun --nproc-per-node=8 examples/frameworks/megatron_train.py --tide interposer

No Transformer Engine or Apex is needed: the local spec, torch's softmax and Megatron-Core's fallback to torch's
AdamW (it warns once) are its pure-PyTorch path; the fusions that need their kernels are off. Which of the
distributed optimizer's collectives TIDE takes is in docs/usage.md ("Megatron-Core").
"""

import sys

from common import batch, init_distributed, parse_args, report_loss

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 512, 128, 4, 3, 64, 4


def build(seed: int):
    import torch
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    config = TransformerConfig(
        num_layers=LAYERS, hidden_size=DIM, num_attention_heads=HEADS, ffn_hidden_size=4 * DIM,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        hidden_dropout=0.0, attention_dropout=0.0,
        masked_softmax_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        gradient_accumulation_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
    )
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                     max_sequence_length=SEQ, position_embedding_type="rope")
    model = Float16Module(config, model.cuda())  # bf16 parameters (norms included), as Megatron's get_model does
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=True)
    model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=3e-3, weight_decay=0.0, bf16=True, params_dtype=torch.bfloat16,
                        use_distributed_optimizer=True, clip_grad=1.0),
        [model],
    )
    return config, model, optimizer


def main(argv=None) -> None:
    args = parse_args(__doc__.splitlines()[0], ("interposer",), argv)
    dist, device = init_distributed(args.tide)
    if device.type != "cuda":
        raise SystemExit("Megatron-Core's DistributedDataParallel needs a CUDA device (its buffers live on "
                         "torch.cuda.current_device())")
    import torch
    from megatron.core import parallel_state
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    config, model, optimizer = build(args.seed)
    config.finalize_model_grads_func = finalize_model_grads  # finishes the DDP gradient reduce-scatter
    config.no_sync_func = model.no_sync
    config.grad_scale_func = optimizer.scale_loss
    rank = parallel_state.get_data_parallel_rank()
    positions = torch.arange(SEQ, device=device).unsqueeze(0).expand(BATCH, SEQ)
    mask = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool, device=device), 1)[None, None]  # True: masked out

    def forward_step(data_iterator, gpt):
        tokens, labels = next(data_iterator)
        per_token = gpt(tokens, positions, mask, labels=labels)

        def loss_func(output):
            loss = output.float().mean()
            return loss, {"lm loss": loss.detach().clone()}  # the schedule scales `loss` in place

        return per_token, loss_func

    forward_backward = get_forward_backward_func()
    for step in range(args.steps):
        model.zero_grad_buffer()
        optimizer.zero_grad()
        data = iter([batch(step, rank, BATCH, SEQ, VOCAB, device)])
        reduced = forward_backward(forward_step_func=forward_step, data_iterator=data, model=[model],
                                   num_microbatches=1, seq_length=SEQ, micro_batch_size=BATCH, forward_only=False)
        ok, _, _ = optimizer.step()
        if not ok:
            raise SystemExit(f"step {step}: the optimizer skipped the update")
        report_loss(dist.get_rank(), step, reduced[0]["lm loss"].item())
    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
