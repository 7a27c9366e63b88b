// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Appends operations to a Program in host issue order, merging what may be merged: consecutive flag operations of
// one lane and issue group become one batch (one cuStreamBatchMemOp), consecutive copy segments one copy batch,
// unless a batch is closed explicitly (a paced put is one batch per schedule step). Internal to program_*.cc.
#ifndef TIDE_CORE_PROGRAM_BUILDER_H_
#define TIDE_CORE_PROGRAM_BUILDER_H_

#include <vector>

#include "program.h"

namespace tide {
namespace prog {

class Builder {
 public:
  explicit Builder(Program* p) : p_(p) {}

  // Subsequent operations go to (lane, group); a new step starts when either changes.
  void at(Lane lane, int group) {
    if (!p_->steps.empty()) {
      Step& s = p_->steps.back();
      if (s.lane == lane && s.group == group) return;
    }
    Step s;
    s.lane = lane;
    s.group = group;
    s.begin = s.end = static_cast<uint32_t>(p_->ops.size());
    p_->steps.push_back(s);
    if (lane == Lane::kInternal) p_->usesInternalLane = true;
    open_ = false;
  }

  void wait(int owner, int word, Val base, int64_t delta) { flag(FlagOp::kWait, owner, word, base, delta, -1); }
  void write(int owner, int word, Val base, int64_t delta) { flag(FlagOp::kWrite, owner, word, base, delta, -1); }
  // Transport operations (cross a node boundary): a signal to / a wait for the signal of `peer`.
  void signalTo(int peer, int word, Val base, int64_t delta) { flag(FlagOp::kWrite, peer, word, base, delta, peer); }
  void waitSignalFrom(int peer, int owner, int word, Val base, int64_t delta) {
    flag(FlagOp::kWait, owner, word, base, delta, peer);
  }

  // The waits of `owner` for the one-shot tokens base + s (value 1) of every rank s != owner of W, and their resets
  // to 0 (program_ag.cc captured, program_rs.cc capturedPush). With pairs (Options::pairTokens) words 2i and 2i + 1 that both
  // have a writer are one paired operation; a word whose partner has none (the owner's own word, or the pad past
  // W - 1) is one 32-bit operation, as without pairs; so world size 1 has none and W = 2 one per barrier step.
  void tokenWaits(int owner, int base, int W, bool pairs) { tokens(FlagOp::kWait, owner, base, W, 1, false, pairs); }
  void tokenResets(int owner, int base, int W, bool pairs) { tokens(FlagOp::kWrite, owner, base, W, 0, false, pairs); }
  // The waits of `owner` for tokens of value `value` in words base + s from every rank s (its own too when
  // includeOwn: a token it writes to itself), paired as above. For RS full and consumed tokens, which live in parity
  // banks (word::capRsFull) so that each word holds 0 or the value waited for.
  void tokenWaitsFor(int owner, int base, int W, int64_t value, bool includeOwn, bool pairs) {
    tokens(FlagOp::kWait, owner, base, W, value, includeOwn, pairs);
  }

  // A copy segment, appended to the open copy batch (or a new one). peer >= 0: a transport put to that rank.
  void copy(Addr dst, Addr src, uint64_t bytes, int peer = -1) {
    if (bytes == 0) return;
    Op* o = last();
    if (!(o && open_ && o->kind == Op::kCopies && o->peer == peer)) o = newOp(Op::kCopies, peer);
    p_->copies.push_back(CopySeg{dst, src, bytes});
    o->end = static_cast<uint32_t>(p_->copies.size());
  }
  // Ends the open batch: the next copy or flag starts a new operation.
  void close() { open_ = false; }

  // One p2p group (Op::kP2p), an operation of its own; nothing for an empty group.
  void p2p(const std::vector<P2pXfer>& group) {
    if (group.empty()) return;
    Op* o = newOp(Op::kP2p, -1);
    o->crossNode = true;
    o->begin = static_cast<uint32_t>(p_->p2p.size());
    p_->p2p.insert(p_->p2p.end(), group.begin(), group.end());
    o->end = static_cast<uint32_t>(p_->p2p.size());
    open_ = false;
  }

  void reduce(const ReduceOp& r) {
    Op* o = newOp(Op::kReduce, -1);
    o->begin = static_cast<uint32_t>(p_->reduces.size());
    p_->reduces.push_back(r);
    o->end = o->begin + 1;
    open_ = false;
  }

 private:
  Op* last() { return p_->steps.empty() || p_->steps.back().end == p_->steps.back().begin ? nullptr : &p_->ops.back(); }
  Op* newOp(Op::Kind kind, int peer) {
    Op o;
    o.kind = kind;
    o.crossNode = peer >= 0;
    o.peer = peer;
    o.begin = o.end = static_cast<uint32_t>(kind == Op::kFlags ? p_->flags.size() : p_->copies.size());
    p_->ops.push_back(o);
    p_->steps.back().end = static_cast<uint32_t>(p_->ops.size());
    open_ = true;
    return &p_->ops.back();
  }
  void flag(FlagOp::Kind kind, int owner, int word, Val base, int64_t delta, int peer) {
    Op* o = last();
    if (!(o && open_ && o->kind == Op::kFlags && o->peer == peer)) o = newOp(Op::kFlags, peer);
    FlagOp f;
    f.kind = kind;
    f.base = base;
    f.owner = owner;
    f.word = word;
    f.delta = delta;
    p_->flags.push_back(f);
    o->end = static_cast<uint32_t>(p_->flags.size());
  }

  void tokens(FlagOp::Kind kind, int owner, int base, int W, int64_t value, bool includeOwn, bool pairs) {
    if (!pairs) {
      for (int s = 0; s < W; ++s) {
        if (s != owner || includeOwn) flag(kind, owner, base + s, Val::kConst, value, -1);
      }
      return;
    }
    for (int s = 0; s < W; s += 2) {
      const bool lo = s != owner || includeOwn, hi = s + 1 < W && (s + 1 != owner || includeOwn);  // has a writer
      if (lo && hi) {
        flag(kind, owner, base + s, Val::kConst, value, -1);
        p_->flags.back().pairNext = true;
        flag(kind, owner, base + s + 1, Val::kConst, value, -1);
      } else if (lo || hi) {  // one word with a writer: one 32-bit operation, as without pairs
        flag(kind, owner, base + s + (lo ? 0 : 1), Val::kConst, value, -1);
      }  // neither (world size 1): nothing to wait for or reset
    }
  }

  Program* p_;
  bool open_ = false;
};

inline Addr addr(Mem mem, int index, uint64_t offset) {
  Addr a;
  a.mem = mem;
  a.index = index;
  a.offset = offset;
  return a;
}

}  // namespace prog
}  // namespace tide

#endif  // TIDE_CORE_PROGRAM_BUILDER_H_
