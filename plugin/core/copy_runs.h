// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Strided runs of a copy list (docs/architecture.md "Eager calls as graph replays", "Strided copies"): copies of
// one width whose destinations and sources each step through memory at one pitch become one 2D copy
// (cudaMemcpy2DAsync: one driver call, one graph node). A captured program otherwise holds one memcpy node per
// copy, and a graph's launch costs host time that grows with its nodes (an all-gather of 64 parameters at W = 8 is
// 512 nodes per rank, whose replay measured 18.2 us of its 38.6 us per call on an H200). For P parameters of one
// size pushed to W ranks, the AG's copies into each destination rank's slot step by the slot's per-parameter stride
// and, when the shards are packed (a send buffer, or shards allocated back to back), by the shard stride: P x W
// nodes become W.
// Pure host code: addresses are plain integers here (device pointers in plugin/cuda/program_exec.cc).
#ifndef TIDE_CORE_COPY_RUNS_H_
#define TIDE_CORE_COPY_RUNS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace tide {

// rows copies: row k copies `width` bytes from src + k * spitch to dst + k * dpitch. rows == 1: a plain copy
// (pitches 0).
struct CopyRun {
  uint64_t dst = 0, src = 0, width = 0, rows = 0, dpitch = 0, spitch = 0;
};

// The runs that together make exactly the n copies (dst[i], src[i], bytes[i]) of one batch, each copy in exactly one
// run. Only copies with the same group[i] are merged (the caller's grouping, e.g. one destination buffer each), and
// only copies that follow each other in list order within their group: a run is a maximal stretch of a group's copies
// of equal width whose destinations step by one pitch and sources by one pitch, each pitch at least the width (rows
// of a 2D copy must not overlap, and a repeated source, such as a zero buffer, stays a plain copy) and at most
// maxPitch (cudaMemcpy2DAsync refuses larger ones). The copies of a batch never overlap each other, so the order in
// which runs are issued does not matter; runs come out in the order of their first copy.
std::vector<CopyRun> stridedRuns(const uint64_t* dst, const uint64_t* src, const uint64_t* bytes, const uint32_t* group,
                                 size_t n, uint64_t maxPitch);

// The allocation holding an address: true with its first byte and size, false if it cannot be told.
using AddressRangeFn = std::function<bool(uint64_t addr, uint64_t* base, uint64_t* size)>;

// The runs again, each split where a row's source or destination leaves the allocation that holds the run's first
// row (a 2D copy is one driver operation over one source and one destination allocation; rows of shards that are
// separate allocations at a constant stride must not become one). A row whose allocation cannot be told is copied
// on its own. Rows keep their order; a piece of one row becomes a plain copy (pitches 0).
std::vector<CopyRun> splitAtAllocations(const std::vector<CopyRun>& runs, const AddressRangeFn& rangeOf);

}  // namespace tide

#endif  // TIDE_CORE_COPY_RUNS_H_
