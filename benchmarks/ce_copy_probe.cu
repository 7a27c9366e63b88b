// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Probe for the interference benchmark: one same-device copy issued exactly as the interference method measures it
// (cudaMemcpyBatchAsync with cudaMemcpyFlagPreferOverlapWithCompute), or as a plain cudaMemcpyAsync, on a caller's
// stream. Built by the benchmark on the GPU machine (nvcc -shared), loaded with ctypes; not part of the library.
#include <cuda_runtime.h>

extern "C" int tide_probe_copy(void* dst, const void* src, size_t bytes, void* stream, int hinted, int pieces) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (!hinted) return static_cast<int>(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  int device = 0;
  cudaGetDevice(&device);
  // Split into `pieces` copies of one batch (TIDE's AG issues one batch of many copies per rank).
  const int n = pieces < 1 ? 1 : (pieces > 64 ? 64 : pieces);
  void* dsts[64];
  const void* srcs[64];
  size_t sizes[64];
  size_t per = bytes / n;
  for (int i = 0; i < n; ++i) {
    dsts[i] = static_cast<char*>(dst) + i * per;
    srcs[i] = static_cast<const char*>(src) + i * per;
    sizes[i] = i == n - 1 ? bytes - per * (n - 1) : per;
  }
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.srcLocHint.type = cudaMemLocationTypeDevice;
  attr.srcLocHint.id = device;
  attr.dstLocHint.type = cudaMemLocationTypeDevice;
  attr.dstLocHint.id = device;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t idx = 0;
  return static_cast<int>(cudaMemcpyBatchAsync(dsts, srcs, sizes, n, &attr, &idx, 1, s));
}
