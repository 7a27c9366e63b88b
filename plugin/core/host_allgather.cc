// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Host all-gather: own-shard placement, the paced inter-node rail schedule, then the node-local fan-out. Every copy
// is a byte copy, so every dtype works. The schedule is executed exactly as the CUDA executor runs it (block byte
// ranges of the packed send-buffer layout, read from the sender's unsharded storage), and each step is checked:
// the sender must hold the block it sends, and each block must arrive whole.
#include <cinttypes>
#include <cstring>
#include <vector>

#include "dtype.h"
#include "errors.h"
#include "host_executor.h"
#include "memory_ranges.h"
#include "schedule.h"

namespace tide {
namespace {

constexpr const char* kComponent = "HostAG";
constexpr uint64_t kOutputBit = 1ull << 63;

inline const unsigned char* cbytes(const void* p) { return static_cast<const unsigned char*>(p); }
inline unsigned char* bytes(void* p) { return static_cast<unsigned char*>(p); }

// True if shard (r, i) is already in place: it is exactly rank r's own segment of its own unsharded storage.
inline bool inPlace(const Layout& l, const void* const* shards, void* const* params, int r, int i) {
  size_t idx = static_cast<size_t>(r) * l.nParams + i;
  return cbytes(shards[idx]) == bytes(params[idx]) + static_cast<uint64_t>(r) * l.params[i].shardBytes;
}

tideResult_t validate(const Layout& l, const void* const* shards, void* const* params) {
  if (shards == nullptr) return fail(tideInvalidArgument, kComponent, "shards table is NULL");
  if (params == nullptr) return fail(tideInvalidArgument, kComponent, "params table is NULL");
  const size_t n = static_cast<size_t>(l.worldSize) * l.nParams;
  std::vector<MemoryRange> ranges;
  ranges.reserve(2 * n);
  for (size_t idx = 0; idx < n; ++idx) {
    int r = static_cast<int>(idx / l.nParams), i = static_cast<int>(idx % l.nParams);
    if (shards[idx] == nullptr) {
      return fail(tideInvalidArgument, kComponent, "shards[%zu] (rank %d, parameter %d) is NULL", idx, r, i);
    }
    if (params[idx] == nullptr) {
      return fail(tideInvalidArgument, kComponent, "params[%zu] (rank %d, parameter %d) is NULL", idx, r, i);
    }
    const ParamLayout& p = l.params[i];
    // Element alignment (include/tide.h "Buffer alignment"): the copies are byte copies, but the contract is one
    // for every executor, and the CUDA path needs it.
    const bool in = reinterpret_cast<uintptr_t>(shards[idx]) % p.elemSize != 0;
    if (in || reinterpret_cast<uintptr_t>(params[idx]) % p.elemSize != 0) {
      return fail(tideInvalidArgument, kComponent,
                  "%s[%zu] (rank %d, parameter %d) = %p is not aligned to its element size (%zu bytes, %s)",
                  in ? "shards" : "params", idx, r, i, in ? shards[idx] : static_cast<const void*>(params[idx]),
                  p.elemSize, dtype::name(p.dtype));
    }
    uintptr_t out = reinterpret_cast<uintptr_t>(params[idx]);
    uintptr_t outEnd = 0;
    if (__builtin_add_overflow(out, p.shardBytes * static_cast<uint64_t>(l.worldSize), &outEnd)) {
      return fail(tideInvalidArgument, kComponent, "params[%zu] wraps around the address space", idx);
    }
    ranges.push_back({out, outEnd, true, kOutputBit | idx});
    if (!inPlace(l, shards, params, r, i)) {
      uintptr_t in = reinterpret_cast<uintptr_t>(shards[idx]);
      uintptr_t inEnd = 0;
      if (__builtin_add_overflow(in, p.shardBytes, &inEnd)) {
        return fail(tideInvalidArgument, kComponent, "shards[%zu] wraps around the address space", idx);
      }
      ranges.push_back({in, inEnd, false, idx});
    }
  }
  uint64_t a = 0, b = 0;
  if (findOverlap(&ranges, &a, &b)) {
    return fail(tideInvalidArgument, kComponent,
                "overlapping buffers: %s[%" PRIu64 "] and %s[%" PRIu64 "] (outputs may not overlap each other or "
                "any input, except a shard that is its own rank's segment of its own storage)",
                (a & kOutputBit) ? "params" : "shards", a & ~kOutputBit, (b & kOutputBit) ? "params" : "shards",
                b & ~kOutputBit);
  }
  return tideSuccess;
}

// Copies bytes [offset, offset + count) of block `blockRank` (packed send-buffer layout) from one rank's unsharded
// storage to another's. A byte range of the packed layout maps to one segment per parameter it touches; alignment
// gaps between parameters carry no data and are skipped.
void copyBlockRange(const Layout& l, void* const* params, int fromRank, int toRank, int blockRank, uint64_t offset,
                    uint64_t count) {
  const uint64_t end = offset + count;
  const size_t from = static_cast<size_t>(fromRank) * l.nParams, to = static_cast<size_t>(toRank) * l.nParams;
  // First parameter whose shard ends after offset (send offsets are increasing).
  int lo = 0, hi = l.nParams;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (l.params[mid].sendOffset + l.params[mid].shardBytes <= offset) lo = mid + 1; else hi = mid;
  }
  for (int i = lo; i < l.nParams && l.params[i].sendOffset < end; ++i) {
    const ParamLayout& p = l.params[i];
    uint64_t a = offset > p.sendOffset ? offset : p.sendOffset;
    uint64_t b = end < p.sendOffset + p.shardBytes ? end : p.sendOffset + p.shardBytes;
    if (a >= b) continue;
    uint64_t at = static_cast<uint64_t>(blockRank) * p.shardBytes + (a - p.sendOffset);
    memcpy(bytes(params[to + i]) + at, bytes(params[from + i]) + at, b - a);
  }
}

// Copies block `blockRank` whole (every parameter's segment) between two ranks' storage.
void copyBlock(const Layout& l, void* const* params, int fromRank, int toRank, int blockRank) {
  const size_t from = static_cast<size_t>(fromRank) * l.nParams, to = static_cast<size_t>(toRank) * l.nParams;
  for (int i = 0; i < l.nParams; ++i) {
    const ParamLayout& p = l.params[i];
    uint64_t at = static_cast<uint64_t>(blockRank) * p.shardBytes;
    memcpy(bytes(params[to + i]) + at, bytes(params[from + i]) + at, p.shardBytes);
  }
}

// Runs the schedule on rail `local`. held[n * N + m]: node n's rank of this rail holds node m's block.
tideResult_t runRail(const Layout& l, void* const* params, int local) {
  const int N = l.nNodes, R = l.ranksPerNode;
  std::vector<char> held(static_cast<size_t>(N) * N, 0);
  std::vector<uint64_t> received(static_cast<size_t>(N) * N, 0);
  for (int n = 0; n < N; ++n) held[static_cast<size_t>(n) * N + n] = 1;
  const SchedulePlan& s = l.schedule;
  for (int k = 0; k < s.numRounds; ++k) {
    for (uint64_t idx = s.roundStart[k]; idx < s.roundStart[k + 1]; ++idx) {
      for (int n = 0; n < N; ++n) {
        ScheduleStep st = scheduleStep(l, n, static_cast<int>(idx));
        ScheduleStep peer = scheduleStep(l, st.sendToNode, static_cast<int>(idx));
        if (st.round != k || peer.recvFromNode != n || peer.recvBlockNode != st.sendBlockNode ||
            peer.offset != st.offset || peer.bytes != st.bytes || st.bytes == 0 || st.bytes > l.paceBytes) {
          return fail(tideInternalError, kComponent, "schedule step %" PRIu64 " of node %d does not match its peer "
                      "node %d", idx, n, st.sendToNode);
        }
        if (!held[static_cast<size_t>(n) * N + st.sendBlockNode]) {
          return fail(tideInternalError, kComponent, "round %d: node %d sends block of node %d before holding it", k,
                      n, st.sendBlockNode);
        }
        copyBlockRange(l, params, n * R + local, st.sendToNode * R + local, st.sendBlockNode * R + local, st.offset,
                       st.bytes);
        received[static_cast<size_t>(st.sendToNode) * N + st.sendBlockNode] += st.bytes;
      }
    }
    // Blocks received in round k become sendable from round k + 1 on, and only if they arrived whole.
    for (size_t x = 0; x < received.size(); ++x) {
      if (received[x] == 0) continue;
      if (received[x] != l.sendBytes || held[x]) {
        return fail(tideInternalError, kComponent, "round %d: node %zu received %" PRIu64 " of %" PRIu64
                    " bytes of the block of node %zu", k, x / N, received[x], l.sendBytes, x % N);
      }
      held[x] = 1;
      received[x] = 0;
    }
  }
  for (size_t x = 0; x < held.size(); ++x) {
    if (!held[x]) {
      return fail(tideInternalError, kComponent, "after the schedule node %zu lacks the block of node %zu", x / N,
                  x % N);
    }
  }
  return tideSuccess;
}

}  // namespace

