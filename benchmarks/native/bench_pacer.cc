// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// LinkPacer (bench_pacer.h). Timeline, per transfer: t0 = max(when the stream reached its first piece, when the
// previous transfer's last piece was released); piece j is released at t0 + (bytes of the transfer's pieces up
// to and including j) / rate. The release is a plain store into mapped host memory that the stream's
// cuStreamWaitValue32 (GEQ, cyclic) polls; the arrival is a cuStreamWriteValue32 into the same page that the
// thread polls, one word per stream (bench_pacer.h, kMaxStreams). The thread spins (with a pause) only while a
// transfer is pending; otherwise it sleeps.
#include "bench_pacer.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "cuda/copy_batch.h"
#include "cuda/cuda_check.h"
#include "cuda/driver_ops.h"
#include "errors.h"

namespace tide {
namespace cuda {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kReleased = 0;
constexpr int kArrived = 16;  // slot s's arrival word: kArrived + 16 s (64 bytes apart, after kReleased's line)
constexpr int kArrivedStride = 16;

inline bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

inline void cpuPause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

double usBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

}  // namespace

void LinkPacer::releaseUpTo(uint32_t id) {
  // Never backwards: after a failed enqueue has released a whole transfer, the thread still releases that
  // transfer's earlier pieces one by one, and lowering the word would block a wait it had already let pass.
  uint32_t cur = __atomic_load_n(host_ + kReleased, __ATOMIC_ACQUIRE);
  while (!reached(cur, id) &&
         !__atomic_compare_exchange_n(host_ + kReleased, &cur, id, false, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) {
  }
}

LinkPacer::~LinkPacer() {
  shutdown();
  if (host_ != nullptr) {
    (void)cudaFreeHost(host_);
    (void)cudaGetLastError();
  }
}

tideResult_t LinkPacer::init() {
  if (!(rate_ > 0)) return fail(tideInvalidArgument, "Bench", "pacer: bytesPerSecond must be > 0");
  if (piece_ < 4096) return fail(tideInvalidArgument, "Bench", "pacer: pieceBytes must be >= 4096");
  TIDE_CHECK(driverOpsInit());
  void* h = nullptr;
  TIDE_CUDA_CHECK(cudaHostAlloc(&h, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
  host_ = static_cast<uint32_t*>(h);
  for (int i = 0; i < 1024; ++i) host_[i] = 0;
  void* d = nullptr;
  TIDE_CUDA_CHECK(cudaHostGetDevicePointer(&d, h, 0));
  dev_ = static_cast<uint32_t*>(d);
  thread_ = std::thread([this] { run(); });
  return tideSuccess;
}

tideResult_t LinkPacer::pacedCopy(int count, void* const* dst, const void* const* src, const size_t* bytes,
                                  cudaStream_t stream) {
  if (count < 0 || (count > 0 && (dst == nullptr || src == nullptr || bytes == nullptr))) {
    return fail(tideInvalidArgument, "Bench", "pacedCopy: bad copy list (count %d)", count);
  }
  if (stream == nullptr) return fail(tideInvalidArgument, "Bench", "pacedCopy: stream is NULL (use a real stream)");
  int device = 0;
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  // Cut the list into pieces of piece_ bytes (a copy may span pieces).
  std::vector<CopyList> lists;
  std::vector<uint64_t> sizes;
  CopyList cur;
  uint64_t curBytes = 0;
  for (int i = 0; i < count; ++i) {
    size_t off = 0;
    while (off < bytes[i]) {
      const size_t take = std::min<size_t>(bytes[i] - off, piece_ - curBytes);
      cur.add(static_cast<char*>(dst[i]) + off, static_cast<const char*>(src[i]) + off, take);
      off += take;
      curBytes += take;
      if (curBytes == piece_) {
        lists.push_back(cur);
        sizes.push_back(curBytes);
        cur.clear();
        curBytes = 0;
      }
    }
  }
  if (curBytes > 0) {
    lists.push_back(cur);
    sizes.push_back(curBytes);
  }
  if (lists.empty()) return tideSuccess;
  // One transfer at a time (callers on several threads): the thread's queue must hold the ids in increasing order,
  // since a release is one monotonic word.
  std::lock_guard<std::mutex> transferLock(transferMu_);
  int slot = 0;
  while (slot < static_cast<int>(streams_.size()) && streams_[slot] != stream) ++slot;
  const bool newSlot = slot == static_cast<int>(streams_.size());
  if (newSlot) {
    if (slot == kMaxStreams) {
      return fail(tideInvalidArgument, "Bench", "pacedCopy: a pacer serves at most %d streams", kMaxStreams);
    }
    streams_.push_back(stream);
  }
  // Each piece is handed to the thread as soon as its wait and copy are on the stream, not after the whole
  // transfer: an enqueue can block once the stream holds as many operations as the driver queues for it (a few
  // hundred pieces: a Llama-70B layer's AG share is 354 pieces of 4 MiB, more of 1 MiB), and a stream blocked on a
  // piece that the thread has not been told about would never drain. The ids are
  // taken under the lock for the whole transfer, so no other transfer's pieces interleave with this one's.
  uint32_t firstId = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return fail(tideInvalidUsage, "Bench", "pacedCopy: the pacer is shut down");
    firstId = nextId_ + 1;
    nextId_ += static_cast<uint32_t>(lists.size());
  }
  // A new slot's word starts just below this transfer's id (not 0, which the cyclic comparison would take as
  // reached once ids pass 2^31); the stream writes it only after the operations enqueued below.
  if (newSlot) __atomic_store_n(host_ + kArrived + kArrivedStride * slot, firstId - 1, __ATOMIC_RELEASE);
  for (size_t j = 0; j < lists.size(); ++j) {
    const Piece p{firstId + static_cast<uint32_t>(j), sizes[j], j == 0, slot};
    std::vector<FlagOp> ops;
    if (p.start) ops.push_back({FlagOp::kWrite, dev_ + kArrived + kArrivedStride * slot, p.id});
    ops.push_back({FlagOp::kWait, dev_ + kReleased, p.id});
    tideResult_t r = enqueueFlagOps(stream, ops);
    if (r == tideSuccess) r = lists[j].enqueue(stream, device);
    if (r != tideSuccess) {
      // The stream may hold waits for pieces the thread will never see: release them all now (GEQ waits).
      std::lock_guard<std::mutex> lock(mu_);
      releaseUpTo(firstId + static_cast<uint32_t>(lists.size()) - 1);
      return r;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(p);
      ++enqueued_;
    }
    cv_.notify_all();
  }
  return tideSuccess;
}

void LinkPacer::run() {
  Clock::time_point linkFree = Clock::now(), t0 = linkFree;
  uint64_t cum = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) break;
    const Piece p = queue_.front();
    lock.unlock();
    bool stopping = false;
    if (p.start) {
      // Wait for the stream to reach the transfer (spin: the arrival is a microsecond-scale event).
      while (!reached(__atomic_load_n(host_ + kArrived + kArrivedStride * p.slot, __ATOMIC_ACQUIRE), p.id)) {
        cpuPause();
        if (__atomic_load_n(&stop_, __ATOMIC_RELAXED)) {
          stopping = true;
          break;
        }
      }
      const Clock::time_point now = Clock::now();
      lock.lock();
      ++transfers_;
      if (now > linkFree) idleUs_ += usBetween(linkFree, now);
      lock.unlock();
      t0 = std::max(now, linkFree);
      cum = 0;
    }
    cum += p.bytes;
    const Clock::time_point due =
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(static_cast<double>(cum) / rate_));
    while (!stopping && Clock::now() < due) {
      cpuPause();
      if (__atomic_load_n(&stop_, __ATOMIC_RELAXED)) stopping = true;
    }
    const Clock::time_point at = Clock::now();
    releaseUpTo(p.id);
    linkFree = due;
    lock.lock();
    if (!queue_.empty()) queue_.pop_front();
    ++released_;
    if (!stopping) maxLagUs_ = std::max(maxLagUs_, usBetween(due, at));
    if (stopping || stop_) break;
  }
  // Let every enqueued wait pass, so that no stream stays blocked on a pacer that is gone.
  releaseUpTo(nextId_);
}

void LinkPacer::stats(double* out, int count) {
  std::lock_guard<std::mutex> lock(mu_);
  const double v[5] = {static_cast<double>(released_), static_cast<double>(transfers_), maxLagUs_, idleUs_,
                       static_cast<double>(enqueued_)};
  for (int i = 0; i < count && i < 5; ++i) out[i] = v[i];
}

void LinkPacer::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    __atomic_store_n(&stop_, true, __ATOMIC_RELAXED);
    if (host_ != nullptr) releaseUpTo(nextId_);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace cuda
}  // namespace tide
