// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Program listing and flag-word names (program.h), for the debug dump, the pending-wait report and tests.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "program.h"

namespace tide {
namespace prog {
namespace {

void append(std::vector<char>* t, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void append(std::vector<char>* t, const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (!t->empty() && t->back() == '\0') t->pop_back();
  t->insert(t->end(), buf, buf + std::min<size_t>(static_cast<size_t>(n), sizeof(buf) - 1));
  t->push_back('\0');
}

const char* memName(Mem m) {
  switch (m) {
    case Mem::kSrc: return "src";
    case Mem::kGrad: return "grad";
    case Mem::kSlot: return "slot";
    case Mem::kStaging: return "staging";
    case Mem::kOut: return "out";
    case Mem::kZeros: return "zeros";
    case Mem::kMulticast: return "multicast";
  }
  return "?";
}

const char* valName(Val v) { return v == Val::kEpoch ? "epoch" : v == Val::kTask ? "task" : "const"; }

}  // namespace

void wordName(int w, char* buf, size_t len) {
  if (w == word::kAgReady) snprintf(buf, len, "AG ready (slot may be written)");
  else if (w == word::kRsEnter) snprintf(buf, len, "RS enter (staging may be written)");
  else if (w == word::kRsConsumed) snprintf(buf, len, "RS consumed (staging buffer reduced)");
  else if (w == word::kRsPushDone) snprintf(buf, len, "RS push done (gradients read)");
  else if (w == word::kRsPrev) snprintf(buf, len, "RS running sum from the previous node");
  else if (w == word::kRsFinal) snprintf(buf, len, "RS final sum from the last node");
  else if (w == word::kAgFinish) snprintf(buf, len, "AG deferred work finished");
  else if (w == word::kCapAgPhase) snprintf(buf, len, "captured AG phase (1 entered, 2 gathering, 0 done)");
  else if (w == word::kCapRsPhase) snprintf(buf, len, "captured RS phase (1 entered, 2 reducing, 0 done)");
  else if (w >= word::kAgRail && w < word::kAgRail + word::kMaxRounds) snprintf(buf, len, "AG rail round %d landed", w - word::kAgRail);
  else if (w >= word::kAgDone && w < word::kAgDone + word::kMaxLocalRanks) snprintf(buf, len, "AG done from local rank %d", w - word::kAgDone);
  else if (w >= word::kRsFull && w < word::kRsFull + word::kMaxLocalRanks) snprintf(buf, len, "RS full from local rank %d", w - word::kRsFull);
  else if (w >= word::kCapAgReady && w < word::kCapAgReady + 64) snprintf(buf, len, "captured AG ready of rank %d", w - word::kCapAgReady);
  else if (w >= word::kCapAgDone && w < word::kCapAgDone + 64) snprintf(buf, len, "captured AG done from rank %d", w - word::kCapAgDone);
  else if (w >= word::kCapRsEnter && w < word::kCapRsEnter + 64) snprintf(buf, len, "captured RS enter of rank %d", w - word::kCapRsEnter);
  else if (w >= word::kCapRsFull && w < word::kCapRsFull + 64) snprintf(buf, len, "captured RS full (even chunk) from rank %d", w - word::kCapRsFull);
  else if (w >= word::kCapRsConsumed && w < word::kCapRsConsumed + 64) snprintf(buf, len, "captured RS consumed (even chunk) by rank %d", w - word::kCapRsConsumed);
  else if (w >= word::kCapRsFullOdd && w < word::kCapRsFullOdd + 64) snprintf(buf, len, "captured RS full (odd chunk) from rank %d", w - word::kCapRsFullOdd);
  else if (w >= word::kCapRsConsumedOdd && w < word::kCapRsConsumedOdd + 64) snprintf(buf, len, "captured RS consumed (odd chunk) by rank %d", w - word::kCapRsConsumedOdd);
  else snprintf(buf, len, "word %d", w);
}

void describe(const Program& p, std::vector<char>* t) {
  append(t, "%s rank %d of %d (%d nodes of %d), mode %d: %zu steps, %zu ops, %zu flag ops, %zu copies, %zu reduces",
         p.coll == Coll::kAllGather ? "AG" : "RS", p.rank, p.worldSize, p.nNodes, p.ranksPerNode,
         static_cast<int>(p.mode), p.steps.size(), p.ops.size(), p.flags.size(), p.copies.size(), p.reduces.size());
  if (p.transport == Transport::kTwoSided) append(t, ", %zu p2p transfers (two-sided)", p.p2p.size());
  append(t, "\n");
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const Step& st = p.steps[s];
    append(t, "step %zu lane %s group %d\n", s, st.lane == Lane::kCaller ? "caller" : "internal", st.group);
    for (uint32_t o = st.begin; o < st.end; ++o) {
      const Op& op = p.ops[o];
      if (op.kind == Op::kFlags) {
        for (uint32_t f = op.begin; f < op.end; ++f) {
          const FlagOp& x = p.flags[f];
          char name[64];
          wordName(x.word, name, sizeof(name));
          append(t, "  %s rank %d word %d (%s) %s %s%+lld%s\n", x.kind == FlagOp::kWait ? "wait " : "write", x.owner,
                 x.word, name, x.kind == FlagOp::kWait ? ">=" : "=", valName(x.base),
                 static_cast<long long>(x.delta), x.pairNext ? " (paired with the next: one 64-bit op, an equality wait)" : "");
        }
      } else if (op.kind == Op::kCopies) {
        const CopySeg& c = p.copies[op.begin];
        append(t, "  copies %u%s: first %s[%d]+%llu <- %s[%d]+%llu (%llu bytes)\n", op.end - op.begin,
               op.crossNode ? " (put)" : "", memName(c.dst.mem), c.dst.index,
               static_cast<unsigned long long>(c.dst.offset), memName(c.src.mem), c.src.index,
               static_cast<unsigned long long>(c.src.offset), static_cast<unsigned long long>(c.bytes));
      } else if (op.kind == Op::kP2p) {
        append(t, "  p2p group of %u:\n", op.end - op.begin);
        for (uint32_t x = op.begin; x < op.end; ++x) {
          const P2pXfer& f = p.p2p[x];
          append(t, "    %s rank %d %s[%d]+%llu (%llu bytes)\n", f.kind == P2pXfer::kSend ? "send to  " : "recv from",
                 f.peer, memName(f.addr.mem), f.addr.index, static_cast<unsigned long long>(f.addr.offset),
                 static_cast<unsigned long long>(f.bytes));
        }
      } else {
        const ReduceOp& r = p.reduces[op.begin];
        append(t, "  reduce %d inputs at %s[%d]+%llu%s -> %s[%d]+%llu, %llu elements\n", r.nInputs,
               memName(r.inputs.mem), r.inputs.index, static_cast<unsigned long long>(r.inputs.offset),
               r.hasPrev ? " + prev" : "", memName(r.out.mem), r.out.index,
               static_cast<unsigned long long>(r.out.offset), static_cast<unsigned long long>(r.n));
      }
    }
  }
}

uint32_t kernelTail(const Program& p, const Op& op, uint32_t* ordered) {
  *ordered = 0;
  if (op.kind != Op::kFlags) return op.end;
  std::vector<std::pair<int32_t, int32_t>> seen;  // (owner, word) of the run so far
  uint32_t begin = op.end;
  while (begin > op.begin) {
    const FlagOp& f = p.flags[begin - 1];
    if (f.kind != FlagOp::kWrite) break;
    const std::pair<int32_t, int32_t> w{f.owner, f.word};
    if (std::find(seen.begin(), seen.end(), w) != seen.end()) break;
    seen.push_back(w);
    --begin;
  }
  if (begin > op.begin && begin < op.end && p.flags[begin - 1].pairNext) ++begin;  // the pair's other half stayed out
  while (begin + *ordered < op.end && p.flags[begin + *ordered].owner == p.rank) ++*ordered;
  return begin;
}

}  // namespace prog
}  // namespace tide
