// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Bruck-style paced recursive doubling over nodes (see schedule.h and include/tide.h).
//
// Steps are not stored: a node's step list is a pure function of (nNodes, sendBytes, paceBytes), so large blocks
// with a small pacing cap cost no memory. Only the first step index of each round is kept.
#include "schedule.h"

#include <algorithm>
#include <cinttypes>
#include <climits>

#include "errors.h"

namespace tide {
namespace {
constexpr const char* kComponent = "Schedule";

inline uint64_t blocksInRound(int nNodes, int round) {
  uint64_t d = 1ull << round;
  uint64_t rest = static_cast<uint64_t>(nNodes) - d;
  return d < rest ? d : rest;
}
}  // namespace

tideResult_t computeSchedule(Layout* l) {
  SchedulePlan& s = l->schedule;
  s = SchedulePlan();
  if (l->nNodes <= 1) {
    s.roundStart.push_back(0);
    return tideSuccess;
  }
  while ((1ll << s.numRounds) < l->nNodes) ++s.numRounds;
  // Ceiling division that cannot wrap: (sendBytes + paceBytes - 1) / paceBytes wrapped to 0 pieces for a pacing cap
  // near 2^64 (any nonzero tideConfig_t::paceBytes is accepted), leaving a multi-node layout with an empty schedule.
  s.piecesPerBlock = l->sendBytes / l->paceBytes + (l->sendBytes % l->paceBytes != 0 ? 1 : 0);
  uint64_t total = 0;
  for (int k = 0; k < s.numRounds; ++k) {
    s.roundStart.push_back(total);
    uint64_t steps = 0;
    if (__builtin_mul_overflow(blocksInRound(l->nNodes, k), s.piecesPerBlock, &steps) ||
        __builtin_add_overflow(total, steps, &total) || total > static_cast<uint64_t>(INT_MAX)) {
      return fail(tideInvalidArgument, kComponent,
                  "the inter-node schedule would exceed INT_MAX steps (send buffer %" PRIu64
                  " bytes, paceBytes %" PRIu64 "); raise paceBytes", l->sendBytes, l->paceBytes);
    }
  }
  s.roundStart.push_back(total);
  s.length = static_cast<int>(total);
  return tideSuccess;
}

ScheduleStep scheduleStep(const Layout& l, int node, int index) {
  const SchedulePlan& s = l.schedule;
  const uint64_t idx = static_cast<uint64_t>(index);
  // Round k holds steps [roundStart[k], roundStart[k+1]).
  auto it = std::upper_bound(s.roundStart.begin(), s.roundStart.end(), idx);
  int round = static_cast<int>(it - s.roundStart.begin()) - 1;
  uint64_t within = idx - s.roundStart[round];
  uint64_t block = within / s.piecesPerBlock;  // position j of the block in this round
  uint64_t piece = within % s.piecesPerBlock;
  const int N = l.nNodes;
  const int d = 1 << round;
  ScheduleStep st;
  st.round = round;
  st.sendToNode = ((node - d) % N + N) % N;
  st.recvFromNode = (node + d) % N;
  st.sendBlockNode = static_cast<int>((static_cast<uint64_t>(node) + block) % N);
  st.recvBlockNode = static_cast<int>((static_cast<uint64_t>(node) + d + block) % N);
  st.offset = piece * l.paceBytes;
  st.bytes = std::min(l.paceBytes, l.sendBytes - st.offset);
  return st;
}

}  // namespace tide
