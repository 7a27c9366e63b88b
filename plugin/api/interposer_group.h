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
// each one TIDE cannot take handed to NCCL. A group whose calls span several communicators or streams, has a call
// on a stream under CUDA graph capture, or finalizes or destroys the communicator of a recorded call goes to NCCL
// whole: from that call on, what was recorded is handed to NCCL inside the group, in order, and so is every later
// call of the group. Each decision depends only on the calls' arguments, which every rank shares, so all ranks go
// the same way.
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
  // Counts a call that neither NCCL nor TIDE runs (its group failed).
  virtual void count(const Call& c, Reason why) = 0;
  // The call through TIDE: its ncclResult_t if TIDE took it (counted), else kPassToNccl with *why set.
  virtual int runTide(const Call& c, Reason* why) = 0;
  virtual int realGroupEnd() = 0;
  virtual int realGroupSimulateEnd() = 0;
  // A nonblocking communicator's launch (ncclInProgress) has finished, however long it takes: NCCL's result for
  // comm. No timer decides here: a rank that gave up would go another way than its peers.
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
// ncclResult_t for the application: success for a recorded call. forward false: the caller forwards the call itself
// (a ...Config call, which has its own entry point); it still counts for the group's communicators and streams.
int call(const Call& c, bool eligible, Reason why, Hooks& h, bool forward = true);

// ncclCommFinalize / ncclCommDestroy of `comm` inside a group: NCCL runs them at the group's end, after the group's
// calls, so a group with recorded calls on comm goes to NCCL whole. Returns NCCL's result of those forwards.
int commGoing(void* comm, Hooks& h);

// ncclRedOpDestroy inside a group of a PREMUL_SUM op a recorded call uses: kept until the group's end, when the
// call has run (true); false if the op can be destroyed now.
bool postponeDestroy(void* comm, int op);

// ncclGroupEnd: the real one at depth > 1; at the outermost, the real one and then the recorded calls. Returns the
// real end's result (ncclInProgress stays ncclInProgress: the launch of a nonblocking communicator is waited for
// before TIDE's calls, and the application's polling then finds it done), or the first error of the recorded
// calls. A failed real end cancels the group whole, as NCCL does: the recorded calls are counted, not run.
int ended(Hooks& h);

// ncclGroupSimulateEnd: NCCL ends the group without launching it; at the outermost level the recorded calls go into
// it first, so that NCCL's simulation sees them.
int simulatedEnd(Hooks& h);

}  // namespace group
}  // namespace interposer
}  // namespace tide

#endif  // TIDE_API_INTERPOSER_GROUP_H_
