// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// What the interposer did with each all-gather and reduce-scatter: calls and bytes taken by TIDE or passed to NCCL,
// per reason, per NCCL communicator and for the whole process (tideInterposerGetCounters, nccl_tide.interposer).
// Bytes are per rank: count times the element size (sendcount for an all-gather, recvcount for a reduce-scatter).
#ifndef TIDE_API_INTERPOSER_COUNTERS_H_
#define TIDE_API_INTERPOSER_COUNTERS_H_

#include <cstddef>
#include <cstdint>

#include "tide.h"

namespace tide {
namespace interposer {

enum Coll : int { kCollAllGather = 0, kCollReduceScatter = 1 };

// Why a call went where it went. kTaken: TIDE ran it. The values are the index of tideInterposerCounters_t's
// forwarded arrays and of tideInterposerReasonString: append only.
enum Reason : int {
  kTaken = 0,
  kConfigCall,
  kUnknownDtype,
  kBelowThreshold,
  kRsOpNotTide,
  kRsDtypeNotFloat,
  kRsHalfWithoutFp32Accum,
  kGroupOfSeveralComms,
  kNoCudaBuild,
  kCaptured,
  kTideOff,
  kRsOverlapNotInPlace,
  kGroupCaptured,
  kGroupFailed,
  kGroupWithTeardown,
  kGroupSimulated,
  kCountTooLarge,
  kEmpty,
  kNumReasons
};
static_assert(kNumReasons <= TIDE_INTERPOSER_MAX_REASONS, "tideInterposerCounters_t holds the reasons");

const char* reasonText(Reason r);

void count(void* ncclComm, Coll coll, Reason reason, uint64_t bytes);
// A taken all-gather that went through the bounce slot and a copy-out (counted as taken too).
void countCopyOut(void* ncclComm, uint64_t bytes);

// One communicator's counters, or the process's totals (ncclComm NULL; released communicators included).
void read(void* ncclComm, tideInterposerCounters_t* out);

// Writes a one-line summary of a communicator's counters ("all-gather taken 12 calls / 3145728 bytes, to NCCL ...").
void summary(void* ncclComm, char* buf, size_t len);

// Drops a released communicator's own counters (its calls stay in the process's totals); false if it had none.
bool forget(void* ncclComm);

}  // namespace interposer
}  // namespace tide

#endif  // TIDE_API_INTERPOSER_COUNTERS_H_
