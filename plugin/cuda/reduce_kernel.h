// Phase 2 of TIDE-RS: the short-lived reduce kernel over one staged chunk.
#ifndef TIDE_CUDA_REDUCE_KERNEL_H_
#define TIDE_CUDA_REDUCE_KERNEL_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tide.h"

namespace tide {
namespace cuda {

struct ReduceArgs {
  const void* staging;    // nSrc inputs of n elements of inType, input s at staging + s * srcStride bytes
  size_t srcStride;       // bytes
  int nSrc;               // node-local ranks, folded left to right in this order
  uint64_t n;             // elements
  void* out;              // n elements of outType
  tideDataType_t inType;  // bf16, fp16, fp32
  tideDataType_t outType; // bf16, fp16, fp32
  tideRedOp_t op;
  float scale;            // PREMUL_SUM
  float divisor;          // AVG: world size
};

// Enqueues the kernel on stream. out[k] = fold over s of x_s[k] in the order of include/tide.h.
tideResult_t launchReduce(const ReduceArgs& args, cudaStream_t stream);

// Grid the launcher uses for n elements (exposed for the benchmarks' SM-time accounting and tests).
int reduceGridSize(uint64_t n, int device);

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_REDUCE_KERNEL_H_
