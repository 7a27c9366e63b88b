// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The reduce's type dispatch, shared by its launchers (reduce_kernel.cu, reduce_staged.cu): from the run-time input
// and output types (fp32, bf16, fp16) and whether a running sum is added, to the one kernel instantiation for them.
#ifndef TIDE_CUDA_REDUCE_TYPES_H_
#define TIDE_CUDA_REDUCE_TYPES_H_

#include <cuda_runtime.h>

#include "../core/errors.h"
#include "reduce_fold.cuh"
#include "reduce_kernel.h"

namespace tide {
namespace cuda {
namespace types {

template <template <typename, typename, bool> class Launch, typename InT, typename OutT>
tideResult_t withPrev(const ReduceArgs& a, const ReduceShape& sh, cudaStream_t stream) {
  return a.prev != nullptr ? Launch<InT, OutT, true>::run(a, sh, stream) : Launch<InT, OutT, false>::run(a, sh, stream);
}

template <template <typename, typename, bool> class Launch, typename InT>
tideResult_t withOut(const ReduceArgs& a, const ReduceShape& sh, cudaStream_t stream) {
  switch (a.outType) {
    case tideFloat32:
      return withPrev<Launch, InT, float>(a, sh, stream);
    case tideBfloat16:
      return withPrev<Launch, InT, fold::Bf16>(a, sh, stream);
    case tideFloat16:
      return withPrev<Launch, InT, fold::Fp16>(a, sh, stream);
    default:
      return fail(tideInvalidArgument, "Cuda", "reduce: unsupported output type %d", static_cast<int>(a.outType));
  }
}

template <template <typename, typename> class Preload, typename InT>
tideResult_t everyOut() {
  TIDE_CHECK((Preload<InT, float>::run()));
  TIDE_CHECK((Preload<InT, fold::Bf16>::run()));
  return Preload<InT, fold::Fp16>::run();
}

}  // namespace types

// Launch<InT, OutT, kPrev>::run(a, sh, stream) for a's input and output types and whether it has a running sum.
template <template <typename, typename, bool> class Launch>
tideResult_t launchForTypes(const ReduceArgs& a, const ReduceShape& sh, cudaStream_t stream) {
  switch (a.inType) {
    case tideFloat32:
      return types::withOut<Launch, float>(a, sh, stream);
    case tideBfloat16:
      return types::withOut<Launch, fold::Bf16>(a, sh, stream);
    case tideFloat16:
      return types::withOut<Launch, fold::Fp16>(a, sh, stream);
    default:
      return fail(tideInvalidArgument, "Cuda", "reduce: unsupported input type %d", static_cast<int>(a.inType));
  }
}

// Preload<InT, OutT>::run() for every pair of input and output types.
template <template <typename, typename> class Preload>
tideResult_t forEveryTypePair() {
  TIDE_CHECK((types::everyOut<Preload, float>()));
  TIDE_CHECK((types::everyOut<Preload, fold::Bf16>()));
  return types::everyOut<Preload, fold::Fp16>();
}

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_REDUCE_TYPES_H_
