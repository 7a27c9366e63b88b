// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Loopback provider: a world of 2..8 virtual ranks in one process on one device (LoopbackWorld, their shared state),
// and one thin view per virtual rank (LoopbackRank: its Provider, with the SharedQueues hook).
//
// Each virtual rank has its own slots (cudaMalloc per tideSlotAlloc call), its own flag array and its own RS staging;
// "peer memory" of a rank is the other virtual ranks' allocations: slot k of rank q is the k-th tideSlotAlloc call of
// rank q, and the peer address of (rank r, pointer p inside r's slot k) is q's slot k at the same offset.
//
// Streams: every virtual rank must run its collectives on a stream of its own. Two virtual ranks on one stream
// would deadlock (the first rank's flag wait blocks the stream that must later write the flag it waits for), so
// checkStream() rejects a stream that another virtual rank already uses for the same epoch, and the legacy default
// stream (it orders itself after every blocking stream). A deadlock the library cannot see: more busy streams than
// the device has hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, default 8) can alias two ranks' streams onto one
// queue; set CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA initializes when running 5 or more virtual ranks.
#ifndef TIDE_CUDA_LOOPBACK_H_
#define TIDE_CUDA_LOOPBACK_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "provider.h"
#include "zero_buffer.h"

namespace tide {
namespace cuda {

class LoopbackRank;

// The state all virtual ranks of one world share (slots, flags, staging, deferred issue, stream and capture use).
// Its methods take the virtual rank they act for: only the per-rank views (LoopbackRank) call them.
class LoopbackWorld {
 public:
  static constexpr int kMaxRanks = 8;
  using IssueFn = SharedQueues::IssueFn;

  // Allocates flags and the zero buffer on `device`, and one view per virtual rank (ranks[r] is rank r; the world
  // lives as long as any of them). Errors: tideCudaError, tideOutOfMemory.
  static tideResult_t create(int nRanks, int device, std::vector<std::shared_ptr<LoopbackRank>>* ranks);
  ~LoopbackWorld();

  // One counter for the world (PeerMemory::memoryGeneration): a slot of any virtual rank changes what the others'
  // peerPtr resolves. slotAlloc and slotFree bump it on entry.
  uint64_t memoryGeneration() const { return memGeneration_.load(std::memory_order_relaxed); }
  tideResult_t slotAlloc(int rank, size_t bytes, void** ptr);
  tideResult_t slotFree(int rank, void* ptr);
  tideResult_t peerPtr(int rank, const void* local, size_t bytes, int peer, const char* what, void** out);
  uint32_t* flags(int owner);
  tideResult_t ownStaging(int rank, int owner, uint64_t bytes, uint64_t epoch, void** out);
  const void* zeros(size_t* bytes);
  // Also checkCallOrder (below), before the stream rule.
  tideResult_t checkStream(int rank, CollKind kind, uint64_t epoch, cudaStream_t stream);
  // Deferred until every virtual rank of the epoch has submitted, then issued chunk-major across ranks (all
  // virtual ranks share the device's copy-engine queues).
  tideResult_t scheduleSteps(int rank, CollKind kind, uint64_t epoch, int numSteps, IssueFn issue);
  // Captured collectives: each virtual rank captures into a graph of its own (two ranks in one graph would wait for
  // each other inside it), with at most one TIDE collective per graph: a graph launch enqueues the rank's whole
  // graph at once, so a second collective's copies would sit in the shared copy-engine queues ahead of the other
  // ranks' copies of the first one, which they (through the flags) wait for.
  tideResult_t checkCapture(int rank, CollKind kind, unsigned long long captureId);

  // Called by the program interpreter before it enqueues a deferred program's call-time steps: fails (without
  // enqueueing anything) if this world is unusable, or if an earlier rank of (kind, epoch) submitted a different
  // step count (then the world is marked unusable: that rank's stream already waits for steps that will never be
  // issued). Records numSteps (and whether the program is a token program issued in rounds) for the epoch otherwise.
  tideResult_t precheckSteps(int rank, CollKind kind, uint64_t epoch, int numSteps, bool tokens);
  // An eager call of `rank` failed after its epoch advanced (SharedQueues::callFailed): the world is marked unusable.
  void callFailed(int rank, CollKind kind, uint64_t epoch, const char* why);

  // tideCommAbort of one virtual rank: the whole world becomes unusable (every later call of any of its ranks fails
  // with tideInvalidUsage naming the reason), pending deferred work is dropped, and the device is synchronized for
  // at most boundMs. If it does not go idle, the world's memory is never freed (left to process exit). Returns true
  // if the device went idle.
  bool abort(int rank, uint64_t boundMs);
  // Virtual rank `rank`'s comm was destroyed. If a deferred collective is pending (some ranks submitted, not all),
  // its issue functions hold bound programs whose comm may be the destroyed one: issuing them later would use freed
  // memory, and the collective can never complete anyway. The world is marked unusable and they are dropped.
  void rankDestroyed(int rank);

 private:
  LoopbackWorld(int nRanks, int device) : nRanks_(nRanks), device_(device) {}

  struct Slot {
    char* base = nullptr;
    size_t bytes = 0;
    bool live = false;
  };
  // One generation of own RS staging: valid for RS epochs >= startEpoch until the next generation.
  struct StagingGen {
    uint64_t startEpoch = 0;
    uint64_t bytes = 0;
    std::vector<void*> ptrs;  // one per rank
  };
  struct StreamUse {
    uint64_t epoch = 0;
    cudaStream_t stream = nullptr;
  };

