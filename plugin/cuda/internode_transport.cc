// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "internode_transport.h"

#include "../core/errors.h"

namespace tide {
namespace cuda {
namespace {

// An operation of the other kind of program than the comm's transport carries (internode_transport.h).
tideResult_t notCarried(const char* transport, const char* op) {
  return fail(tideInternalError, "Cuda", "a %s reached the %s transport, whose programs never hold one", op,
              transport);
}

}  // namespace

tideResult_t PeerMappedTransport::put(cudaStream_t stream, int peer, const CopyBatch& copies, bool batchApi,
                                      int device) {
  (void)peer;  // the destinations are already the peer's mapped addresses
  return enqueueCopyBatch(stream, device, copies, batchApi);
}

tideResult_t PeerMappedTransport::flags(cudaStream_t stream, int peer, MemOpBatch& batch) {
  (void)peer;  // the addresses are the peer's mapped flag words (signals) or the own ones (waits)
  // A write with the default flags: the puts enqueued before it on this stream are complete and visible before the
  // word is (the same ordering every node-local flag relies on).
  return enqueueMemOps(stream, batch);
}

tideResult_t PeerMappedTransport::sendRecv(cudaStream_t, const nccl::P2pCall*, size_t) {
  return notCarried("peer-mapped", "p2p group");
}

tideResult_t SendRecvTransport::put(cudaStream_t, int, const CopyBatch&, bool, int) {
  return notCarried("sendrecv", "cross-node put");
}

tideResult_t SendRecvTransport::flags(cudaStream_t, int, MemOpBatch&) {
  return notCarried("sendrecv", "cross-node flag batch");
}

tideResult_t SendRecvTransport::sendRecv(cudaStream_t stream, const nccl::P2pCall* calls, size_t n) {
  return nccl::issueGroup(*lib_, comm_, stream, calls, n);
}

std::unique_ptr<InterNodeTransport> makeTransport(internode::Transport kind, const nccl::Lib* lib,
                                                  nccl::ncclComm_t comm) {
  if (kind == internode::Transport::kSendRecv) return std::make_unique<SendRecvTransport>(lib, comm);
  return std::make_unique<PeerMappedTransport>();
}

}  // namespace cuda
}  // namespace tide
