// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Which ranks of a communicator form one TIDE node.
//
// By default TIDE's nodes are NCCL's hosts: ranks whose NCCL host identity agrees are one node. That identity is
// what NCCL hashes (NCCL_HOSTID when set, else the hostname followed by the kernel's boot id), so ranks that NCCL
// treats as different hosts, e.g. ranks of one machine given distinct NCCL_HOSTIDs, are different TIDE nodes too.
// NCCL_TIDE_RANKS_PER_NODE=R overrides this: every R consecutive ranks are one node, also across what NCCL calls
// different hosts, as long as each node's ranks are on one machine (they must map each other's memory).
//
// Pure host code: the identities come from the providers' rank exchange; nothing here talks to peers.
#ifndef TIDE_CORE_NODE_MAP_H_
#define TIDE_CORE_NODE_MAP_H_

#include <cstdint>

#include "tide.h"

namespace tide {
namespace nodes {

// What every rank announces about where it runs.
struct RankHost {
  uint64_t ncclHost;  // hash of NCCL's host identity (ncclHostIdentity)
  uint64_t machine;   // hash of hostname + boot id: equal exactly when two ranks share a kernel (can map memory)
};

// NCCL's host identity string of this process: $NCCL_HOSTID if set, else hostname + boot id. Exposed for tests.
void ncclHostIdentity(char* buf, int len);

// This process's RankHost.
RankHost localHost();

// The node split of a world of `world` ranks whose announcements are all[0..world). `override` is
// NCCL_TIDE_RANKS_PER_NODE (0: follow NCCL's hosts). On success *ranksPerNode is the node size (ranks r and q are
// on one node exactly when r / size == q / size). Errors (with one WARN naming both views):
//   tideInvalidArgument  override does not divide the world;
//   tideUnsupported      NCCL's hosts are not consecutive equal blocks of ranks (TIDE's node of rank r is
//                        r / ranksPerNode), or ranks declared or found to be one node are on different machines.
tideResult_t decide(const RankHost* all, int world, int override, int* ranksPerNode);

}  // namespace nodes
}  // namespace tide

#endif  // TIDE_CORE_NODE_MAP_H_
