// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// ncclGroupStart / ncclGroupEnd for the interposer: eligible calls inside a group are recorded and run by TIDE
// after the group, so that grouped all-gathers and reduce-scatters (torch's coalescing manager: Megatron-Core,
// Megatron-FSDP; DeepSpeed MiCS) are TIDE's too (docs/usage.md "Groups").
//
// Per thread, as NCCL's groups are: only the outermost ncclGroupEnd launches. Inside a group an eligible call is
// recorded (its op already resolved: torch destroys a PREMUL_SUM op before the group ends) and returns success; any
// other call goes to NCCL at once. At the outermost end the real ncclGroupEnd is forwarded first (TIDE's own NCCL
// traffic must not land inside the application's group), then the recorded calls run through TIDE in call order,
// each one TIDE cannot take handed to NCCL. A group whose calls span several communicators, or with a call on a
// stream under CUDA graph capture, goes to NCCL whole: from that call on, what was recorded is handed to NCCL
// inside the group, in order, and so is every later call of the group. Each decision depends only on the calls'
// arguments, which every rank shares, so all ranks go the same way.
//
// No NCCL and no CUDA here: the interposer supplies both through Hooks, which the unit tests fake
// (tests/native/interposer_group_test.cc).
#ifndef TIDE_API_INTERPOSER_GROUP_H_
#define TIDE_API_INTERPOSER_GROUP_H_

#include <cstddef>
#include <cstdint>

#include "interposer_counters.h"
#include "interposer_ops.h"

namespace tide {
namespace interposer {
namespace group {

// One all-gather or reduce-scatter, as the application called it.
struct Call {
  Coll coll = kCollAllGather;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // sendcount (all-gather) or recvcount (reduce-scatter)
  int dtype = 0;
  int op = 0;              // reduce-scatter: the ncclRedOp_t passed
  ops::Resolved resolved;  // reduce-scatter: what the op means for TIDE, resolved at the call
  void* comm = nullptr;
  void* stream = nullptr;
  uint64_t bytes = 0;  // count times the element size
};

// ncclResult_t values used here.
constexpr int kNcclSuccess = 0;
constexpr int kNcclInProgress = 7;

class Hooks {
 public:
  virtual ~Hooks() = default;
  // The call to NCCL's own entry point, counted with `why`; NCCL's result.
  virtual int forward(const Call& c, Reason why) = 0;
  // The call through TIDE: its ncclResult_t if TIDE took it (counted), else kPassToNccl with *why set.
  virtual int runTide(const Call& c, Reason* why) = 0;
  virtual int realGroupEnd() = 0;
  // A nonblocking communicator's group launch (ncclInProgress) has finished: NCCL's result for comm.
  virtual int waitLaunched(void* comm) = 0;
  virtual bool capturing(void* stream) = 0;
  virtual int destroyOp(void* comm, int op) = 0;  // NCCL's ncclRedOpDestroy
};

// After NCCL's ncclGroupStart succeeded.
void started();

// Inside a group on this thread.
bool open();

// An all-gather or reduce-scatter inside a group, `eligible` or not (why: its reason when not). Records it, or
// hands it to NCCL at once (what was recorded first, if this call makes the group go to NCCL whole). Returns the
// ncclResult_t for the application: success for a recorded call.
int call(const Call& c, bool eligible, Reason why, Hooks& h);

// ncclRedOpDestroy inside a group of a PREMUL_SUM op a recorded call uses: kept until the group's end, when the
// call has run (true); false if the op can be destroyed now.
bool postponeDestroy(void* comm, int op);

// ncclGroupEnd: the real one at depth > 1; at the outermost, the real one and then the recorded calls. Returns the
// first error, else success (a nonblocking communicator's launch is waited for first).
int ended(Hooks& h);

}  // namespace group
}  // namespace interposer
}  // namespace tide

#endif  // TIDE_API_INTERPOSER_GROUP_H_
