// TIDE-AG over several (virtual) nodes: own-shard placement, the paced rail schedule over nodes, node-local fan-out;
// the same three phases, in the same order and over the same byte ranges, as the host executor
// (plugin/core/host_allgather.cc). No kernel: every byte moves by copy engine, every ordering by a stream memop.
//
// Rank me = node n, local index q (rail q = the ranks with local index q on every node). Epoch e (the comm's AG
// sequence number, equal on every rank). All on the caller's stream:
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
#include <algorithm>
#include <cinttypes>
#include <vector>

#include "../core/errors.h"
#include "../core/log.h"
#include "copy_batch.h"
#include "driver_ops.h"
#include "executors.h"
#include "internode_transport.h"

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

tideResult_t allGatherMultiNode(tideComm* comm, const LayoutView& v, tideLayout_t layout,
                                const std::vector<const char*>& src, const std::vector<char*>& slotOf,
                                cudaStream_t stream) {
  const int R = v.info.ranksPerNode, N = v.info.nNodes;
  const int me = comm->rank, n = me / R, q = me % R;
  const int nParams = v.info.nParams;
  int rounds = 0;
  while ((1ll << rounds) < N) ++rounds;
  if (rounds > flag::kMaxRounds) {
    return fail(tideUnsupported, "Cuda", "tideAllGather: %d nodes need %d rounds; at most %d are supported", N, rounds,
                flag::kMaxRounds);
  }

  // The schedule of this node, checked before anything is enqueued. Steps are recomputed when enqueued rather than
  // stored: a small pacing cap can make millions of them (tideLayoutGetScheduleStep is a pure function).
  int len = 0;
  TIDE_CHECK(tideLayoutGetScheduleLength(layout, n, &len));
  auto stepAt = [&](int s, tideScheduleStep_t* st) -> tideResult_t {
    *st = tideScheduleStep_t{};
    st->size = sizeof(*st);
    st->version = TIDE_SCHEDULE_STEP_VERSION;
    return tideLayoutGetScheduleStep(layout, n, s, st);
  };
  std::vector<int> roundPeer(rounds, -1);
  int prevRound = 0;
  for (int s = 0; s < len; ++s) {
    tideScheduleStep_t st;
    TIDE_CHECK(stepAt(s, &st));
    const int d = 1 << st.round;
    if (st.round < prevRound || st.round >= rounds || st.sendToNode != ((n - d) % N + N) % N || st.bytes == 0 ||
        st.offset + st.bytes > v.info.sendBytes) {
      return fail(tideInternalError, "Cuda", "tideAllGather: schedule step %d of node %d is inconsistent", s, n);
    }
    prevRound = st.round;
    roundPeer[st.round] = st.sendToNode * R + q;
  }
  for (int k = 0; k < rounds; ++k) {
    if (roundPeer[k] < 0) return fail(tideInternalError, "Cuda", "tideAllGather: round %d has no step", k);
  }

  // Everything is checked: take the epoch.
  TIDE_CHECK(driverOpsInit());
  const uint64_t epoch = comm->agEpoch + 1;
  TIDE_CHECK(comm->provider->checkStream(me, CollKind::kAllGather, epoch, stream));
  comm->agEpoch = epoch;
  const uint32_t e = static_cast<uint32_t>(epoch);

  PeerMappedTransport net(comm->provider.get(), me, comm->device);
  PeerProvider* pp = comm->provider.get();
  char* mine = slotOf[me];

  // 1. Announce, then wait for every rank written into.
  std::vector<int> dests;
  for (int l = 0; l < R; ++l) {
    if (l != q) dests.push_back(n * R + l);
  }
  for (int k = 0; k < rounds; ++k) {
    if (std::find(dests.begin(), dests.end(), roundPeer[k]) == dests.end()) dests.push_back(roundPeer[k]);
  }
  std::vector<FlagOp> ops;
  ops.push_back({FlagOp::kWrite, pp->flags(me, me) + flag::kAgReady, e});
  for (int d : dests) ops.push_back({FlagOp::kWait, pp->flags(me, d) + flag::kAgReady, e});
  TIDE_CHECK(enqueueFlagOps(stream, ops));

  // 2. Own placement.
  CopyList copies;
  for (int i = 0; i < nParams; ++i) {
    const tideParamInfo_t& p = v.params[i];
    const uint64_t shardBytes = p.shardNumel * p.elemSize;
    char* dst = mine + p.slotOffset + static_cast<uint64_t>(me) * shardBytes;
    if (dst != src[i]) copies.add(dst, src[i], shardBytes);
  }
  TIDE_CHECK(copies.enqueue(stream, comm->device));

  // 3-4. Rail schedule: one put per step (at most paceBytes), one signal per round.
  size_t puts = 0;
  int s = 0;  // steps are ordered by round (checked above)
  for (int k = 0; k < rounds; ++k) {
    if (k > 0) TIDE_CHECK(net.waitSignal(stream, flag::kAgRail + k - 1, e));
    const int peer = roundPeer[k];
    while (s < len) {
      tideScheduleStep_t st;
      TIDE_CHECK(stepAt(s, &st));
      if (st.round != k) break;
      copies.clear();
      addBlockRange(v, mine, slotOf[peer], st.sendBlockNode * R + q, st.offset, st.bytes, &copies);
      TIDE_CHECK(net.put(stream, peer, copies));
      ++puts;
      ++s;
    }
    TIDE_CHECK(net.signal(stream, peer, flag::kAgRail + k, e));
  }
  TIDE_CHECK(net.waitSignal(stream, flag::kAgRail + rounds - 1, e));

  // 5. Node-local fan-out of the rail's N blocks, then completion.
  if (R > 1) {
    copies.clear();
    for (int dl = 1; dl < R; ++dl) {
      const int d = n * R + (q + dl) % R;
      for (int j = 0; j < N; ++j) {
        const int b = j * R + q;
        for (int i = 0; i < nParams; ++i) {
          const tideParamInfo_t& p = v.params[i];
          const uint64_t shardBytes = p.shardNumel * p.elemSize;
          const uint64_t at = p.slotOffset + static_cast<uint64_t>(b) * shardBytes;
          copies.add(slotOf[d] + at, mine + at, shardBytes);
        }
      }
    }
    TIDE_CHECK(copies.enqueue(stream, comm->device));
    ops.clear();
    for (int l = 0; l < R; ++l) {
      if (l != q) ops.push_back({FlagOp::kWrite, pp->flags(me, n * R + l) + flag::kAgDone + q, e});
    }
    for (int l = 0; l < R; ++l) {
      if (l != q) ops.push_back({FlagOp::kWait, pp->flags(me, me) + flag::kAgDone + l, e});
    }
    TIDE_CHECK(enqueueFlagOps(stream, ops));
  }
  TIDE_TRACE("Cuda", "AG rank %d (node %d of %d, rail %d) epoch %u: %d rounds, %zu paced puts, fan-out to %d", me, n,
             N, q, e, rounds, puts, R - 1);
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
