// Loopback provider: a world of 2..8 virtual ranks in one process on one device.
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

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "peer_provider.h"

namespace tide {
namespace cuda {

class LoopbackProvider final : public PeerProvider {
 public:
  static constexpr int kMaxRanks = 8;

  // Allocates flags and the zero buffer on `device`. Errors: tideCudaError, tideOutOfMemory.
  static tideResult_t create(int nRanks, int device, std::shared_ptr<LoopbackProvider>* out);
  ~LoopbackProvider() override;

  const char* name() const override { return "loopback"; }
  int worldSize() const override { return nRanks_; }
  int device() const override { return device_; }

  tideResult_t slotAlloc(int rank, size_t bytes, void** ptr) override;
  tideResult_t slotFree(int rank, void* ptr) override;
  tideResult_t peerPtr(int rank, const void* local, size_t bytes, int peer, const char* what, void** out) override;
  uint32_t* flags(int rank, int owner) override;
  tideResult_t ownStaging(int rank, int owner, uint64_t bytes, uint64_t epoch, void** out) override;
  const void* zeros(size_t* bytes) override;
  tideResult_t checkStream(int rank, CollKind kind, uint64_t epoch, cudaStream_t stream) override;
  // Deferred until every virtual rank of the epoch has submitted, then issued chunk-major across ranks (all
  // virtual ranks share the device's copy-engine queues).
  bool defersPushes() const override { return true; }
  tideResult_t scheduleSteps(int rank, CollKind kind, uint64_t epoch, int numSteps, IssueFn issue) override;
  // Captured collectives: each virtual rank captures into a graph of its own (two ranks in one graph would wait for
  // each other inside it), with at most one TIDE collective per graph: a graph launch enqueues the rank's whole
  // graph at once, so a second collective's copies would sit in the shared copy-engine queues ahead of the other
  // ranks' copies of the first one, which they (through the flags) wait for.
  bool capturable() const override { return true; }
  tideResult_t checkCapture(int rank, CollKind kind, unsigned long long captureId) override;

  // Called by the program interpreter before it enqueues a deferred program's call-time steps: fails (without enqueueing anything) if this world is unusable, or if an earlier rank of
  // (kind, epoch) submitted a different step count (then the world is marked unusable: that rank's stream already
  // waits for steps that will never be issued). Records numSteps for the epoch otherwise.
  tideResult_t precheckSteps(int rank, CollKind kind, uint64_t epoch, int numSteps) override;

  // tideCommAbort of one virtual rank: the whole world becomes unusable (every later call of any of its ranks fails
  // with tideInvalidUsage naming the reason), pending deferred work is dropped, and the device is synchronized for
  // at most boundMs. If it does not go idle, the world's memory is never freed (left to process exit). Returns true
  // if the device went idle.
  bool abort(int rank, uint64_t boundMs);

 private:
  LoopbackProvider(int nRanks, int device) : nRanks_(nRanks), device_(device) {}

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
  std::mutex mu_;
  std::vector<std::vector<Slot>> slots_;  // [rank][allocation index]
  uint32_t* flagMem_ = nullptr;           // nRanks_ * flag::kWords words
  void* zeros_ = nullptr;
  size_t zeroBytes_ = 0;
  std::vector<StagingGen> staging_;
  StreamUse streamUse_[2][kMaxRanks];
  struct PendingPushes {
    int submitted = 0;
    int numChunks = 0;
    std::vector<IssueFn> issue;  // per rank
  };
  std::map<std::pair<int, uint64_t>, PendingPushes> pending_;  // by (collective kind, epoch)
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

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_LOOPBACK_H_
