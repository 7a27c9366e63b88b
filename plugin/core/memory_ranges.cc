// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Sweep over ranges sorted by start: a range conflicts with an earlier one iff it starts before the furthest end
// seen so far among earlier outputs (any range vs output), or among earlier inputs (when it is an output).
#include "memory_ranges.h"

#include <algorithm>

namespace tide {

bool findOverlap(std::vector<MemoryRange>* ranges, uint64_t* idA, uint64_t* idB) {
  std::sort(ranges->begin(), ranges->end(),
            [](const MemoryRange& a, const MemoryRange& b) { return a.begin < b.begin; });
  uintptr_t outEnd = 0, inEnd = 0;
  uint64_t outId = 0, inId = 0;
  bool haveOut = false, haveIn = false;
  for (const MemoryRange& r : *ranges) {
    if (r.begin == r.end) continue;
    if (haveOut && r.begin < outEnd) {
      *idA = outId;
      *idB = r.id;
      return true;
    }
    if (r.output && haveIn && r.begin < inEnd) {
      *idA = inId;
      *idB = r.id;
      return true;
    }
    if (r.output) {
      if (!haveOut || r.end > outEnd) outEnd = r.end, outId = r.id;
      haveOut = true;
    } else {
      if (!haveIn || r.end > inEnd) inEnd = r.end, inId = r.id;
      haveIn = true;
    }
  }
  return false;
}

}  // namespace tide
