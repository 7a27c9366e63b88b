// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The provider of one rank of a comm: its memory for peers (PeerMemory, peer_memory.h: slots, own RS staging, the
// peers' addresses of them) and the ordering between its ranks (RankOrdering, rank_ordering.h: flags, layout
// agreement, the per-call check, abort, and for ranks that share one device's queues the SharedQueues hook,
// shared_queues.h), with what it is and can do (name, traits, node size). tideComm holds one per rank (comm.h); the
// executors (ag_executor.cc, rs_executor.cc) and the program interpreter (program_exec.cc) see only these interfaces.
// What crosses a node boundary is not the provider's: the comm's InterNodeTransport carries it
// (internode_transport.h).
//
// Built: IpcProvider (one rank per process, CUDA IPC; ipc_provider.h), WindowProvider (one rank per process, NCCL
// windows; window_provider.h) and LoopbackRank (a virtual rank of a single-process world on one device;
// loopback.h). These interfaces are internal to the library (C++, not part of include/tide.h, loaded by nothing
// outside it): they carry no ABI version, and a new provider is built into the library.
#ifndef TIDE_CUDA_PROVIDER_H_
#define TIDE_CUDA_PROVIDER_H_

#include "peer_memory.h"
#include "rank_ordering.h"
#include "shared_queues.h"
#include "tide.h"

namespace tide {
namespace cuda {

class Provider : public PeerMemory, public RankOrdering {
 public:
  // What a provider can do, fixed at its creation.
  struct Traits {
    // Its collectives may be captured into CUDA graphs (the kCaptured programs), and then its eager calls of such
    // programs take the token protocol when NCCL_TIDE_EAGER_GRAPHS is on. False: refused at capture time, eager calls
    // on the epoch protocol.
    bool capturable = false;
    // agreeOnLayout exchanges with the other ranks. Such an exchange cannot run inside a CUDA graph capture (it
    // synchronizes), so a captured call with a layout this comm has not agreed on yet is refused at capture time
    // (layoutEntry); the first eager call with the layout agrees on it.
    bool agreementExchanges = false;
    // Every rank can address every other rank's slots, staging and flags. Then a layout may split the ranks into any
    // number of (virtual) nodes, the inter-node stage running over the peer-mapped transport. False: a rank maps only
    // the ranks of its own node (nodeRanks), and steps between nodes go through NCCL (the comm's sendrecv transport,
    // plugin/core/internode.h).
    bool peerMapsAllRanks = true;
  };

  virtual ~Provider() = default;

  // "loopback", "ipc", "window": tideCommGetProvider, the debug dump, error messages.
  const char* name() const { return name_; }
  const Traits& traits() const { return traits_; }
  // The provider's node size: ranks r and q are on one node exactly when r / nodeRanks() == q / nodeRanks() (IPC:
  // NCCL's hosts or NCCL_TIDE_RANKS_PER_NODE, plugin/core/node_map.h); 0: no node split of its own (loopback: one
  // device). Without peerMapsAllRanks, peers on other nodes have no address here: peerPtr fails and flags returns
  // nullptr for them (two-sided programs never address them).
  int nodeRanks() const { return nodeRanks_; }

 protected:
  Provider(const char* name, Traits traits) : name_(name), traits_(traits) {}
  // While the provider is being created (its node split is known only after the ranks' exchange): the node size, and
  // whether ranks on other nodes are mapped too.
  void setNodes(int nodeRanks, bool peerMapsAllRanks) {
    nodeRanks_ = nodeRanks;
    traits_.peerMapsAllRanks = peerMapsAllRanks;
  }

 private:
  const char* const name_;
  Traits traits_;
  int nodeRanks_ = 0;
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_PROVIDER_H_
