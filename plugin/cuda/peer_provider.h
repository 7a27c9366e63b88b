// Peer memory providers: where a virtual or real rank's slots, flags and own RS staging live, and how one rank
// addresses another rank's memory.
//
// The executors (ag_executor.cc, rs_executor.cc) see only this interface, so the loopback provider of this issue
// and the NCCL providers (windows, CUDA IPC) of the NCCL-binding issue plug in without touching them.
// Addresses returned here are device addresses that the calling rank's device can read and write directly
// (peer-mapped); for loopback they are plain allocations on the one device.
#ifndef TIDE_CUDA_PEER_PROVIDER_H_
#define TIDE_CUDA_PEER_PROVIDER_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "../core/program.h"
#include "tide.h"

namespace tide {
namespace cuda {

class InterNodeTransport;

// Flag words of one rank (uint32 each, zero at creation): defined once, with the programs that use them
// (plugin/core/program.h; their meaning in docs/architecture.md "Step programs").
namespace flag = ::tide::prog::word;

// Kinds of collective, for the loopback stream check.
enum class CollKind { kAllGather = 0, kReduceScatter = 1 };

class PeerProvider {
 public:
  virtual ~PeerProvider() = default;

  virtual const char* name() const = 0;

  // Bumped whenever a slot is allocated or freed (tideSlotAlloc / tideSlotFree): bound programs keep peer addresses
  // resolved through peerPtr, and this is part of their cache key.
  uint64_t memoryGeneration() const { return memGeneration_.load(std::memory_order_relaxed); }
  void bumpMemoryGeneration() { memGeneration_.fetch_add(1, std::memory_order_relaxed); }
  virtual int worldSize() const = 0;
  virtual int device() const = 0;

  // Collective slot allocation (same order and sizes on every rank).
  virtual tideResult_t slotAlloc(int rank, size_t bytes, void** ptr) = 0;
  virtual tideResult_t slotFree(int rank, void* ptr) = 0;

  // Address, as seen by `rank`, of peer `peer`'s copy of the slot region [local, local + bytes) of `rank`.
  // tideInvalidArgument if the region is not inside one of rank's slots (what names the argument);
  // tideInvalidUsage if the peer has not (yet) allocated the matching slot.
  virtual tideResult_t peerPtr(int rank, const void* local, size_t bytes, int peer, const char* what,
                               void** out) = 0;

  // Device address of `owner`'s flag array (flag::kWords words), as seen by `rank`.
  virtual uint32_t* flags(int rank, int owner) = 0;

  // The provider's own RS staging buffer of `owner` (at least `bytes`) for the RS epoch `epoch`, as seen by `rank`.
  // Every rank of one epoch gets the same buffers. Errors: tideOutOfMemory, tideMismatch (ranks disagree on size).
  virtual tideResult_t ownStaging(int rank, int owner, uint64_t bytes, uint64_t epoch, void** out) = 0;

  // Device buffer of zeros (at least *bytes long) that a copy engine reads to fill padding.
  virtual const void* zeros(size_t* bytes) = 0;

  // NVLink multicast address of the slot region, or nullptr if the provider has none (loopback never has one; the
  // NCCL provider hands out only what ncclGetLsaMultimemDevicePointer returns; TIDE never creates multicast objects).
  virtual void* multicastPtr(int rank, const void* local, size_t bytes) {
    (void)rank;
    (void)local;
    (void)bytes;
    return nullptr;
  }

  // Issue policy. True (loopback): step programs are compiled in prog::Mode::kDeferred, and their issue groups are
  // handed to scheduleSteps. False (default): every step is issued at call time in program order (kInOrder).
  virtual bool defersPushes() const { return false; }

