// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// What only a provider whose ranks share one device's hardware queues needs (RankOrdering::sharedQueues; built by the
// loopback stand-in, loopback.h): a copy queued behind a copy it waits for (through flags) would never run, so the
// ranks' steps are issued step-major, rank-minor once every rank has submitted, and what could break that order is
// refused or makes the world unusable. Called by the program interpreter (program_exec.cc), the executors and
// markCallFailed (comm.h).
//
// Internal to the library (C++, not part of include/tide.h, loaded by nothing outside it): no ABI version.
#ifndef TIDE_CUDA_SHARED_QUEUES_H_
#define TIDE_CUDA_SHARED_QUEUES_H_

#include <cstdint>
#include <functional>

#include "rank_ordering.h"
#include "tide.h"

namespace tide {
namespace cuda {

class SharedQueues {
 public:
  using IssueFn = std::function<tideResult_t(int group)>;

  // Step programs are compiled in prog::Mode::kDeferred and their issue groups handed to scheduleSteps:
  // issue(k) for k = 0 .. numSteps (inclusive) enqueues issue group k of this rank's program of collective
  // (kind, epoch). Steps are numbered so that a copy of step k only ever waits (through flags) for work of steps < k
  // of any rank, or of step k of a lower rank, so no copy is queued behind a copy it waits for.
  virtual tideResult_t scheduleSteps(CollKind kind, uint64_t epoch, int numSteps, IssueFn issue) = 0;

  // Called before a deferred program's call-time steps are enqueued: fails (enqueueing nothing) if the groups could
  // not be issued later (the world is unusable, or an earlier rank of (kind, epoch) has another group count, which
  // then makes the world unusable). tokens: the program is a token program issued in rounds
  // (BoundProgram::issueTokens), whose later rounds must be issued before this rank's next collective enqueues
  // anything (checkStream refuses that next call while the rounds are held).
  virtual tideResult_t precheckSteps(CollKind kind, uint64_t epoch, int numSteps, bool tokens) = 0;

  // An eager call of (kind, epoch) failed after the rank's epoch advanced (while its work was being enqueued, or in
  // the deferred issue): part of it may be queued, and the peers' matching calls would wait for the rest. The whole
  // world becomes unusable (every later call of any rank fails with the reason).
  virtual void callFailed(CollKind kind, uint64_t epoch, const char* why) = 0;

  // Check of a collective enqueued into the stream capture `captureId` (cudaStreamGetCaptureInfo) by this rank,
  // after every other check, immediately before the captured enqueue: each rank captures into its own graph, with
  // at most one TIDE collective per graph (tideUnsupported otherwise: a graph launch enqueues a rank's whole graph at
  // once).
  virtual tideResult_t checkCapture(CollKind kind, unsigned long long captureId) = 0;

 protected:
  ~SharedQueues() = default;
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_SHARED_QUEUES_H_
