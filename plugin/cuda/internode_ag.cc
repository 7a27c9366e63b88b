// TIDE-AG over several (virtual) nodes: own-shard placement, the paced rail schedule over nodes, node-local fan-out;
// the same three phases, in the same order and over the same byte ranges, as the host executor
// (plugin/core/host_allgather.cc). No kernel: every byte moves by copy engine, every ordering by a stream memop.
//
// Rank me = node n, local index q (rail q = the ranks with local index q on every node). Epoch e (the comm's AG
// sequence number, equal on every rank). Phases (on the caller's stream, or deferred, see below):
//   1. write own ready = e; wait ready(d) >= e for every rank d this rank writes into (its rail peers of every round
//      and the other ranks of its node): their slots may be overwritten (they finished reading them).
//   2. own placement: shard_i -> own slot at slotOffset_i + me * shardBytes_i (skipped when already in place).
//   3. rail schedule, round k = 0 .. ceil(log2 N) - 1 (tideLayoutGetScheduleStep, Bruck-style recursive doubling):
//      k > 0: wait own rail[k-1] >= e (the blocks of round k-1 have landed; they may be forwarded now);
//      each step: one put (copy batch of at most paceBytes: the step's byte range of a block, one segment per
//      parameter it touches) from the own slot into the same positions of rank (sendToNode, q)'s slot;
//      after the round's steps: signal rail[k] = e to that rank.
//      The steps of one stream run one after another, so at most paceBytes are in flight per rank (pacing).
//   4. wait own rail[last] >= e: this rank holds the blocks of its rail from every node.
//   5. fan-out: one copy batch of those N blocks into the slots of the other R - 1 ranks of the node; then write
//      done[q] = e into each of them, and wait own done[l] >= e for every other local l.
// Deadlock-free: a rank's waits are for (a) the first operation of other ranks' calls (ready), (b) the signal of
// round k-1, which its sender writes after its own round k-2 wait, and so on down to round 0, which waits only for
// (a), and (c) the fan-out of local ranks, which follows their own last round. No wait depends on a later operation
// of the waiting rank, so every rank's stream runs to its end as long as each rank has a stream of its own (the
// loopback provider checks this) that is not aliased onto another's hardware queue (CUDA_DEVICE_MAX_CONNECTIONS).
// Flag values are AG epochs: monotonic per comm, the same on every rank, each word with one writer per epoch (one
// rail sender per round per receiver, one fan-out sender per done word).
//
// Shared copy-engine queues (loopback: every virtual rank's copies feed the same device's copy connections): a copy
// waits in the queue for its stream's earlier memop waits, and blocks what is queued behind it. So a provider that
// defers (PeerProvider::defersPushes) gets the phases above as steps 0 (ready waits, own placement), 1 + k (round
// k) and rounds + 1 (fan-out, done), run on the comm's internal stream and issued step-major across all ranks once
// every rank has called (PeerProvider::scheduleSteps): every copy of step p waits only for copies of steps < p. The
// caller's stream gets, at call time, "write ready = e" (the internal stream waits for it: the caller's earlier work
// is done) and "wait own finish >= e" (written at the end of the internal stream's work): stream order for the
// caller is kept. Providers that do not defer (IPC, one rank per process: one stream, so its copies are queued in
// its own dependency order) run the phases in order on the caller's stream.
#include <algorithm>
#include <cinttypes>
#include <memory>
#include <vector>

#include "../core/errors.h"
#include "../core/log.h"
#include "copy_batch.h"
#include "driver_ops.h"
#include "executors.h"
#include "internode_transport.h"
#include "loopback.h"

namespace tide {
namespace cuda {
namespace {

// Adds the copies of bytes [offset, offset + bytes) of block `blockRank` (packed send-buffer layout) from `from` to
// `to` (slot regions with the same layout), one segment per parameter; alignment gaps carry nothing.
void addBlockRange(const LayoutView& v, const char* from, char* to, int blockRank, uint64_t offset, uint64_t bytes,
                   CopyList* copies) {
  const uint64_t end = offset + bytes;
  const int nParams = v.info.nParams;
  int lo = 0, hi = nParams;  // first parameter whose shard ends after offset (send offsets increase)
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    const tideParamInfo_t& p = v.params[mid];
    if (p.sendOffset + p.shardNumel * p.elemSize <= offset) lo = mid + 1; else hi = mid;
  }
  for (int i = lo; i < nParams && v.params[i].sendOffset < end; ++i) {
    const tideParamInfo_t& p = v.params[i];
    const uint64_t shardBytes = p.shardNumel * p.elemSize;
    const uint64_t a = std::max(offset, p.sendOffset), b = std::min(end, p.sendOffset + shardBytes);
    if (a >= b) continue;
    const uint64_t at = p.slotOffset + static_cast<uint64_t>(blockRank) * shardBytes + (a - p.sendOffset);
    copies->add(to + at, from + at, b - a);
  }
}

}  // namespace

namespace {

struct AgStep {
  int round;
  int blockNode;
  uint64_t offset;
  uint64_t bytes;
};

// Everything the phases need, owned (a deferring provider issues them during another rank's call).
struct AgPlan {
  std::shared_ptr<PeerProvider> provider;
  std::shared_ptr<const LayoutView> view;
  int me = 0, n = 0, q = 0, R = 0, N = 0, rounds = 0, device = 0;
  uint32_t e = 0;
  std::vector<const char*> src;
  std::vector<char*> slotOf;
  std::vector<int> roundPeer;
  std::vector<int> dests;
  std::vector<AgStep> steps;  // ordered by round
  std::vector<size_t> roundStart;  // steps of round k: [roundStart[k], roundStart[k+1])
  bool deferred = false;      // phases run on the internal stream: wait own ready first, write own finish last

