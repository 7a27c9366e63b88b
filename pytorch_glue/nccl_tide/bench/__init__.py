"""Benchmarks beyond single collectives: the FSDP2 training step (python -m nccl_tide.bench.fsdp_step)."""
