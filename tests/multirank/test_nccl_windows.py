# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The NCCL window provider (NCCL >= 2.29.2) on one GPU, in test_nccl_hosts.py's set-up: W ranks share the card, each
a process, their NCCL hosts given by NCCL_HOSTID. Marker gpu: one card.

* Two ranks of one NCCL host (NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1, from TIDE_TEST_NCCL_LIBRARY): the
  provider is window (tideCommCreate's INFO line says so and why), and TIDE's AG and RS are bit for bit the host
  executor's on random layouts (one node and virtual nodes; slots allocated and freed per case, own RS staging
  grown); NCCL_TIDE_PROVIDER=ipc keeps CUDA IPC on the same NCCL.
* Two NCCL hosts of two ranks: windows inside each host, on a communicator split off per TIDE node, and grouped
  ncclSend / ncclRecv across (the sendrecv transport of test_nccl_transport.py, its INFO line checked too).
* One TIDE node declared across the two NCCL hosts: NCCL has no symmetric memory on such a communicator over
  sockets (ncclCommWindowRegister gives no window), so every rank falls back to IPC, runs bit for bit (one node and
  virtual nodes) and names the NCCL call that said no; forced windows are refused there with that reason.
* torch's own NCCL (2.28.9): NCCL_TIDE_PROVIDER=window is refused with what to change, on an NCCL communicator and
  on a bootstrap.

