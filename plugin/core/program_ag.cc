// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// TIDE-AG step programs (docs/architecture.md "Step programs"): one node (eager, multicast, captured) and several
// (virtual) nodes (paced rail schedule, then the node-local fan-out), in the byte placement of the host executor.
#include <algorithm>
#include <cinttypes>

#include "errors.h"
#include "p2p_plan.h"
#include "program_builder.h"
#include "schedule.h"

namespace tide {
namespace prog {
namespace {

constexpr const char* kComponent = "Program";

void singleNode(const Layout& l, const Options& opt, Builder& b) {
  const int W = l.worldSize, me = l.rank;
  b.at(Lane::kCaller, -1);
  b.write(me, word::kAgReady, Val::kEpoch, 0);
  for (int r = 0; r < W; ++r) {
    if (r != me) b.wait(r, word::kAgReady, Val::kEpoch, 0);
  }
  for (int i = 0; i < l.nParams; ++i) {
    const ParamLayout& p = l.params[i];
    if (opt.multicast) {
      b.copy(addr(Mem::kMulticast, 0, p.slotPos(me)), addr(Mem::kSrc, i, 0), p.shardBytes);
      continue;
    }
    for (int k = 0; k < W; ++k) {
      const int r = (me + k) % W;  // self first, then the next ranks: spreads the writes over destinations
      b.copy(addr(Mem::kSlot, r, p.slotPos(me)), addr(Mem::kSrc, i, 0), p.shardBytes);
    }
  }
  for (int r = 0; r < W; ++r) {
    if (r != me) b.write(r, word::kAgDone + me, Val::kEpoch, 0);
  }
  for (int s = 0; s < W; ++s) {
    if (s != me) b.wait(me, word::kAgDone + s, Val::kEpoch, 0);
  }
}

// Replay-safe constant tokens (docs/architecture.md "CUDA graphs"), in issue rounds (groups -1, 0, 1: see
// docs/architecture.md "Issue rounds").
void captured(const Layout& l, bool pairs, Builder& b) {
  const int W = l.worldSize, me = l.rank;
  b.at(Lane::kCaller, -1);
  b.write(me, word::kCapAgPhase, Val::kConst, 1);
  for (int d = 0; d < W; ++d) {
    if (d != me) b.write(d, word::kCapAgReady + me, Val::kConst, 1);
  }
  b.at(Lane::kCaller, 0);  // round 1: waits only for the announces (round 0) of every rank
  b.tokenWaits(me, word::kCapAgReady, W, pairs);
  // The resets stay ahead of the copies (unlike the RS's, docs/architecture.md "Trailing resets"): behind them they
  // are barriered memop writes that wait for the copies in flight (measured on an H100: 20-28 us per AG at W = 8),
  // and the AG's flags are memops (params::kAgSignalKernelsDefault is false).
  b.tokenResets(me, word::kCapAgReady, W, pairs);
  b.write(me, word::kCapAgPhase, Val::kConst, 2);
  for (int i = 0; i < l.nParams; ++i) {
    const ParamLayout& p = l.params[i];
    for (int k = 0; k < W; ++k) {
      const int r = (me + k) % W;
      b.copy(addr(Mem::kSlot, r, p.slotPos(me)), addr(Mem::kSrc, i, 0), p.shardBytes);
    }
  }
  for (int d = 0; d < W; ++d) {
    if (d != me) b.write(d, word::kCapAgDone + me, Val::kConst, 1);
  }
  b.at(Lane::kCaller, 1);  // round 2: waits only for round 1's done writes
  b.tokenWaits(me, word::kCapAgDone, W, pairs);
  b.tokenResets(me, word::kCapAgDone, W, pairs);
  b.write(me, word::kCapAgPhase, Val::kConst, 0);
}

tideResult_t multiNode(const Layout& l, const Options& opt, Program* prog, Builder& b) {
  const int R = l.ranksPerNode, N = l.nNodes, me = l.rank, n = me / R, q = me % R;
  const int rounds = l.schedule.numRounds;
  if (rounds > word::kMaxRounds) {
    return fail(tideUnsupported, kComponent, "all-gather: %d nodes need %d rounds; at most %d are supported", N,
                rounds, word::kMaxRounds);
  }
  const bool deferred = opt.mode == Mode::kDeferred;
  const bool twoSided = opt.transport == Transport::kTwoSided;  // p2p groups instead of puts, signals and waits
  const int len = scheduleLength(l);
  std::vector<int> roundPeer(rounds, -1), recvPeer(rounds, -1);  // who this rank sends to / hears from per round
  std::vector<ScheduleStep> steps(len);
  for (int s = 0; s < len; ++s) {
    steps[s] = scheduleStep(l, n, s);
    roundPeer[steps[s].round] = steps[s].sendToNode * R + q;
    recvPeer[steps[s].round] = steps[s].recvFromNode * R + q;
  }
  for (int k = 0; k < rounds; ++k) {
    if (roundPeer[k] < 0) return fail(tideInternalError, kComponent, "all-gather: round %d has no step", k);
  }
  // Ranks this rank writes into: the other ranks of its node, then (one-sided) its rail peers of every round; a
  // two-sided receive is posted by the receiver itself, in its call.
  std::vector<int> dests;
  for (int x = 0; x < R; ++x) {
    if (x != q) dests.push_back(n * R + x);
  }
  for (int k = 0; k < rounds && !twoSided; ++k) {
    if (std::find(dests.begin(), dests.end(), roundPeer[k]) == dests.end()) dests.push_back(roundPeer[k]);
  }
  const Lane lane = deferred ? Lane::kInternal : Lane::kCaller;
  auto group = [&](int g) { return deferred ? g : -1; };

  // At call time on the caller's stream: announce (and, deferred, wait for the internal stream's end).
  b.at(Lane::kCaller, -1);
  b.write(me, word::kAgReady, Val::kEpoch, 0);
  if (deferred) b.wait(me, word::kAgFinish, Val::kEpoch, 0);

  // Group 0: ready waits, own placement.
  b.at(lane, group(0));
  if (deferred) b.wait(me, word::kAgReady, Val::kEpoch, 0);
  for (int d : dests) b.wait(d, word::kAgReady, Val::kEpoch, 0);
  for (int i = 0; i < l.nParams; ++i) {
    const ParamLayout& p = l.params[i];
    b.copy(addr(Mem::kSlot, me, p.slotPos(me)), addr(Mem::kSrc, i, 0), p.shardBytes);
  }
  // Groups 1 + k: round k of the rail schedule, one put (copy batch) or p2p group per step of at most paceBytes.
  for (int k = 0, x = 0; k < rounds; ++k) {
    b.at(lane, group(1 + k));
    b.close();
    const int peer = roundPeer[k];
    if (twoSided) {  // a step's receives land before the next step's sends read them (stream order)
      for (; x < len && steps[x].round == k; ++x) {
        for (const P2pGroup& g : p2pGroups(l, P2pAt::kAgStep, x)) b.p2p(g);
      }
      continue;
    }
    if (k > 0) b.waitSignalFrom(recvPeer[k - 1], me, word::kAgRail + k - 1, Val::kEpoch, 0);
    for (; x < len && steps[x].round == k; ++x) {
      b.close();
      for (const Wire& w : agStepWires(l, me, x)) {
        b.copy(addr(Mem::kSlot, peer, w.offset), addr(Mem::kSlot, me, w.offset), w.bytes, peer);
      }
    }
    b.close();
    b.signalTo(peer, word::kAgRail + k, Val::kEpoch, 0);
  }
  // Group rounds + 1: the blocks of this rail from every node have landed; fan them out inside the node.
  b.at(lane, group(rounds + 1));
  b.close();
  if (rounds > 0 && !twoSided) {
    b.waitSignalFrom(recvPeer[rounds - 1], me, word::kAgRail + rounds - 1, Val::kEpoch, 0);
    b.close();
  }
  if (R > 1) {
    for (int dl = 1; dl < R; ++dl) {
      const int d = n * R + (q + dl) % R;
      for (int j = 0; j < N; ++j) {
        for (int i = 0; i < l.nParams; ++i) {
          const ParamLayout& p = l.params[i];
          const uint64_t at = p.slotPos(j * R + q);
          b.copy(addr(Mem::kSlot, d, at), addr(Mem::kSlot, me, at), p.shardBytes);
        }
      }
    }
    for (int x = 0; x < R; ++x) {
      if (x != q) b.write(n * R + x, word::kAgDone + q, Val::kEpoch, 0);
    }
    for (int x = 0; x < R; ++x) {
      if (x != q) b.wait(me, word::kAgDone + x, Val::kEpoch, 0);
    }
  }
  if (deferred) b.write(me, word::kAgFinish, Val::kEpoch, 0);
  prog->numGroups = deferred ? rounds + 2 : 0;
  return tideSuccess;
}

}  // namespace

tideResult_t compileAllGather(const Layout& l, const Options& opt, Program* out) {
  Program p;
  p.coll = Coll::kAllGather;
  p.mode = opt.mode;
  p.rank = l.rank;
  p.worldSize = l.worldSize;
  p.ranksPerNode = l.ranksPerNode;
  p.nNodes = l.nNodes;
  if (l.nNodes > 1) p.transport = opt.transport;
  if (l.ranksPerNode > word::kMaxLocalRanks) {
    return fail(tideUnsupported, kComponent, "all-gather: %d ranks per node exceed the supported %d",
                l.ranksPerNode, word::kMaxLocalRanks);
  }
  Builder b(&p);
  if (l.nNodes > 1) {
    if (opt.mode == Mode::kCaptured) {
      return fail(tideUnsupported, kComponent,
                  "all-gather: layouts of several nodes (%d nodes of %d ranks) cannot be captured into a CUDA graph: "
                  "their rail schedule is issued in steps across ranks and carries per-call epochs",
                  l.nNodes, l.ranksPerNode);
    }
    TIDE_CHECK(multiNode(l, opt, &p, b));
  } else if (opt.mode == Mode::kCaptured) {
    captured(l, opt.pairTokens, b);
    p.numGroups = 2;  // issue rounds 1 and 2 (round 0, the announce, is group -1)
  } else {
    singleNode(l, opt, b);  // single node: always at call time on the caller's stream, also on deferring providers
    p.mode = Mode::kInOrder;
  }
  *out = std::move(p);
  return tideSuccess;
}

}  // namespace prog
}  // namespace tide
