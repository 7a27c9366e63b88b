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
  // Multi-node: the running fp32 sum of the earlier nodes (n elements), or nullptr. With it, out[k] =
  // post(prev[k] + fold) (the node order of include/tide.h: total = total + partial(node)). out may be prev itself
  // (in place, outType fp32): each element is read and written by the same thread.
  const float* prev = nullptr;
};

// Enqueues the kernel on stream. out[k] = fold over s of x_s[k] in the order of include/tide.h (plus prev[k]).
tideResult_t launchReduce(const ReduceArgs& args, cudaStream_t stream);

// Loads every reduce kernel into the current device's context now. Required before the first RS: under lazy
// module loading (CUDA_MODULE_LOADING=LAZY, which PyTorch sets) the first launch of a kernel loads it, and loading
// waits for the device's work in flight, which includes this rank's flag waits for work that other (virtual)
// ranks have not issued yet: the host thread would wait forever.
tideResult_t preloadReduceKernels();

// Grid the launcher uses for n elements (exposed for the benchmarks' SM-time accounting and tests).
int reduceGridSize(uint64_t n, int device);

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_REDUCE_KERNEL_H_
