// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The link model of the single-GPU "one rank's share" benchmark (tide_bench.h): copy-engine copies paced to a byte
// rate by stream waits on words in mapped host memory that a host thread releases on time. The pacer runs nothing
// on the SMs (the waits and the arrival write are stream memory operations, the copies the hinted batch API); the
// copies themselves, when same-device, run as SM kernels on an H200 (they wait behind a kernel that holds every SM),
// while from pinned host memory they are copy-engine work.
#ifndef TIDE_BENCH_PACER_H_
#define TIDE_BENCH_PACER_H_

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "tide.h"

namespace tide {
namespace cuda {

class LinkPacer {
 public:
  LinkPacer(double bytesPerSecond, size_t pieceBytes) : rate_(bytesPerSecond), piece_(pieceBytes) {}
  ~LinkPacer();
  LinkPacer(const LinkPacer&) = delete;
  LinkPacer& operator=(const LinkPacer&) = delete;

  // Allocates the mapped words and starts the thread.
  tideResult_t init();
  // One transfer (see tide_bench.h) on stream, on the current device.
  tideResult_t pacedCopy(int count, void* const* dst, const void* const* src, const size_t* bytes,
                         cudaStream_t stream);
  void stats(double* out, int count);
  // Releases everything enqueued and joins the thread (idempotent).
  void shutdown();

 private:
  struct Piece {
    uint32_t id;
    uint64_t bytes;
    bool start;  // first piece of a transfer
    int slot;    // the stream's arrival word
  };
  // Arrival words: one per stream, each on a 64-byte line of its own after the release word's, in the 4 KiB page.
  // One shared word would go backwards when a later transfer's stream reported before an earlier one's, and the
  // thread, waiting for the earlier id, would then miss the later transfer's arrival.
  static constexpr int kMaxStreams = 63;
  void run();
  void releaseUpTo(uint32_t id);  // raises the release word to id (cyclic order), never lowers it

  const double rate_;
  const size_t piece_;
  uint32_t* host_ = nullptr;  // [0] released (host writes), [16 + 16 slot] arrived (stream slot writes): separate lines
  uint32_t* dev_ = nullptr;   // the same words as device pointers
  std::thread thread_;
  std::mutex transferMu_;  // held by pacedCopy for a whole transfer
  std::vector<cudaStream_t> streams_;  // slot of each stream that has paced a transfer (under transferMu_)
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Piece> queue_;
  uint32_t nextId_ = 0;
  bool stop_ = false;
  // Stats (under mu_).
  uint64_t released_ = 0, transfers_ = 0, enqueued_ = 0;
  double maxLagUs_ = 0, idleUs_ = 0;
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_BENCH_PACER_H_
