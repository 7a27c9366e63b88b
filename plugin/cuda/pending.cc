// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "pending.h"

#include <cstdio>

#include "program_exec.h"

namespace tide {
namespace cuda {
namespace {

bool reached(uint32_t have, uint32_t want) { return static_cast<int32_t>(have - want) >= 0; }

// Who writes the value a wait on (owner, word) expects (cross-node waits name their peer in the program).
int writerOf(const prog::Program& p, const prog::Op& op, const prog::FlagOp& f) {
  if (op.crossNode && op.peer >= 0) return op.peer;
  const int R = p.ranksPerNode > 0 ? p.ranksPerNode : p.worldSize;
  const int node = f.owner / R;
  namespace w = prog::word;
  if (f.word >= w::kAgDone && f.word < w::kAgDone + w::kMaxLocalRanks) return node * R + (f.word - w::kAgDone);
  if (f.word >= w::kRsFull && f.word < w::kRsFull + w::kMaxLocalRanks) return node * R + (f.word - w::kRsFull);
  if (f.word >= w::kCapAgReady && f.word < w::kWords) return (f.word - w::kCapAgReady) % 64;  // the token's writer
  return f.owner;
}

// A token program's waits are followed by resets to 0, so a word at 0 may be one already waited for: its phase word
// (prog::word::kCapAgPhase / kCapRsPhase) says which of its two wait sets can still be pending (0: none).
bool tokenWaitMayPend(const prog::Program& p, const prog::FlagOp& f, const std::vector<uint32_t>& words) {
  namespace w = prog::word;
  const bool ag = p.coll == prog::Coll::kAllGather;
  const size_t at = static_cast<size_t>(p.rank) * w::kWords + (ag ? w::kCapAgPhase : w::kCapRsPhase);
  const uint32_t phase = at < words.size() ? words[at] : 0;
  const int first = ag ? w::kCapAgReady : w::kCapRsEnter;  // the entry tokens; then done / full / consumed tokens
  const bool entry = f.word >= first && f.word < first + 64;
  return (phase == 1 && entry) || (phase == 2 && !entry);
}

void scan(const tideComm::LastCall& last, int coll, const std::vector<uint32_t>& words, std::vector<PendingWait>* out) {
  if (!last.bound) return;
  const prog::Program& p = last.bound->program();
  const bool tokens = p.mode == prog::Mode::kCaptured;
  bool stuck[2] = {false, false};
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const prog::Step& st = p.steps[s];
    const int lane = static_cast<int>(st.lane);
    if (stuck[lane]) continue;
    for (uint32_t o = st.begin; o < st.end && !stuck[lane]; ++o) {
      const prog::Op& op = p.ops[o];
      if (op.kind != prog::Op::kFlags) continue;
      for (uint32_t i = op.begin; i < op.end; ++i) {
        const prog::FlagOp& f = p.flags[i];
        if (f.kind != prog::FlagOp::kWait) continue;
        if (tokens && !tokenWaitMayPend(p, f, words)) continue;
        const size_t at = static_cast<size_t>(f.owner) * prog::word::kWords + f.word;
        if (at >= words.size()) continue;
        const uint32_t want = f.value(last.epoch, last.task), have = words[at];
        if (reached(have, want)) continue;
        PendingWait pw;
        pw.collective = coll;
        pw.lane = lane;
        pw.step = static_cast<int>(s);
        pw.owner = f.owner;
        pw.word = f.word;
        pw.writer = writerOf(p, op, f);
        pw.expected = want;
        pw.seen = have;
        shortWordName(f.word, p.ranksPerNode, pw.name, sizeof(pw.name));
        out->push_back(pw);
        stuck[lane] = true;
        break;
      }
    }
  }
}

}  // namespace

void shortWordName(int w, int ranksPerNode, char* buf, size_t len) {
  (void)ranksPerNode;
  namespace k = prog::word;
  if (w == k::kAgReady) snprintf(buf, len, "agReady");
  else if (w == k::kRsEnter) snprintf(buf, len, "rsEnter");
  else if (w == k::kRsConsumed) snprintf(buf, len, "rsConsumed");
  else if (w == k::kRsPushDone) snprintf(buf, len, "rsPushDone");
  else if (w == k::kRsPrev) snprintf(buf, len, "rsPrev");
  else if (w == k::kRsFinal) snprintf(buf, len, "rsFinal");
  else if (w == k::kAgFinish) snprintf(buf, len, "agFinish");
  else if (w == k::kCapAgPhase) snprintf(buf, len, "capAgPhase");
  else if (w == k::kCapRsPhase) snprintf(buf, len, "capRsPhase");
  else if (w >= k::kAgRail && w < k::kAgRail + k::kMaxRounds) snprintf(buf, len, "agRail[%d]", w - k::kAgRail);
  else if (w >= k::kAgDone && w < k::kAgDone + k::kMaxLocalRanks) snprintf(buf, len, "agDone[%d]", w - k::kAgDone);
  else if (w >= k::kRsFull && w < k::kRsFull + k::kMaxLocalRanks) snprintf(buf, len, "rsFull[%d]", w - k::kRsFull);
  // Token words (captured calls, eager calls on the graph route) read like the epoch words they stand for, with the
  // writer in brackets: "rank 0 waits for agReadyTok[1]" says what "waits for rank 1's agReady" says eagerly.
  else if (w >= k::kCapAgReady && w < k::kCapAgDone) snprintf(buf, len, "agReadyTok[%d]", w - k::kCapAgReady);
  else if (w >= k::kCapAgDone && w < k::kCapRsEnter) snprintf(buf, len, "agDoneTok[%d]", w - k::kCapAgDone);
  else if (w >= k::kCapRsEnter && w < k::kCapRsFull) snprintf(buf, len, "rsEnterTok[%d]", w - k::kCapRsEnter);
  else if (w >= k::kCapRsFull && w < k::kCapRsConsumed) snprintf(buf, len, "rsFullTok[%d]", w - k::kCapRsFull);
  else if (w >= k::kCapRsConsumed && w < k::kCapRsFullOdd) snprintf(buf, len, "rsConsumedTok[%d]", w - k::kCapRsConsumed);
  else if (w >= k::kCapRsFullOdd && w < k::kCapRsConsumedOdd) snprintf(buf, len, "rsFullTokOdd[%d]", w - k::kCapRsFullOdd);
  else if (w >= k::kCapRsConsumedOdd && w < k::kWords) snprintf(buf, len, "rsConsumedTokOdd[%d]", w - k::kCapRsConsumedOdd);
  else snprintf(buf, len, "word[%d]", w);
}

void pendingWaits(const tideComm* comm, const std::vector<uint32_t>& words, std::vector<PendingWait>* out) {
  out->clear();
  scan(comm->lastAg, 0, words, out);
  scan(comm->lastRs, 1, words, out);
}

}  // namespace cuda
}  // namespace tide
