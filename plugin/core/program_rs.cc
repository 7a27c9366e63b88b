// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// TIDE-RS step programs (docs/architecture.md "Step programs"): node-local pushes into each owner's (or proxy's)
// staging, the fp32 fold per chunk, and with several nodes the running fp32 sum along each rail in node order;
// staging geometry from the layout's RsPlan (plugin/core/rs_plan.cc), the only place it is computed.
#include <algorithm>
#include <cinttypes>
#include <climits>

#include "dtype.h"
#include "errors.h"
#include "p2p_plan.h"
#include "program_builder.h"

namespace tide {
namespace prog {
namespace {

constexpr const char* kComponent = "Program";

struct Geometry {
  int W, R, N, me, n, q, numChunks, nb;
  uint64_t chunk, outNumel, peerStride, inputsOffset, partialOffset, bufBytes, zeroBytes;
  size_t inElem;
  uint64_t buf(int t) const { return static_cast<uint64_t>(t % nb) * bufBytes; }
};

// The copies of this rank's gradient elements for output owner d, output chunk [c0, c1), into `dst` (a staging
// input slot), padding past numel filled from the zero buffer. pi: first parameter that can overlap (advanced here).
void chunkSegments(const Layout& l, const Geometry& g, int d, uint64_t c0, uint64_t c1, Addr dst, int peer, int* pi,
                   Builder& b) {
  while (*pi < l.nParams && l.params[*pi].rsOutOffset + l.params[*pi].shardNumel <= c0) ++*pi;
  for (int i = *pi; i < l.nParams && l.params[i].rsOutOffset < c1; ++i) {
    const ParamLayout& p = l.params[i];
    const uint64_t lo = std::max(c0, p.rsOutOffset), hi = std::min(c1, p.rsOutOffset + p.shardNumel);
    if (lo >= hi) continue;
    const uint64_t j = static_cast<uint64_t>(d) * p.shardNumel + (lo - p.rsOutOffset);  // gradient element
    const uint64_t count = hi - lo;
    const uint64_t valid = j >= p.numel ? 0 : std::min(count, p.numel - j);
    Addr to = dst;
    to.offset += (lo - c0) * g.inElem;
    b.copy(to, addr(Mem::kGrad, i, j * g.inElem), valid * g.inElem, peer);
    for (uint64_t z = valid * g.inElem; z < count * g.inElem; z += g.zeroBytes) {
      Addr zt = to;
      zt.offset += z;
      b.copy(zt, addr(Mem::kZeros, 0, 0), std::min<uint64_t>(g.zeroBytes, count * g.inElem - z), peer);
    }
  }
}

// Waits: "the buffer of task t on rank x is free" (t < nb: x entered this call; else x consumed task t - nb).
void credit(const Geometry& g, int t, int x, Builder& b) {
  if (t < g.nb) {
    b.wait(x, word::kRsEnter, Val::kEpoch, 0);
    b.wait(x, word::kRsConsumed, Val::kTask, 0);
  } else {
    b.wait(x, word::kRsConsumed, Val::kTask, t - g.nb + 1);
  }
}

ReduceOp foldOf(const Geometry& g, int t, uint64_t n) {
  ReduceOp r;
  r.inputs = addr(Mem::kStaging, g.me, g.buf(t) + g.inputsOffset);
  r.stride = g.peerStride;
  r.nInputs = g.R;
  r.n = n;
  return r;
}

// One node: chunk k of owner d gathers every rank's input s at buffer k % nb, input slot s.
void singleNodePush(const Layout& l, const Geometry& g, int k, int* pi, Builder& b) {
  const uint64_t c0 = static_cast<uint64_t>(k) * g.chunk, c1 = std::min(c0 + g.chunk, g.outNumel);
  for (int d = 0; d < g.W; ++d) credit(g, k, d, b);
  for (int dd = 0; dd < g.W; ++dd) {
    const int d = (g.me + dd) % g.W;
    chunkSegments(l, g, d, c0, c1, addr(Mem::kStaging, d, g.buf(k) + g.inputsOffset + g.me * g.peerStride), -1, pi,
                  b);
  }
  b.close();
  for (int d = 0; d < g.W; ++d) b.write(d, word::kRsFull + g.me, Val::kTask, k + 1);
}

void singleNodeReduce(const Geometry& g, int k, Builder& b) {
  const uint64_t c0 = static_cast<uint64_t>(k) * g.chunk, c1 = std::min(c0 + g.chunk, g.outNumel);
  ReduceOp r = foldOf(g, k, c1 - c0);
  r.out = addr(Mem::kOut, 0, c0);  // offset in elements of the output type: scaled by the interpreter
  b.reduce(r);
  b.write(g.me, word::kRsConsumed, Val::kTask, k + 1);
}

void singleNode(const Layout& l, const Geometry& g, Mode mode, Builder& b) {
  const int me = g.me, K = g.numChunks, nb = g.nb;
  auto waitFull = [&](int k) {
    for (int s = 0; s < g.W; ++s) b.wait(me, word::kRsFull + s, Val::kTask, k + 1);
  };
  int pi = 0;
  b.at(Lane::kCaller, -1);
  b.write(me, word::kRsEnter, Val::kEpoch, 0);
  if (mode == Mode::kDeferred) {
    // Caller's stream at call time: the reductions; the provider issues the pushes (group k) across ranks.
    for (int k = 0; k < K; ++k) {
      waitFull(k);
      singleNodeReduce(g, k, b);
    }
    b.wait(me, word::kRsPushDone, Val::kEpoch, 0);
    for (int k = 0; k < K; ++k) {
      b.at(Lane::kInternal, k);
      singleNodePush(l, g, k, &pi, b);
    }
    b.at(Lane::kInternal, K);
    b.write(me, word::kRsPushDone, Val::kEpoch, 0);
    return;
  }
  // In host order: pushes of chunk k before its reduction, the reduction of chunk k before the push of chunk k + nb
  // that reuses its buffer (and the wait for chunk k + 1, merged with the consumed write, before that push too).
  b.at(Lane::kInternal, -1);
  for (int k = 0; k < nb && k < K; ++k) singleNodePush(l, g, k, &pi, b);
  b.at(Lane::kCaller, -1);
  waitFull(0);
  for (int k = 0; k < K; ++k) {
    b.at(Lane::kCaller, -1);
    singleNodeReduce(g, k, b);
    if (k + 1 < K) waitFull(k + 1);
    if (k + nb < K) {
      b.at(Lane::kInternal, -1);
      singleNodePush(l, g, k + nb, &pi, b);
    }
  }
  b.at(Lane::kInternal, -1);
  b.write(me, word::kRsPushDone, Val::kEpoch, 0);
  b.at(Lane::kCaller, -1);
  b.wait(me, word::kRsPushDone, Val::kEpoch, 0);
}

// Token programs: the announce (caller's lane) and the entry waits of round 1 on the lane that pushes
// (docs/architecture.md "CUDA graphs", "Issue rounds").
void capturedEntry(const Geometry& g, Lane pushLane, bool pairs, Builder& b) {
  const int W = g.W, me = g.me;
  b.at(Lane::kCaller, -1);
  b.write(me, word::kCapRsPhase, Val::kConst, 1);
  for (int d = 0; d < W; ++d) {
    if (d != me) b.write(d, word::kCapRsEnter + me, Val::kConst, 1);
  }
  b.at(pushLane, 0);  // round 1: waits only for the announces (round 0) of every rank
  b.tokenWaits(me, word::kCapRsEnter, W, pairs);
  // The phase and the enter resets follow chunk 0's pushes (capturedPush).
}

// This rank's pushes of chunk k into every owner's buffer k % nb, then its full token (value k + 1) to each other
// rank, and to itself too when its reduce runs on another lane (own). Chunk 0's full writes are preceded by the
// entry's phase write and enter resets (docs/architecture.md "Trailing resets"): one write-only batch, and the resets
// precede every full token, so no peer can announce its next call before they land.
void capturedPush(const Layout& l, const Geometry& g, int k, bool own, bool pairs, int* pi, Builder& b) {
  const int W = g.W, me = g.me;
  const uint64_t c0 = static_cast<uint64_t>(k) * g.chunk, c1 = std::min(c0 + g.chunk, g.outNumel);
  for (int dd = 0; dd < W; ++dd) {
    const int d = (me + dd) % W;
    chunkSegments(l, g, d, c0, c1, addr(Mem::kStaging, d, g.buf(k) + g.inputsOffset + me * g.peerStride), -1, pi, b);
  }
  b.close();
  if (k == 0) {
    b.write(me, word::kCapRsPhase, Val::kConst, 2);
    b.tokenResets(me, word::kCapRsEnter, W, pairs);
  }
  for (int d = 0; d < W; ++d) {
    if (own || d != me) b.write(d, word::capRsFull(k) + me, Val::kConst, k + 1);
  }
}

// The wait for every other rank's full token of chunk k (and this rank's own, own), then this rank's fold of chunk k.
void capturedReduce(const Geometry& g, int k, bool own, bool pairs, Builder& b) {
  const uint64_t c0 = static_cast<uint64_t>(k) * g.chunk, c1 = std::min(c0 + g.chunk, g.outNumel);
  b.tokenWaitsFor(g.me, word::capRsFull(k), g.W, k + 1, own, pairs);
  ReduceOp r = foldOf(g, k, c1 - c0);
  r.out = addr(Mem::kOut, 0, c0);
  b.reduce(r);
}

// Replay-safe constant tokens, one staging buffer per chunk (at most 2 chunks), in issue rounds (groups -1, 0, 1).
void captured(const Layout& l, const Geometry& g, bool pairs, Builder& b) {
  capturedEntry(g, Lane::kCaller, pairs, b);
  int pi = 0;
  for (int k = 0; k < g.numChunks; ++k) capturedPush(l, g, k, false, pairs, &pi, b);
  b.at(Lane::kCaller, 1);  // round 2: waits only for round 1's full writes (every chunk's)
  for (int k = 0; k < g.numChunks; ++k) capturedReduce(g, k, false, pairs, b);
  for (int k = 0; k < g.numChunks; ++k) {  // each chunk's bank (chunks 0 and 1: one each)
    for (int s = 0; s < g.W; ++s) {
      if (s != g.me) b.write(g.me, word::capRsFull(k) + s, Val::kConst, 0);
    }
  }
  b.write(g.me, word::kCapRsPhase, Val::kConst, 0);
}

// Replay-safe constant tokens with more chunks (K > 2) than staging buffers (nb = 2), on two lanes
// (docs/architecture.md "More chunks than buffers"): the internal lane takes the entry waits and the pushes (chunk k
// into buffer k % 2 of every owner, from k = 2 on once each owner's consumed token of chunk k - 2 is there), the
// caller's lane the reductions. The lanes meet only at flags, this rank's own tokens included (its own full token
// before its reduce, its own consumed token before it pushes into a buffer it has just reduced), so a captured graph
// forks and joins per round (program_exec.cc issueTokenRange) and the pushes of chunk k + 1 overlap the reduce of
// chunk k. Program order is a valid schedule on one stream too (direct issue: both lanes on the
// caller's stream). Rounds (group r - 1 is round r): round 0 the announce (caller); round 1 the entry waits and the
// pushes of chunks 0 and 1 (internal); round r in 2..K the push of chunk r - 1 from round 3 on (internal) and the
// reduce of chunk r - 2 (caller); round K + 1 the reduce of chunk K - 1 and the resets (caller). Every wait of round r
// is for writes of earlier rounds: consumed(r - 3) is written in round r - 1, full(r - 2) in round r - 1 (or 1).
void capturedPipelined(const Layout& l, const Geometry& g, bool pairs, Builder& b) {
  const int W = g.W, me = g.me, K = g.numChunks;
  capturedEntry(g, Lane::kInternal, pairs, b);
  int pi = 0;
  capturedPush(l, g, 0, true, pairs, &pi, b);
  capturedPush(l, g, 1, true, pairs, &pi, b);
  for (int r = 2; r <= K + 1; ++r) {
    const int push = r - 1, red = r - 2;
    if (r >= 3 && push < K) {
      b.at(Lane::kInternal, r - 1);
      // every d (this rank too) reduced chunk push - 2, whose buffer this push reuses
      b.tokenWaitsFor(me, word::capRsConsumed(push - 2), W, push - 1, true, pairs);
      capturedPush(l, g, push, true, pairs, &pi, b);
    }
    b.at(Lane::kCaller, r - 1);
    capturedReduce(g, red, true, pairs, b);
    if (red + 2 < K) {
      for (int d = 0; d < W; ++d) b.write(d, word::capRsConsumed(red) + me, Val::kConst, red + 1);
    }
  }
  // The last consumed token of every rank (value K - 2) was waited for by the internal lane before its last push,
  // and every full token (K) by the reduce just issued, which waited this rank's own last full token, written after
  // that push: no write of this call can land after these resets, and the next call's come after the next entry.
  // Both parity banks of each kind (K > 2: chunks of both parities, consumed tokens of chunks 0 .. K - 3).
  for (int s = 0; s < W; ++s) b.write(me, word::kCapRsFull + s, Val::kConst, 0);
  for (int s = 0; s < W; ++s) b.write(me, word::kCapRsFullOdd + s, Val::kConst, 0);
  for (int d = 0; d < W; ++d) b.write(me, word::kCapRsConsumed + d, Val::kConst, 0);
  if (K > 3) {
    for (int d = 0; d < W; ++d) b.write(me, word::kCapRsConsumedOdd + d, Val::kConst, 0);
  }
  b.write(me, word::kCapRsPhase, Val::kConst, 0);
}

// Several nodes. Task t = k * N + m: chunk k of this rank's rail owner on node m. See docs/architecture.md.
// twoSided: the running and final sums travel as p2p groups (p2p_plan.h), whose completion on the lane replaces the
// one-sided protocol's credit waits on the receiver, its puts, and the signals and waits that announce them.
struct MultiNode {
  const Layout& l;
  const Geometry& g;
  Builder& b;
  bool twoSided = false;
  int pi = 0;

