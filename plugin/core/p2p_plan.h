// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The cross-node transfers of a multi-node step program as two-sided p2p groups (Options::transport =
// Transport::kTwoSided): what the compilers (program_ag.cc, program_rs.cc) emit as Op::kP2p, and what an interpreter
// maps to ncclGroupStart / ncclSend / ncclRecv / ncclGroupEnd. Pure functions of the layout; host-only.
//
// Every cross-node put of the one-sided programs moves bytes between the same offset of the same kind of memory on
// two ranks: an all-gather put copies slot bytes to the same slot position of a rail peer, a reduce-scatter put the
// fp32 running sum to the same staging position (the partial area of buffer t % numBuffers) of the next node's rail
// rank, or, from the last node, of the owner. So a transfer is a Wire; its sender sends its own memory at the offset
// and its receiver receives into its own memory at the offset, exactly where the put would have landed, and the
// node-local steps that follow are unchanged.
//
// Where the groups sit (docs/protocol.md "Across nodes"):
//   kAgStep s   AG schedule step s (group 1 + its round): one group of the step's sends to the rail peer of node
//               n - 2^k and the receives of the step s that the rail peer of node n + 2^k sends. All nodes have the
//               same steps, so step s of every rank of a rail matches step s of the others, and the send and the
//               receive that close a cycle of the ring are posted together.
//   kRsPrev t   RS, before the fold of task t (node n > 0): the running sum from the previous node's rail rank.
//   kRsNext t   RS, after the fold of task t: the running sum to the next node, or (last node) the final sum to the
//               owner of task t on its node.
//   kRsFinal t  RS, the finish of task t on its owner (not on the last node): the final sum.
// RS groups hold one transfer each. Every group moves at most Layout::paceBytes per peer and direction.
// A rank's receives are the sends of the rank that sends to it at the matching point (recvsOf in p2p_plan.cc), so
// the k-th send from A to B and the k-th receive of B from A are the same Wire.
#ifndef TIDE_CORE_P2P_PLAN_H_
#define TIDE_CORE_P2P_PLAN_H_

#include <cstdint>
#include <vector>

#include "layout.h"
#include "program.h"

namespace tide {
namespace prog {

// Bytes [offset, offset + bytes) of `mem` from rank `from` to the same place of rank `to`.
struct Wire {
  int from = 0, to = 0;
  Mem mem = Mem::kSlot;
  uint64_t offset = 0, bytes = 0;
};

enum class P2pAt : uint8_t { kAgStep = 0, kRsPrev = 1, kRsNext = 2, kRsFinal = 3 };

using P2pGroup = std::vector<P2pXfer>;

// The sends of `rank` at AG schedule step `step`: its block range of the step, one wire per parameter it touches
// (alignment gaps carry nothing). The one-sided program puts the same wires.
std::vector<Wire> agStepWires(const Layout& l, int rank, int step);

// The groups of layout.rank at (at, index), in issue order (empty where it has no transfer).
std::vector<P2pGroup> p2pGroups(const Layout& l, P2pAt at, int index);

}  // namespace prog
}  // namespace tide

#endif  // TIDE_CORE_P2P_PLAN_H_
