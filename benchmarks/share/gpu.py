# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The GPU the share runs on: random inputs, streams of its own, images of the other ranks' data, a timed sleep."""


SLEEP_CYCLES_PER_MS = 2_000_000  # torch.cuda._sleep cycles per ms at H200 clocks (approximate)


class Gpu:
    def __init__(self):
        import torch

        self.torch = torch
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.n_sm = torch.cuda.get_device_properties(self.dev).multi_processor_count

    def rand(self, n, dtype, seed):
        g = self.torch.Generator(device=self.dev).manual_seed(seed)
        return self.torch.randn(n, dtype=dtype, device=self.dev, generator=g)

    def stream(self):
        """A fresh stream of its own (driver-created, nccl_tide.cuda.new_streams): torch's pool of 32 wraps, and a
        side stream that happened to be the GEMM's would serialize the two and void the measurement. The few
        streams of a run live until the process ends."""
        from nccl_tide.cuda import new_streams

        (s,), _release = new_streams(1, self.dev.index)
        return s

    def images(self, n, seed, source):
        """The other ranks' data: n random bf16 on this GPU (source "device") or in pinned host memory ("host":
        incoming copies are then host-to-device, copy-engine work, see the module docstring)."""
        x = self.rand(n, self.torch.bfloat16, seed)
        if source == "device":
            return x
        h = self.torch.empty(n, dtype=self.torch.bfloat16, pin_memory=True)
        h.copy_(x)
        return h

    def sleep_ms(self, ms, stream=None):
        with self.torch.cuda.stream(stream or self.torch.cuda.current_stream()):
            self.torch.cuda._sleep(int(max(ms, 0.05) * SLEEP_CYCLES_PER_MS))
