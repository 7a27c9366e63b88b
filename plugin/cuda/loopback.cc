// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "loopback.h"

#include "../core/errors.h"
#include "../core/log.h"
#include "cuda_check.h"
#include "rank_exchange.h"  // boundedDeviceSync

namespace tide {
namespace cuda {
namespace {

// Switches to `device` for the lifetime of the object and back afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device) (void)cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int cur = -1;
    if (prev_ >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev_) (void)cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1;
};

}  // namespace

tideResult_t LoopbackWorld::create(int nRanks, int device, std::vector<std::shared_ptr<LoopbackRank>>* ranks) {
  std::shared_ptr<LoopbackWorld> p(new LoopbackWorld(nRanks, device));
  DeviceGuard guard(device);
  p->slots_.resize(nRanks);
  TIDE_CUDA_CHECK(cudaSetDevice(device));
  size_t flagBytes = sizeof(uint32_t) * flag::kWords * nRanks;
  TIDE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p->flagMem_), flagBytes));
  TIDE_CUDA_CHECK(cudaMemset(p->flagMem_, 0, flagBytes));
  TIDE_CUDA_CHECK(p->zeros_.allocate());
  // The memsets run on the legacy stream, which non-blocking streams do not wait for: finish them here.
  TIDE_CUDA_CHECK(cudaDeviceSynchronize());
  TIDE_INFO("Cuda", "loopback world: %d virtual ranks on device %d", nRanks, device);
  ranks->clear();
  for (int r = 0; r < nRanks; ++r) ranks->push_back(std::make_shared<LoopbackRank>(p, r));
  return tideSuccess;
}

LoopbackWorld::~LoopbackWorld() {
  if (deviceStuck_) {
    TIDE_WARN("Cuda", "loopback world aborted with device work still pending: its memory stays allocated until the "
                      "process exits");
    return;  // a cudaFree would wait for the stuck work
  }
  DeviceGuard guard(device_);
  for (auto& rankSlots : slots_)
    for (auto& s : rankSlots)
      if (s.live) (void)cudaFree(s.base);
  for (auto& g : staging_)
    for (void* p : g.ptrs) (void)cudaFree(p);
  if (flagMem_) (void)cudaFree(flagMem_);
  zeros_.release();
  (void)cudaGetLastError();
}

tideResult_t LoopbackWorld::brokenError(int rank, const char* what) {
  return fail(tideInvalidUsage, "Cuda",
              "%s: loopback world (virtual rank %d) is unusable: %s. Destroy (or tideCommAbort) every comm of this "
              "world",
              what, rank, broken_.c_str());
}

void LoopbackWorld::markBroken(const char* reason) {
  if (broken_.empty()) broken_ = reason;
  pending_.clear();  // deferred work that will never be issued: drop it (its issue functions hold plans)
  issuedCv_.notify_all();  // a call waiting in checkCallOrder fails with the reason
}

void LoopbackWorld::callFailed(int rank, CollKind kind, uint64_t epoch, const char* why) {
  std::lock_guard<std::mutex> lock(mu_);
  char reason[400];
  snprintf(reason, sizeof(reason),
           "virtual rank %d's %s epoch %llu failed while it was being enqueued (%s); its peers' matching calls may "
           "wait forever for the part not issued",
           rank, kind == CollKind::kAllGather ? "all-gather" : "reduce-scatter", static_cast<unsigned long long>(epoch),
           why ? why : "?");
  markBroken(reason);
}

void LoopbackWorld::rankDestroyed(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_.empty()) return;
  char why[160];
  snprintf(why, sizeof(why),
           "virtual rank %d's comm was destroyed while a deferred collective of this world was pending (submitted by "
           "some ranks, not all)",
           rank);
  markBroken(why);
}

