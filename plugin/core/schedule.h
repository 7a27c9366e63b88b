// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Inter-node all-gather schedule: Bruck-style recursive doubling over nodes on each rail (the ranks with the same
// local index on every node), paced into steps of at most paceBytes. Works for any node count.
//
// Round k (distance d = 2^k, cnt = min(d, N - d)): node n sends to node (n - d) mod N the blocks of nodes
// n .. n + cnt - 1 (mod N) and receives from node (n + d) mod N the blocks of nodes n + d .. n + d + cnt - 1.
// Each block (one rank's packed send buffer, sendBytes) is cut into pieces of at most paceBytes; step s of every node
// is matched with step s of its peer (same round, same block position, same byte range).
#ifndef TIDE_CORE_SCHEDULE_H_
#define TIDE_CORE_SCHEDULE_H_

#include <cstdint>

#include "layout.h"
#include "tide.h"

namespace tide {

struct ScheduleStep {
  int round = 0;
  int sendToNode = 0;
  int recvFromNode = 0;
  int sendBlockNode = 0;
  int recvBlockNode = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Fills layout->schedule from nNodes, sendBytes and paceBytes. Errors if the schedule would exceed INT_MAX steps.
tideResult_t computeSchedule(Layout* layout);

// Steps per node (identical for every node; 0 for a single node).
inline int scheduleLength(const Layout& layout) { return layout.schedule.length; }

// Step `index` of node `node`; both must be in range (checked by the caller).
ScheduleStep scheduleStep(const Layout& layout, int node, int index);

}  // namespace tide

#endif  // TIDE_CORE_SCHEDULE_H_
