// Inter-node transport: the operations of a step program that cross a node boundary (prog::Op::crossNode: paced
// puts, the signals that announce them, the waits for those signals), handed out by the rank's issue policy
// (IssuePolicy::transport) and called by the program interpreter (program_exec.cc) with prebuilt arguments.
// Node-local pushes and the fan-out are plain peer-mapped copies and never come here.
//
//   put(s, peer, copies)   the copies land in `peer`'s memory (destinations are addresses of the peer's slot or
//                          staging as the provider resolves them for the calling rank);
//   flags(s, peer, batch)  signals to `peer` (writes into the peer's flag array, ordered after every put enqueued
//                          earlier on s) and waits for `peer`'s signals (waits on the own array), in batch order.
//                          The batch keeps the symbolic ops (owner, word, value) next to the driver parameters, so a
//                          transport that does not map the peer's flags can translate them.
// Flag values are per-comm counters, equal on every rank (AG epoch, RS task number): docs/architecture.md.
//
// Built: PeerMappedTransport (every rank maps every other rank's memory: loopback, CUDA IPC on one host; "virtual
// nodes"): put = one copy-engine batch into the peer-mapped address, flags = one cuStreamBatchMemOp.
// Not built (issue "Beyond one node through NCCL"): an NCCL transport (ncclPutSignal / ncclWaitSignal on windows
// with NCCL >= 2.29.2; grouped ncclSend / ncclRecv per round on 2.28), which plugs in here unchanged.
#ifndef TIDE_CUDA_INTERNODE_TRANSPORT_H_
#define TIDE_CUDA_INTERNODE_TRANSPORT_H_

#include <cuda_runtime.h>

#include "prebuilt.h"
#include "tide.h"

namespace tide {
namespace cuda {

class InterNodeTransport {
 public:
  virtual ~InterNodeTransport() = default;
  virtual const char* name() const = 0;
  virtual tideResult_t put(cudaStream_t stream, int peer, const CopyBatch& copies, bool batchApi, int device) = 0;
  virtual tideResult_t flags(cudaStream_t stream, int peer, MemOpBatch& batch) = 0;
};

// Copy engines and stream memory operations on peer-mapped memory. Stateless.
class PeerMappedTransport final : public InterNodeTransport {
 public:
  const char* name() const override { return "peer-mapped"; }
  tideResult_t put(cudaStream_t stream, int peer, const CopyBatch& copies, bool batchApi, int device) override;
  tideResult_t flags(cudaStream_t stream, int peer, MemOpBatch& batch) override;
};

// The process's one PeerMappedTransport (what IssuePolicy::transport() returns by default).
InterNodeTransport* peerMappedTransport();

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_INTERNODE_TRANSPORT_H_
