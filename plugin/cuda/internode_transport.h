// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Inter-node transport: the operations of a step program that cross a node boundary, called by the program
// interpreter (program_exec.cc) with prebuilt arguments through the comm's transport (tideComm::transport, made by
// commInit from the choice of plugin/core/internode.h). Node-local pushes and the fan-out are plain peer-mapped copies
// and never come here. A one-sided program (prog::Transport::kOneSided) crosses nodes with put and flags
// (prog::Op::crossNode), a two-sided one (prog::Transport::kTwoSided) with sendRecv (prog::Op::kP2p); the comm's
// programs are compiled for its transport, so each transport receives only the operations it carries and refuses the
// others (tideInternalError: a compiler bug).
//
//   put(s, peer, copies)   the copies land in `peer`'s memory. copies.dst are the destinations as the provider
//                          resolved them for the calling rank (PeerMemory::peerPtr: the peer's slot or staging);
//                          copies.peerDst names the same destinations symbolically (whose slot or staging, byte
//                          offset), for a transport that does not address the peer's memory directly (a one-sided
//                          put into a registered window);
//   flags(s, peer, batch)  signals to `peer` (writes into the peer's flag array, ordered after every put enqueued
//                          earlier on s) and waits for `peer`'s signals (waits on the own array), in batch order.
//                          The batch keeps the symbolic ops (owner, word, value) next to the driver parameters, so a
//                          transport that does not map the peer's flags can translate them.
//   sendRecv(s, calls, n)  one p2p group: the rank's sends and receives of the group, in program order, completed on
//                          s before what follows on it.
// Flag values are per-comm counters, equal on every rank (AG epoch, RS task number): docs/architecture.md.
//
// Built: PeerMappedTransport (every rank maps every other rank's memory: loopback, CUDA IPC or NCCL windows on one
// node; "virtual nodes"): put = one copy-engine batch into the peer-mapped address, flags = one cuStreamBatchMemOp.
// SendRecvTransport (the comm's NCCL communicator): each p2p group as grouped ncclSend / ncclRecv
// (plugin/nccl/p2p_group.h). The interface is internal to the library (C++, not part of include/tide.h, loaded by
// nothing outside it): it carries no ABI version, and a new transport is built into the library.
#ifndef TIDE_CUDA_INTERNODE_TRANSPORT_H_
#define TIDE_CUDA_INTERNODE_TRANSPORT_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "../core/internode.h"
#include "../nccl/p2p_group.h"
#include "prebuilt.h"
#include "tide.h"

namespace tide {
namespace cuda {

class InterNodeTransport {
 public:
  virtual ~InterNodeTransport() = default;
  virtual tideResult_t put(cudaStream_t stream, int peer, const CopyBatch& copies, bool batchApi, int device) = 0;
  virtual tideResult_t flags(cudaStream_t stream, int peer, MemOpBatch& batch) = 0;
  virtual tideResult_t sendRecv(cudaStream_t stream, const nccl::P2pCall* calls, size_t n) = 0;
};

// Copy engines and stream memory operations on peer-mapped memory. Stateless.
class PeerMappedTransport final : public InterNodeTransport {
 public:
  tideResult_t put(cudaStream_t stream, int peer, const CopyBatch& copies, bool batchApi, int device) override;
  tideResult_t flags(cudaStream_t stream, int peer, MemOpBatch& batch) override;
  tideResult_t sendRecv(cudaStream_t stream, const nccl::P2pCall* calls, size_t n) override;
};

// Grouped ncclSend / ncclRecv on an NCCL communicator of the process's NCCL (both outlive the transport).
class SendRecvTransport final : public InterNodeTransport {
 public:
  SendRecvTransport(const nccl::Lib* lib, nccl::ncclComm_t comm) : lib_(lib), comm_(comm) {}
  tideResult_t put(cudaStream_t stream, int peer, const CopyBatch& copies, bool batchApi, int device) override;
  tideResult_t flags(cudaStream_t stream, int peer, MemOpBatch& batch) override;
  tideResult_t sendRecv(cudaStream_t stream, const nccl::P2pCall* calls, size_t n) override;

 private:
  const nccl::Lib* const lib_;
  const nccl::ncclComm_t comm_;
};

// The transport of `kind` (what internode::choose picked for a comm); lib and comm are the comm's NCCL communicator,
// which kSendRecv needs (choose refuses it without one).
std::unique_ptr<InterNodeTransport> makeTransport(internode::Transport kind, const nccl::Lib* lib,
                                                  nccl::ncclComm_t comm);

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_INTERNODE_TRANSPORT_H_
