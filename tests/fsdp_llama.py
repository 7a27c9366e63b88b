# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Shared by the FSDP2 tests: a tiny Llama-style model (benchmarks/fsdp_model.py's, built small) and the body of
their gloo workers (started by multirank.harness.run_script).

Sizes are chosen so that no dim-0 divides the world sizes used (2, 4), and one parameter
has fewer rows than ranks (trailing ranks hold only padding).
"""

import json
import os
import sys
from pathlib import Path

_BENCHMARKS = str(Path(__file__).resolve().parents[1] / "benchmarks")
if _BENCHMARKS not in sys.path:
    sys.path.append(_BENCHMARKS)  # fsdp_model.py; appended, so that tests/ modules keep their names
from fsdp_model import LlamaConfig, build  # noqa: E402

# free_port: for benchmarks/tests/test_fsdp_memory_probe.py.
from multirank.harness import free_port, init_gloo  # noqa: E402, F401

VOCAB, DIM, HEADS, HIDDEN, LAYERS = 37, 26, 2, 45, 2
TINY = LlamaConfig(layers=LAYERS, hidden=DIM, heads=HEADS, kv_heads=HEADS, ffn=HIDDEN, vocab=VOCAB)


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
    """The tiny model: benchmarks/fsdp_model.py's decoder with short names (wq.., w1/w3/w2, each norm before its
    sublayer), a gate per block, multi-head attention and torch's default initialisation."""
    return build(TINY._replace(layers=layers), seed, names="short", gates=True, tied=tied, init="torch")


def batch(step: int, rank: int, b: int = 2, t: int = 7):
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, VOCAB, (b, t + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
