// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Two-sided p2p groups of multi-node programs (p2p_plan.h).
#include "p2p_plan.h"

#include <algorithm>

#include "schedule.h"

namespace tide {
namespace prog {
namespace {

// The running sum of RS task t (chunk t / N of the rail owner on node t % N): its staging offset and fp32 bytes.
void rsPartial(const Layout& l, int t, uint64_t* offset, uint64_t* bytes) {
  const uint64_t k = static_cast<uint64_t>(t / l.nNodes), c0 = k * l.rs.chunkNumel;
  *offset = static_cast<uint64_t>(t % l.rs.numBuffers) * l.rs.stagingBufferBytes + l.rs.stagingPartialOffset;
  *bytes = (std::min(c0 + l.rs.chunkNumel, l.rsOutNumel) - c0) * sizeof(float);
}

// The sends of `rank` after its fold of RS task t, in pieces of at most paceBytes.
std::vector<Wire> rsNextWires(const Layout& l, int rank, int t) {
  const int R = l.ranksPerNode, N = l.nNodes, n = rank / R, q = rank % R, m = t % N;
  int to = -1;
  if (n < N - 1) to = rank + R;             // the running sum, on to the next node
  else if (m != N - 1) to = m * R + q;      // the last node: the final sum to the owner
  std::vector<Wire> out;
  if (to < 0) return out;
  uint64_t offset = 0, bytes = 0;
  rsPartial(l, t, &offset, &bytes);
  for (uint64_t at = 0; at < bytes; at += l.paceBytes) {
    out.push_back(Wire{rank, to, Mem::kStaging, offset + at, std::min(l.paceBytes, bytes - at)});
  }
  return out;
}

std::vector<Wire> sendsOf(const Layout& l, P2pAt at, int index, int rank) {
  if (at == P2pAt::kAgStep) return agStepWires(l, rank, index);
  if (at == P2pAt::kRsNext) return rsNextWires(l, rank, index);
  return {};
}

// The receives of `rank` at (at, index): the sends, at the matching point, of the one rank that sends to it there.
std::vector<Wire> recvsOf(const Layout& l, P2pAt at, int index, int rank) {
  const int R = l.ranksPerNode, N = l.nNodes, n = rank / R, q = rank % R;
  int from = -1;
  P2pAt fromAt = P2pAt::kRsNext;
  if (at == P2pAt::kAgStep) {
    from = scheduleStep(l, n, index).recvFromNode * R + q;
    fromAt = P2pAt::kAgStep;
  } else if (at == P2pAt::kRsPrev && n > 0) {
    from = rank - R;
  } else if (at == P2pAt::kRsFinal && index % N == n && n != N - 1) {
    from = (N - 1) * R + q;
  }
  std::vector<Wire> out;
  if (from < 0) return out;
  for (const Wire& w : sendsOf(l, fromAt, index, from)) {
    if (w.to == rank) out.push_back(w);
  }
  return out;
}

P2pXfer xfer(P2pXfer::Kind kind, int peer, const Wire& w, int me) {
  P2pXfer x;
  x.kind = kind;
  x.peer = peer;
  x.addr.mem = w.mem;
  x.addr.index = me;
  x.addr.offset = w.offset;
  x.bytes = w.bytes;
  return x;
}

}  // namespace

std::vector<Wire> agStepWires(const Layout& l, int rank, int step) {
  const int R = l.ranksPerNode, q = rank % R;
  const ScheduleStep st = scheduleStep(l, rank / R, step);
  const int to = st.sendToNode * R + q, block = st.sendBlockNode * R + q;
  const uint64_t offset = st.offset, end = st.offset + st.bytes;
  int lo = 0, hi = l.nParams;  // first parameter whose shard ends after offset (send offsets increase)
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    const ParamLayout& p = l.params[mid];
    if (p.sendOffset + p.shardBytes <= offset) lo = mid + 1; else hi = mid;
  }
  std::vector<Wire> out;
  for (int i = lo; i < l.nParams && l.params[i].sendOffset < end; ++i) {
    const ParamLayout& p = l.params[i];
    const uint64_t a = std::max(offset, p.sendOffset), e = std::min(end, p.sendOffset + p.shardBytes);
    if (a < e) out.push_back(Wire{rank, to, Mem::kSlot, p.slotPos(block) + (a - p.sendOffset), e - a});
  }
  return out;
}

std::vector<P2pGroup> p2pGroups(const Layout& l, P2pAt at, int index) {
  std::vector<P2pGroup> groups;
  if (l.nNodes <= 1) return groups;
  const int me = l.rank;
  const std::vector<Wire> sends = sendsOf(l, at, index, me), recvs = recvsOf(l, at, index, me);
  if (at == P2pAt::kAgStep) {  // one group: the step's send and the receive it must not wait behind
    P2pGroup g;
    for (const Wire& w : sends) g.push_back(xfer(P2pXfer::kSend, w.to, w, me));
    for (const Wire& w : recvs) g.push_back(xfer(P2pXfer::kRecv, w.from, w, me));
    if (!g.empty()) groups.push_back(std::move(g));
    return groups;
  }
  for (const Wire& w : sends) groups.push_back({xfer(P2pXfer::kSend, w.to, w, me)});
  for (const Wire& w : recvs) groups.push_back({xfer(P2pXfer::kRecv, w.from, w, me)});
  return groups;
}

}  // namespace prog
}  // namespace tide
