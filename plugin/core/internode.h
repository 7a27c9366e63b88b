// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// What carries a comm's steps between TIDE nodes, chosen once per communicator from NCCL_TIDE_INTERNODE and what its
// provider maps (docs/architecture.md "Providers", docs/usage.md "Across nodes"). Pure host code, so that the choice
// and its refusals are testable without a GPU (tests/native/internode_test.cc).
#ifndef TIDE_CORE_INTERNODE_H_
#define TIDE_CORE_INTERNODE_H_

#include <cstddef>

#include "params.h"
#include "tide.h"

namespace tide {
namespace internode {

enum class Transport {
  // Copies into the peer's mapped memory and stream memory operations on its flags: one-sided step programs
  // (prog::Transport::kOneSided). Needs every rank to map every other rank's memory.
  kPeerMapped = 0,
  // Grouped ncclSend / ncclRecv on the comm's NCCL communicator: two-sided step programs (prog::Transport::kTwoSided).
  kSendRecv = 1,
};

// "peer-mapped" or "sendrecv".
const char* name(Transport t);

// The facts the choice depends on, fixed when the comm is created.
struct World {
  int worldSize = 1;
  int ranksPerNode = 1;           // the provider's node size (ranks that map each other's memory)
  bool peerMapsAllRanks = true;   // Provider::Traits::peerMapsAllRanks
  bool overNccl = false;          // the comm was created on an ncclComm_t (tideCommCreate)
  const char* provider = "";      // for messages
};

// What of `setting` can be refused before the ranks' node split is known: rma (not built), sendrecv forced on a comm
// without an NCCL communicator (tideUnsupported). choose() checks it too.
tideResult_t checkSetting(params::InterNodeSetting setting, bool overNccl, const char* provider);

// The transport for `setting` (NCCL_TIDE_INTERNODE) on `w`, and the INFO line that says which and why (written to
// line, at most len bytes). Errors (tideUnsupported, with what to change): rma (not built); sendrecv forced, or
// nodes that do not map each other, without an NCCL communicator.
tideResult_t choose(params::InterNodeSetting setting, const World& w, Transport* out, char* line, size_t len);

}  // namespace internode
}  // namespace tide

#endif  // TIDE_CORE_INTERNODE_H_
