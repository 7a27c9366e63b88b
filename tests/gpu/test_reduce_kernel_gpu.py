# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The reduce kernels (plugin/cuda/reduce_kernel.cu; its shape: CTAs paced to the link, bounded work, several
launches) on given buffers through tideBenchReduce (the benchmark library, benchmarks/bench_lib.py), bit for bit
against the host executor (tideHostReduceScatter) across sizes, source counts, dtypes, ops, alignments and shape
overrides; with a running sum (prev, also in place) against the documented order computed on the CPU. Each runs with
both kernels of the 16-byte path: the register kernel ("loads") and the staged one (TMA bulk copies into a ring of
shared-memory stages, plugin/cuda/reduce_staged.cu), whose tails, unaligned bases and too-wide tiles go to the other
paths. Outputs are poisoned first.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

pytestmark = pytest.mark.gpu

TORCH_T = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
KERNELS = ("loads", "staged")
STAGE_BYTES = 64 << 10  # reduce_staged.cu kStageBytes: a tile of 32 vectors of every source (and prev) must fit


def _tt(torch, name):
    return getattr(torch, TORCH_T[name])


def _expected_kernel(kernel, vector, nsrc, in_size, prev=False):
    """The kernel the 16-byte path runs (None: the element path): the staged one where its stage holds a tile of
    32 vectors of every source and prev, else the register kernel."""
    if not vector:
        return None
    fits = 32 * (nsrc * 8 * in_size + (32 if prev else 0)) <= STAGE_BYTES
    return "staged" if kernel == "staged" and fits else "loads"


def _poison(torch, t):
    t.view(torch.uint8).fill_(0xFF)  # NaN in every float type


def _host_oracle(torch, xs_cpu, out_type, op, scale):
    """Raw output bits (numpy int16/int32) of rank 0 of a host RS whose ranks' single gradient begins with input
    s (length n): the host executor's fold of exactly the kernel's inputs."""
    from nccl_tide import Layout, host_reduce_scatter

    W, n = len(xs_cpu), xs_cpu[0].numel()
    name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[xs_cpu[0].dtype]
    with Layout([W * n], name, W, ranks_per_node=W) as lay:  # one node: the kernel folds all W in order
        assert lay.params[0].shard_numel == n
        # Only rank 0's output is compared: the other ranks' elements are filler (zeros, cheap to make).
        grads = [[torch.cat([x, torch.zeros(W * n - n, dtype=x.dtype)])] for x in xs_cpu]
        out = np.asarray(host_reduce_scatter(lay, grads, out_type, op, scale)[0])
    return out.view(np.int32 if out.dtype.itemsize == 4 else np.int16)


CASES = [
    # n, nSrc, in, out, op, misalign(bytes), max_ctas, cta_bytes
    (8, 8, "bf16", "fp32", "sum", 0, 0, 0),
    (1, 2, "bf16", "fp32", "sum", 0, 0, 0),
    (13, 3, "fp16", "fp16", "avg", 0, 0, 0),
    (4099, 8, "bf16", "bf16", "premul", 0, 0, 0),
    (65536 + 5, 8, "bf16", "fp32", "avg", 0, 0, 0),
    (65536 + 5, 9, "bf16", "fp32", "sum", 0, 0, 0),  # more sources than the prefetch depth (8)
    (70_001, 13, "bf16", "fp32", "avg", 0, 0, 0),  # 13 sources: 8 prefetched, 5 folded one by one
    (300_001, 8, "fp32", "fp32", "sum", 0, 0, 0),
    (300_001, 5, "fp32", "bf16", "premul", 0, 0, 0),
    (1_000_003, 8, "bf16", "fp32", "sum", 0, 1, 0),  # one CTA
    (1_000_003, 8, "bf16", "fp32", "sum", 0, 3, 1 << 16),  # many small CTAs: launch cap reached
    (1_000_000, 8, "bf16", "fp32", "sum", 0, 132, 1 << 12),
    (777_777, 4, "bf16", "fp16", "avg", 2, 0, 0),  # unaligned: the element path
    (5000, 2, "fp16", "fp32", "sum", 4, 2, 4096),  # 4-byte aligned (fp32 out): the element path
    (8 << 20, 8, "bf16", "fp32", "sum", 0, 0, 0),  # one default chunk: 10 CTAs x 3 launches of up to 8 MiB
    (262_147, 16, "bf16", "fp32", "sum", 0, 0, 0),  # 16 sources (two virtual nodes' worth); partial last tile
    (100_003, 17, "bf16", "fp32", "sum", 0, 0, 0),
    (333_333, 1, "bf16", "bf16", "avg", 0, 5, 1 << 15),  # one source, small CTAs (a tile larger than a CTA's slice)
    (1_234_567, 2, "fp16", "fp32", "premul", 0, 2, 0),  # 2 sources: 4 passes per tile
]



