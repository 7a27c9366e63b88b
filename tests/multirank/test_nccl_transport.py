# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""TIDE across TIDE nodes through NCCL (the sendrecv transport: grouped ncclSend / ncclRecv on the framework's
communicator), W ranks sharing one GPU as NCCL hosts (test_nccl_hosts.py's set-up: NCCL_HOSTID per rank, NCCL's
socket transport over loopback). Marker gpu: one card.

* Every rank its own NCCL host, nothing declared: each is its own TIDE node, the IPC provider maps no peer, and
  TIDE's AG and RS on layouts of one rank per node run as two-sided programs, bit for bit against the host
  executor (odd sizes, mixed dtypes, sum / avg); a layout whose nodes span the comm's nodes is refused.
* Two NCCL hosts of two ranks (NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1): two TIDE nodes of two ranks,
  layouts of 1 and 2 ranks per node.
* One declared node with NCCL_TIDE_INTERNODE=sendrecv and layouts of 2 ranks per node: peer-mapped node-local steps
  and p2p groups meet in one call.
* FSDP2 at two NCCL hosts: stock and nccl_tide.fsdp losses and parameters bit-identical.
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



@pytest.mark.parametrize("world", [2, 4])
def test_each_nccl_host_its_own_node(tmp_path, world):
    for rep in hosts.launch(tmp_path, world, "collectives", INFO, rpns=[1]):
        assert rep["provider"] == "ipc" and rep["checked"] == len(hosts._cases(world)), rep
        assert rep["comm_ranks_per_node"] == 1, rep
        line = _transport_line(tmp_path, rep["rank"])
        assert f"inter-node transport sendrecv ({world} TIDE nodes of 1 ranks do not map" in line, line
        assert "NCCL's kernels, which use SMs" in line, line


def test_layout_spanning_the_comm_nodes_is_refused(tmp_path):
    for rep in hosts.launch(tmp_path, 2, _spanning):
        assert rep["checked"] == 1, rep
        assert "span the comm's TIDE nodes of 1 ranks" in rep["message"], rep["message"]


@hosts.needs_multi_rank_nccl
def test_two_nccl_hosts_of_two_ranks_through_nccl(tmp_path):
    env = dict(hosts.MULTI_RANK_ENV, **INFO)
    for rep in hosts.launch(tmp_path, 4, "collectives", env, host_of=lambda r: f"tide-host-{r // 2}", rpns=[1, 2]):
        assert rep["nccl"] >= "2.30" and rep["checked"] == len(hosts._cases(4)) * 2, rep
        assert "sendrecv (2 TIDE nodes of 2 ranks do not map" in _transport_line(tmp_path, rep["rank"])


def test_forced_sendrecv_between_virtual_nodes_of_one_declared_node(tmp_path):
    env = dict(INFO, NCCL_TIDE_RANKS_PER_NODE="4", NCCL_TIDE_INTERNODE="sendrecv")
    for rep in hosts.launch(tmp_path, 4, "collectives", env, rpns=[2, 1, 4]):
        assert rep["checked"] == len(hosts._cases(4)) * 3, rep
        assert "sendrecv (forced by NCCL_TIDE_INTERNODE=sendrecv)" in _transport_line(tmp_path, rep["rank"])


def test_fsdp2_across_two_nccl_hosts_matches_stock(tmp_path):
    # enable() without ranks_per_node: the layouts take the comm's node size (one rank per NCCL host).
    for rep in hosts.launch(tmp_path, 2, "fsdp", INFO, timeout=400):
        assert not rep["stock_groups"], rep["stock_groups"]
        assert rep["tide_calls"]["ag_calls"] > 0 and rep["tide_calls"]["rs_calls"] > 0, rep["tide_calls"]
        assert "inter-node transport sendrecv" in _transport_line(tmp_path, rep["rank"])


def test_forced_rma_is_refused(tmp_path):
    for rep in hosts.launch(tmp_path, 2, "refusal", {"NCCL_TIDE_INTERNODE": "rma"}, bootstrap=False):
        assert rep["checked"] == 1, rep
        assert "NCCL_TIDE_INTERNODE=rma" in rep["message"] and "not built" in rep["message"], rep["message"]
