# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Host collectives sized beyond the machine are refused up front with the figures, instead of the out-of-memory
killer ending the process without a word (tide-perf's host backend allocates about ranks x size)."""

import os
import resource
import subprocess
import sys

import pytest

from nccl_tide import Layout, TideOutOfMemoryError
from nccl_tide._memory import available_host_memory, check_host_memory, host_collective_bytes


def test_more_than_available_is_refused_with_both_figures():
    avail, source = available_host_memory()
    assert avail is not None and avail > 0 and source  # Linux: /proc/meminfo at least
    with pytest.raises(TideOutOfMemoryError, match=r"the thing needs about 1024\.0 GiB of host memory, but only "
                                                   r"[0-9.]+ GiB are available \(.+\)"):
        check_host_memory(1 << 40, "the thing")
    check_host_memory(1 << 20, "a small thing")  # no error


def test_estimate_counts_every_rank():
    with Layout([4096, 100], "bf16", 8) as layout:
        per_rank_shards = sum(p.shard_numel for p in layout.params) * 2
        assert host_collective_bytes(layout, "all_gather") == 8 * per_rank_shards * (1 + 8)
        assert host_collective_bytes(layout, "all_gather", results_copy=True) == 8 * per_rank_shards * (2 + 8)
        grads = 8 * (4096 + 100) * 2
        outs = 8 * layout.rs_out_numel * 4
        assert host_collective_bytes(layout, "reduce_scatter", 4) == grads + outs
        assert host_collective_bytes(layout, "reduce_scatter", 4, results_copy=True) == grads + 2 * outs


def _cap_address_space():
    # Should the check ever be lost, the child fails with MemoryError instead of driving this machine out of memory.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
def test_tide_perf_host_backend_refuses_a_world_beyond_memory(collective):
    cmd = [sys.executable, "-m", "nccl_tide.perf", collective, "--backend", "host", "--ranks", "4096",
           "-b", "64M", "-e", "64M"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, preexec_fn=_cap_address_space,
                       env=dict(os.environ))
    out = p.stdout + p.stderr
    assert p.returncode > 0, out  # an error exit, not a signal
    assert f"tide-perf {collective} --backend host needs about" in out, out
    assert "GiB are available" in out and "Traceback" not in out, out