  using IssueFn = std::function<tideResult_t(int group)>;
  // Deferred issue: issue(k) for k = 0 .. numSteps (inclusive) enqueues issue group k of this rank's program of
  // collective (kind, epoch). Called only if defersPushes(). A provider whose ranks share copy-engine queues (loopback) issues the steps of
  // all ranks step-major, rank-minor, once every rank has submitted: steps are numbered so that a copy of step k only
  // ever waits (through flags) for work of steps < k of any rank, or of step k of a lower rank, so no copy is queued
  // behind a copy it waits for. Default: all now, in order.
  virtual tideResult_t scheduleSteps(int rank, CollKind kind, uint64_t epoch, int numSteps, IssueFn issue) {
    (void)rank;
    (void)kind;
    (void)epoch;
    for (int k = 0; k <= numSteps; ++k) {
      tideResult_t r = issue(k);
      if (r != tideSuccess) return r;
    }
    return tideSuccess;
  }

  // Called before a deferred program's call-time steps are enqueued: fails (enqueueing nothing) if the groups could
  // not be issued later (loopback: the world is unusable, or an earlier rank of (kind, epoch) has another group
  // count, which then makes the world unusable). Default: nothing to check.
  virtual tideResult_t precheckSteps(int rank, CollKind kind, uint64_t epoch, int numSteps) {
    (void)rank;
    (void)kind;
    (void)epoch;
    (void)numSteps;
    return tideSuccess;
  }

  // The transport of cross-node operations (internode_transport.h). Default: the peer-mapped one, valid where
  // peerMapsAllRanks(); a provider spanning hosts returns its NCCL transport (not built yet).
  virtual InterNodeTransport* transport();

  // Collective agreement on a layout the comm has not used before (called by every rank at the same call, because
  // every rank makes the same collective calls in the same order): tideMismatch on every rank if the ranks' layout
  // hashes differ. This holds when every rank's layout is new to it (the usual mismatch: ranks built their layouts
  // differently). A rank whose layout is new while a peer's is one they agreed on before waits alone in the
  // exchange, bounded only by NCCL_TIDE_TIMEOUT_MS (docs/reliability.md). Default: nothing to compare (loopback: one process, one layout object per rank,
  // ranks submit one after another, so there is no point at which they could wait for each other).
  virtual tideResult_t agreeOnLayout(int rank, uint64_t layoutHash) {
    (void)rank;
    (void)layoutHash;
    return tideSuccess;
  }

  // True if every rank of the comm can address every other rank's slots, staging and flags (loopback, CUDA IPC on
  // one host). Then a layout may split the ranks into any number of (virtual) nodes: the inter-node stage runs over
  // the peer-mapped transport (internode_transport.h). A provider spanning hosts returns false and needs an NCCL
  // transport (not built yet).
  virtual bool peerMapsAllRanks() const { return true; }

  // True if agreeOnLayout exchanges with the other ranks (IPC: over NCCL or the bootstrap). Such an exchange cannot
  // run inside a CUDA graph capture (it synchronizes), so a captured call with a layout this comm has not agreed on
  // yet is refused at capture time (layoutView); the first eager call with the layout agrees on it.
  virtual bool agreementExchanges() const { return false; }

  // True if this provider's collectives may be captured into CUDA graphs (the kCaptured programs; checked first). Default
  // false: refused at capture time. Loopback and IPC: true.
  virtual bool capturable() const { return false; }

  // Check of a collective enqueued into the stream capture `captureId` (cudaStreamGetCaptureInfo) by `rank`, after
  // every other check, immediately before the captured enqueue. Loopback: each virtual rank captures into its own
  // graph, at most one TIDE collective per graph (tideUnsupported otherwise: its ranks share the device's copy-engine
  // queues and a graph launch enqueues a rank's whole graph at once). Default: nothing to check (one rank per
  // process, its own queues: a graph may hold several TIDE collectives).
  virtual tideResult_t checkCapture(int rank, CollKind kind, unsigned long long captureId) {
    (void)rank;
    (void)kind;
    (void)captureId;
    return tideSuccess;
  }

  // Provider-specific check of the stream a rank uses for a collective epoch (loopback: each virtual rank needs a
  // stream of its own, never the legacy default stream). Default: nothing to check.
  virtual tideResult_t checkStream(int rank, CollKind kind, uint64_t epoch, cudaStream_t stream) {
    (void)rank;
    (void)kind;
    (void)epoch;
    (void)stream;
    return tideSuccess;
  }

 private:
  std::atomic<uint64_t> memGeneration_{0};
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_PEER_PROVIDER_H_