@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n,nsrc,it,ot,op,mis,mc,cb", CASES)
def test_reduce_bit_exact_vs_host_executor(torch_cuda, n, nsrc, it, ot, op, mis, mc, cb, kernel):
    torch = torch_cuda
    import bench_lib as B

    g = torch.Generator(device="cuda").manual_seed(n + nsrc)
    esz = 4 if it == "fp32" else 2
    stride = n * esz + 16 * int(n % 3 == 0)  # a stride that is not n * size sometimes
    stride = (stride + 15) // 16 * 16 if not mis else stride + mis
    raw = torch.empty(nsrc * stride + 64, dtype=torch.uint8, device="cuda")
    xs = []
    for s in range(nsrc):
        x = torch.randn(n, generator=g, device="cuda").to(_tt(torch, it))
        if op == "premul":
            x = x * 3
        raw[mis + s * stride: mis + s * stride + n * esz].copy_(x.view(torch.uint8))
        xs.append(x.cpu())
    osz = 4 if ot == "fp32" else 2
    out_raw = torch.empty(n * osz + 64, dtype=torch.uint8, device="cuda")
    _poison(torch, out_raw)
    scale = 0.37
    args = B.reduce_args(raw.data_ptr() + mis, stride, nsrc, n, out_raw.data_ptr() + mis, it, ot, op, scale,
                         float(nsrc), None, mc, cb, kernel=kernel)
    shape = B.reduce_shape(args)
    assert shape["vector"] == (mis == 0 and stride % 16 == 0)
    assert shape["kernel"] == _expected_kernel(kernel, shape["vector"], nsrc, esz)
    assert shape["threads"] == (544 if shape["kernel"] == "staged" else 512)
    if mc:
        assert shape["ctas"] <= mc
    else:  # paced to the link: at most kReduceMaxPacedCtas (one input: nothing arrives, the whole GPU)
        assert shape["ctas"] <= (32 if nsrc > 1 else torch.cuda.get_device_properties(0).multi_processor_count)
    assert shape["launches"] <= 16
    s = torch.cuda.Stream()
    B.reduce(args, s.cuda_stream)
    torch.cuda.synchronize()
    got = out_raw[mis:mis + n * osz].view(_tt(torch, ot)).cpu()
    want = _host_oracle(torch, xs, ot, op, scale)
    assert not torch.isnan(got.float()).any(), "unwritten (poisoned) elements"
    got_bits = got.view(torch.int16 if osz == 2 else torch.int32).numpy()
    assert got_bits.shape == want.shape
    bad = np.flatnonzero(got_bits != want)
    assert bad.size == 0, f"{bad.size} of {n} elements differ from the host executor, first at {bad[:5]}"
    # Untouched around the output.
    assert (out_raw[:mis] == 0xFF).all() and (out_raw[mis + n * osz:] == 0xFF).all()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("in_off,stride_off,out_off,ot", [(0, 0, 2, "fp32"), (1, 0, 0, "fp32"), (0, 1, 0, "bf16"),
                                                          (0, 0, 1, "bf16")])