Each rank logs at INFO into its own file; the provider line of tideCommCreate is checked there.
"""

import pytest
import test_nccl_hosts as hosts
import test_nccl_transport as transport

pytestmark = [pytest.mark.gpu]
INFO = {"NCCL_TIDE_DEBUG": "INFO"}
ONE_HOST = lambda r: "tide-one-host"  # noqa: E731
TWO_HOSTS = lambda r: f"tide-host-{r // 2}"  # noqa: E731


@pytest.fixture(autouse=True)
def _gpu(torch_cuda, cuda_lib):
    pass


def _provider_line(tmp_path, rank):
    """tideCommCreate's line in the rank's log (one per comm the rank created; all alike here)."""
    lines = [x.split("tideCommCreate: ", 1)[1] for x in (tmp_path / f"tide-rank{rank}.log").read_text().splitlines()
             if "NCCL TIDE INFO Nccl: tideCommCreate: " in x]
    assert lines and len(set(lines)) == 1, lines
    return lines[0]


@hosts.needs_multi_rank_nccl
@pytest.mark.parametrize("setting,provider", [(None, "window"), ("ipc", "ipc")])
def test_two_ranks_of_one_host_on_windows(tmp_path, setting, provider):
    env = dict(hosts.MULTI_RANK_ENV, **INFO)
    if setting:
        env["NCCL_TIDE_PROVIDER"] = setting
    for rep in hosts.launch(tmp_path, 2, "collectives", env, host_of=ONE_HOST):
        assert rep["nccl"] >= "2.30" and rep["checked"] == len(hosts._cases(2)) * 2, rep
        assert rep["provider"] == provider and rep["comm_ranks_per_node"] == 2, rep
        line = _provider_line(tmp_path, rep["rank"])
        if setting:
            assert "provider ipc (NCCL_TIDE_PROVIDER=ipc)" in line, line
        else:
            assert "provider window (NCCL 2." in line and "has windows with host-side peer pointers" in line, line
            assert "windows on the comm's NCCL communicator" in line and "inter-node peer-mapped" in line, line


@hosts.needs_multi_rank_nccl
def test_two_hosts_windows_inside_sendrecv_across(tmp_path):
    env = dict(hosts.MULTI_RANK_ENV, **INFO)
    for rep in hosts.launch(tmp_path, 4, "collectives", env, host_of=TWO_HOSTS, rpns=[2, 1]):
        assert rep["nccl"] >= "2.30" and rep["checked"] == len(hosts._cases(4)) * 2, rep
        assert rep["provider"] == "window" and rep["comm_ranks_per_node"] == 2, rep
        line = _provider_line(tmp_path, rep["rank"])
        assert "windows on a communicator split off per TIDE node" in line and "inter-node sendrecv" in line, line
        line = transport._transport_line(tmp_path, rep["rank"])
        assert "sendrecv (2 TIDE nodes of 2 ranks do not map" in line, line


# The NCCL calls whose answer makes the window provider fall back (plugin/nccl/window_memory.h). On a communicator
# spanning two NCCL hosts over sockets (no GIN), NCCL 2.30.7 has no symmetric memory at all, so ncclCommWindowRegister
# returns ncclSuccess with no window on every rank; with a GIN network it would give a window whose peer addresses
# stop at the own host (ncclGetPeerDevicePointer: ncclSuccess, NULL). Either way every rank must fall back alike.
NCCL_SAID_NO = ("ncclCommWindowRegister on the comm's NCCL communicator ",
                "ncclGetPeerDevicePointer on the comm's NCCL communicator ")
FALLBACK = "provider ipc (NCCL has no windows for this comm's TIDE nodes: "


@hosts.needs_multi_rank_nccl
def test_node_across_nccl_hosts_falls_back_to_ipc(tmp_path):
    env = dict(hosts.MULTI_RANK_ENV, NCCL_TIDE_RANKS_PER_NODE="4", **INFO)
    calls = set()
    for rep in hosts.launch(tmp_path / "auto", 4, "collectives", env, host_of=TWO_HOSTS, rpns=[4, 2]):
        # Every case bit for bit against the host executor (the harness fails on any rank's error).
        assert rep["checked"] == len(hosts._cases(4)) * 2, rep
        assert rep["provider"] == "ipc" and rep["comm_ranks_per_node"] == 4, rep
        line = _provider_line(tmp_path / "auto", rep["rank"])
        assert FALLBACK in line, line
        reason = line.split(FALLBACK, 1)[1]
        assert reason.startswith(NCCL_SAID_NO), line
        calls.add(reason.split(" ", 1)[0])
        assert "ncclSuccess" in reason or "NCCL error" in reason, line  # what the call returned
    assert len(calls) == 1, calls  # one NCCL answer for the whole world
    forced = dict(env, NCCL_TIDE_PROVIDER="window")
    for rep in hosts.launch(tmp_path / "forced", 4, "refusal", forced, host_of=TWO_HOSTS, bootstrap=False):
        assert rep["checked"] == 1, rep
        # UnsupportedError's text: "tideCommCreate: " + the library's message + " (" + hint + ")".
        msg = rep["message"]
        assert msg.startswith("tideCommCreate: NCCL_TIDE_PROVIDER=window: "), msg
        reason = msg[len("tideCommCreate: NCCL_TIDE_PROVIDER=window: "):]
        assert reason.startswith(NCCL_SAID_NO) and reason.split(" ", 1)[0] in calls, (msg, calls)
        assert "unset NCCL_TIDE_PROVIDER (auto) to use CUDA IPC there" in msg, msg


def _forced_window(rank, world, report):
    """NCCL_TIDE_PROVIDER=window on the process's NCCL: nccl_info and both constructors refuse it (UnsupportedError)."""
    import torch.distributed as dist
    from nccl_tide.comm import Comm, nccl_info
    from nccl_tide.errors import UnsupportedError

    report["messages"] = []
    gloo = dist.new_group(backend="gloo")
    for make in (nccl_info, lambda: Comm.from_process_group().close(),
                 lambda: Comm.from_bootstrap(rank, world, 0, group=gloo).close()):
        try:
            make()
            report["errors"].append("the call succeeded")
        except UnsupportedError as e:
            report["messages"].append(str(e))
            report["checked"] += 1


def test_forced_window_on_torch_nccl_is_refused(tmp_path):
    import torch

    version = tuple(torch.cuda.nccl.version())
    if version >= (2, 29, 2):
        pytest.skip(f"torch's NCCL {version} has the window API: nothing to refuse")
    env = {"NCCL_TIDE_PROVIDER": "window", "NCCL_TIDE_RANKS_PER_NODE": "2"}
    for rep in hosts.launch(tmp_path, 2, _forced_window, env):
        assert rep["checked"] == 3, rep
        info, nccl, bootstrap = rep["messages"]
        for msg in (info, nccl):
            assert "NCCL_TIDE_PROVIDER=window" in msg and "is older than 2.29.2" in msg, msg
            assert "unset NCCL_TIDE_PROVIDER (auto) or set ipc" in msg, msg
        assert "a comm on a caller's bootstrap has no NCCL communicator" in bootstrap, bootstrap