  void p2p(P2pAt at, int t) {
    for (const P2pGroup& x : p2pGroups(l, at, t)) b.p2p(x);
  }

  void push(int t) {
    const int k = t / g.N, m = t % g.N;
    const uint64_t c0 = static_cast<uint64_t>(k) * g.chunk, c1 = std::min(c0 + g.chunk, g.outNumel);
    for (int x = 0; x < g.R; ++x) credit(g, t, g.n * g.R + x, b);
    for (int dl = 0; dl < g.R; ++dl) {
      const int x = (g.q + dl) % g.R;
      chunkSegments(l, g, m * g.R + x, c0, c1,
                    addr(Mem::kStaging, g.n * g.R + x, g.buf(t) + g.inputsOffset + g.q * g.peerStride), -1, &pi, b);
    }
    b.close();
    for (int x = 0; x < g.R; ++x) b.write(g.n * g.R + x, word::kRsFull + g.q, Val::kTask, t + 1);
  }

  void reduceAndPut(int t) {
    const int k = t / g.N, m = t % g.N;
    const uint64_t c0 = static_cast<uint64_t>(k) * g.chunk, cnt = std::min(c0 + g.chunk, g.outNumel) - c0;
    const bool last = g.n == g.N - 1, owner = m == g.n;
    for (int x = 0; x < g.R; ++x) b.wait(g.me, word::kRsFull + x, Val::kTask, t + 1);
    if (twoSided) p2p(P2pAt::kRsPrev, t);
    else if (g.n > 0) b.waitSignalFrom(g.me - g.R, g.me, word::kRsPrev, Val::kTask, t + 1);
    ReduceOp r = foldOf(g, t, cnt);
    const Addr partial = addr(Mem::kStaging, g.me, g.buf(t) + g.partialOffset);
    if (g.n > 0) {
      r.hasPrev = true;
      r.prev = partial;
    }
    if (last && owner) {
      r.out = addr(Mem::kOut, 0, c0);
    } else {
      r.out = partial;  // in place over prev (same element, same thread)
      r.outFinal = false;
      r.applyAvg = last;  // AVG divides once, after the last node's add
    }
    b.reduce(r);
    if (twoSided) {
      p2p(P2pAt::kRsNext, t);
    } else if (!last) {
      const int next = g.me + g.R;
      credit(g, t, next, b);
      b.close();
      b.copy(addr(Mem::kStaging, next, g.buf(t) + g.partialOffset), partial, cnt * sizeof(float), next);
      b.close();
      b.signalTo(next, word::kRsPrev, Val::kTask, t + 1);
    } else if (!owner) {
      const int d = m * g.R + g.q;
      b.copy(addr(Mem::kStaging, d, g.buf(t) + g.partialOffset), partial, cnt * sizeof(float), d);
      b.close();
      b.signalTo(d, word::kRsFinal, Val::kTask, t + 1);
    }
  }

