# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The reference executor's flat collectives use the spelling the running torch prefers: no FutureWarning."""

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent(
    """
    import os, socket, warnings
    import torch, torch.distributed as dist
    from nccl_tide import Layout
    from nccl_tide._dist import all_gather_flat, reduce_scatter_flat
    from nccl_tide.reference_executor import ReferenceExecutor

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    warnings.simplefilter("error")  # any warning from here on fails the script
    g = torch.Generator().manual_seed(7)
    lay = Layout([5, 12], "bf16", 1, rank=0)
    shards = [torch.randn(p.shard_numel, generator=g).to(torch.bfloat16) for p in lay.params]
    ex = ReferenceExecutor()
    params = [torch.full((p.shard_numel,), float("nan")).to(torch.bfloat16) for p in lay.params]
    ex.all_gather(lay, ex.pack(lay, shards), params)
    for s, p in zip(shards, params):
        assert torch.equal(s, p)
    x = torch.randn(8, generator=g)
    out = torch.empty(8)
    all_gather_flat(out, x)
    assert torch.equal(out, x)
    reduce_scatter_flat(out, x)
    assert torch.equal(out, x)
    dist.destroy_process_group()
    print("clean")
    """
)


def test_flat_collectives_emit_no_warning():
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "clean" in p.stdout, p.stderr[-2000:]
