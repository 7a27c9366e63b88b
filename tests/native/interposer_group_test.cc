// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The interposer's group recorder (plugin/api/interposer_group.h) against fake NCCL and TIDE hooks: the call
// sequences the frameworks send (tests/unit/test_interposer_group.py runs it), then random sequences checked
// against the rules a group must keep.
//
// Usage: interposer_group_test [random sequences]   exit 0: every check passed
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/interposer_group.h"
#include "api/interposer_tide.h"
#include "expect.h"

namespace ip = tide::interposer;
namespace g = tide::interposer::group;

namespace {

void* const kCommA = reinterpret_cast<void*>(0xA000);
void* const kCommB = reinterpret_cast<void*>(0xB000);
void* const kStream = reinterpret_cast<void*>(0x5000);
void* const kCaptured = reinterpret_cast<void*>(0xCA97);

// Every hook call, in order: "nccl <id> <reason>", "tide <id>", "GE", "wait <comm>", "destroy <op>".
struct FakeHooks : g::Hooks {
  std::vector<std::string> log;
  int groupEndResult = g::kNcclSuccess;
  int passFromId = -1;  // runTide passes calls with id >= this to NCCL (TIDE turned off)
  int forwardError = 0;
  int forwardInProgressId = -1;  // forward of this id returns ncclInProgress (a nonblocking communicator)
  static int id(const g::Call& c) { return static_cast<int>(c.count); }
  std::vector<int> forwardedInsideGroup;  // ids NCCL got while the group was open
  int forward(const g::Call& c, ip::Reason why) override {
    if (g::open()) forwardedInsideGroup.push_back(id(c));
    log.push_back("nccl " + std::to_string(id(c)) + " " + std::to_string(why));
    return id(c) == forwardInProgressId ? g::kNcclInProgress : forwardError;
  }
  int runTide(const g::Call& c, ip::Reason* why) override {
    EXPECT(!g::open(), "TIDE runs call %d inside the group", id(c));
    if (passFromId >= 0 && id(c) >= passFromId) {
      *why = ip::kTideOff;
      return ip::kPassToNccl;
    }
    log.push_back("tide " + std::to_string(id(c)));
    return g::kNcclSuccess;
  }
  void count(const g::Call& c, ip::Reason why) override {
    log.push_back("count " + std::to_string(id(c)) + " " + std::to_string(why));
  }
  int realGroupEnd() override {
    log.push_back("GE");
    return groupEndResult;
  }
  int realGroupSimulateEnd() override {
    log.push_back("GSE");
    return g::kNcclSuccess;
  }
  int waitLaunched(void* comm) override {
    log.push_back(comm == kCommA ? "wait A" : "wait B");
    return g::kNcclSuccess;
  }
  bool capturing(void* stream) override { return stream == kCaptured; }
  int destroyOp(void*, int op) override {
    log.push_back("destroy " + std::to_string(op));
    return g::kNcclSuccess;
  }
};

// A call with id `n` (carried in count: the fake hooks log it).
g::Call mk(int n, void* comm = kCommA, ip::Coll coll = ip::kCollReduceScatter, int op = 0, void* stream = kStream) {
  g::Call c;
  c.coll = coll;
  c.count = static_cast<size_t>(n);
  c.comm = comm;
  c.op = op;
  c.stream = stream;
  return c;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

void expectLog(const FakeHooks& h, const std::vector<std::string>& want, const char* what) {
  EXPECT(h.log == want, "%s: got [%s], want [%s]", what, joined(h.log).c_str(), joined(want).c_str());
}

const std::string kSeveral = std::to_string(ip::kGroupOfSeveralComms);
const std::string kCapture = std::to_string(ip::kGroupCaptured);
const std::string kBelow = std::to_string(ip::kBelowThreshold);

void frameworkSequences() {
  {  // Megatron-Core, one bucket: GS, RS (in place), GE. The real end first, then TIDE.
    FakeHooks h;
    g::started();
    EXPECT(g::open(), "open after started");
    EXPECT(g::call(mk(1), true, ip::kTaken, h) == 0, "recorded call returns success");
    EXPECT(h.log.empty(), "nothing runs inside the group");
    EXPECT(g::ended(h) == 0, "group end");
    EXPECT(!g::open(), "closed after the outermost end");
    expectLog(h, {"GE", "tide 1"}, "one bucket");
  }
  {  // Two buckets, then the parameter all-gather group: in call order.
    FakeHooks h;
    g::started();
    g::call(mk(1), true, ip::kTaken, h);
    g::call(mk(2), true, ip::kTaken, h);
    g::ended(h);
    g::started();
    g::call(mk(3, kCommA, ip::kCollAllGather), true, ip::kTaken, h);
    g::ended(h);
    expectLog(h, {"GE", "tide 1", "tide 2", "GE", "tide 3"}, "two buckets and an all-gather group");
  }
  {  // Nested groups (torch's coalescing manager inside a caller's group): only the outermost end launches.
    FakeHooks h;
    g::started();
    g::call(mk(1), true, ip::kTaken, h);
    g::started();
    g::call(mk(2), true, ip::kTaken, h);
    g::ended(h);
    EXPECT(g::open(), "still open after the inner end");
    g::call(mk(3), true, ip::kTaken, h);
    g::ended(h);
    expectLog(h, {"GE", "GE", "tide 1", "tide 2", "tide 3"}, "nested");
  }
  {  // A group over two communicators goes to NCCL whole, in order, before the real end.
    FakeHooks h;
    g::started();
    g::call(mk(1, kCommA), true, ip::kTaken, h);
    g::call(mk(2, kCommA), true, ip::kTaken, h);
    EXPECT(h.log.empty(), "one communicator so far: recorded");
    g::call(mk(3, kCommB), true, ip::kTaken, h);
    g::call(mk(4, kCommA), true, ip::kTaken, h);
    g::ended(h);
    expectLog(h, {"nccl 1 " + kSeveral, "nccl 2 " + kSeveral, "nccl 3 " + kSeveral, "nccl 4 " + kSeveral, "GE"},
              "two communicators");
  }
  {  // An ineligible call on another communicator also makes the group NCCL's.
    FakeHooks h;
    g::started();
    g::call(mk(1, kCommB), false, ip::kBelowThreshold, h);
    g::call(mk(2, kCommA), true, ip::kTaken, h);
    g::ended(h);
    expectLog(h, {"nccl 1 " + kBelow, "nccl 2 " + kSeveral, "GE"}, "ineligible call on another communicator");
  }
  {  // Eligible and ineligible calls on one communicator: the ineligible one goes to NCCL at once.
    FakeHooks h;
    g::started();
    g::call(mk(1), true, ip::kTaken, h);
    g::call(mk(2), false, ip::kBelowThreshold, h);
    g::call(mk(3), true, ip::kTaken, h);
    g::ended(h);
    expectLog(h, {"nccl 2 " + kBelow, "GE", "tide 1", "tide 3"}, "mixed eligibility");
  }
  {  // Calls on a capturing stream: the group is NCCL's.
    FakeHooks h;
    g::started();
    for (int i = 1; i <= 3; ++i) g::call(mk(i, kCommA, ip::kCollReduceScatter, 0, kCaptured), true, ip::kTaken, h);
    g::ended(h);
    expectLog(h, {"nccl 1 " + kCapture, "nccl 2 " + kCapture, "nccl 3 " + kCapture, "GE"}, "capture");
  }
  {  // torch's PREMUL_SUM: the op is destroyed before the group ends; NCCL's destroy waits for the recorded call.
    FakeHooks h;
    g::started();
    g::call(mk(1, kCommA, ip::kCollReduceScatter, 7), true, ip::kTaken, h);
    EXPECT(g::postponeDestroy(kCommA, 7), "an op a recorded call uses is kept");
    EXPECT(!g::postponeDestroy(kCommA, 8), "another op is not");
    EXPECT(!g::postponeDestroy(kCommB, 7), "the op of another communicator is not");
    g::ended(h);
    expectLog(h, {"GE", "tide 1", "destroy 7"}, "premul op destroyed inside the group");
    EXPECT(!g::postponeDestroy(kCommA, 7), "no group: destroyed at once");
  }
  {  // TIDE turns off in the middle of the group: that call and the rest go to NCCL, in order, after the end.
    FakeHooks h;
    h.passFromId = 2;
    g::started();
    for (int i = 1; i <= 3; ++i) g::call(mk(i), true, ip::kTaken, h);
    g::ended(h);
    const std::string off = std::to_string(ip::kTideOff);
    expectLog(h, {"GE", "tide 1", "nccl 2 " + off, "nccl 3 " + off}, "failure in the middle");
  }
  {  // A nonblocking communicator: the group's launch is waited for, then TIDE; the application still polls.
    FakeHooks h;
    h.groupEndResult = g::kNcclInProgress;
    g::started();
    g::call(mk(1), true, ip::kTaken, h);
    EXPECT(g::ended(h) == g::kNcclInProgress, "ncclInProgress stays the application's answer");
    expectLog(h, {"GE", "wait A", "tide 1"}, "nonblocking");
  }
  {  // A nonblocking group with nothing recorded: nothing to wait for here, ncclInProgress returned as is.
    FakeHooks h;
    h.groupEndResult = g::kNcclInProgress;
    g::started();
    g::call(mk(1), false, ip::kBelowThreshold, h);
    EXPECT(g::ended(h) == g::kNcclInProgress, "plain nonblocking group");
    expectLog(h, {"nccl 1 " + kBelow, "GE"}, "plain nonblocking group");
  }
  {  // TIDE passes calls back on a nonblocking communicator: each forward's launch settles before the next call.
    FakeHooks h;
    h.passFromId = 1;
    h.forwardInProgressId = 1;
    g::started();
    g::call(mk(1), true, ip::kTaken, h);
    g::call(mk(2), true, ip::kTaken, h);
    EXPECT(g::ended(h) == g::kNcclSuccess, "settled forwards");
    const std::string off = std::to_string(ip::kTideOff);
    expectLog(h, {"GE", "nccl 1 " + off, "wait A", "nccl 2 " + off}, "settled forwards");
  }
  {  // The real end fails: NCCL cancels the group whole; the recorded calls are counted, not run; the error returned.
    FakeHooks h;
    h.groupEndResult = 3;  // ncclInternalError
    g::started();
    g::call(mk(1, kCommA, ip::kCollReduceScatter, 7), true, ip::kTaken, h);
    EXPECT(g::postponeDestroy(kCommA, 7), "op kept");
    EXPECT(g::ended(h) == 3, "the group's error is returned");
    expectLog(h, {"GE", "count 1 " + std::to_string(ip::kGroupFailed), "destroy 7"}, "failed group end");
  }
  {  // Two streams in one group: NCCL joins them, TIDE would not; the group goes to NCCL whole.
    FakeHooks h;
    g::started();
    g::call(mk(1), true, ip::kTaken, h);
    g::call(mk(2, kCommA, ip::kCollReduceScatter, 0, reinterpret_cast<void*>(0x5001)), true, ip::kTaken, h);
    g::ended(h);
    expectLog(h, {"nccl 1 " + kSeveral, "nccl 2 " + kSeveral, "GE"}, "two streams");
  }
  {  // A ...Config call on another communicator (forwarded by its own entry point) makes the group NCCL's too.
    FakeHooks h;
    g::started();
    g::call(mk(1, kCommA), true, ip::kTaken, h);
    g::call(mk(2, kCommB), false, ip::kConfigCall, h, /*forward=*/false);
    g::ended(h);
    expectLog(h, {"nccl 1 " + kSeveral, "GE"}, "Config call on another communicator");
  }
  {  // Finalizing the communicator of a recorded call inside the group: the group goes to NCCL whole.
    FakeHooks h;
    g::started();
    g::call(mk(1, kCommA), true, ip::kTaken, h);
    EXPECT(g::commGoing(kCommB, h) == 0 && h.log.empty(), "another communicator: nothing to do");
    g::commGoing(kCommA, h);
    g::call(mk(2, kCommA), true, ip::kTaken, h);
    g::ended(h);
    const std::string down = std::to_string(ip::kGroupWithTeardown);
    expectLog(h, {"nccl 1 " + down, "nccl 2 " + down, "GE"}, "teardown inside the group");
  }
  {  // ncclGroupSimulateEnd: the recorded calls go into the simulated group; nested, it ends one level.
    FakeHooks h;
    g::started();
    g::started();
    g::call(mk(1), true, ip::kTaken, h);
    g::simulatedEnd(h);
    EXPECT(g::open(), "an inner simulated end leaves the outer group open");
    g::call(mk(2), true, ip::kTaken, h);
    g::simulatedEnd(h);
    EXPECT(!g::open(), "closed");
    const std::string sim = std::to_string(ip::kGroupSimulated);
    expectLog(h, {"GSE", "nccl 1 " + sim, "nccl 2 " + sim, "GSE"}, "simulated end");
  }
  {  // An unmatched end is NCCL's to judge.
    FakeHooks h;
    h.groupEndResult = 5;
    EXPECT(g::ended(h) == 5, "unmatched end");
    expectLog(h, {"GE"}, "unmatched end");
  }
  {  // Groups are per thread: another thread's calls are not in this thread's group.
    FakeHooks h;
    g::started();
    bool otherOpen = true;
    std::thread([&] { otherOpen = g::open(); }).join();
    EXPECT(!otherOpen, "another thread is not inside this thread's group");
    g::ended(h);
  }
}

// Random sequences of group starts, ends, calls (two communicators, eligible or not, capturing or not) and op
// destroys, checked against the rules: every call reaches NCCL or TIDE exactly once; TIDE runs a call only after the
// outermost real end of its group, in call order; a group with two communicators or a capturing stream gives TIDE
// nothing, and its calls reach NCCL before its real end in call order; a postponed destroy follows its calls.
void randomSequences(int n) {
  std::mt19937 rng(20261207);
  for (int seq = 0; seq < n; ++seq) {
    FakeHooks h;
    struct Planned {
      int id;
      bool eligible;
      void* comm;
      bool captured;
    };
    std::vector<Planned> calls;
    int depth = 0, next = 1;
    const int events = 1 + static_cast<int>(rng() % 30);
    std::vector<int> groupOf;  // per call id - 1: index of the outermost group, or -1
    int groups = 0;
    for (int e = 0; e < events; ++e) {
      const unsigned k = rng() % 10;
      if (k < 2) {
        if (depth == 0) ++groups;
        g::started();
        ++depth;
      } else if (k < 4 && depth > 0) {
        g::ended(h);
        --depth;
      } else if (depth > 0) {
        Planned p{next++, rng() % 4 != 0, rng() % 5 == 0 ? kCommB : kCommA, rng() % 12 == 0};
        calls.push_back(p);
        groupOf.push_back(groups - 1);
        g::call(mk(p.id, p.comm, ip::kCollReduceScatter, 0, p.captured ? kCaptured : kStream), p.eligible,
                p.eligible ? ip::kTaken : ip::kBelowThreshold, h);
      }
    }
    while (depth-- > 0) g::ended(h);
    EXPECT(!g::open(), "sequence %d: closed", seq);
    // Where each call went, and the position of each event.
    std::vector<int> seen(calls.size(), 0), at(calls.size(), -1);
    std::vector<bool> tide(calls.size(), false);
    for (size_t i = 0; i < h.log.size(); ++i) {
      int id = 0;
      char kind[8] = {};
      const bool collective = sscanf(h.log[i].c_str(), "%7s %d", kind, &id) == 2 &&
                              (std::string(kind) == "nccl" || std::string(kind) == "tide");
      if (collective) {
        EXPECT(id >= 1 && id <= static_cast<int>(calls.size()), "sequence %d: unknown id %d", seq, id);
        if (id < 1 || id > static_cast<int>(calls.size())) continue;
        ++seen[id - 1];
        at[id - 1] = static_cast<int>(i);
        tide[id - 1] = std::string(kind) == "tide";
      }
    }
    for (size_t c = 0; c < calls.size(); ++c) {
      EXPECT(seen[c] == 1, "sequence %d: call %zu reached NCCL or TIDE %d times: %s", seq, c + 1, seen[c],
             joined(h.log).c_str());
      if (tide[c]) EXPECT(calls[c].eligible, "sequence %d: TIDE ran ineligible call %zu", seq, c + 1);
    }
    // Per outermost group: mixed communicators or a capture give TIDE nothing; TIDE's calls in call order, after
    // the group's last real end (every GE event before them).
    for (int gi = 0; gi < groups; ++gi) {
      bool several = false, captured = false;
      void* first = nullptr;
      bool firstCaptured = false;
      int lastTide = -1, lastNccl = -1;
      for (size_t c = 0; c < calls.size(); ++c) {
        if (groupOf[c] != gi) continue;
        if (first == nullptr) {
          first = calls[c].comm;
          firstCaptured = calls[c].captured;
        }
        several = several || calls[c].comm != first || calls[c].captured != firstCaptured;  // comm or stream
        captured = captured || calls[c].captured;
        if (tide[c]) {
          EXPECT(at[c] > lastTide, "sequence %d: TIDE ran call %zu out of order: %s", seq, c + 1, joined(h.log).c_str());
          lastTide = at[c];
        } else if (seen[c] == 1 && (several || captured)) {
          EXPECT(at[c] > lastNccl, "sequence %d: NCCL got call %zu out of order: %s", seq, c + 1, joined(h.log).c_str());
          lastNccl = at[c];
        }
      }
      if (several || captured) {
        for (size_t c = 0; c < calls.size(); ++c) {
          if (groupOf[c] != gi) continue;
          EXPECT(!tide[c], "sequence %d: TIDE ran call %zu of a group NCCL must take whole: %s", seq, c + 1,
                 joined(h.log).c_str());
          const auto& in = h.forwardedInsideGroup;
          EXPECT(std::find(in.begin(), in.end(), static_cast<int>(c + 1)) != in.end(),
                 "sequence %d: call %zu of a group NCCL takes whole reached NCCL after the group: %s", seq, c + 1,
                 joined(h.log).c_str());
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 2000;
  frameworkSequences();
  randomSequences(n);
  if (failures == 0) printf("all checks passed (%d random sequences)\n", n);
  return failures == 0 ? 0 : 1;
}
