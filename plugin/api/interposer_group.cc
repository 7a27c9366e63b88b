// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "interposer_group.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "interposer_tide.h"

namespace tide {
namespace interposer {
namespace group {
namespace {

struct State {
  int depth = 0;
  void* comm = nullptr;  // the communicator of the group's first all-gather or reduce-scatter
  Reason whole = kTaken;  // kTaken: TIDE may take the group's calls; else why the group goes to NCCL whole
  std::vector<Call> recorded;
  std::vector<std::pair<void*, int>> destroys;  // postponed ncclRedOpDestroy
};
thread_local State t;

int firstError(int have, int r) { return have != kNcclSuccess ? have : r; }

}  // namespace

void started() { ++t.depth; }

bool open() { return t.depth > 0; }

int call(const Call& c, bool eligible, Reason why, Hooks& h) {
  int rc = kNcclSuccess;
  if (t.whole == kTaken) {
    if (t.comm == nullptr) t.comm = c.comm;
    t.whole = c.comm != t.comm ? kGroupOfSeveralComms : h.capturing(c.stream) ? kGroupCaptured : kTaken;
    // From here the group is NCCL's: what was recorded goes in first, keeping the application's order.
    if (t.whole != kTaken) {
      for (const Call& r : t.recorded) rc = firstError(rc, h.forward(r, t.whole));
      t.recorded.clear();
    }
  }
  if (!eligible) return firstError(rc, h.forward(c, why));
  if (t.whole != kTaken) return firstError(rc, h.forward(c, t.whole));
  t.recorded.push_back(c);
  return rc;
}

bool postponeDestroy(void* comm, int op) {
  if (t.depth == 0) return false;
  const bool used = std::any_of(t.recorded.begin(), t.recorded.end(), [&](const Call& c) {
    return c.coll == kCollReduceScatter && c.comm == comm && c.op == op;
  });
  if (used) t.destroys.emplace_back(comm, op);
  return used;
}

int ended(Hooks& h) {
  if (t.depth == 0) return h.realGroupEnd();  // NCCL says what it makes of an unmatched end
  if (--t.depth > 0) return h.realGroupEnd();
  State s = std::move(t);
  t = State{};
  int rc = h.realGroupEnd();
  if (rc == kNcclInProgress) {
    // A nonblocking communicator launches the group in the background; TIDE's calls come after it.
    std::vector<void*> comms;
    for (const Call& c : s.recorded) {
      if (std::find(comms.begin(), comms.end(), c.comm) == comms.end()) comms.push_back(c.comm);
    }
    rc = kNcclSuccess;
    for (void* comm : comms) rc = firstError(rc, h.waitLaunched(comm));
  }
  for (const Call& c : s.recorded) {
    Reason why = kTaken;
    // After a failed group NCCL reports the communicator's error for each call; TIDE is not asked.
    int r = rc == kNcclSuccess ? h.runTide(c, &why) : kPassToNccl;
    if (r == kPassToNccl) r = h.forward(c, rc == kNcclSuccess ? why : kGroupFailed);
    rc = firstError(rc, r);
  }
  for (const auto& d : s.destroys) rc = firstError(rc, h.destroyOp(d.first, d.second));
  return rc;
}

}  // namespace group
}  // namespace interposer
}  // namespace tide
