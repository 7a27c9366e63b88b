// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// NCCL's point-to-point semantics for the CPU model of step programs (tests/native/program_model.cc, --two-sided), as a
// two-sided transport's p2p groups (prog::Op::kP2p) rely on them:
//   * matching: the k-th send from A to B matches the k-th receive of B from A, in host issue order (issue());
//   * a group's transfers are posted together when its lane reaches it (post());
//   * rendezvous: a transfer completes only once its partner is posted, and the bytes move then (the strictest
//     semantics NCCL allows: a send may not complete before its receive is posted, so nothing buffers a cycle open);
//   * the lane goes past the group only once every transfer of the group has completed (done()).
// Checked: matched transfers carry equal byte counts and belong to the same call; per rank, peer and direction at
// most `pace` bytes are in flight (posted, their group not yet complete).
#ifndef TIDE_TESTS_NCCL_P2P_MODEL_H_
#define TIDE_TESTS_NCCL_P2P_MODEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "program.h"

namespace tide {
namespace model {

class P2pNet {
 public:
  // Moves the bytes of a matched pair: (sending rank, its transfer, receiving rank, its transfer, call).
  using Move = std::function<void(int, const prog::P2pXfer&, int, const prog::P2pXfer&, int)>;
  using Fail = std::function<void(const std::string&)>;

  P2pNet(int worldSize, uint64_t pace, Move move, Fail fail)
      : W_(worldSize), pace_(pace), move_(std::move(move)), fail_(std::move(fail)), inFlight_(2 * W_ * W_, 0) {}

  // Rank `rank` issues the group xs[0..n) of call `call` (host order: every rank's groups in its program order).
  // Returns the group's id.
  int issue(int rank, int call, const prog::P2pXfer* xs, size_t n) {
    Group g;
    g.rank = rank;
    g.call = call;
    for (size_t i = 0; i < n; ++i) {
      const prog::P2pXfer& x = xs[i];
      if (x.peer < 0 || x.peer >= W_ || x.peer == rank) fail_("rank " + std::to_string(rank) + ": p2p peer " + std::to_string(x.peer));
      const bool send = x.kind == prog::P2pXfer::kSend;
      const Pair key{send ? rank : x.peer, send ? x.peer : rank};
      Slots& s = pairs_[key];
      g.xfers.push_back(Entry{x, send ? s.sends.size() : s.recvs.size(), false});
      (send ? s.sends : s.recvs).push_back(Ref{static_cast<int>(groups_.size()), static_cast<int>(i), false});
      ++issued_;
    }
    groups_.push_back(std::move(g));
    return static_cast<int>(groups_.size()) - 1;
  }

  // The group's lane reached it: every transfer is posted; those whose partner is posted complete.
  void post(int id) {
    Group& g = groups_[id];
    for (size_t i = 0; i < g.xfers.size(); ++i) {
      const Entry& e = g.xfers[i];
      const bool send = e.x.kind == prog::P2pXfer::kSend;
      uint64_t& f = inFlight_[slot(g.rank, e.x.peer, send)];
      f += e.x.bytes;
      if (f > pace_) {
        fail_("rank " + std::to_string(g.rank) + ": " + std::to_string(f) + " bytes in flight " +
              (send ? "to" : "from") + " rank " + std::to_string(e.x.peer) + ", above the pace cap " +
              std::to_string(pace_));
      }
      Slots& s = pairs_[send ? Pair{g.rank, e.x.peer} : Pair{e.x.peer, g.rank}];
      Ref& mine = (send ? s.sends : s.recvs)[e.seq];
      mine.posted = true;
      const std::vector<Ref>& other = send ? s.recvs : s.sends;
      if (e.seq < other.size() && other[e.seq].posted) complete(id, static_cast<int>(i), other[e.seq]);
    }
  }

  // Whether every transfer of the group has completed. The first true also takes the group's bytes out of flight:
  // the lane then moves past the group and asks no more.
  bool done(int id) {
    Group& g = groups_[id];
    for (const Entry& e : g.xfers) {
      if (!e.done) return false;
    }
    for (const Entry& e : g.xfers) inFlight_[slot(g.rank, e.x.peer, e.x.kind == prog::P2pXfer::kSend)] -= e.x.bytes;
    return true;
  }

  // "rank 3 send to 7 #2 (512 bytes)": an unmatched transfer of group id, for a deadlock report.
  std::string pending(int id) const {
    std::string m;
    for (const Entry& e : groups_[id].xfers) {
      if (e.done) continue;
      m += " " + std::string(e.x.kind == prog::P2pXfer::kSend ? "send to " : "recv from ") + std::to_string(e.x.peer) +
           " #" + std::to_string(e.seq) + " (" + std::to_string(e.x.bytes) + " bytes)";
    }
    return m;
  }

  uint64_t issued() const { return issued_; }
  uint64_t matched() const { return matched_; }

 private:
  struct Pair {
    int from, to;
    bool operator<(const Pair& o) const { return from != o.from ? from < o.from : to < o.to; }
  };
  struct Ref {
    int group, index;
    bool posted;
  };
  struct Slots {
    std::vector<Ref> sends, recvs;  // per pair, in issue order
  };
  struct Entry {
    prog::P2pXfer x;
    size_t seq;  // position in its pair's sends or receives
    bool done;
  };
  struct Group {
    int rank = 0, call = 0;
    std::vector<Entry> xfers;
  };

  size_t slot(int rank, int peer, bool send) const { return (static_cast<size_t>(rank) * W_ + peer) * 2 + send; }

  void complete(int id, int index, const Ref& partner) {
    Group& g = groups_[id];
    Group& h = groups_[partner.group];
    Entry& a = g.xfers[index];
    Entry& b = h.xfers[partner.index];
    if (a.x.bytes != b.x.bytes || g.call != h.call) {
      fail_("p2p match #" + std::to_string(a.seq) + " between rank " + std::to_string(g.rank) + " (call " +
            std::to_string(g.call) + ", " + std::to_string(a.x.bytes) + " bytes) and rank " + std::to_string(h.rank) +
            " (call " + std::to_string(h.call) + ", " + std::to_string(b.x.bytes) + " bytes) differs");
    }
    const bool aSends = a.x.kind == prog::P2pXfer::kSend;
    if (aSends) move_(g.rank, a.x, h.rank, b.x, g.call);
    else move_(h.rank, b.x, g.rank, a.x, g.call);
    a.done = b.done = true;
    ++matched_;
  }

  int W_;
  uint64_t pace_;
  Move move_;
  Fail fail_;
  std::vector<uint64_t> inFlight_;  // [rank][peer][send]
  std::map<Pair, Slots> pairs_;
  std::vector<Group> groups_;
  uint64_t issued_ = 0, matched_ = 0;
};

}  // namespace model
}  // namespace tide

#endif  // TIDE_TESTS_NCCL_P2P_MODEL_H_