def test_reduce_refuses_element_misaligned_pointers(torch_cuda, in_off, stride_off, out_off, ot, kernel):
    """A pointer or stride that is not a multiple of its element size is refused with a message, before any launch
    (the device would fault with a sticky misaligned-address error); the context stays usable."""
    torch = torch_cuda
    import bench_lib as B

    n, nsrc = 1000, 3
    raw = torch.randn(nsrc * n + 64, device="cuda").bfloat16()
    out = torch.full((n + 16,), float("nan"), device="cuda")
    args = B.reduce_args(raw.data_ptr() + in_off, n * 2 + stride_off, nsrc, n, out.data_ptr() + out_off, "bf16", ot,
                         kernel=kernel)
    with pytest.raises(Exception, match="not aligned"):
        B.reduce(args, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert torch.isnan(out).all()  # nothing written
    ok = B.reduce_args(raw.data_ptr(), n * 2, nsrc, n, out.data_ptr(), "bf16", "fp32", kernel=kernel)
    B.reduce(ok, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    ref = raw[:nsrc * n].view(nsrc, n).float()
    assert torch.equal(out[:n], ref[0] + ref[1] + ref[2])


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("n,ot,op", [(100_003, "fp32", "sum"), (1 << 20, "fp32", "avg"), (4101, "bf16", "premul")])
def test_reduce_with_running_sum(torch_cuda, n, ot, op, in_place, kernel):
    torch = torch_cuda
    import bench_lib as B

    if in_place and ot != "fp32":
        pytest.skip("in place needs an fp32 output")
    W, scale = 4, 1.25
    g = torch.Generator(device="cuda").manual_seed(n)
    npad = (n + 7) // 8 * 8  # 16-byte source stride: the 16-byte paths (and the n % 8 tail) run
    xp = torch.randn(W, npad, generator=g, device="cuda").bfloat16()
    x = xp[:, :n]
    prev = torch.randn(n, generator=g, device="cuda")
    prev_cpu = prev.cpu()
    out = prev if in_place else torch.full((n,), float("nan"), device="cuda").to(_tt(torch, ot))
    args = B.reduce_args(xp.data_ptr(), npad * 2, W, n, out.data_ptr(), "bf16", ot, op, scale, 8.0, prev.data_ptr(),
                         kernel=kernel)
    shape = B.reduce_shape(args)
    assert shape["vector"] and shape["kernel"] == _expected_kernel(kernel, True, W, 2, prev=True)
    B.reduce(args, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    xc = x.cpu().float()
    pre = (lambda v: v * scale) if op == "premul" else (lambda v: v)
    acc = pre(xc[0].clone())
    for s in range(1, W):
        acc = acc + pre(xc[s])
    acc = prev_cpu + acc
    if op == "avg":
        acc = acc / 8.0
    want = acc.to(_tt(torch, ot))
    got = out.cpu()
    assert not torch.isnan(got.float()).any()
    assert torch.equal(got, want)


@pytest.mark.parametrize("nsrc", [64, 65])
def test_staged_kernel_takes_a_tile_of_32_vectors_and_leaves_wider_ones_to_the_register_kernel(torch_cuda, nsrc):
    """fp32 inputs: 64 sources fill a stage with a tile of 32 vectors (the least the staged kernel takes), 65 do not
    fit and run on the register kernel; both bit for bit the left fold, several CTAs of several tiles each."""
    torch = torch_cuda
    import bench_lib as B

    n, npad = 40_003, 40_008  # a tail of 3 elements past the last 8-element vector; 16-byte source stride
    g = torch.Generator(device="cuda").manual_seed(nsrc)
    x = torch.randn(nsrc, npad, generator=g, device="cuda")
    out = torch.full((n,), float("nan"), device="cuda")
    args = B.reduce_args(x.data_ptr(), npad * 4, nsrc, n, out.data_ptr(), "fp32", "fp32", max_ctas=3,
                         kernel="staged")
    shape = B.reduce_shape(args)
    assert shape["kernel"] == ("staged" if nsrc == 64 else "loads") and shape["ctas"] == 3
    B.reduce(args, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    xc = x[:, :n].cpu()
    want = xc[0].clone()
    for s in range(1, nsrc):
        want = want + xc[s]
    assert torch.equal(out.cpu().view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("it,ot", [("bf16", "fp32"), ("fp16", "fp16"), ("fp32", "bf16")])
def test_reduce_nan_and_infinity_inputs_store_the_host_executors_bits(torch_cuda, it, ot, kernel):
    """NaNs of both signs with payloads and infinities of both signs among random inputs: every output element's
    bits, the canonical NaN included, are the host executor's."""
    torch = torch_cuda
    import bench_lib as B

    n, nsrc = 50_000, 8
    g = torch.Generator().manual_seed(len(it) + len(ot) + len(kernel))
    xs = [torch.randn(n, generator=g).to(_tt(torch, it)) for _ in range(nsrc)]
    bits_t = torch.int32 if it == "fp32" else torch.int16
    specials = {"bf16": [0x7FC1, -0x3F, 0x7F80, -0x80], "fp16": [0x7E01, -0x1FF, 0x7C00, -0x400],
                "fp32": [0x7FC00001, -0x3FFFFF, 0x7F800000, -0x800000]}[it]  # +NaN, -NaN, +inf, -inf (as signed ints)
    for x in xs:
        at = torch.randint(0, n, (n // 50,), generator=g)
        x.view(bits_t)[at] = torch.tensor(specials, dtype=bits_t)[torch.randint(0, 4, (at.numel(),), generator=g)]
    esz, osz = (4 if it == "fp32" else 2), (4 if ot == "fp32" else 2)
    stack = torch.stack(xs).cuda()
    out = torch.empty(n * osz, dtype=torch.uint8, device="cuda")
    _poison(torch, out)
    args = B.reduce_args(stack.data_ptr(), n * esz, nsrc, n, out.data_ptr(), it, ot, kernel=kernel)
    assert B.reduce_shape(args)["kernel"] == _expected_kernel(kernel, True, nsrc, esz)
    B.reduce(args, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    got = out.cpu().view(torch.int32 if osz == 4 else torch.int16).numpy()
    want = _host_oracle(torch, xs, ot, "sum", 1.0)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} of {n} elements differ from the host executor, first at {bad[:5]}"