bool LoopbackWorld::abort(int rank, uint64_t boundMs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    char why[96];
    snprintf(why, sizeof(why), "virtual rank %d was aborted (tideCommAbort)", rank);
    markBroken(why);
    if (deviceStuck_) return false;
  }
  bool timedOut = false;
  tideResult_t r = boundedDeviceSync(device_, boundMs == 0 ? 1 : boundMs, &timedOut);
  (void)r;
  std::lock_guard<std::mutex> lock(mu_);
  if (timedOut) {
    deviceStuck_ = true;
    TIDE_WARN("Cuda",
              "tideCommAbort: loopback virtual rank %d: the device's queued work did not finish within %llu ms; the "
              "world's memory is left to process exit",
              rank, static_cast<unsigned long long>(boundMs));
  }
  return !deviceStuck_;
}

tideResult_t LoopbackWorld::slotAlloc(int rank, size_t bytes, void** ptr) {
  memGeneration_.fetch_add(1, std::memory_order_relaxed);
  if (bytes == 0) return fail(tideInvalidArgument, "Cuda", "tideSlotAlloc: bytes must be > 0");
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.empty()) return brokenError(rank, "tideSlotAlloc");
  std::vector<Slot>& mine = slots_[rank];
  size_t index = mine.size();
  // Collective rule: a peer that already made its index-th allocation must have used the same size.
  for (int q = 0; q < nRanks_; ++q) {
    if (q != rank && slots_[q].size() > index && slots_[q][index].bytes != bytes) {
      return fail(tideInvalidUsage, "Cuda",
                  "tideSlotAlloc: virtual rank %d's allocation #%zu has %zu bytes but rank %d's has %zu; every rank "
                  "must allocate the same sizes in the same order",
                  rank, index, bytes, q, slots_[q][index].bytes);
    }
  }
  DeviceGuard guard(device_);
  void* p = nullptr;
  TIDE_CUDA_CHECK(cudaMalloc(&p, bytes));
  mine.push_back(Slot{static_cast<char*>(p), bytes, true});
  *ptr = p;
  TIDE_TRACE("Cuda", "slot alloc rank %d #%zu: %zu bytes at %p", rank, index, bytes, p);
  return tideSuccess;
}

tideResult_t LoopbackWorld::slotFree(int rank, void* ptr) {
  memGeneration_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  for (Slot& s : slots_[rank]) {
    if (s.live && s.base == ptr) {
      // An unusable world may have work queued that never completes: a cudaFree would wait for it.
      if (!broken_.empty()) return brokenError(rank, "tideSlotFree");
      DeviceGuard guard(device_);
      s.live = false;
      TIDE_CUDA_CHECK(cudaFree(ptr));
      return tideSuccess;
    }
  }
  return fail(tideInvalidArgument, "Cuda", "tideSlotFree: %p is not a live slot of virtual rank %d", ptr, rank);
}

tideResult_t LoopbackWorld::peerPtr(int rank, const void* local, size_t bytes, int peer, const char* what,
                                       void** out) {
  std::lock_guard<std::mutex> lock(mu_);
  const char* p = static_cast<const char*>(local);
  const std::vector<Slot>& mine = slots_[rank];
  for (size_t k = 0; k < mine.size(); ++k) {
    const Slot& s = mine[k];
    if (!s.live || p < s.base || p >= s.base + s.bytes) continue;
    size_t off = static_cast<size_t>(p - s.base);
    if (bytes > s.bytes - off) {
      return fail(tideInvalidArgument, "Cuda",
                  "%s: region of %zu bytes at offset %zu runs past the end of virtual rank %d's slot (%zu bytes)", what,
                  bytes, off, rank, s.bytes);
    }
    if (peer == rank) {
      *out = const_cast<char*>(p);
      return tideSuccess;
    }
    const std::vector<Slot>& theirs = slots_[peer];
    if (theirs.size() <= k || !theirs[k].live || theirs[k].bytes != s.bytes) {
      return fail(tideInvalidUsage, "Cuda",
                  "%s: virtual rank %d has no slot #%zu matching rank %d's (%zu bytes): allocate slots on every rank "
                  "in the same order with the same sizes",
                  what, peer, k, rank, s.bytes);
    }
    *out = theirs[k].base + off;
    return tideSuccess;
  }
  return fail(tideInvalidArgument, "Cuda", "%s: %p is not inside a live slot of virtual rank %d (use tideSlotAlloc)",
              what, local, rank);
}

