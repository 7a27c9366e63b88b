// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The NCCL-like baseline of the "one rank's share" benchmark (tide_bench.h, tideBenchPersistentReduce):
// a persistent kernel of a fixed number of CTAs that does the node-local reduce (bf16 inputs -> fp32, sum, the
// documented left fold) spread evenly over a given time, each CTA spinning on %globaltimer until its next step is
// due, as NCCL's CTAs spin on their peers' flags while data arrives. It holds its SMs for the whole transfer, which
// is what the benchmark's baseline measures against; it is not used by any collective.
#include "bench_kernels.h"
#include "cuda/cuda_check.h"
#include "errors.h"

namespace tide {
namespace cuda {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ float bf16ToFloat(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

__global__ void __launch_bounds__(kThreads) persistentReduceKernel(const char* __restrict__ staging,
                                                                   size_t srcStride, int nSrc, uint64_t nVec,
                                                                   float* __restrict__ out, uint64_t perCta,
                                                                   uint64_t stepUnits, uint64_t durationNs) {
  __shared__ uint64_t t0;
  const uint64_t begin = static_cast<uint64_t>(blockIdx.x) * perCta;
  if (begin >= nVec) return;
  const uint64_t end = begin + perCta < nVec ? begin + perCta : nVec;
  const uint64_t steps = (end - begin + stepUnits - 1) / stepUnits;
  if (threadIdx.x == 0) t0 = globalTimerNs();
  __syncthreads();
  for (uint64_t j = 0; j < steps; ++j) {
    if (threadIdx.x == 0) {
      const uint64_t due = t0 + (j + 1) * durationNs / steps;  // this step's bytes have crossed the link by then
      while (globalTimerNs() < due) {
      }
    }
    __syncthreads();
    const uint64_t s0 = begin + j * stepUnits;
    const uint64_t s1 = s0 + stepUnits < end ? s0 + stepUnits : end;
    for (uint64_t v = s0 + threadIdx.x; v < s1; v += kThreads) {
      float acc[8];
      for (int s = 0; s < nSrc; ++s) {
        const uint4 w = __ldg(reinterpret_cast<const uint4*>(staging + s * srcStride) + v);
        const uint32_t h[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float lo = bf16ToFloat(h[k] & 0xffffu), hi = bf16ToFloat(h[k] >> 16);
          if (s == 0) {
            acc[2 * k] = lo;
            acc[2 * k + 1] = hi;
          } else {
            acc[2 * k] = __fadd_rn(acc[2 * k], lo);
            acc[2 * k + 1] = __fadd_rn(acc[2 * k + 1], hi);
          }
        }
      }
      float4* o = reinterpret_cast<float4*>(out + v * 8);
      o[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      o[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
  }
}

}  // namespace

tideResult_t launchPersistentReduce(const void* staging, size_t srcStride, int nSrc, uint64_t n, float* out,
                                    int ctas, double seconds, cudaStream_t stream) {
  const uintptr_t in = reinterpret_cast<uintptr_t>(staging), o = reinterpret_cast<uintptr_t>(out);
  if (staging == nullptr || out == nullptr || nSrc < 1 || n == 0) {
    return fail(tideInvalidArgument, "Bench", "persistent reduce: NULL buffer, nSrc < 1 or n == 0");
  }
  if (in % 16 != 0 || o % 16 != 0 || srcStride % 16 != 0 || n % 8 != 0) {
    return fail(tideInvalidArgument, "Bench",
                "persistent reduce: staging, out and srcStride must be 16-byte aligned and n a multiple of 8");
  }
  if (ctas < 1 || ctas > 1024) return fail(tideInvalidArgument, "Bench", "persistent reduce: ctas %d", ctas);
  if (!(seconds >= 0) || seconds > 60) {
    return fail(tideInvalidArgument, "Bench", "persistent reduce: seconds must be in [0, 60]");
  }
  const uint64_t nVec = n / 8;
  const uint64_t perCta = (nVec + ctas - 1) / ctas;
  const uint64_t durationNs = static_cast<uint64_t>(seconds * 1e9);
  // Steps of about 5 us of link time, each at least one vector per thread.
  uint64_t steps = durationNs / 5000;
  if (steps < 1) steps = 1;
  uint64_t stepUnits = (perCta + steps - 1) / steps;
  if (stepUnits < static_cast<uint64_t>(kThreads)) stepUnits = kThreads;
  persistentReduceKernel<<<ctas, kThreads, 0, stream>>>(static_cast<const char*>(staging), srcStride, nSrc, nVec, out,
                                                        perCta, stepUnits, durationNs);
  TIDE_CUDA_CHECK(cudaGetLastError());
  return tideSuccess;
}

tideResult_t preloadBenchKernels() {
  cudaFuncAttributes attr;
  TIDE_CUDA_CHECK(cudaFuncGetAttributes(&attr, persistentReduceKernel));
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
