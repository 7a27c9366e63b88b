# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""What a collective is to tide-perf, as nccl-tests' `struct testColl`: its names, whether it reduces, its bandwidth
factor, and how each backend makes its buffers, calls it and checks the result. perf/all_gather.py and
perf/reduce_scatter.py are the two; the harness and the backends run whichever they are given and read what is
particular to it from its descriptor.

What a GPU backend offers a collective (loopback_backend.LoopbackBackend, torchrun_backend.TorchrunBackend):
* `name`, `W` (the world size), `device`;
* `mine`: the ranks whose outputs live in this process, in order (loopback: every virtual rank; torchrun: its own);
* `layouts(case, numels, rows)`: those ranks' Layouts;
* `rank_generators(seed)`: the generator of every rank's inputs (all W: a process checks against all of them);
* `tide()`: TIDE's calls for those ranks, every list argument in `mine`'s order;
* loopback only `nodes` (its virtual nodes); torchrun only `rank`, `dist` (torch.distributed), `zero_cta_group()`."""

from abc import ABC, abstractmethod
from typing import Callable, Dict, List, NamedTuple, Tuple, Union

from .runner import Bench, CaseSpec, Unavailable

BaselineFn = Callable[..., Bench]  # (backend, case) -> the Bench of one baseline row


class HostVariant(NamedTuple):
    """One variant (out of place or in place) of a collective on the host backend, its buffers already made."""

    run: Callable[[], None]  # one call of every simulated rank
    check: Callable[[], int]  # wrong elements in the outputs of the last call
    reset: Callable[[], None] = lambda: None  # puts back what a call overwrote of the inputs (in place)


def not_run(reason: str) -> BaselineFn:
    """A baseline row the collective cannot have: the row says why."""

    def unavailable(backend, case: CaseSpec) -> Bench:
        raise Unavailable(reason)

    return unavailable


def shard_numels(numels: List[int], rows: List[int], world: int) -> List[int]:
    """Each parameter's per-rank shard: its rows split over the ranks, dim 0 padded to a multiple of them."""
    return [-(-n // r // world) * r for n, r in zip(numels, rows)]


class Collective(ABC):
    """One collective (nccl-tests' testColl): a subclass names it and fills in the abstract methods and baselines;
    collectives.COLLECTIVES holds one instance of each."""

    name: str  # all_gather | reduce_scatter
    perf_name: str  # nccl-tests' program name: the "Collective test" lines and the JSON's experiment name
    reduces: bool  # takes a reduction op, an output type and a premul scale
    fsdp2_copy_op: str  # the FSDP2 layout conversion its fsdp2 row adds per rank

    def bus_factor(self, world: int) -> float:
        """nccl-tests' AllGatherGetBw / ReduceScatterGetBw: (W-1)/W, whatever the node topology."""
        return (world - 1) / world if world > 1 else 0.0

    def bandwidth(self, nbytes_total: int, world: int, time_us: float) -> Tuple[float, float]:
        """(algbw, busbw) in GB/s of `nbytes_total` bytes (the whole gathered / reduced size) in `time_us`."""
        algbw = nbytes_total / 1e3 / time_us if time_us > 0 else 0.0  # bytes/us/1e3 = GB/s
        return algbw, algbw * self.bus_factor(world)

    def redop(self, op: str) -> str:
        """The table's redop column: the op of a reduction, "none" otherwise (nccl-tests' all_gather)."""
        return op if self.reduces else "none"

    # -- host backend (perf/host_backend.py): every rank simulated in this process ---------------------------------

    @abstractmethod
    def host_peak_bytes(self, numels: List[int], rows: List[int], world: int, elem: int, out_elem: int,
                        check: bool) -> int:
        """Bytes host_variants and its calls hold at their peak for one non-empty case, every simulated rank
        included: what lives at once in each phase, the largest phase. The host backend's memory check
        (perf/host_memory.py) compares it with what the machine has."""

    @abstractmethod
    def host_variants(self, layout, o) -> Tuple[HostVariant, Union[HostVariant, str]]:
        """Every rank's inputs and outputs on `layout` for the host options `o` (host_backend.Opts), as the
        out-of-place variant and the in-place one, or the note saying why there is no in-place one."""

    # -- GPU backends (perf/loopback_backend.py, perf/torchrun_backend.py) --------------------------------------------

    # The baselines by impl name. Loopback: same-device stand-ins (its virtual ranks share one process, which holds no
    # NCCL communicator between them); torchrun: NCCL's own calls on its process group.
    stand_ins: Dict[str, BaselineFn] = {}
    nccl_rows: Dict[str, BaselineFn] = {}

    @abstractmethod
    def tide_bench(self, backend, case: CaseSpec) -> Bench:
        """TIDE's call for the ranks `backend` holds, its check and its prebuilt issue (the host / gpu columns)."""

    def bench(self, impl: str, backend, case: CaseSpec, baselines: Dict[str, BaselineFn]) -> Bench:
        """The Bench of `impl`: TIDE's call, else the baseline of that name among the backend's kind of baselines."""
        if impl == "tide":
            return self.tide_bench(backend, case)
        make = baselines.get(impl)
        if make is None:
            raise Unavailable(f"not run: no {backend.name} implementation of {impl}")
        return make(backend, case)