  // Phase p on stream s: 0 = ready waits + own placement; 1 + k = round k; rounds + 1 = fan-out and done.
  tideResult_t phase(int p, cudaStream_t s) const {
    const LayoutView& v = *view;
    const int nParams = v.info.nParams;
    PeerProvider* pp = provider.get();
    char* mine = slotOf[me];
    PeerMappedTransport net(pp, me, device);
    CopyList copies;
    std::vector<FlagOp> ops;
    if (p == 0) {
      if (deferred) ops.push_back({FlagOp::kWait, pp->flags(me, me) + flag::kAgReady, e});
      for (int d : dests) ops.push_back({FlagOp::kWait, pp->flags(me, d) + flag::kAgReady, e});
      TIDE_CHECK(enqueueFlagOps(s, ops));
      for (int i = 0; i < nParams; ++i) {
        const tideParamInfo_t& pi = v.params[i];
        const uint64_t shardBytes = pi.shardNumel * pi.elemSize;
        char* dst = mine + pi.slotOffset + static_cast<uint64_t>(me) * shardBytes;
        if (dst != src[i]) copies.add(dst, src[i], shardBytes);
      }
      return copies.enqueue(s, device);
    }
    if (p <= rounds) {
      const int k = p - 1;
      if (k > 0) TIDE_CHECK(net.waitSignal(s, flag::kAgRail + k - 1, e));
      const int peer = roundPeer[k];
      for (size_t x = roundStart[k]; x < roundStart[k + 1]; ++x) {
        const AgStep& st = steps[x];
        copies.clear();
        addBlockRange(v, mine, slotOf[peer], st.blockNode * R + q, st.offset, st.bytes, &copies);
        TIDE_CHECK(net.put(s, peer, copies));
      }
      return net.signal(s, peer, flag::kAgRail + k, e);
    }
    TIDE_CHECK(net.waitSignal(s, flag::kAgRail + rounds - 1, e));
    if (R > 1) {
      for (int dl = 1; dl < R; ++dl) {
        const int d = n * R + (q + dl) % R;
        for (int j = 0; j < N; ++j) {
          const int b = j * R + q;
          for (int i = 0; i < nParams; ++i) {
            const tideParamInfo_t& pi = v.params[i];
            const uint64_t shardBytes = pi.shardNumel * pi.elemSize;
            const uint64_t at = pi.slotOffset + static_cast<uint64_t>(b) * shardBytes;
            copies.add(slotOf[d] + at, mine + at, shardBytes);
          }
        }
      }
      TIDE_CHECK(copies.enqueue(s, device));
      for (int l = 0; l < R; ++l) {
        if (l != q) ops.push_back({FlagOp::kWrite, pp->flags(me, n * R + l) + flag::kAgDone + q, e});
      }
      for (int l = 0; l < R; ++l) {
        if (l != q) ops.push_back({FlagOp::kWait, pp->flags(me, me) + flag::kAgDone + l, e});
      }
    }
    if (deferred) ops.push_back({FlagOp::kWrite, pp->flags(me, me) + flag::kAgFinish, e});
    return enqueueFlagOps(s, ops);
  }
};

// A pacing cap so small that the step list would take more than this many entries is refused (each step is one copy
// batch: millions of them would take minutes of host time anyway).
constexpr int kMaxSteps = 1 << 22;

}  // namespace

tideResult_t allGatherMultiNode(tideComm* comm, const std::shared_ptr<const LayoutView>& view, tideLayout_t layout,
                                const std::vector<const char*>& src, const std::vector<char*>& slotOf,
                                cudaStream_t stream) {
  const LayoutView& v = *view;
  auto plan = std::make_shared<AgPlan>();
  AgPlan& P = *plan;
  P.provider = comm->provider;
  P.view = view;
  P.R = v.info.ranksPerNode;
  P.N = v.info.nNodes;
  P.me = comm->rank;
  P.n = P.me / P.R;
  P.q = P.me % P.R;
  P.device = comm->device;
  P.src = src;
  P.slotOf = slotOf;
  const int R = P.R, N = P.N, n = P.n, q = P.q, me = P.me;
  while ((1ll << P.rounds) < N) ++P.rounds;
  if (P.rounds > flag::kMaxRounds) {
    return fail(tideUnsupported, "Cuda", "tideAllGather: %d nodes need %d rounds; at most %d are supported", N,
                P.rounds, flag::kMaxRounds);
  }

  // The schedule of this node, checked before anything is enqueued.
  int len = 0;
  TIDE_CHECK(tideLayoutGetScheduleLength(layout, n, &len));
  if (len > kMaxSteps) {
    return fail(tideUnsupported, "Cuda",
                "tideAllGather: the inter-node schedule has %d steps per node (send buffer %" PRIu64
                " bytes, paceBytes %" PRIu64 "); the CUDA executor takes at most %d: raise paceBytes",
                len, v.info.sendBytes, v.info.paceBytes, kMaxSteps);
  }
  P.roundPeer.assign(P.rounds, -1);
  P.roundStart.assign(P.rounds + 1, 0);
  P.steps.reserve(static_cast<size_t>(len));
  for (int s = 0; s < len; ++s) {
    tideScheduleStep_t st{};
    st.size = sizeof(st);
    st.version = TIDE_SCHEDULE_STEP_VERSION;
    TIDE_CHECK(tideLayoutGetScheduleStep(layout, n, s, &st));
    const int d = 1 << st.round;
    const int prev = P.steps.empty() ? 0 : P.steps.back().round;
    if (st.round < prev || st.round >= P.rounds || st.sendToNode != ((n - d) % N + N) % N || st.bytes == 0 ||
        st.offset + st.bytes > v.info.sendBytes) {
      return fail(tideInternalError, "Cuda", "tideAllGather: schedule step %d of node %d is inconsistent", s, n);
    }
    P.roundPeer[st.round] = st.sendToNode * R + q;
    P.steps.push_back(AgStep{st.round, st.sendBlockNode, st.offset, st.bytes});
  }
  for (int k = 0; k < P.rounds; ++k) {
    if (P.roundPeer[k] < 0) return fail(tideInternalError, "Cuda", "tideAllGather: round %d has no step", k);
  }
  for (int k = 0, x = 0; k <= P.rounds; ++k) {
    while (x < len && P.steps[x].round < k) ++x;
    P.roundStart[k] = static_cast<size_t>(k == P.rounds ? len : x);
  }
  for (int l = 0; l < R; ++l) {
    if (l != q) P.dests.push_back(n * R + l);
  }
  for (int k = 0; k < P.rounds; ++k) {
    if (std::find(P.dests.begin(), P.dests.end(), P.roundPeer[k]) == P.dests.end()) P.dests.push_back(P.roundPeer[k]);
  }

  // Everything is checked: take the epoch.
  TIDE_CHECK(driverOpsInit());
  const uint64_t epoch = comm->agEpoch + 1;
  TIDE_CHECK(comm->provider->checkStream(me, CollKind::kAllGather, epoch, stream));
  comm->agEpoch = epoch;
  P.e = static_cast<uint32_t>(epoch);
  PeerProvider* pp = comm->provider.get();
  comm->lastAgMulti = tideComm::MultiRecord{epoch, R, P.rounds, pp->defersPushes()};
  uint32_t* own = pp->flags(me, me);
  const int last = P.rounds + 1;  // phases 0 .. last

  if (pp->defersPushes()) {
    // Caller's stream: announce (the internal stream starts after it), then wait for the deferred work's end. The
    // provider first checks that the deferred steps can be issued (world usable, same step count as the earlier
    // ranks), so that no caller-stream wait is enqueued for steps that will never come.
    P.deferred = true;
    if (auto* lb = dynamic_cast<LoopbackProvider*>(pp)) TIDE_CHECK(lb->precheckSteps(me, CollKind::kAllGather, epoch, last));
    TIDE_CHECK(enqueueFlagOps(stream, {FlagOp{FlagOp::kWrite, own + flag::kAgReady, P.e},
                                       FlagOp{FlagOp::kWait, own + flag::kAgFinish, P.e}}));
    cudaStream_t side = comm->sideStream;
    PeerProvider::IssueFn issue = [plan, side](int p) -> tideResult_t { return plan->phase(p, side); };
    TIDE_CHECK(pp->scheduleSteps(me, CollKind::kAllGather, epoch, last, std::move(issue)));
  } else {
    TIDE_CHECK(enqueueFlagOps(stream, {FlagOp{FlagOp::kWrite, own + flag::kAgReady, P.e}}));
    for (int p = 0; p <= last; ++p) TIDE_CHECK(plan->phase(p, stream));
  }
  TIDE_TRACE("Cuda", "AG rank %d (node %d of %d, rail %d) epoch %u: %d rounds, %d paced puts, fan-out to %d%s", me, n,
             N, q, P.e, P.rounds, len, R - 1, P.deferred ? " (deferred, internal stream)" : "");
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
