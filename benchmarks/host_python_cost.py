# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The Python part of Comm.reduce_scatter / Comm.all_gather per call, on a CPU: no GPU, no NCCL.

    python benchmarks/host_python_cost.py [--params 64] [--numel 262144] [--world 2] [--profile]

What runs is the real entry point with everything it does per call (argument and tensor checks, the pointer
table, the ctypes marshalling, the library call), with two stand-ins: the tensors are CPU tensors that say they are
on CUDA (FakeCudaTensor: is_cuda and device report CUDA; every other attribute and method is torch's own), and the
library is the host-only build, whose tideReduceScatter / tideAllGather refuse at once (no CUDA in it): the refusal
is ignored here, so the timed call is the Python entry up to and including the C call. Printed, in us per call
(best of several repeats): the whole call, the bare C call with prebuilt arguments, and, as the floor no Python
entry can go under, reading the gradients' data_ptr() once.

benchmarks/host_vs_nccl.py measures the same entry points on a GPU beside torch.distributed's NCCL calls.
"""

import argparse
import timeit
from typing import Callable, Dict

import torch


class _FakeCudaDevice:
    type = "cuda"
    index = 0

    def __str__(self) -> str:
        return "cuda:0"


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that reports CUDA (is_cuda, device): what the CUDA wrappers' checks read, at torch's own cost
    for everything else (the subclass opts out of __torch_function__)."""

    is_cuda = True
    device = _FakeCudaDevice()
    __torch_function__ = torch._C._disabled_torch_function_impl


def fake_cuda(t: torch.Tensor) -> FakeCudaTensor:
    return t.as_subclass(FakeCudaTensor)


class Bench:
    """A Comm over no library comm (handle 0x1000, never dereferenced: the host-only build refuses before), one
    layout of `params` bf16 parameters of `numel` elements at `world` ranks, and its tensors."""

    STREAM = 0x1234  # a stream address: the lookup of the current stream needs CUDA

    def __init__(self, params: int = 64, numel: int = 1 << 18, world: int = 2):
        import nccl_tide
        from nccl_tide import _native as N
        from nccl_tide._lifetime import Lifetime
        from nccl_tide.comm import Comm

        self.N = N
        self.layout = nccl_tide.Layout([numel] * params, "bf16", world, rank=0)
        L = self.layout
        self.grads = [fake_cuda(torch.empty(numel, dtype=torch.bfloat16)) for _ in range(params)]
        self.out = fake_cuda(torch.empty(L.rs_out_numel, dtype=torch.float32))
        self.shards = [fake_cuda(torch.empty(p.shard_numel, dtype=torch.bfloat16)) for p in L.params]
        self.slot = fake_cuda(torch.empty(L.slot_bytes, dtype=torch.uint8))
        c = Comm.__new__(Comm)
        c._life, c._handle, c.rank, c.world_size, c.device, c._slots = Lifetime("Comm"), 0x1000, 0, world, 0, []
        self.comm = c

    def reduce_scatter(self) -> None:
        self.comm.reduce_scatter(self.layout, self.grads, self.out, op="sum", stream=self.STREAM)

    def all_gather(self) -> None:
        self.comm.all_gather(self.layout, self.slot, shards=self.shards, stream=self.STREAM)

    def bare_c_call(self) -> None:
        self.N.lib().tideReduceScatter(0x1000, self.layout.handle, None, 1, self.N.tideFloat32, self.N.tideSum, 1.0,
                                       None, self.STREAM)

    def data_ptr_floor(self) -> None:
        [g.data_ptr() for g in self.grads]

    def close(self) -> None:
        self.layout.close()


class refusals_ignored:
    """Within the block, the library's refusal (tideUnsupported from the host-only build) raises nothing."""

    def __init__(self, bench: Bench):
        self._N = bench.N

    def __enter__(self):
        self._saved = self._N.check
        self._N.check = lambda rc, what="": None
        return self

    def __exit__(self, *exc):
        self._N.check = self._saved


def best_us(fns: Dict[str, Callable[[], None]], number: int = 1000, repeat: int = 7) -> Dict[str, float]:
    """Per function, the best of `repeat` runs of `number` calls, in us per call (the run least disturbed by other
    processes). The functions take turns run by run, so that a spell of load reaches them alike."""
    for fn in fns.values():
        fn()
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            best[k] = min(best[k], timeit.timeit(fn, number=number) / number * 1e6)
    return best


def measure(bench: Bench, number: int = 1000, repeat: int = 7) -> Dict[str, float]:
    with refusals_ignored(bench):
        return best_us({
            "reduce_scatter_us": bench.reduce_scatter,
            "all_gather_us": bench.all_gather,
            "bare_c_call_us": bench.bare_c_call,
            "data_ptr_floor_us": bench.data_ptr_floor,
        }, number, repeat)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=64)
    ap.add_argument("--numel", type=int, default=1 << 18)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--number", type=int, default=2000)
    ap.add_argument("--profile", action="store_true", help="also a cProfile of reduce_scatter, by own time")
    args = ap.parse_args()
    bench = Bench(args.params, args.numel, args.world)
    m = measure(bench, args.number)
    print(f"# {args.params} x {args.numel} bf16, W={args.world}; us per call, best of 7 x {args.number} calls")
    for k, v in m.items():
        print(f"{k:<22}{v:>9.2f}")
    print(f"{'rs / data_ptr floor':<22}{m['reduce_scatter_us'] / m['data_ptr_floor_us']:>9.2f}")
    if args.profile:
        import cProfile
        import pstats

        with refusals_ignored(bench):
            prof = cProfile.Profile()
            prof.runcall(lambda: [bench.reduce_scatter() for _ in range(args.number)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    bench.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