  const int nRanks_;
  const int device_;
  std::atomic<uint64_t> memGeneration_{0};
  std::mutex mu_;
  std::vector<std::vector<Slot>> slots_;  // [rank][allocation index]
  uint32_t* flagMem_ = nullptr;           // nRanks_ * flag::kWords words
  ZeroBuffer zeros_;
  std::vector<StagingGen> staging_;
  StreamUse streamUse_[2][kMaxRanks];
  struct PendingPushes {
    int submitted = 0;
    int numChunks = 0;
    bool tokens = false;         // a token program's rounds (BoundProgram::issueTokens): see checkCallOrder
    std::vector<IssueFn> issue;  // per rank
  };
  std::map<std::pair<int, uint64_t>, PendingPushes> pending_;  // by (collective kind, epoch)
  // Call order of token calls (caller holds mu_, through `lock`; may wait on it). A token call's announce is
  // enqueued at the call and its rounds only once every rank has announced, so a rank's next collective must not
  // enqueue anything before those rounds: its writes would precede them on the rank's stream (a second announce
  // would merge with the first unconsumed token, and the peers' next waits would never be satisfied; its stream
  // would claim the slot or staging free while the held rounds still use it). So a rank with a token call still held
  // for a peer is refused (tideInvalidUsage, nothing enqueued, the world stays usable), and one whose held rounds are
  // being issued by another rank's thread right now waits for that issue to end (host only, no device wait).
  tideResult_t checkCallOrder(int rank, CollKind kind, uint64_t epoch, std::unique_lock<std::mutex>& lock);
  int issuing_[kMaxRanks] = {};        // per rank: token rounds being issued outside mu_ (scheduleSteps)
  std::condition_variable issuedCv_;  // notified when an issue of token rounds ends
  // Non-empty: why this world is unusable (a deferred issue failed partway, a step-count mismatch, an abort). Every
  // later checkStream / scheduleSteps / slotAlloc fails with it: some rank's stream may wait forever for work that
  // was never issued, so the world must be destroyed (or aborted).
  std::string broken_;
  bool deviceStuck_ = false;  // abort() timed out: the destructor frees nothing
  tideResult_t brokenError(int rank, const char* what);  // caller holds mu_
  void markBroken(const char* reason);                   // caller holds mu_
  struct CaptureUse {
    int rank;
    CollKind kind;
  };
  std::map<unsigned long long, CaptureUse> captures_;  // capture id -> the (rank, kind) that captured into it
};

// Virtual rank `rank` of a world: its Provider and SharedQueues, each call forwarded to the world with the rank.
class LoopbackRank final : public Provider, public SharedQueues {
 public:
  LoopbackRank(std::shared_ptr<LoopbackWorld> world, int rank)
      : Provider("loopback", kTraits), world_(std::move(world)), rank_(rank) {}
  // The rank's comm is gone: deferred work of the world that a later call would issue may hold this rank's
  // programs (and through them its destroyed comm), so the world drops it and becomes unusable.
  ~LoopbackRank() override { world_->rankDestroyed(rank_); }

  // PeerMemory (peer_memory.h).
  uint64_t memoryGeneration() const override { return world_->memoryGeneration(); }
  tideResult_t slotAlloc(size_t bytes, void** ptr) override { return world_->slotAlloc(rank_, bytes, ptr); }
  tideResult_t slotFree(void* ptr) override { return world_->slotFree(rank_, ptr); }
  tideResult_t peerPtr(const void* local, size_t bytes, int peer, const char* what, void** out) override {
    return world_->peerPtr(rank_, local, bytes, peer, what, out);
  }
  tideResult_t ownStaging(int owner, uint64_t bytes, uint64_t epoch, void** out) override {
    return world_->ownStaging(rank_, owner, bytes, epoch, out);
  }
  const void* zeros(size_t* bytes) override { return world_->zeros(bytes); }

  // RankOrdering (rank_ordering.h).
  uint32_t* flags(int owner) override { return world_->flags(owner); }
  // One process, one layout object per rank, ranks submitting one after another: nothing to compare, and no point
  // at which the ranks could wait for each other.
  tideResult_t agreeOnLayout(uint64_t, bool, int) override { return tideSuccess; }
  tideResult_t checkStream(CollKind kind, uint64_t epoch, cudaStream_t stream) override {
    return world_->checkStream(rank_, kind, epoch, stream);
  }
  bool abort(uint64_t boundMs) override { return world_->abort(rank_, boundMs); }
  SharedQueues* sharedQueues() override { return this; }

  // SharedQueues (shared_queues.h).
  tideResult_t scheduleSteps(CollKind kind, uint64_t epoch, int numSteps, IssueFn issue) override {
    return world_->scheduleSteps(rank_, kind, epoch, numSteps, std::move(issue));
  }
  tideResult_t precheckSteps(CollKind kind, uint64_t epoch, int numSteps, bool tokens) override {
    return world_->precheckSteps(rank_, kind, epoch, numSteps, tokens);
  }
  void callFailed(CollKind kind, uint64_t epoch, const char* why) override {
    world_->callFailed(rank_, kind, epoch, why);
  }
  tideResult_t checkCapture(CollKind kind, unsigned long long captureId) override {
    return world_->checkCapture(rank_, kind, captureId);
  }

 private:
  // Capturable; no exchange to agree on a layout; every virtual rank maps every other's memory.
  static constexpr Traits kTraits{true, false, true};
  const std::shared_ptr<LoopbackWorld> world_;
  const int rank_;
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_LOOPBACK_H_