tideResult_t hostAllGather(const Layout& l, const void* const* shards, void* const* params) {
  TIDE_CHECK(validate(l, shards, params));
  const int W = l.worldSize, R = l.ranksPerNode, N = l.nNodes;
  // 1. Every rank places its own shard in its own storage.
  for (int r = 0; r < W; ++r) {
    for (int i = 0; i < l.nParams; ++i) {
      if (inPlace(l, shards, params, r, i)) continue;
      size_t idx = static_cast<size_t>(r) * l.nParams + i;
      memcpy(bytes(params[idx]) + static_cast<uint64_t>(r) * l.params[i].shardBytes, shards[idx],
             l.params[i].shardBytes);
    }
  }
  // 2. Inter-node: each rail gathers the blocks of its own local index from every node.
  if (N > 1) {
    for (int local = 0; local < R; ++local) TIDE_CHECK(runRail(l, params, local));
  }
  // 3. Node-local fan-out: rank q hands every block of its rail to the other ranks of its node.
  for (int node = 0; node < N; ++node) {
    for (int lq = 0; lq < R; ++lq) {
      int q = node * R + lq;
      for (int ld = 0; ld < R; ++ld) {
        if (ld == lq) continue;
        for (int m = 0; m < N; ++m) copyBlock(l, params, q, node * R + ld, m * R + lq);
      }
    }
  }
  return tideSuccess;
}

}  // namespace tide
