// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "signal_kernel.h"

#include "../core/errors.h"
#include "cuda_check.h"

namespace tide {
namespace cuda {
namespace {

struct SignalArgs {
  uint32_t* addr[kSignalsPerLaunch];
  uint32_t value[kSignalsPerLaunch];
  int n;
  int first;  // stores [0, first) land before any of [first, n) is made
};

__device__ __forceinline__ void store(const SignalArgs& a, int i) {
  __threadfence_system();
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(a.addr[i]), "r"(a.value[i]) : "memory");
}

__global__ void __launch_bounds__(kSignalsPerLaunch) signalKernel(SignalArgs a) {
  const int i = threadIdx.x;
  if (i < a.first) {
    store(a, i);
    __threadfence_system();  // visible to the system before the barrier releases the others
  }
  if (a.first > 0 && a.first < a.n) __syncthreads();  // uniform: depends on the arguments only
  if (i >= a.first && i < a.n) store(a, i);
}

// Flushes the stores gathered in `a` as one launch.
tideResult_t launch(cudaStream_t stream, SignalArgs* a) {
  if (a->n == 0) return tideSuccess;
  signalKernel<<<1, kSignalsPerLaunch, 0, stream>>>(*a);
  TIDE_CUDA_CHECK(cudaGetLastError());
  a->n = a->first = 0;
  return tideSuccess;
}

}  // namespace

tideResult_t enqueueSignals(cudaStream_t stream, const CUstreamBatchMemOpParams* writes, size_t n, size_t ordered) {
  SignalArgs a;
  a.n = a.first = 0;
  for (size_t k = 0; k < n; ++k) {
    const CUstreamBatchMemOpParams& w = writes[k];
    uint32_t* at = reinterpret_cast<uint32_t*>(static_cast<uintptr_t>(w.writeValue.address));
    const bool wide = w.operation == CU_STREAM_MEM_OP_WRITE_VALUE_64;  // a token pair: two words, two stores
    if (!wide && w.operation != CU_STREAM_MEM_OP_WRITE_VALUE_32) {
      return fail(tideInternalError, "Cuda", "a signal kernel given a flag operation that is not a write");
    }
    // The ordered writes come first, so they are a prefix of each launch; a full launch goes out first (stream order
    // keeps its stores ahead of the next launch's).
    if (a.n + (wide ? 2 : 1) > kSignalsPerLaunch) TIDE_CHECK(launch(stream, &a));
    const uint64_t v = wide ? w.writeValue.value64 : w.writeValue.value;
    for (int h = 0; h < (wide ? 2 : 1); ++h) {
      a.addr[a.n] = at + h;
      a.value[a.n] = static_cast<uint32_t>(v >> (32 * h));  // little-endian: the lower word first
      ++a.n;
      if (k < ordered) a.first = a.n;
    }
  }
  return launch(stream, &a);
}

tideResult_t preloadSignalKernel() {
  cudaFuncAttributes attr;
  TIDE_CUDA_CHECK(cudaFuncGetAttributes(&attr, signalKernel));
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
