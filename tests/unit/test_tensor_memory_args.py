# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Tensors whose memory, read raw, is not their value are refused wherever the library reads a tensor's memory:
torch's negative bit (the memory holds -x for the value x), a storage resized under its tensor (fewer bytes than the
tensor reaches: a read past its end). The host executor's results on the same values, resolved, are right."""

import numpy as np
import pytest
import torch

from nccl_tide import Layout, host_all_gather, host_reduce_scatter
from nccl_tide.errors import InvalidArgumentError


def _layout(rng, world=2):
    numels = [int(x) for x in rng.integers(1, 200, int(rng.integers(1, 5)))]
    return Layout(numels, "fp32", world, rank=0)


def _grads(rng, L):
    return [[torch.from_numpy(rng.standard_normal(p.numel).astype(np.float32)) for p in L.params]
            for _ in range(L.world_size)]


def _conj_route(x):
    """A float tensor equal to x with the negative bit set, made with public API: the imaginary part of a conjugate
    view is -imag with the bit set."""
    n = x.numel()
    f = torch.zeros(2 * n)
    f[1:n + 1] = -x
    z = torch.view_as_complex(f.view(n, 2))
    v = torch.as_strided(z.conj().imag, (n,), (1,), 1)  # f[1:n+1], contiguous, with the bit: the value is x
    assert v.is_neg() and v.is_contiguous()
    return v


@pytest.mark.parametrize("route", ["_neg_view", "conj().imag"])
def test_host_reduce_scatter_refuses_a_negative_bit_gradient(rng, route):
    with _layout(rng) as L:
        grads = _grads(rng, L)
        r, i = int(rng.integers(0, L.world_size)), int(rng.integers(0, L.n_params))
        value = grads[r][i]
        grads[r][i] = torch._neg_view(-value) if route == "_neg_view" else _conj_route(value)
        assert torch.equal(grads[r][i], value)  # the same values to torch
        with pytest.raises(InvalidArgumentError, match=rf"grads\[{r}\]\[{i}\]: .*negative bit.*resolve_neg\(\)"):
            host_reduce_scatter(L, grads)
        grads[r][i] = grads[r][i].resolve_neg()
        got = host_reduce_scatter(L, grads)
        grads[r][i] = value
        want = host_reduce_scatter(L, grads)
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_host_all_gather_refuses_negative_bit_shards_and_outputs(rng):
    with _layout(rng) as L:
        W = L.world_size
        shards = [[torch.randn(p.shard_numel) for p in L.params] for _ in range(W)]
        params = [[torch.empty(p.shard_numel * W) for p in L.params] for _ in range(W)]
        bad = [row[:] for row in shards]
        bad[1][0] = torch._neg_view(-shards[1][0])
        with pytest.raises(InvalidArgumentError, match=r"shards\[1\]\[0\]: .*negative bit"):
            host_all_gather(L, bad, params)
        outs = [row[:] for row in params]
        outs[0][-1] = torch._neg_view(outs[0][-1])
        with pytest.raises(InvalidArgumentError, match=rf"params\[0\]\[{L.n_params - 1}\]: .*negative bit"):
            host_all_gather(L, shards, outs)
        rs_out = [torch._neg_view(torch.empty(L.rs_out_numel)) for _ in range(W)]
        with pytest.raises(InvalidArgumentError, match=r"outs\[0\]: .*negative bit"):
            host_reduce_scatter(L, _grads(rng, L), outs=rs_out)


def test_a_storage_shorter_than_its_tensor_is_refused(rng):
    with _layout(rng) as L:
        W = L.world_size
        shards = [[torch.randn(p.shard_numel) for p in L.params] for _ in range(W)]
        k = int(rng.integers(0, L.n_params))
        short = shards[0][k].clone()
        keep = int(rng.integers(0, short.numel())) * 4
        short.untyped_storage().resize_(keep)
        shards[0][k] = short
        with pytest.raises(InvalidArgumentError,
                           match=rf"shards\[0\]\[{k}\]: its storage holds {keep} bytes but the tensor reaches byte"):
            host_all_gather(L, shards)
        # an offset view that runs past the end of its storage
        base = torch.randn(L.params[k].shard_numel + 3)
        view = base[3:]
        base.untyped_storage().resize_(4 * (L.params[k].shard_numel + 2))
        shards[0][k] = view
        with pytest.raises(InvalidArgumentError, match=r"storage holds"):
            host_all_gather(L, shards)
