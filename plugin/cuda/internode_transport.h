// Inter-node transport of the multi-node executors (internode_ag.cc, internode_rs.cc): the operations that cross a
// node boundary, and nothing else (node-local pushes and fan-out stay plain peer-mapped copies).
//
// Four stream-ordered operations, all enqueued on a CUDA stream of the calling rank, none launching a kernel:
//   put(s, peer, copies)            the copies land in `peer`'s memory (destinations are addresses of the peer's slot or
//                                   staging as PeerProvider resolves them for the calling rank);
//   signal(s, peer, word, v)        once every put enqueued earlier on s has landed, peer's flag word becomes v;
//   waitSignal(s, word, v)          s waits until this rank's flag word >= v (cyclic), i.e. a peer's signal arrived;
//   waitCredit(s, peer, word, v)    s waits until peer's flag word >= v: the peer announced that the buffer the next
//                                   put writes is free (its AG epoch started, its RS staging buffer was consumed).
// Flag values are per-comm counters that grow monotonically and are equal on every rank (AG epoch, RS task number).
//
// Built: PeerMappedTransport (every rank maps every other rank's memory: loopback, CUDA IPC on one host; "virtual
// nodes"): put = copy-engine batch into the peer-mapped address, signal = cuStreamWriteValue32 into the peer's flag
// word (after the copies in stream order, with the write's memory barrier), waitSignal/waitCredit =
// cuStreamWaitValue32 GEQ on the own / the peer's flag word.
//
// Not built (no multi-node hardware here), and where they plug in:
//   * NCCL put/signal (NCCL >= 2.29.2, window provider): put = ncclPutSignal on the window offset of the destination,
//     the signal of the last put of a step = signal(); waitSignal = ncclWaitSignal; waitCredit = a waitSignal on a
//     credit signal that the peer sends back (the peer-mapped version reads the peer's word instead).
//   * grouped ncclSend/ncclRecv: put + signal become a send matched by a recv the receiver posts in its own
//     waitSignal; credits are implicit in the matching. That needs the receiver to know the byte ranges, which the
//     schedule gives (tideLayoutGetScheduleStep is a pure function of the layout).
// Both honour the pacing cap the same way: the executors issue one put per schedule step (at most paceBytes).
#ifndef TIDE_CUDA_INTERNODE_TRANSPORT_H_
#define TIDE_CUDA_INTERNODE_TRANSPORT_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "copy_batch.h"
#include "peer_provider.h"
#include "tide.h"

namespace tide {
namespace cuda {

class InterNodeTransport {
 public:
  virtual ~InterNodeTransport() = default;
  virtual const char* name() const = 0;
  virtual tideResult_t put(cudaStream_t stream, int peer, const CopyList& copies) = 0;
  virtual tideResult_t signal(cudaStream_t stream, int peer, int word, uint32_t value) = 0;
  virtual tideResult_t waitSignal(cudaStream_t stream, int word, uint32_t value) = 0;
  virtual tideResult_t waitCredit(cudaStream_t stream, int peer, int word, uint32_t value) = 0;
};

// Copy engines and stream memory operations on peer-mapped memory (see above). Cheap to construct (per call).
class PeerMappedTransport final : public InterNodeTransport {
 public:
  PeerMappedTransport(PeerProvider* provider, int rank, int device)
      : provider_(provider), rank_(rank), device_(device) {}
  const char* name() const override { return "peer-mapped"; }
  tideResult_t put(cudaStream_t stream, int peer, const CopyList& copies) override;
  tideResult_t signal(cudaStream_t stream, int peer, int word, uint32_t value) override;
  tideResult_t waitSignal(cudaStream_t stream, int word, uint32_t value) override;
  tideResult_t waitCredit(cudaStream_t stream, int peer, int word, uint32_t value) override;

 private:
  PeerProvider* provider_;
  int rank_;
  int device_;
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_INTERNODE_TRANSPORT_H_
