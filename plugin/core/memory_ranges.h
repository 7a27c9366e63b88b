// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Overlap checks for caller-supplied buffers, so that an executor can refuse aliasing before it writes anything.
#ifndef TIDE_CORE_MEMORY_RANGES_H_
#define TIDE_CORE_MEMORY_RANGES_H_

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

}  // namespace tide

#endif  // TIDE_CORE_MEMORY_RANGES_H_