uint32_t* LoopbackWorld::flags(int owner) {
  return flagMem_ + static_cast<size_t>(owner) * flag::kWords;
}

tideResult_t LoopbackWorld::ownStaging(int rank, int owner, uint64_t bytes, uint64_t epoch, void** out) {
  std::lock_guard<std::mutex> lock(mu_);
  // Generation valid for this epoch: the last one that started at or before it.
  int gen = -1;
  for (int g = static_cast<int>(staging_.size()) - 1; g >= 0; --g) {
    if (staging_[g].startEpoch <= epoch) {
      gen = g;
      break;
    }
  }
  if (gen < 0 || staging_[gen].bytes < bytes) {
    bool isLatest = (gen == static_cast<int>(staging_.size()) - 1);
    bool startsHere = gen >= 0 && staging_[gen].startEpoch == epoch;
    if (!isLatest || startsHere) {
      return fail(tideMismatch, "Cuda",
                  "reduce-scatter epoch %llu: virtual rank %d needs %llu bytes of own staging but another rank of the "
                  "same epoch used a smaller layout; every rank must pass the same layout in the same order",
                  static_cast<unsigned long long>(epoch), rank, static_cast<unsigned long long>(bytes));
    }
    // Grow for every rank at once. Older generations stay allocated until the world is destroyed: work already
    // enqueued may still use them, and the hot path must not synchronize.
    StagingGen g;
    g.startEpoch = epoch;
    g.bytes = bytes;
    DeviceGuard guard(device_);
    for (int q = 0; q < nRanks_; ++q) {
      void* p = nullptr;
      cudaError_t err = cudaMalloc(&p, bytes);
      if (err != cudaSuccess) {
        for (void* x : g.ptrs) (void)cudaFree(x);
        return cudaFail(err, "cudaMalloc(own RS staging)", __FILE__, __LINE__);
      }
      g.ptrs.push_back(p);
    }
    TIDE_INFO("Cuda", "loopback: own RS staging grown to %llu bytes per rank from epoch %llu",
              static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(epoch));
    staging_.push_back(std::move(g));
    gen = static_cast<int>(staging_.size()) - 1;
  }
  *out = staging_[gen].ptrs[owner];
  return tideSuccess;
}

const void* LoopbackWorld::zeros(size_t* bytes) { return zeros_.get(bytes); }

tideResult_t LoopbackWorld::checkStream(int rank, CollKind kind, uint64_t epoch, cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy) {
    return fail(tideInvalidUsage, "Cuda",
                "loopback world: virtual rank %d passed the legacy default stream; every virtual rank needs a "
                "non-default stream of its own (a shared stream deadlocks on the cross-rank flags)",
                rank);
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!broken_.empty()) {
    return brokenError(rank, kind == CollKind::kAllGather ? "tideAllGather" : "tideReduceScatter");
  }
  TIDE_CHECK(checkCallOrder(rank, kind, epoch, lock));
  StreamUse* uses = streamUse_[static_cast<int>(kind)];
  for (int q = 0; q < nRanks_; ++q) {
    if (q != rank && uses[q].epoch == epoch && uses[q].stream == stream) {
      return fail(tideInvalidUsage, "Cuda",
                  "loopback world: virtual ranks %d and %d use the same stream for one %s; every virtual rank needs "
                  "a stream of its own (this world is now unusable: rank %d's enqueued work waits for a rank that "
                  "cannot run)",
                  q, rank, kind == CollKind::kAllGather ? "all-gather" : "reduce-scatter", q);
    }
  }
  uses[rank].epoch = epoch;
  uses[rank].stream = stream;
  return tideSuccess;
}

