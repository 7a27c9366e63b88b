# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""TIDE across TIDE nodes through NCCL (the sendrecv transport: grouped ncclSend / ncclRecv on the framework's
communicator), W ranks sharing one GPU as NCCL hosts (test_nccl_hosts.py's set-up: NCCL_HOSTID per rank, NCCL's
socket transport over loopback). Marker gpu: one card.

* Every rank its own NCCL host, nothing declared (2 and 4 ranks): each is its own TIDE node, the IPC provider maps
  no peer, and TIDE's AG and RS on layouts of one rank per node run as two-sided programs, bit for bit against the
  host executor (odd sizes, mixed dtypes, sum / avg). On the world of 2, in turn (test_nccl_hosts.py's "in_turn"):
  a layout whose nodes span the comm's nodes is refused; FSDP2 stock and with nccl_tide.fsdp, losses and
  parameters bit-identical.
* Two NCCL hosts of two ranks (NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1): two TIDE nodes of two ranks,
  layouts of 1 and 2 ranks per node: test_nccl_windows.py's, whose provider there is windows inside each host.
* One declared node with NCCL_TIDE_INTERNODE=sendrecv and layouts of 2 ranks per node: peer-mapped node-local steps
  and p2p groups meet in one call.
* Forced NCCL_TIDE_INTERNODE=rma: tideCommCreate refuses it as not built.

Each rank logs at INFO into its own file; the comm's transport line is checked there.
"""

import re

import pytest
import test_nccl_hosts as hosts

pytestmark = [pytest.mark.gpu]
INFO = {"NCCL_TIDE_DEBUG": "INFO"}
TRANSPORT_LINE = re.compile(r"NCCL TIDE INFO Cuda: rank \d+: (inter-node transport .*)$")


@pytest.fixture(autouse=True)
def _gpu(torch_cuda, cuda_lib):
    pass


def _transport_line(tmp_path, rank):
    """The comm's transport line in the rank's log (one per comm the rank created; all alike here): the INFO line whose
    message starts with it (the NCCL binding's own line names the transport too, further in)."""
    log = (tmp_path / f"tide-rank{rank}.log").read_text().splitlines()
    lines = [m.group(1) for m in map(TRANSPORT_LINE.search, log) if m]
    assert lines and len(set(lines)) == 1, lines
    return lines[0]


def _spanning(rank, world, report):
    """A layout of `world` ranks per node on a comm of one-rank nodes: refused before anything is enqueued."""
    import nccl_tide
    import torch
    from nccl_tide.comm import Comm
    from nccl_tide.errors import UnsupportedError

    comm = Comm.from_process_group()
    L = nccl_tide.Layout([4096 * world], ["fp32"], world, ranks_per_node=world, rank=rank)
    slot = comm.alloc_slot(L.slot_bytes)
    try:
        comm.all_gather(L, slot, sendbuf=torch.zeros(L.send_bytes, dtype=torch.uint8, device="cuda"))
        report["errors"].append("a layout spanning the comm's TIDE nodes was accepted")
    except UnsupportedError as e:
        report["message"] = str(e)
        report["checked"] += 1
    comm.free_slot(slot)
    comm.close()



def _assert_own_nodes_bit_exact(collectives, world, tmp_path, rank):
    """The collectives check of a world whose every rank is its own NCCL host and TIDE node."""
    assert collectives["provider"] == "ipc" and collectives["checked"] == len(hosts._cases(world)), collectives
    assert collectives["comm_ranks_per_node"] == 1, collectives
    line = _transport_line(tmp_path, rank)
    assert f"inter-node transport sendrecv ({world} TIDE nodes of 1 ranks do not map" in line, line
    assert "NCCL's kernels, which use SMs" in line, line


def test_two_nccl_hosts_bit_exact_spanning_refused_and_fsdp2_matches_stock(tmp_path):
    # enable() without ranks_per_node: the layouts take the comm's node size (one rank per NCCL host).
    checks = [("collectives", {"rpns": [1]}), (_spanning, {}), ("fsdp", {})]
    for rep in hosts.launch(tmp_path, 2, "in_turn", INFO, timeout=400, checks=checks):
        collectives, spanning, fsdp = rep["checks"]
        _assert_own_nodes_bit_exact(collectives, 2, tmp_path, rep["rank"])
        assert spanning["checked"] == 1, spanning
        assert "span the comm's TIDE nodes of 1 ranks" in spanning["message"], spanning["message"]
        assert not fsdp["stock_groups"], fsdp["stock_groups"]
        assert fsdp["tide_calls"]["ag_calls"] > 0 and fsdp["tide_calls"]["rs_calls"] > 0, fsdp["tide_calls"]


def test_four_nccl_hosts_each_its_own_node(tmp_path):
    for rep in hosts.launch(tmp_path, 4, "collectives", INFO, rpns=[1]):
        _assert_own_nodes_bit_exact(rep, 4, tmp_path, rep["rank"])


def test_forced_sendrecv_between_virtual_nodes_of_one_declared_node(tmp_path):
    env = dict(INFO, NCCL_TIDE_RANKS_PER_NODE="4", NCCL_TIDE_INTERNODE="sendrecv")
    for rep in hosts.launch(tmp_path, 4, "collectives", env, rpns=[2, 1, 4]):
        assert rep["checked"] == len(hosts._cases(4)) * 3, rep
        assert "sendrecv (forced by NCCL_TIDE_INTERNODE=sendrecv)" in _transport_line(tmp_path, rep["rank"])


def test_forced_rma_is_refused(tmp_path):
    for rep in hosts.launch(tmp_path, 2, "refusal", {"NCCL_TIDE_INTERNODE": "rma"}, bootstrap=False):
        assert rep["checked"] == 1, rep
        assert "NCCL_TIDE_INTERNODE=rma" in rep["message"] and "not built" in rep["message"], rep["message"]
