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

// How one reduce is launched: `launches` kernels in a row on the stream, each of `ctas` CTAs of `threads` threads;
// CTA b of launch l handles the contiguous units [(l * ctas + b) * perCta, ... + perCta) (units: 8-element vectors
// on the 16-byte path, elements otherwise), so every CTA does a bounded amount of work and exits.
struct ReduceShape {
  int ctas = 1;
  int launches = 1;
  int threads = 0;
  uint64_t perCta = 0;   // units per CTA
  bool vector = false;   // 16-byte path (every base 16-byte aligned)
  uint64_t bytes = 0;    // HBM traffic of the whole reduce: inputs read + prev read + output written
};

// The grid rule (docs/architecture.md, "Reduce kernel shape"): traffic T = n * (nSrc * inSize + outSize (+ 4 with
// prev)); ctas = clamp(ceil(T / ctaBytes), 1, maxCtas); launches = min(ceil(T / (ctas * ctaBytes)), kMaxLaunches);
// units are then split evenly over ctas * launches CTAs. So at most maxCtas SMs are held at any time, and a CTA
// moves about ctaBytes (more only for chunks above maxCtas * kMaxLaunches * ctaBytes of traffic) and exits.
// Defaults: maxCtas = kReduceMaxCtas, ctaBytes = kReduceCtaBytes. Bit-exactness does not depend on the shape:
// each element is folded by one thread in the fixed order.
constexpr int kReduceMaxCtas = 4;
constexpr uint64_t kReduceCtaBytes = 2ull << 20;
constexpr int kReduceMaxLaunches = 16;  // bounds the launches queued per chunk (the stream may be blocked on flags)
ReduceShape reduceShape(const ReduceArgs& args, int maxCtas = 0, uint64_t ctaBytes = 0);

// Enqueues the kernel on stream. out[k] = fold over s of x_s[k] in the order of include/tide.h (plus prev[k]).
tideResult_t launchReduce(const ReduceArgs& args, cudaStream_t stream);
// The same with the rule's two constants overridden (maxCtas, ctaBytes; 0 keeps the rule's): benchmarks and tests.
tideResult_t launchReduce(const ReduceArgs& args, cudaStream_t stream, int maxCtas, uint64_t ctaBytes);

// Loads every reduce kernel into the current device's context now. Required before the first RS: under lazy
// module loading (CUDA_MODULE_LOADING=LAZY, which PyTorch sets) the first launch of a kernel loads it, and loading
// waits for the device's work in flight, which includes this rank's flag waits for work that other (virtual)
// ranks have not issued yet: the host thread would wait forever.
tideResult_t preloadReduceKernels();

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_REDUCE_KERNEL_H_