tideResult_t LoopbackWorld::checkCallOrder(int rank, CollKind kind, uint64_t epoch,
                                           std::unique_lock<std::mutex>& lock) {
  const char* fn = kind == CollKind::kAllGather ? "tideAllGather" : "tideReduceScatter";
  for (const auto& kv : pending_) {
    const PendingPushes& p = kv.second;
    if (!p.tokens || static_cast<int>(p.issue.size()) <= rank || !p.issue[rank]) continue;
    char missing[64] = {0};
    size_t at = 0;
    for (int q = 0; q < nRanks_ && at + 4 < sizeof(missing); ++q) {
      if (!p.issue[q]) at += snprintf(missing + at, sizeof(missing) - at, "%s%d", at ? ", " : "", q);
    }
    return fail(tideInvalidUsage, "Cuda",
                "%s (epoch %llu): loopback world: virtual rank %d's %s epoch %llu (token protocol, "
                "NCCL_TIDE_EAGER_GRAPHS=1) is still held on the host until virtual rank(s) %s make their matching "
                "call, and rank %d's next collective cannot be enqueued before it (it would run ahead of the held "
                "call on rank %d's stream). Make every virtual rank's call of one collective before any rank's next "
                "(nothing was enqueued; the world is still usable)",
                fn, static_cast<unsigned long long>(epoch), rank,
                kv.first.first == static_cast<int>(CollKind::kAllGather) ? "all-gather" : "reduce-scatter",
                static_cast<unsigned long long>(kv.first.second), missing, rank, rank);
  }
  // The last rank of this rank's previous token call may be issuing its rounds right now, on another thread.
  issuedCv_.wait(lock, [&] { return issuing_[rank] == 0 || !broken_.empty(); });
  if (!broken_.empty()) return brokenError(rank, fn);
  return tideSuccess;
}

tideResult_t LoopbackWorld::checkCapture(int rank, CollKind kind, unsigned long long captureId) {
  auto kindName = [](CollKind k) { return k == CollKind::kAllGather ? "all-gather" : "reduce-scatter"; };
  std::lock_guard<std::mutex> lock(mu_);
  auto it = captures_.find(captureId);
  if (it != captures_.end()) {
    if (it->second.rank != rank) {
      return fail(tideUnsupported, "Cuda",
                  "loopback world: virtual ranks %d and %d capture into the same CUDA graph; each virtual rank must "
                  "capture its collectives on a stream of its own into a graph of its own (nothing was enqueued; the "
                  "capture is still valid)",
                  it->second.rank, rank);
    }
    return fail(tideUnsupported, "Cuda",
                "loopback world: virtual rank %d's captured graph already holds a TIDE %s; a loopback graph may hold "
                "only one TIDE collective (all virtual ranks share the device's copy-engine queues, and a graph launch "
                "enqueues the whole graph at once, so a second collective's copies could wait in those queues ahead "
                "of copies they depend on). Capture this %s into a separate graph (nothing was enqueued; the capture "
                "is still valid)",
                rank, kindName(it->second.kind), kindName(kind));
  }
  // Ids grow per process: drop the oldest (an ended capture) rather than everything, which could forget a capture
  // still in progress and let a second collective into its graph.
  if (captures_.size() > 4096) captures_.erase(captures_.begin());
  captures_[captureId] = CaptureUse{rank, kind};
  return tideSuccess;
}

