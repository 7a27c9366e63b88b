// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The staged reduce kernel (ReduceKernel::kStaged, reduce_kernel.h): the 16-byte path's fold with the inputs
// brought into a ring of shared-memory stages by TMA bulk copies (reduce_staged.cu). launchReduce picks it; this
// header is what reduce_kernel.cu needs of it.
#ifndef TIDE_CUDA_REDUCE_STAGED_H_
#define TIDE_CUDA_REDUCE_STAGED_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "reduce_kernel.h"
#include "tide.h"

namespace tide {
namespace cuda {

// Threads of a staged CTA: 16 consumer warps (one 8-element vector per thread per pass over a tile, as many
// threads as the register kernel's CTA) and one producer warp.
constexpr int kStagedThreads = 16 * 32 + 32;

// 8-element vectors per tile for args: as many as a stage holds of every source (and prev), whole passes of the
// consumers where a tile has at least one, else whole warps; 0 where a stage cannot hold 32 (then the register
// kernel runs). Assumes the 16-byte path's alignment (ReduceShape::vector).
uint32_t stagedTileVectors(const ReduceArgs& args);

// Enqueues sh.launches launches of the staged kernel over the n / 8 vectors of args (sh.staged; the n % 8 tail is
// the caller's).
tideResult_t launchStaged(const ReduceArgs& args, const ReduceShape& sh, cudaStream_t stream);

// Loads every staged kernel into the current device's context and lets it use its ring of shared memory (more than
// the 48 KiB a kernel gets without asking): once per device, before the first launch (preloadReduceKernels).
tideResult_t preloadStagedKernels();

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_REDUCE_STAGED_H_
