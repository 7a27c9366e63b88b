// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "interposer_counters.h"

#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "../core/fork_guard.h"

namespace tide {
namespace interposer {
namespace {

const char* const kReasonText[] = {
    "taken by TIDE",
    "a ...Config call (per-collective config is honoured only by NCCL)",
    "unknown ncclDataType_t",
    "smaller than NCCL_TIDE_ENABLE_MIN_BYTES",
    "reduce-scatter with an op TIDE does not run",
    "reduce-scatter in a type other than fp32/fp16/bf16",
    "bf16/fp16 reduce-scatter without NCCL_TIDE_RS_ACCUM=FP32 (TIDE accumulates in fp32 only)",
    "inside a group that spans several NCCL communicators or streams (the group goes to NCCL whole)",
    "this libnccl-tide.so is not a CUDA build: nothing can be run by TIDE",
    "on a stream under CUDA graph capture (the interposer does not capture TIDE calls)",
    "TIDE is off for this communicator (a TIDE call or the comm's creation failed; its WARN says why)",
    "reduce-scatter whose output overlaps its input other than NCCL's in-place form",
    "inside a group with a call on a stream under CUDA graph capture (the group goes to NCCL whole)",
    "recorded in a group whose ncclGroupEnd failed (NCCL cancels the group: not run)",
    "inside a group that finalizes or destroys the call's communicator (the group goes to NCCL whole)",
    "inside a group ended by ncclGroupSimulateEnd (NCCL simulates it, nothing runs)",
    "count times the element size does not fit in 64 bits",
    "count 0: nothing to move (a TIDE layout has at least one element)",
};
static_assert(sizeof(kReasonText) / sizeof(kReasonText[0]) == kNumReasons, "one text per reason");

std::mutex gMu;
// Never freed: calls may be counted by threads still running while the process exits.
auto* gByComm = new std::unordered_map<void*, tideInterposerCounters_t>();
tideInterposerCounters_t gTotal{};
[[maybe_unused]] const bool gCountersForkGuarded = forkguard::guard(forkguard::kInterposerCounters, &gMu);

void add(tideInterposerCounters_t* c, Coll coll, Reason reason, uint64_t bytes) {
  if (reason == kTaken) {
    ++c->takenCalls[coll];
    c->takenBytes[coll] += bytes;
  } else {
    ++c->forwardedCalls[coll][reason];
    c->forwardedBytes[coll][reason] += bytes;
  }
}

void stamp(tideInterposerCounters_t* c) {
  c->size = sizeof(*c);
  c->version = TIDE_INTERPOSER_COUNTERS_VERSION;
}

}  // namespace

const char* reasonText(Reason r) { return r >= 0 && r < kNumReasons ? kReasonText[r] : nullptr; }

void count(void* ncclComm, Coll coll, Reason reason, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(gMu);
  add(&(*gByComm)[ncclComm], coll, reason, bytes);
  add(&gTotal, coll, reason, bytes);
}

void countCopyOut(void* ncclComm, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(gMu);
  for (tideInterposerCounters_t* c : {&(*gByComm)[ncclComm], &gTotal}) {
    ++c->allGatherCopyOutCalls;
    c->allGatherCopyOutBytes += bytes;
  }
}

void read(void* ncclComm, tideInterposerCounters_t* out) {
  std::lock_guard<std::mutex> lock(gMu);
  if (ncclComm == nullptr) {
    *out = gTotal;
  } else {
    auto it = gByComm->find(ncclComm);
    *out = it == gByComm->end() ? tideInterposerCounters_t{} : it->second;
  }
  stamp(out);
}

void summary(void* ncclComm, char* buf, size_t len) {
  tideInterposerCounters_t c;
  read(ncclComm, &c);
  size_t at = 0;
  for (int coll = 0; coll < 2 && at < len; ++coll) {
    uint64_t calls = 0, bytes = 0;
    for (int r = 1; r < kNumReasons; ++r) {
      calls += c.forwardedCalls[coll][r];
      bytes += c.forwardedBytes[coll][r];
    }
    int n = snprintf(buf + at, len - at, "%s%s taken %llu calls / %llu bytes, to NCCL %llu calls / %llu bytes",
                     coll == 0 ? "" : "; ", coll == 0 ? "all-gather" : "reduce-scatter",
                     static_cast<unsigned long long>(c.takenCalls[coll]),
                     static_cast<unsigned long long>(c.takenBytes[coll]), static_cast<unsigned long long>(calls),
                     static_cast<unsigned long long>(bytes));
    if (n < 0) break;
    at += static_cast<size_t>(n);
    if (coll == 0 && at < len) {
      n = snprintf(buf + at, len - at, " (%llu taken with the copy-out)",
                   static_cast<unsigned long long>(c.allGatherCopyOutCalls));
      if (n < 0) break;
      at += static_cast<size_t>(n);
    }
  }
  if (len > 0 && at >= len) buf[len - 1] = '\0';
}

bool forget(void* ncclComm) {
  std::lock_guard<std::mutex> lock(gMu);
  return gByComm->erase(ncclComm) != 0;
}

}  // namespace interposer
}  // namespace tide
