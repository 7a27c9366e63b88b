// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Error handling for CUDA runtime and driver calls inside plugin/cuda.
//
// As everywhere (docs/architecture.md, "Errors, logging, parameters"): the root cause logs one WARN, here with the
// CUDA error's name and string, clears the sticky error (cudaGetLastError) and returns tideCudaError; callers
// propagate with TIDE_CHECK.
#ifndef TIDE_CUDA_CUDA_CHECK_H_
#define TIDE_CUDA_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include "../core/errors.h"

namespace tide {
namespace cuda {

// Records and logs a failed runtime call; returns tideCudaError (tideOutOfMemory for allocation failures).
inline tideResult_t cudaFail(cudaError_t err, const char* what, const char* file, int line) {
  (void)cudaGetLastError();  // clear the (non-sticky) last error so the next call starts clean
  tideResult_t code = (err == cudaErrorMemoryAllocation) ? tideOutOfMemory : tideCudaError;
  return fail(code, "Cuda", "%s failed: %s (%s) at %s:%d", what, cudaGetErrorName(err), cudaGetErrorString(err), file,
              line);
}

}  // namespace cuda
}  // namespace tide

#define TIDE_CUDA_CHECK(call)                                                            \
  do {                                                                                   \
    cudaError_t tide_cuda_err_ = (call);                                                 \
    if (tide_cuda_err_ != cudaSuccess)                                                   \
      return ::tide::cuda::cudaFail(tide_cuda_err_, #call, __FILE__, __LINE__);          \
  } while (0)

#endif  // TIDE_CUDA_CUDA_CHECK_H_
