// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Overlap checks for caller-supplied buffers, so that an executor can refuse aliasing before it writes anything.
#ifndef TIDE_CORE_MEMORY_RANGES_H_
#define TIDE_CORE_MEMORY_RANGES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tide {

struct MemoryRange {
  uintptr_t begin = 0;
  uintptr_t end = 0;  // exclusive
  bool output = false;
  uint64_t id = 0;    // caller's index, reported on conflict
};

// Finds a pair that conflicts: two outputs that overlap, or an input that overlaps an output (inputs may overlap
// each other). Returns true and the two ids on conflict. Sorts `ranges`. O(n log n).
bool findOverlap(std::vector<MemoryRange>* ranges, uint64_t* idA, uint64_t* idB);

// NCCL's in-place reduce-scatter form, the one overlap of an output with a gradient that the reduce-scatter executors
// take (include/tide.h, tideReduceScatter): a layout of one parameter with rowNumel 1 and numel = W * shardNumel (no
// padding), an output of the gradient's type, and rank `rank`'s output exactly its own block of its own gradient,
// out = grad + rank * shardNumel * elemSize. Anything else that overlaps stays refused: near misses are bugs, and
// only this form is proven (tests/native/program_model.cc --in-place for the step programs).
inline bool isInPlaceReduceScatter(int nParams, uint64_t numel, uint64_t rowNumel, uint64_t shardNumel,
                                   size_t elemSize, bool outTypeIsGradType, int worldSize, int rank, const void* grad,
                                   const void* out) {
  if (nParams != 1 || rowNumel != 1 || !outTypeIsGradType || grad == nullptr || out == nullptr || rank < 0 ||
      rank >= worldSize || shardNumel == 0 || numel != static_cast<uint64_t>(worldSize) * shardNumel) {
    return false;
  }
  return reinterpret_cast<uintptr_t>(out) ==
         reinterpret_cast<uintptr_t>(grad) + static_cast<uint64_t>(rank) * shardNumel * elemSize;
}

}  // namespace tide

#endif  // TIDE_CORE_MEMORY_RANGES_H_