  // An owner before the last node: wait for the final sum, copy (fp32) or narrow it into out; release the buffer.
  void finish(int t) {
    const int k = t / g.N, m = t % g.N;
    const uint64_t c0 = static_cast<uint64_t>(k) * g.chunk, cnt = std::min(c0 + g.chunk, g.outNumel) - c0;
    if (m == g.n && g.n != g.N - 1) {
      if (twoSided) p2p(P2pAt::kRsFinal, t);
      else b.waitSignalFrom((g.N - 1) * g.R + g.q, g.me, word::kRsFinal, Val::kTask, t + 1);
      ReduceOp f;
      f.inputs = addr(Mem::kStaging, g.me, g.buf(t) + g.partialOffset);
      f.nInputs = 1;
      f.inputsFp32 = true;
      f.applyPremul = false;
      f.applyAvg = false;
      f.out = addr(Mem::kOut, 0, c0);
      f.n = cnt;
      b.reduce(f);  // the interpreter turns an fp32 -> fp32 narrow into a copy
    }
    b.write(g.me, word::kRsConsumed, Val::kTask, t + 1);
  }
};

}  // namespace

tideResult_t compileReduceScatter(const Layout& l, const Options& opt, Program* out) {
  Program p;
  p.coll = Coll::kReduceScatter;
  p.mode = opt.mode;
  p.rank = l.rank;
  p.worldSize = l.worldSize;
  p.ranksPerNode = l.ranksPerNode;
  p.nNodes = l.nNodes;
  p.numChunks = l.rs.numChunks;
  p.numBuffers = l.rs.numBuffers;
  p.needsStaging = true;
  if (l.ranksPerNode > word::kMaxLocalRanks) {
    return fail(tideUnsupported, kComponent, "reduce-scatter: %d ranks per node exceed the supported %d",
                l.ranksPerNode, word::kMaxLocalRanks);
  }
  for (const ParamLayout& q : l.params) {
    if (q.dtype != l.params[0].dtype) {
      return fail(tideUnsupported, kComponent,
                  "reduce-scatter needs one gradient dtype per layout, but parameter 0 is %s and another is %s; "
                  "split the group by dtype (or use the host executor)",
                  dtype::name(l.params[0].dtype), dtype::name(q.dtype));
    }
  }
  Geometry g;
  g.W = l.worldSize;
  g.R = l.ranksPerNode;
  g.N = l.nNodes;
  g.me = l.rank;
  g.n = g.me / g.R;
  g.q = g.me % g.R;
  g.numChunks = l.rs.numChunks;
  g.nb = l.rs.numBuffers;
  g.chunk = l.rs.chunkNumel;
  g.outNumel = l.rsOutNumel;
  g.peerStride = l.rs.stagingPeerStride;
  g.inputsOffset = l.rs.stagingInputsOffset;
  g.partialOffset = l.rs.stagingPartialOffset;
  g.bufBytes = l.rs.stagingBufferBytes;
  g.zeroBytes = opt.zeroBytes == 0 ? 1 : opt.zeroBytes;
  g.inElem = l.params.empty() ? 4 : l.params[0].elemSize;
  const uint64_t tasks = static_cast<uint64_t>(g.numChunks) * static_cast<uint64_t>(g.N);
  if (3 * tasks + 1 > static_cast<uint64_t>(INT_MAX)) {
    return fail(tideUnsupported, kComponent,
                "reduce-scatter: %d chunks x %d nodes exceed the pipeline's step limit; raise rsChunkBytes",
                g.numChunks, g.N);
  }
  p.numTasks = tasks;
  Builder b(&p);
  if (opt.mode == Mode::kCaptured) {
    if (g.N > 1) {
      return fail(tideUnsupported, kComponent,
                  "reduce-scatter: layouts of several nodes (%d nodes of %d ranks) cannot be captured into a CUDA "
                  "graph (their pipeline is issued in steps across ranks and carries per-call task numbers)",
                  g.N, g.R);
    }
    const int most = std::max(2, opt.maxTokenRsChunks);
    if (g.numChunks < 1 || g.numChunks > most) {
      return fail(tideUnsupported, kComponent,
                  "reduce-scatter: a captured (token) reduce-scatter takes at most %d pipeline chunks "
                  "(NCCL_TIDE_TOKEN_RS_CHUNKS), but this layout has %d chunks of %" PRIu64
                  " elements; create the layout with a larger rsChunkBytes so that it has at most %d, or raise "
                  "NCCL_TIDE_TOKEN_RS_CHUNKS on every rank",
                  most, g.numChunks, g.chunk, most);
    }
    if ((g.numChunks <= 2 && g.nb != g.numChunks) || (g.numChunks > 2 && g.nb != 2)) {
      return fail(tideInternalError, kComponent, "reduce-scatter: %d chunks with %d staging buffers", g.numChunks,
                  g.nb);
    }
    p.numTasks = 0;  // captured calls never touch the eager counters
    if (g.numChunks <= 2) {
      captured(l, g, opt.pairTokens, b);
      p.numGroups = 2;  // issue rounds 1 and 2 (round 0, the announce, is group -1)
    } else {
      capturedPipelined(l, g, opt.pairTokens, b);
      p.numGroups = g.numChunks + 1;  // rounds 1 .. K + 1
    }
  } else if (g.N == 1) {
    singleNode(l, g, opt.mode, b);
    if (opt.mode == Mode::kDeferred) p.numGroups = g.numChunks + 1;
  } else {
    p.transport = opt.transport;
    MultiNode mn{l, g, b, opt.transport == Transport::kTwoSided};
    const int T = static_cast<int>(tasks);
    b.at(Lane::kCaller, -1);
    b.write(g.me, word::kRsEnter, Val::kEpoch, 0);
    if (opt.mode == Mode::kDeferred) {
      // Everything on the internal stream, issued by the provider step-major across ranks; the caller's stream
      // waits for its end.
      b.wait(g.me, word::kRsPushDone, Val::kEpoch, 0);
      for (int t = 0; t < T; ++t) {
        b.at(Lane::kInternal, 3 * t);
        mn.push(t);
        b.at(Lane::kInternal, 3 * t + 1);
        mn.reduceAndPut(t);
        b.at(Lane::kInternal, 3 * t + 2);
        mn.finish(t);
      }
      b.at(Lane::kInternal, 3 * T);
      b.write(g.me, word::kRsPushDone, Val::kEpoch, 0);
      p.numGroups = 3 * T + 1;
    } else {
      b.at(Lane::kInternal, -1);
      for (int t = 0; t < g.nb && t < T; ++t) mn.push(t);
      for (int t = 0; t < T; ++t) {
        b.at(Lane::kCaller, -1);
        mn.reduceAndPut(t);
        mn.finish(t);
        if (t + g.nb < T) {
          b.at(Lane::kInternal, -1);
          mn.push(t + g.nb);
        }
      }
      b.at(Lane::kInternal, -1);
      b.write(g.me, word::kRsPushDone, Val::kEpoch, 0);
      b.at(Lane::kCaller, -1);
      b.wait(g.me, word::kRsPushDone, Val::kEpoch, 0);
    }
  }
  *out = std::move(p);
  return tideSuccess;
}

}  // namespace prog
}  // namespace tide
