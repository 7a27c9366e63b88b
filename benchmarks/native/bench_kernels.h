// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Benchmark-only kernels (tide_bench.h): the NCCL-like persistent reduce baseline.
#ifndef TIDE_BENCH_KERNELS_H_
#define TIDE_BENCH_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tide.h"

namespace tide {
namespace cuda {

// ctas persistent CTAs fold nSrc bf16 inputs (staging + s * srcStride) into n fp32 outputs, evenly over `seconds`.
tideResult_t launchPersistentReduce(const void* staging, size_t srcStride, int nSrc, uint64_t n, float* out,
                                    int ctas, double seconds, cudaStream_t stream);
tideResult_t preloadBenchKernels();

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_BENCH_KERNELS_H_
