// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Inter-node transport: the operations of a step program that cross a node boundary (prog::Op::crossNode: paced
// puts, the signals that announce them, the waits for those signals), called by the program interpreter
// (program_exec.cc) with prebuilt arguments through the rank's provider (Provider::transport). Node-local pushes and
// the fan-out are plain peer-mapped copies and never come here.
//
//   put(s, peer, copies)   the copies land in `peer`'s memory. copies.dst are the destinations as the provider
//                          resolved them for the calling rank (Provider::peerPtr: the peer's slot or staging);
//                          copies.peerDst names the same destinations symbolically (whose slot or staging, byte
//                          offset), for a transport that does not address the peer's memory directly (NCCL send /
//                          recv, a one-sided put into a registered window);
//   flags(s, peer, batch)  signals to `peer` (writes into the peer's flag array, ordered after every put enqueued
//                          earlier on s) and waits for `peer`'s signals (waits on the own array), in batch order.
//                          The batch keeps the symbolic ops (owner, word, value) next to the driver parameters, so a
//                          transport that does not map the peer's flags can translate them.
// Flag values are per-comm counters, equal on every rank (AG epoch, RS task number): docs/architecture.md.
//
// Built: PeerMappedTransport (every rank maps every other rank's memory: loopback, CUDA IPC on one host; "virtual
// nodes"): put = one copy-engine batch into the peer-mapped address, flags = one cuStreamBatchMemOp. A transport
// over NCCL (ncclPutSignal / ncclWaitSignal on windows, or grouped ncclSend / ncclRecv per round) plugs in here,
// chosen per communicator when its provider is created.
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
  virtual tideResult_t put(cudaStream_t stream, int peer, const CopyBatch& copies, bool batchApi, int device) = 0;
  virtual tideResult_t flags(cudaStream_t stream, int peer, MemOpBatch& batch) = 0;
};

// Copy engines and stream memory operations on peer-mapped memory. Stateless.
class PeerMappedTransport final : public InterNodeTransport {
 public:
  tideResult_t put(cudaStream_t stream, int peer, const CopyBatch& copies, bool batchApi, int device) override;
  tideResult_t flags(cudaStream_t stream, int peer, MemOpBatch& batch) override;
};

// The process's one PeerMappedTransport (what a provider is created with unless it names another).
InterNodeTransport* peerMappedTransport();

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_INTERNODE_TRANSPORT_H_
