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

#include <cstddef>
#include <cstdint>
#include <functional>

#include "tide.h"

namespace tide {
namespace cuda {

// Flag words of one rank (uint32 each, zero at creation). A peer writes into these words of the owner's array.
namespace flag {
constexpr int kAgReady = 0;      // owner: AG epoch it has entered (its slot may be written)
constexpr int kRsEnter = 1;      // owner: RS epoch it has entered (its staging may be written)
constexpr int kRsConsumed = 2;   // owner: global RS chunk number it has reduced (that staging buffer is free again)
constexpr int kRsPushDone = 3;   // owner: RS epoch whose phase-1 pushes (reads of its gradients) have all completed
// Multi-node layouts (virtual nodes; plugin/cuda/internode_*.cc). Each word has exactly one writer per value
// sequence, and its values grow monotonically per comm (cyclically, like the ones above), equal on every rank.
constexpr int kRsPrev = 4;       // owner: global RS task number whose running fp32 sum from the previous node's rank
                                 // of its rail has landed in its partial slot (writer: that rank)
constexpr int kRsFinal = 5;      // owner: global RS task number whose final fp32 sum from the last node's rank of its
                                 // rail has landed in its partial slot (writer: that rank; only tasks it owns)
constexpr int kAgFinish = 6;     // owner: AG epoch whose multi-node work, deferred onto the internal stream by a
                                 // provider that defers (loopback), has completed (writer: the owner's internal stream)
constexpr int kAgRail = 16;      // + round: AG epoch whose rail-schedule puts of that round have landed in the slot
constexpr int kMaxRounds = 32;   // words kAgRail .. kAgRail + 31 (ceil(log2 N) <= 16 rounds for N <= 65536)
constexpr int kAgDone = 64;      // + source local rank: AG epoch whose copies into the owner have completed
constexpr int kRsFull = 128;     // + source local rank: global RS chunk (task) number pushed into the owner's staging
constexpr int kMaxLocalRanks = 64;
// Captured collectives (CUDA graphs; docs/architecture.md "CUDA graphs"): a bank of token words that only captured
// calls use (eager calls never touch them, and captured calls never touch the words above). Each word carries a
// token from one writer (the peer named by the index) to the owner of the array: the writer sets it (1, or the RS
// chunk count so far), the owner alone resets it to 0 once its wait has seen the last value of the collective, and
// the writer sets it again only after a causal chain through that reset. Fixed values, so a replay is identical.
constexpr int kCapAgReady = 256;  // + local rank d: d's slot may be written (d's stream has reached this AG)
constexpr int kCapAgDone = 320;   // + local rank s: s's copies into the owner's slot have landed
constexpr int kCapRsEnter = 384;  // + local rank d: d's staging may be written (d's stream has reached this RS)
constexpr int kCapRsFull = 448;   // + local rank s: number of chunks s has pushed into the owner's staging
constexpr int kWords = 512;
// Free: 7..15, 48..63, 192..255.
}  // namespace flag

// Kinds of collective, for the loopback stream check.
enum class CollKind { kAllGather = 0, kReduceScatter = 1 };

class PeerProvider {
 public:
  virtual ~PeerProvider() = default;

  virtual const char* name() const = 0;
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

  // True if the provider issues RS phase-1 pushes itself through schedulePushes (loopback). False (default): the
  // executor issues them, interleaved with the reduce chunks in host order so that no wait is enqueued before the
  // operation of the same process that satisfies it; schedulePushes is then not called.
  virtual bool defersPushes() const { return false; }

  // Issues a rank's RS phase-1 pushes: issue(k) enqueues chunk k for k < numChunks, and issue(numChunks) the
  // tail. (Multi-node layouts pass their pipeline tasks, numChunks * nNodes, as the chunks: internode_rs.cc.) Called only if defersPushes(). Default: all of them now, in order. A provider whose ranks share copy-engine queues (loopback: all
  // virtual ranks on one device) must issue the chunks of all ranks interleaved, chunk-major, once every rank of
  // the epoch has submitted: a push of chunk k waits for the owners' reduction of chunk k-2, which waits for the
  // other ranks' pushes of chunk k-2; those must not sit behind it in a shared queue.
  using IssueFn = std::function<tideResult_t(int chunk)>;
  virtual tideResult_t schedulePushes(int rank, uint64_t epoch, int numChunks, IssueFn issue) {
    (void)rank;
    (void)epoch;
    for (int k = 0; k <= numChunks; ++k) {
      tideResult_t r = issue(k);
      if (r != tideSuccess) return r;
    }
    return tideSuccess;
  }

  // The multi-node executors' form of schedulePushes (internode_ag.cc, internode_rs.cc): issue(k) for k = 0 ..
  // numSteps (inclusive) enqueues step k of this rank's work of collective (kind, epoch) on the comm's internal stream.
  // Called only if defersPushes(). A provider whose ranks share copy-engine queues (loopback) issues the steps of
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

  // True if this provider's collectives may be captured into CUDA graphs (captured.cc; checked first). Default
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
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_PEER_PROVIDER_H_
