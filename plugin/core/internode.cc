// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "internode.h"

#include <cstdio>

#include "errors.h"

namespace tide {
namespace internode {
namespace {
constexpr const char* kComponent = "Nodes";
}  // namespace

const char* name(Transport t) { return t == Transport::kSendRecv ? "sendrecv" : "peer-mapped"; }

tideResult_t checkSetting(params::InterNodeSetting setting, bool overNccl, const char* provider) {
  if (setting == params::kInterNodeRma) {
    return fail(tideUnsupported, kComponent,
                "NCCL_TIDE_INTERNODE=rma: the one-sided NCCL transport (ncclPutSignal / ncclWaitSignal, NCCL >= "
                "2.29.2 on a network with host RMA) is not built; unset NCCL_TIDE_INTERNODE (auto) or set sendrecv");
  }
  if (setting == params::kInterNodeSendRecv && !overNccl) {
    return fail(tideUnsupported, kComponent,
                "NCCL_TIDE_INTERNODE=sendrecv needs a comm created on an NCCL communicator (tideCommCreate); this %s "
                "comm has none: unset NCCL_TIDE_INTERNODE",
                provider);
  }
  return tideSuccess;
}

tideResult_t choose(params::InterNodeSetting setting, const World& w, Transport* out, char* line, size_t len) {
  TIDE_CHECK(checkSetting(setting, w.overNccl, w.provider));
  const int nodes = w.ranksPerNode > 0 ? w.worldSize / w.ranksPerNode : 1;
  const bool forced = setting == params::kInterNodeSendRecv;
  if (!forced && w.peerMapsAllRanks) {
    *out = Transport::kPeerMapped;
    snprintf(line, len,
             "inter-node transport peer-mapped: every rank of the %s provider maps every other rank's memory (%d "
             "ranks, %d per node), so steps between (virtual) nodes are copy-engine copies and stream memory "
             "operations",
             w.provider, w.worldSize, w.ranksPerNode);
    return tideSuccess;
  }
  if (!w.overNccl) {
    return fail(tideUnsupported, kComponent,
                "the %d ranks are %d TIDE nodes whose memory the %s provider does not map across nodes, and steps "
                "between nodes run through NCCL (grouped ncclSend / ncclRecv): create the comm on an NCCL "
                "communicator (tideCommCreate)",
                w.worldSize, nodes, w.provider);
  }
  *out = Transport::kSendRecv;
  char why[128];
  if (forced) {
    snprintf(why, sizeof(why), "forced by NCCL_TIDE_INTERNODE=sendrecv");
  } else {
    snprintf(why, sizeof(why), "%d TIDE nodes of %d ranks do not map each other's memory", nodes, w.ranksPerNode);
  }
  snprintf(line, len,
           "inter-node transport sendrecv (%s): steps between nodes are grouped ncclSend / ncclRecv on the NCCL "
           "communicator, run by NCCL's kernels, which use SMs",
           why);
  return tideSuccess;
}

}  // namespace internode
}  // namespace tide
