#include "internode_transport.h"

#include "driver_ops.h"

namespace tide {
namespace cuda {

tideResult_t PeerMappedTransport::put(cudaStream_t stream, int peer, const CopyList& copies) {
  (void)peer;  // the destinations are already the peer's mapped addresses
  return copies.enqueue(stream, device_);
}

tideResult_t PeerMappedTransport::signal(cudaStream_t stream, int peer, int word, uint32_t value) {
  // A stream write with the default flags: the copies enqueued before it on this stream are complete and visible
  // before the word is (the same ordering every single-node flag of the executors relies on).
  return enqueueFlagOps(stream, {FlagOp{FlagOp::kWrite, provider_->flags(rank_, peer) + word, value}});
}

tideResult_t PeerMappedTransport::waitSignal(cudaStream_t stream, int word, uint32_t value) {
  return enqueueFlagOps(stream, {FlagOp{FlagOp::kWait, provider_->flags(rank_, rank_) + word, value}});
}

tideResult_t PeerMappedTransport::waitCredit(cudaStream_t stream, int peer, int word, uint32_t value) {
  return enqueueFlagOps(stream, {FlagOp{FlagOp::kWait, provider_->flags(rank_, peer) + word, value}});
}

}  // namespace cuda
}  // namespace tide