tideResult_t LoopbackWorld::precheckSteps(int rank, CollKind kind, uint64_t epoch, int numSteps, bool tokens) {
  const char* what = kind == CollKind::kAllGather ? "all-gather" : "reduce-scatter";
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.empty()) return brokenError(rank, kind == CollKind::kAllGather ? "tideAllGather" : "tideReduceScatter");
  PendingPushes& p = pending_[std::make_pair(static_cast<int>(kind), epoch)];
  if (p.issue.empty()) {
    p.issue.resize(nRanks_);
    p.numChunks = numSteps;
    p.tokens = tokens;
    return tideSuccess;
  }
  if (p.numChunks != numSteps) {
    char why[256];
    snprintf(why, sizeof(why),
             "%s epoch %llu: virtual rank %d has %d steps but an earlier rank has %d (the ranks passed different "
             "layouts; the earlier ranks' streams wait for work that is never issued)",
             what, static_cast<unsigned long long>(epoch), rank, numSteps, p.numChunks);
    markBroken(why);
    return fail(tideMismatch, "Cuda", "%s; every rank must pass the same layout in the same order", why);
  }
  return tideSuccess;
}

tideResult_t LoopbackWorld::scheduleSteps(int rank, CollKind kind, uint64_t epoch, int numChunks, IssueFn issue) {
  const std::pair<int, uint64_t> key(static_cast<int>(kind), epoch);
  const char* what = kind == CollKind::kAllGather ? "all-gather" : "reduce-scatter";
  std::vector<IssueFn> ready;
  bool tokens = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) return brokenError(rank, kind == CollKind::kAllGather ? "tideAllGather" : "tideReduceScatter");
    PendingPushes& p = pending_[key];
    if (p.issue.empty()) {
      p.issue.resize(nRanks_);
      p.numChunks = numChunks;
    }
    if (p.numChunks != numChunks) {
      char why[256];
      snprintf(why, sizeof(why),
               "%s epoch %llu: virtual rank %d has %d steps but an earlier rank has %d (the ranks passed different "
               "layouts; the earlier ranks' streams wait for work that is never issued)",
               what, static_cast<unsigned long long>(epoch), rank, numChunks, p.numChunks);
      markBroken(why);
      return fail(tideMismatch, "Cuda", "%s; every rank must pass the same layout in the same order", why);
    }
    if (p.issue[rank]) {
      markBroken("a virtual rank submitted the same deferred collective twice (internal error)");
      return fail(tideInternalError, "Cuda", "%s epoch %llu: virtual rank %d submitted twice", what,
                  static_cast<unsigned long long>(epoch), rank);
    }
    p.issue[rank] = std::move(issue);
    if (++p.submitted < nRanks_) return tideSuccess;
    ready = std::move(p.issue);
    tokens = p.tokens;
    pending_.erase(key);
    if (tokens) {
      for (int r = 0; r < nRanks_; ++r) ++issuing_[r];  // checkCallOrder: a next call of rank r waits for the loop
    }
  }
  // Ends the issuing state of every rank on every path out of the loop below.
  struct IssuingGuard {
    LoopbackWorld* w;
    bool on;
    ~IssuingGuard() {
      if (!on) return;
      std::lock_guard<std::mutex> lock(w->mu_);
      for (int r = 0; r < w->nRanks_; ++r) --w->issuing_[r];
      w->issuedCv_.notify_all();
    }
  } issuingGuard{this, tokens};
  // Step-major, rank-minor: a copy never sits in a shared copy-engine queue ahead of a copy it waits for.
  for (int k = 0; k <= numChunks; ++k) {
    for (int r = 0; r < nRanks_; ++r) {
      tideResult_t res = ready[r](k);
      if (res != tideSuccess) {
        // Issued partway: every rank's stream may now wait for steps that will never be issued. Make every later call
        // of every rank of this world fail with the reason (not only this, the last, submitter).
        char why[320];
        snprintf(why, sizeof(why),
                 "issuing step %d of %d of virtual rank %d's deferred %s epoch %llu failed (%s: %s); the ranks' "
                 "streams may wait forever for the steps not issued",
                 k, numChunks, r, what, static_cast<unsigned long long>(epoch), tideGetErrorString(res),
                 tideGetLastError());
        std::lock_guard<std::mutex> lock(mu_);
        markBroken(why);
        return res;
      }
    }
  }
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
