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
  bool seen = false;      // the group has had an all-gather or reduce-scatter
  void* comm = nullptr;   // the communicator and stream of the group's first one
  void* stream = nullptr;
  Reason whole = kTaken;  // kTaken: TIDE may take the group's calls; else why the group goes to NCCL whole
  std::vector<Call> recorded;
  std::vector<std::pair<void*, int>> destroys;  // postponed ncclRedOpDestroy
};
thread_local State t;

int firstError(int have, int r) { return have != kNcclSuccess ? have : r; }

// From here the group is NCCL's: what was recorded goes in first, inside the group, in the application's order.
int goWhole(Reason why, Hooks& h) {
  int rc = kNcclSuccess;
  t.whole = why;
  for (const Call& r : t.recorded) rc = firstError(rc, h.forward(r, why));
  t.recorded.clear();
  return rc;
}

// A forward outside any group on a nonblocking communicator may return ncclInProgress: NCCL takes no other call on
// that communicator until its launch is done, so it is waited for before the next one.
int forwardSettled(const Call& c, Reason why, Hooks& h) {
  int r = h.forward(c, why);
  return r == kNcclInProgress ? h.waitLaunched(c.comm) : r;
}

}  // namespace

void started() { ++t.depth; }

bool open() { return t.depth > 0; }

int call(const Call& c, bool eligible, Reason why, Hooks& h, bool forward) {
  int rc = kNcclSuccess;
  if (t.whole == kTaken) {
    if (!t.seen) {
      t.seen = true;
      t.comm = c.comm;
      t.stream = c.stream;
    }
    // NCCL makes every stream of a group wait for the whole group; TIDE's calls run on their own stream after it.
    const Reason turn = c.comm != t.comm || c.stream != t.stream ? kGroupOfSeveralComms
                        : h.capturing(c.stream)                  ? kGroupCaptured
                                                                 : kTaken;
    if (turn != kTaken) rc = goWhole(turn, h);
  }
  if (!forward) return rc;
  if (!eligible) return firstError(rc, h.forward(c, why));
  if (t.whole != kTaken) return firstError(rc, h.forward(c, t.whole));
  t.recorded.push_back(c);
  return rc;
}

int commGoing(void* comm, Hooks& h) {
  if (t.depth == 0) return kNcclSuccess;
  // NCCL finalizes a communicator at the group's end, after the group's calls: they must be NCCL's too.
  const bool used = std::any_of(t.recorded.begin(), t.recorded.end(), [&](const Call& c) { return c.comm == comm; });
  return used ? goWhole(kGroupWithTeardown, h) : kNcclSuccess;
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
  const int groupRc = h.realGroupEnd();
  int rc = groupRc;
  if (groupRc == kNcclSuccess || groupRc == kNcclInProgress) {
    // A nonblocking communicator launches the group in the background and takes no other call until it is done:
    // TIDE's calls (and its own NCCL traffic) come after it. ncclInProgress stays the application's answer.
    int launch = kNcclSuccess;
    if (groupRc == kNcclInProgress) {
      std::vector<void*> comms;
      for (const Call& c : s.recorded) {
        if (std::find(comms.begin(), comms.end(), c.comm) == comms.end()) comms.push_back(c.comm);
      }
      for (void* comm : comms) launch = firstError(launch, h.waitLaunched(comm));
      if (launch != kNcclSuccess) rc = launch;
    }
    int callsRc = kNcclSuccess;
    for (const Call& c : s.recorded) {
      if (launch != kNcclSuccess) {
        h.count(c, kGroupFailed);  // the launch failed: the communicator is in error and would refuse the call
        continue;
      }
      Reason why = kTaken;
      int r = h.runTide(c, &why);
      if (r == kPassToNccl) r = forwardSettled(c, why, h);
      callsRc = firstError(callsRc, r);
    }
    if (callsRc != kNcclSuccess) rc = callsRc;
  } else {
    // NCCL cancels a failed group whole: nothing of it runs, the recorded calls neither.
    for (const Call& c : s.recorded) h.count(c, kGroupFailed);
  }
  for (const auto& d : s.destroys) {
    const int r = h.destroyOp(d.first, d.second);
    if (r != kNcclSuccess && (rc == kNcclSuccess || rc == kNcclInProgress)) rc = r;
  }
  return rc;
}

int simulatedEnd(Hooks& h) {
  if (t.depth == 1) {
    // NCCL ends the group without launching it; its simulation must see the recorded calls.
    (void)goWhole(kGroupSimulated, h);
    State s = std::move(t);
    t = State{};
    int rc = h.realGroupSimulateEnd();
    for (const auto& d : s.destroys) (void)h.destroyOp(d.first, d.second);
    return rc;
  }
  if (t.depth > 0) --t.depth;
  return h.realGroupSimulateEnd();
}

}  // namespace group
}  // namespace interposer
}  // namespace tide
