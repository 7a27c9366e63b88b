// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// CPU model of the step-program protocol (plugin/core/program.h; docs/architecture.md "Step programs").
//
// Runs the programs of all W ranks of a layout together over host memory: every rank has two lanes (its caller's
// stream and the comm's internal stream), each a FIFO of operations; a seeded scheduler repeatedly executes the
// head of a random lane whose head can run (a wait runs once its flag has reached the value, cyclically, as
// CU_STREAM_WAIT_VALUE_GEQ compares). A sequence of collectives (AG and RS, RS staging in the slot region
// (Slot-Reuse) or in a separate buffer) runs back to back, with the inputs rewritten on each caller lane between
// calls. Checked:
//   * termination: no state in which some lane is non-empty but no head can run (a deadlock);
//   * results: each AG slot and RS output equal the host executor's bit for bit, at the caller lane's end of the call;
//   * hazards, from a shadow tag per byte: a staging or slot byte is written only when empty (consumed), read only
//     after this call wrote it; inputs (shards, gradients) are read only while they hold this call's data; staging is
//     empty again when the caller's lane reaches the end of an RS; every access stays inside its buffer.
// Usage: program_model [--token-rs-chunks N] [--pair-tokens] [--kernel-order[-swapped]] [--fold] [--caller-first] MODE...
//        --pair-tokens: token programs with Options::pairTokens (barrier tokens in pairs of words, each pair one
//                       64-bit operation whose wait needs both words equal to their values).
//        --single-rs-banks (after --pair-tokens): a mutant with the RS full / consumed tokens of odd chunks in the
//                       even banks; the model must catch a pair's equality wait that could never pass.
//        --kernel-order: token programs' batch tails stored as a signal kernel may (prog::kernelTail): the ordered
//                       prefix first, then the rest, each part reversed. --kernel-order-swapped: the rest first, a
//                       mutant the model must catch.
//                                         --fold (with --copy-queue / --channels): every token program on its
//                                         caller's lane (direct issue on one stream) instead of two lanes;
//                                         --caller-first (with groups): each round's caller-lane items issued before
//                                         its internal-lane items (a graph executor may order a round's branches so)
//                                         a leading option for every mode below: token RS programs may have up to
//                                         N pipeline chunks (default 2; NCCL_TIDE_TOKEN_RS_CHUNKS), so layouts of
//                                         more chunks than staging buffers run the consumed-token pipeline
//                                         (program_rs.cc capturedPipelined) and the loopback models add such layouts
//        program_model [seeds]            exit 0: every case passed; prints one line per case
//        program_model --drop-wait WORD   the same cases with every wait on flag word WORD removed from every
//                                         program: must fail (a hazard, a wrong result or a deadlock), which shows
//                                         that the model sees what that wait protects
//                                         (tests/unit/test_program_model.py)
//        program_model --drop-own-token-waits [seeds] | --no-fork [seeds]
//                                         mutations of the two-lane token RS (more chunks than buffers): without a
//                                         rank's waits for its own full / consumed tokens (its lanes' meeting
//                                         points), or without the fork (its internal lane starting before its caller
//                                         produced the call's inputs), the model must fail
//        program_model --two-sided [MUTANT] [seeds]
//                                         multi-node layouts (2x4, 4x2, 3x2, 2x3, 5x1, 2x1, 8x8, 16x8 nodes x ranks
//                                         per node; random parameter counts, sizes, dtypes, RS chunks and pace caps)
//                                         compiled with Options::transport = kTwoSided: every cross-node transfer
//                                         is a p2p group (Op::kP2p) run with NCCL's p2p semantics
//                                         (tests/native/nccl_p2p_model.h: per-pair matching in issue order,
//                                         rendezvous, a group posted at once), AG and RS calls back to back; also
//                                         checked: no program touches memory or flags of another node, every p2p
//                                         group is on one lane, at most the pace cap is in flight per peer.
//                                         MUTANT --p2p-swap | --p2p-drop-recv | --p2p-split: two adjacent groups
//                                         swapped, each program's first receive dropped, each group's receives
//                                         posted after its sends; the model must fail
//        program_model --in-place [MUTANT] [seeds]
//                                         NCCL's in-place reduce-scatter (include/tide.h, tideReduceScatter): every
//                                         RS output is rank r's own block of its own one-parameter gradient (bytes
//                                         r * shardBytes on, output type = gradient type), so output writes and
//                                         gradient reads share bytes and tags; a gradient byte read after this
//                                         call's output write is a hazard. Random layouts (odd sizes, up to 40
//                                         chunks; 6 per node split), W = 2, 3, 4, 8 with every node split, bf16 /
//                                         fp16 / fp32, sum / avg / premul; in-order, deferred, two-sided, captured
//                                         (two lanes and folded), eager token calls, and the loopback issue models
//                                         (inPlaceMain).
//                                         MUTANT --in-place-other-block (outputs in rank (r + 1) % W's block) or
//                                         --in-place-mirror (reduces write chunk k where a later chunk's gradient
//                                         is still to be pushed): the model must fail
//        program_model --copy-queue C ENTRIES ISSUE PROTOCOL [seeds]
//                                         the loopback issue model (docs/protocol.md, "Shared hardware queues"): the
//                                         host issues each virtual rank's call in turn, every copy also enters ONE
//                                         copy queue shared by all ranks (first in, first out: a copy runs only at
//                                         its head) that holds C entries; a copy batch costs 1 entry (ENTRIES
//                                         "batch", cudaMemcpyBatchAsync) or one per copy ("graph", a captured
//                                         graph's memcpy nodes); the host blocks while the queue is full. ISSUE
//                                         "call" issues a rank's whole program at its call; "announce" issues only
//                                         its first writes (up to its first wait) then, and the rest of every rank
//                                         after the last rank's call; "rounds" (token protocols only) splits each
//                                         rank's program into rounds at every wait that follows a non-wait (a round
//                                         is "waits*, then non-waits*", round 0 the announce), issues round 0 at
//                                         each rank's call and, after the last rank's call, round 1 of every rank
//                                         (rank 0 .. W-1), then round 2 of every rank, ...; "groups" the same
//                                         with the programs' own issue rounds (Step::group), which is what
//                                         BoundProgram::issueTokens does on loopback. PROTOCOL "epoch" or
//                                         "token" (single-node all-gathers), "token-mixed" (token all-gathers and
//                                         reduce-scatters alternating, at most N RS chunks). Exit 0, or FAIL with
//                                         "deadlock" if it can hang.
//        program_model --channels K MAP C ISSUE PROTOCOL [seeds]
//                                         the shared-channel model (a hypothesis about the H200's queues:
//                                         docs/protocol.md, "Shared hardware queues"): the same loopback issue orders and
//                                         protocols, but EVERY issued operation (each memop, waits included; each
//                                         copy batch, costing one entry per copy; each reduce; the model's input
//                                         and check pseudo-operations) enters one of K first-in-first-out channels
//                                         and runs only at the head of its channel (and of its lane), so a wait at
//                                         a channel's head blocks everything behind it, other ranks' work included.
//                                         MAP "rank": rank r's operations in channel r % K (K = 1: one FIFO for
//                                         everything, the worst case); "random": each operation in a seeded random
//                                         channel. C: each channel's capacity in entries, the host blocking while
//                                         an operation does not fit (0: unbounded). Every run is reported ("ok" or
//                                         "HANG" with the channel heads); exit 0 if none hung, 3 if some did, 1 on
//                                         any other failure (hazard, result differing from the host executor).
//                                         Why the rounds order should not hang under any MAP, K or C: every wait's
//                                         producers (peer writes of earlier rounds) are issued before it, so by
//                                         induction on issue order everything issued completes (an argument; the
//                                         model checks the MAPs, K and C that tests/unit/test_program_model.py runs).
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dtype.h"
#include "errors.h"
#include "host_executor.h"
#include "layout.h"
#include "nccl_p2p_model.h"
#include "program.h"

using namespace tide;
using namespace tide::prog;

namespace {

constexpr int32_t kEmpty = -1;
int g_dropWord = -1;  // --drop-wait
// --drop-own-token-waits: remove the waits a rank's caller and internal lanes use to meet each other (its own full
// and consumed tokens, which only the two-lane token RS of more chunks than buffers has); --no-fork: no fork item.
bool g_dropOwn = false, g_noFork = false;
// --token-rs-chunks N: the most chunks a token RS may have (NCCL_TIDE_TOKEN_RS_CHUNKS; Options::maxTokenRsChunks).
int g_tokenRsChunks = 2;
// --pair-tokens: token programs compiled with Options::pairTokens (barrier tokens waited for and reset in pairs).
bool g_pairTokens = false;
// --single-rs-banks: a mutant that puts the RS full and consumed tokens of odd chunks back into the even banks (one
// word per writer for every chunk, as an earlier layout had): with pairs, an equality wait must then be caught.
bool g_singleBanks = false;
// --kernel-order: every token program's batch tails (prog::kernelTail) run as a signal kernel may store them: its
// ordered prefix first, then the rest, each part in reverse program order (pairs kept whole). --kernel-order-swapped:
// a mutant kernel that stores the rest before the ordered prefix; the model must fail (a reset landing after a peer's
// next-call token).
int g_kernelOrder = 0;  // 1 --kernel-order, 2 --kernel-order-swapped
uint64_t g_kernelTailFlags = 0;  // flags that the reordering put in another position (printed: it ran)
uint64_t g_pairOps = 0;  // token pairs run as one operation (printed at the end)
// --two-sided: multi-node programs compiled with Options::transport = kTwoSided, their p2p groups run by P2pNet.
bool g_twoSided = false;
// --two-sided's mutants, which the model must catch: kSwap exchanges the first two adjacent p2p groups of a step (a
// wrong order), kDropRecv removes each program's first receive, kSplit posts each group's receives as a group of
// their own after its sends (no longer posted together: a rendezvous cycle).
enum class P2pMutant { kNone, kSwap, kDropRecv, kSplit };
P2pMutant g_p2pMutant = P2pMutant::kNone;
uint64_t g_p2pIssued = 0, g_p2pMatched = 0;  // p2p transfers over every run (printed: they ran)
// --in-place: NCCL's in-place reduce-scatter form (include/tide.h, tideReduceScatter): rank r's output (Mem::kOut) is
// rank r's own block of its own gradient, bytes [r * shardBytes, (r + 1) * shardBytes) of its one parameter, so the
// output shares bytes and shadow tags with that gradient. An output write turns a byte's tag into outTag(call), and
// any later read of it as a gradient is a hazard. Mutants the model must catch: kOtherBlock resolves the output into
// rank (r + 1) % W's block instead; kMirror compiles the reduces to write chunk [c0, c1) at [n - c1, n - c0) of the
// n-element output (a program whose reduce of an early chunk overwrites gradient bytes a later push still reads).
bool g_inPlace = false;
enum class InPlaceMutant { kNone, kOtherBlock, kMirror };
InPlaceMutant g_inPlaceMutant = InPlaceMutant::kNone;
uint64_t g_inPlaceOutBytes = 0;  // output bytes written into a gradient (printed: the in-place form ran)
constexpr int32_t kOutTagBase = 1 << 24;  // above any call index of a run
int32_t outTag(int call) { return kOutTagBase + call; }

// The p2p mutants (g_p2pMutant) applied to a two-sided program.
void mutateP2p(Program* p) {
  if (g_p2pMutant == P2pMutant::kSwap) {
    for (const Step& st : p->steps) {
      for (uint32_t o = st.begin; o + 1 < st.end; ++o) {
        if (p->ops[o].kind == Op::kP2p && p->ops[o + 1].kind == Op::kP2p) {
          std::swap(p->ops[o], p->ops[o + 1]);
          return;
        }
      }
    }
  } else if (g_p2pMutant == P2pMutant::kDropRecv) {
    for (Op& op : p->ops) {
      for (uint32_t x = op.kind == Op::kP2p ? op.begin : op.end; x < op.end; ++x) {
        if (p->p2p[x].kind != P2pXfer::kRecv) continue;
        p->p2p.erase(p->p2p.begin() + x);
        for (Op& o : p->ops) {
          if (o.kind != Op::kP2p) continue;
          if (o.begin > x) --o.begin;
          if (o.end > x) --o.end;
        }
        return;
      }
    }
  } else if (g_p2pMutant == P2pMutant::kSplit) {
    std::vector<Op> ops;
    for (Step& st : p->steps) {
      const uint32_t b = static_cast<uint32_t>(ops.size());
      for (uint32_t o = st.begin; o < st.end; ++o) {
        const Op& op = p->ops[o];
        uint32_t r = op.begin;
        while (op.kind == Op::kP2p && r < op.end && p->p2p[r].kind == P2pXfer::kSend) ++r;
        if (op.kind != Op::kP2p || r == op.begin || r == op.end) {
          ops.push_back(op);
          continue;
        }
        Op sends = op, recvs = op;
        sends.end = recvs.begin = r;
        ops.push_back(sends);
        ops.push_back(recvs);
      }
      st.begin = b;
      st.end = static_cast<uint32_t>(ops.size());
    }
    p->ops = std::move(ops);
  }
}

// Reorders the tails of p's flag batches as a signal kernel may store them (g_kernelOrder).
void reorderKernelTails(Program* p) {
  for (const Op& op : p->ops) {
    uint32_t ordered = 0;
    const uint32_t t = kernelTail(*p, op, &ordered);
    if (t >= op.end) continue;
    auto units = [&](uint32_t b, uint32_t e) {  // a pair is one unit, kept whole
      std::vector<std::vector<FlagOp>> u;
      for (uint32_t f = b; f < e;) {
        const uint32_t n = p->flags[f].pairNext && f + 1 < e ? 2 : 1;
        u.emplace_back(p->flags.begin() + f, p->flags.begin() + f + n);
        f += n;
      }
      std::reverse(u.begin(), u.end());
      return u;
    };
    std::vector<std::vector<FlagOp>> first = units(t, t + ordered), rest = units(t + ordered, op.end);
    if (g_kernelOrder == 2) std::swap(first, rest);
    uint32_t at = t;
    for (const auto* part : {&first, &rest}) {
      for (const auto& u : *part) {
        for (const FlagOp& f : u) {
          const FlagOp& was = p->flags[at];
          g_kernelTailFlags += was.owner != f.owner || was.word != f.word;
          p->flags[at++] = f;
        }
      }
    }
  }
}

// Removes every wait on g_dropWord (the mutation of --drop-wait); flag runs left empty become no-ops.
void mutate(Program* p) {
  if (g_kernelOrder != 0 && p->mode == Mode::kCaptured) reorderKernelTails(p);
  if (g_singleBanks) {
    for (FlagOp& f : p->flags) {
      if (f.word >= word::kCapRsFullOdd && f.word < word::kWords) f.word -= word::kCapRsFullOdd - word::kCapRsFull;
    }
  }
  if (p->transport == Transport::kTwoSided) mutateP2p(p);
  if (g_dropWord < 0 && !g_dropOwn) return;
  auto dropped = [&](const FlagOp& f) {
    if (f.kind != FlagOp::kWait) return false;
    if (f.word == g_dropWord) return true;
    return g_dropOwn && f.owner == p->rank &&
           (f.word == word::kCapRsFull + p->rank || f.word == word::kCapRsConsumed + p->rank ||
            f.word == word::kCapRsFullOdd + p->rank || f.word == word::kCapRsConsumedOdd + p->rank);
  };
  std::vector<FlagOp> flags;
  for (Op& op : p->ops) {
    if (op.kind != Op::kFlags) continue;
    const uint32_t b = static_cast<uint32_t>(flags.size());
    for (uint32_t f = op.begin; f < op.end; ++f) {
      if (!dropped(p->flags[f])) flags.push_back(p->flags[f]);
    }
    op.begin = b;
    op.end = static_cast<uint32_t>(flags.size());
  }
  p->flags = std::move(flags);
  for (FlagOp& f : p->flags) f.pairNext = false;  // a dropped half leaves no pair: the mutants run word by word
}


[[noreturn]] void die(const std::string& what) {
  fprintf(stderr, "FAIL: %s\n", what.c_str());
  exit(1);
}

// The kMirror mutant of --in-place: every reduce into the output writes chunk [c0, c1) at [n - c1, n - c0), which
// tiles the output exactly as before but lets the reduce of chunk k overwrite gradient bytes of a later chunk.
void mirrorOutputs(Program* p, const Layout& l) {
  for (ReduceOp& red : p->reduces) {
    if (red.out.mem == Mem::kOut) red.out.offset = l.rsOutNumel - (red.out.offset + red.n);
  }
}

// A token pair (FlagOp::pairNext) must be what an interpreter may issue as one 64-bit operation.
void checkPairs(const Program& p) {
  for (const Op& op : p.ops) {
    if (op.kind != Op::kFlags) continue;
    for (uint32_t f = op.begin; f < op.end; ++f) {
      const FlagOp& a = p.flags[f];
      if (!a.pairNext) continue;
      if (f + 1 >= op.end) die("a token pair's first word ends its batch");
      const FlagOp& b = p.flags[f + 1];
      if (b.pairNext || b.kind != a.kind || b.owner != a.owner || a.word % 2 != 0 || b.word != a.word + 1 ||
          a.base != Val::kConst || b.base != Val::kConst) {
        die("rank " + std::to_string(p.rank) + ": a malformed token pair at word " + std::to_string(a.word));
      }
      ++f;
    }
  }
}

struct Buffer {
  std::vector<unsigned char> bytes;
  std::vector<int32_t> tag;  // kEmpty or the index of the call whose data the byte holds
  void resize(size_t n) {
    bytes.assign(n, 0xA5);  // poison
    tag.assign(n, kEmpty);
  }
};

enum class Kind { kAg, kRs };
struct Call {
  Kind kind;
  bool slotStaging;  // RS: staging in the slot region (Slot-Reuse)
  tideRedOp_t op;
  tideDataType_t outType;
  bool token = false;  // eager call on the token route (NCCL_TIDE_EAGER_GRAPHS): the kCaptured program
};

struct LaneItem {
  int call;            // index into the sequence
  const Program* prog;
  int op;              // op index, or -1: consume (check) pseudo-op, -2: produce (rewrite inputs) pseudo-op,
                       // -3: fork (a two-lane token program's internal lane starts once the caller's lane has
                       // produced this call's inputs: the event fork of a captured graph, program_exec.cc)
  uint32_t sub = 0;    // position inside a flag run
  uint32_t subEnd = 0; // end of the part of the flag run this item runs (0: the run's end)
  int chan = -1;       // --channels: the FIFO channel the item was issued into
  uint32_t cost = 0;   // --channels: the entries it holds there until it completes
  int p2p = -1;        // a p2p group: its id in World::net
  bool posted = false; // a p2p group: posted (its lane reached it)
};

struct World {
  const std::vector<std::unique_ptr<Layout>>& layouts;
  int W;
  std::vector<Buffer> slot, ownStaging, out;
  std::vector<std::vector<Buffer>> src, grad;  // [rank][param]
  std::vector<std::vector<uint32_t>> flags;
  std::vector<unsigned char> zeros;
  std::vector<std::vector<LaneItem>> lanes;  // [rank * 2 + lane]
  std::vector<size_t> head;
  std::vector<int> produced;  // per rank: the last call whose inputs its caller's lane produced (-1: none)
  std::vector<Call> seq;
  std::vector<uint64_t> epochOf, taskOf;  // per call: its epoch and RS task base
  std::mt19937_64 rng;
  uint64_t executed = 0;
  std::unique_ptr<model::P2pNet> net;  // two-sided programs' p2p groups (NCCL semantics)
  // --copy-queue: one first-in-first-out copy queue shared by every rank's copies, of queueCap entries (0: none).
  struct Queued {
    int lane;
    size_t pos;
    uint32_t entries;
  };
  uint32_t queueCap = 0;
  uint32_t queueUsed = 0;
  std::deque<Queued> queue;
  // --channels: K first-in-first-out channels every issued operation enters (waits included); an operation runs only
  // at the head of its channel (and of its lane); each channel holds chanCap entries (0: unbounded).
  std::vector<std::deque<std::pair<int, size_t>>> chan;  // (lane, position in the lane)
  std::vector<uint32_t> chanUsed;
  uint32_t chanCap = 0;

  explicit World(const std::vector<std::unique_ptr<Layout>>& ls) : layouts(ls), W(ls[0]->worldSize) {}
  const Layout& L(int r) const { return *layouts[r]; }

  Buffer& stagingOf(int call, int r) { return seq[call].slotStaging ? slot[r] : ownStaging[r]; }

  // Resolves a symbolic address of rank r's program for `call` to (buffer, offset); bounds-checked.
  Buffer* resolve(int call, int r, const Addr& a, uint64_t bytes, uint64_t* off, const char* what) {
    Buffer* b = nullptr;
    uint64_t o = a.offset;
    const Layout& l = L(r);
    switch (a.mem) {
      case Mem::kSrc: b = &src[r].at(a.index); break;
      case Mem::kGrad: b = &grad[r].at(a.index); break;
      case Mem::kSlot: b = &slot.at(a.index); break;
      case Mem::kStaging: b = &stagingOf(call, a.index); break;
      case Mem::kOut: {
        const uint64_t oe = dtype::size(seq[call].outType);
        o = a.offset * oe;
        if (!g_inPlace) {
          b = &out[r];
          break;
        }
        if (o + bytes > l.rsOutNumel * oe) die("rank " + std::to_string(r) + ": an output write runs past the output");
        const int block = g_inPlaceMutant == InPlaceMutant::kOtherBlock ? (r + 1) % W : r;
        b = &grad[r].at(0);
        o += static_cast<uint64_t>(block) * l.params[0].shardBytes;
        break;
      }
      case Mem::kZeros: if (bytes > zeros.size()) die("zero copy larger than the zero buffer"); *off = 0; return nullptr;
      case Mem::kMulticast: die("multicast address in a model program");
    }
    if (o + bytes > b->bytes.size()) {
      char m[256];
      snprintf(m, sizeof(m), "rank %d call %d: %s of %" PRIu64 " bytes at %" PRIu64 " runs past its buffer (%zu)", r,
               call, what, bytes, o, b->bytes.size());
      die(m);
    }
    *off = o;
    return b;
  }

  static bool geq(uint32_t have, uint32_t want) { return static_cast<int32_t>(have - want) >= 0; }

  void hazard(int r, int call, const char* what, uint64_t at, int32_t tag) {
    char m[256];
    snprintf(m, sizeof(m), "rank %d call %d: %s (byte %" PRIu64 " has tag %d)", r, call, what, at, tag);
    die(m);
  }

  // Input-side check: inputs (src/grad) hold this call's data; staging/slot bytes were written in this call.
  void readCheck(int r, int call, Buffer* b, uint64_t o, uint64_t n, bool consume, const char* what) {
    if (!b) return;
    for (uint64_t k = 0; k < n; ++k) {
      if (b->tag[o + k] == outTag(call)) hazard(r, call, "gradient read after an output write", o + k, b->tag[o + k]);
      if (b->tag[o + k] != call) hazard(r, call, what, o + k, b->tag[o + k]);
      if (consume) b->tag[o + k] = kEmpty;
    }
  }
  // An output write. In place, the byte must still hold this call's gradient (written once, after the caller
  // produced it) and is marked as output, so that a later gradient read of it fails readCheck.
  void writeOut(int r, int call, Buffer* b, uint64_t o, uint64_t n) {
    if (!g_inPlace) {
      writeCheck(r, call, b, o, n, false, "output byte written twice in one call");
      return;
    }
    for (uint64_t k = 0; k < n; ++k) {
      if (b->tag[o + k] == outTag(call)) hazard(r, call, "output byte written twice in one call", o + k, b->tag[o + k]);
      if (b->tag[o + k] != call) {
        hazard(r, call, "output written over a gradient byte not of this call", o + k, b->tag[o + k]);
      }
      b->tag[o + k] = outTag(call);
    }
    g_inPlaceOutBytes += n;
  }
  void writeCheck(int r, int call, Buffer* b, uint64_t o, uint64_t n, bool mustBeEmpty, const char* what) {
    for (uint64_t k = 0; k < n; ++k) {
      if (mustBeEmpty && b->tag[o + k] != kEmpty) hazard(r, call, what, o + k, b->tag[o + k]);
      if (!mustBeEmpty && b->tag[o + k] == call) hazard(r, call, what, o + k, b->tag[o + k]);
      b->tag[o + k] = call;
    }
  }
  bool tracked(const Addr& a) const { return a.mem == Mem::kSlot || a.mem == Mem::kStaging; }

  // Executes the head of lane x if it can run. Returns false if it must wait. With channels, only an item at the
  // head of its channel runs (a wait there blocks everything behind it).
  bool step(int x) {
    if (chan.empty()) return stepLane(x);
    const size_t pos = head[x];
    const LaneItem& it = lanes[x][pos];
    const int c = it.chan;
    const uint32_t cost = it.cost;
    if (chan[c].empty() || chan[c].front().first != x || chan[c].front().second != pos) return false;
    if (!stepLane(x)) return false;
    if (head[x] != pos) {  // the item completed: it leaves its channel
      chan[c].pop_front();
      chanUsed[c] -= cost;
    }
    return true;
  }

  bool stepLane(int x) {
    LaneItem& it = lanes[x][head[x]];
    const int r = x / 2;
    const int call = it.call;
    if (it.op == -2) {
      produce(r, call);
      ++head[x];
      return true;
    }
    if (it.op == -1) {
      consume(r, call);
      ++head[x];
      return true;
    }
    if (it.op == -3) {
      if (produced[r] < call) return false;
      ++head[x];
      return true;
    }
    const Program& p = *it.prog;
    const Op& op = p.ops[it.op];
    const uint64_t e = epochOf[call], t = taskOf[call];
    if (op.kind == Op::kFlags && op.begin == op.end) {
      ++head[x];
      return true;
    }
    if (op.kind == Op::kFlags) {
      const FlagOp& f = p.flags[op.begin + it.sub];
      const uint32_t end = it.subEnd ? it.subEnd : op.end - op.begin;
      if (f.pairNext && it.sub + 1 < end) {
        // One 64-bit operation, as the CUDA interpreter issues it: a write of both words, or a wait for equality of
        // both. The wait passes here when both words have reached their values, and then they must equal them (a
        // word past its value would keep the GPU's equality wait from ever passing).
        const FlagOp& g = p.flags[op.begin + it.sub + 1];
        uint32_t* w0 = &flags.at(f.owner).at(f.word);
        uint32_t* w1 = &flags.at(g.owner).at(g.word);
        const uint32_t v0 = f.value(e, t), v1 = g.value(e, t);
        if (f.kind == FlagOp::kWait) {
          if (!geq(*w0, v0) || !geq(*w1, v1)) return false;
          if (*w0 != v0 || *w1 != v1) {
            die("rank " + std::to_string(x / 2) + ": token pair at word " + std::to_string(f.word) + " holds " +
                std::to_string(*w0) + "/" + std::to_string(*w1) + ", waited for " + std::to_string(v0) + "/" +
                std::to_string(v1) + ": an equality wait would never pass");
          }
        } else {
          *w0 = v0;
          *w1 = v1;
        }
        ++g_pairOps;
        it.sub += 2;
        if (it.sub == end) ++head[x];
        return true;
      }
      uint32_t* w = &flags.at(f.owner).at(f.word);
      const uint32_t v = f.value(e, t);
      if (f.kind == FlagOp::kWait) {
        if (!geq(*w, v)) return false;
      } else {
        *w = v;
      }
      if (++it.sub == (it.subEnd ? it.subEnd : op.end - op.begin)) ++head[x];
      return true;
    }
    if (op.kind == Op::kCopies) {
      if (queueCap > 0) {  // the shared copy queue: only its head may run
        if (queue.empty() || queue.front().lane != x || queue.front().pos != head[x]) return false;
        queueUsed -= queue.front().entries;
        queue.pop_front();
      }
      // A copy batch lands as a whole (copies in one batch may run in any order; none of ours overlap).
      for (uint32_t c = op.begin; c < op.end; ++c) {
        const CopySeg& s = p.copies[c];
        uint64_t so = 0, d = 0;
        Buffer* sb = resolve(call, r, s.src, s.bytes, &so, "copy source");
        Buffer* db = resolve(call, r, s.dst, s.bytes, &d, "copy destination");
        if (sb == db && so == d) continue;  // in place: the interpreter drops it
        const unsigned char* from = sb ? &sb->bytes[so] : zeros.data();
        // Partial sums are consumed by their put; slot bytes forwarded stay (the owner still needs them).
        const bool consume = tracked(s.src) && s.src.mem == Mem::kStaging;
        readCheck(r, call, sb, so, s.bytes, consume, "copy reads a byte not written in this call");
        if (tracked(s.dst)) writeCheck(r, call, db, d, s.bytes, true, "copy overwrites a byte not yet consumed");
        else writeOut(r, call, db, d, s.bytes);
        memcpy(&db->bytes[d], from, s.bytes);
      }
      ++head[x];
      return true;
    }
    if (op.kind == Op::kP2p) {
      bool progress = false;
      if (!it.posted) {
        it.posted = progress = true;
        net->post(it.p2p);
      }
      if (!net->done(it.p2p)) return progress;
      ++head[x];
      return true;
    }
    reduce(r, call, p.reduces[op.begin]);
    ++head[x];
    return true;
  }

  // A matched send / receive pair of p2p groups (P2pNet): the bytes land where the receive says, read where the send
  // says, each in its own rank's memory; staging bytes (running sums) are consumed by their send, as by a put.
  void moveP2p(int from, const P2pXfer& s, int to, const P2pXfer& d, int call) {
    if (s.addr.index != from || d.addr.index != to || !tracked(s.addr) || !tracked(d.addr)) {
      die("a p2p transfer between ranks " + std::to_string(from) + " and " + std::to_string(to) +
          " addresses memory other than the slot or staging of its own rank");
    }
    uint64_t so = 0, dof = 0;
    Buffer* sb = resolve(call, from, s.addr, s.bytes, &so, "p2p send");
    Buffer* db = resolve(call, to, d.addr, d.bytes, &dof, "p2p receive");
    readCheck(from, call, sb, so, s.bytes, s.addr.mem == Mem::kStaging, "p2p send reads a byte not written in this call");
    writeCheck(to, call, db, dof, d.bytes, true, "p2p receive overwrites a byte not yet consumed");
    memcpy(&db->bytes[dof], &sb->bytes[so], d.bytes);
  }

  void reduce(int r, int call, const ReduceOp& red) {
    const Call& c = seq[call];
    const Layout& l = L(r);
    const tideDataType_t inT = red.inputsFp32 ? tideFloat32 : l.params[0].dtype;
    const size_t inE = dtype::size(inT);
    const tideDataType_t outT = red.outFinal ? c.outType : tideFloat32;
    std::vector<float> acc(red.n), x(red.n), prev(red.n);
    for (int s = 0; s < red.nInputs; ++s) {
      Addr a = red.inputs;
      a.offset += static_cast<uint64_t>(s) * red.stride;
      uint64_t o = 0;
      Buffer* b = resolve(call, r, a, red.n * inE, &o, "reduce input");
      readCheck(r, call, b, o, red.n * inE, true, "reduce reads a staged input not written in this call");
      dtype::toFloat(&b->bytes[o], inT, red.n, s == 0 ? acc.data() : x.data());
      float* v = s == 0 ? acc.data() : x.data();
      if (red.applyPremul && c.op == tidePremulSum) {
        for (uint64_t k = 0; k < red.n; ++k) v[k] = v[k] * 0.375f;
      }
      if (s > 0) {
        for (uint64_t k = 0; k < red.n; ++k) acc[k] = acc[k] + x[k];
      }
    }
    if (red.hasPrev) {
      uint64_t o = 0;
      Buffer* b = resolve(call, r, red.prev, red.n * 4, &o, "reduce prev");
      readCheck(r, call, b, o, red.n * 4, true, "reduce reads a running sum not written in this call");
      memcpy(prev.data(), &b->bytes[o], red.n * 4);
      for (uint64_t k = 0; k < red.n; ++k) acc[k] = prev[k] + acc[k];
    }
    if (red.applyAvg && c.op == tideAvg) {
      for (uint64_t k = 0; k < red.n; ++k) acc[k] = acc[k] / static_cast<float>(W);
    }
    uint64_t o = 0;
    Buffer* ob = resolve(call, r, red.out, red.n * dtype::size(outT), &o, "reduce output");
    if (tracked(red.out)) writeCheck(r, call, ob, o, red.n * dtype::size(outT), true, "reduce overwrites a byte not consumed");
    else writeOut(r, call, ob, o, red.n * dtype::size(outT));
    dtype::fromFloat(acc.data(), red.n, outT, &ob->bytes[o]);
  }

  void randomFill(Buffer& b, tideDataType_t t, int call) {
    const size_t e = dtype::size(t), n = b.bytes.size() / e;
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    std::vector<float> f(n);
    for (auto& v : f) v = u(rng);
    dtype::fromFloat(f.data(), n, t, b.bytes.data());
    for (auto& g : b.tag) g = call;
  }

  // The inputs each rank produced for each call, kept for the oracle (a rank may rewrite its inputs for the next
  // call, legally, before a slower rank checks this call's result).
  std::vector<std::vector<std::vector<std::vector<unsigned char>>>> inputsOf;  // [call][rank][param]
  void produce(int r, int call) {
    const Layout& l = L(r);
    produced[r] = call;
    if (inputsOf.size() <= static_cast<size_t>(call)) inputsOf.resize(call + 1);
    inputsOf[call].resize(W);
    for (int i = 0; i < l.nParams; ++i) {
      Buffer& b = seq[call].kind == Kind::kAg ? src[r][i] : grad[r][i];
      randomFill(b, l.params[i].dtype, call);
      inputsOf[call][r].push_back(b.bytes);
    }
  }

  // The caller's lane reached the end of the call: every rank's result for this call is final here.
  std::vector<std::vector<unsigned char>> expected;  // per rank, computed when the last rank produced
  void consume(int r, int call) {
    const Layout& l = L(r);
    for (int s = 0; s < W; ++s) {
      if (inputsOf.size() <= static_cast<size_t>(call) || inputsOf[call].at(s).empty()) {
        char m[160];
        snprintf(m, sizeof(m), "rank %d's stream passed the end of call %d before rank %d entered it", r, call, s);
        die(m);
      }
    }
    if (seq[call].kind == Kind::kAg) {
      // Expected: the host executor over every rank's shards of this call (src tags say they are this call's).
      std::vector<const void*> shards(static_cast<size_t>(W) * l.nParams);
      for (int s = 0; s < W; ++s) {
        for (int i = 0; i < l.nParams; ++i) {
          shards[static_cast<size_t>(s) * l.nParams + i] = inputsOf.at(call).at(s).at(i).data();
        }
      }
      std::vector<std::vector<unsigned char>> params(l.nParams);
      std::vector<void*> outs(static_cast<size_t>(W) * l.nParams);
      std::vector<std::vector<unsigned char>> store(static_cast<size_t>(W) * l.nParams);
      for (int s = 0; s < W; ++s)
        for (int i = 0; i < l.nParams; ++i) {
          auto& v = store[static_cast<size_t>(s) * l.nParams + i];
          v.assign(l.params[i].shardBytes * W, 0);
          outs[static_cast<size_t>(s) * l.nParams + i] = v.data();
        }
      if (hostAllGather(l, shards.data(), outs.data()) != tideSuccess) die("host executor AG failed");
      for (int i = 0; i < l.nParams; ++i) {
        const ParamLayout& p = l.params[i];
        for (uint64_t k = 0; k < p.shardBytes * W; ++k) {
          if (slot[r].tag[p.slotOffset + k] != call) hazard(r, call, "AG slot byte not written by this call", p.slotOffset + k, slot[r].tag[p.slotOffset + k]);
        }
        if (memcmp(&slot[r].bytes[p.slotOffset], store[static_cast<size_t>(r) * l.nParams + i].data(), p.shardBytes * W) != 0) {
          char m[128];
          snprintf(m, sizeof(m), "AG result of rank %d parameter %d differs from the host executor", r, i);
          die(m);
        }
      }
      for (auto& g : slot[r].tag) g = kEmpty;  // the caller is done reading the slot
      return;
    }
    std::vector<const void*> grads(static_cast<size_t>(W) * l.nParams);
    for (int s = 0; s < W; ++s)
      for (int i = 0; i < l.nParams; ++i) {
        grads[static_cast<size_t>(s) * l.nParams + i] = inputsOf.at(call).at(s).at(i).data();
      }
    const size_t oe = dtype::size(seq[call].outType);
    std::vector<std::vector<unsigned char>> ref(W, std::vector<unsigned char>(l.rsOutNumel * oe));
    std::vector<void*> outs(W);
    for (int s = 0; s < W; ++s) outs[s] = ref[s].data();
    if (hostReduceScatter(l, grads.data(), outs.data(), seq[call].outType, seq[call].op, 0.375f) != tideSuccess) {
      die("host executor RS failed");
    }
    // In place the output is read where it must be, rank r's own block of its gradient (whatever a mutant wrote).
    Buffer& ob = g_inPlace ? grad[r].at(0) : out[r];
    const uint64_t ob0 = g_inPlace ? static_cast<uint64_t>(r) * l.params[0].shardBytes : 0;
    const int32_t want = g_inPlace ? outTag(call) : call;
    for (uint64_t k = 0; k < ref[r].size(); ++k) {
      if (ob.tag[ob0 + k] != want) hazard(r, call, "RS output byte not written by this call", ob0 + k, ob.tag[ob0 + k]);
    }
    if (memcmp(&ob.bytes[ob0], ref[r].data(), ref[r].size()) != 0) {
      char m[128];
      snprintf(m, sizeof(m), "RS result of rank %d differs from the host executor", r);
      die(m);
    }
    Buffer& st = stagingOf(call, r);
    for (size_t k = 0; k < st.tag.size(); ++k) {
      if (st.tag[k] != kEmpty && (seq[call].slotStaging ? k < l.rs.stagingBytes : true)) {
        hazard(r, call, "staging byte still full at the end of the RS", k, st.tag[k]);
      }
    }
  }
};

struct Case {
  std::vector<uint64_t> numels;
  tideDataType_t dtype;
  int W, R;
  uint64_t chunkBytes, paceBytes;
};

std::vector<std::unique_ptr<Layout>> makeLayouts(const Case& c) {
  std::vector<std::unique_ptr<Layout>> ls;
  std::vector<tideDataType_t> dts(c.numels.size(), c.dtype);
  for (int r = 0; r < c.W; ++r) {
    tideLayoutDesc_t d{sizeof(tideLayoutDesc_t), TIDE_LAYOUT_DESC_VERSION, static_cast<int>(c.numels.size()),
                       c.numels.data(), nullptr, dts.data(), c.W, c.R, r};
    tideConfig_t cfg{sizeof(tideConfig_t), TIDE_CONFIG_VERSION, c.chunkBytes, c.paceBytes};
    std::unique_ptr<Layout> l;
    if (createLayout(&d, &cfg, &l) != tideSuccess) die("createLayout failed");
    ls.push_back(std::move(l));
  }
  return ls;
}

struct Programs {
  std::vector<Program> ag, rs, agT, rsT;  // per rank: epoch-protocol and token (kCaptured) programs
};

// Buffers, flags, counters and every rank's programs for `seq` over the layouts, programs of `mode`.
// The CUDA interpreter may issue a flag batch's trailing writes to distinct words (prog::kernelTail) in a graph as a
// signal kernel, whose threads store in no particular order beyond its ordered prefix (plugin/cuda/signal_kernel.h;
// --kernel-order runs them so). Checked on every token program the model compiles: each write-only batch is such a
// tail as a whole (so none keeps a memop node).
void checkWriteBatchesDistinct(const Program& p, int rank) {
  for (const Op& op : p.ops) {
    if (op.kind != Op::kFlags || op.begin == op.end) continue;
    bool writesOnly = true;
    for (uint32_t f = op.begin; f < op.end; ++f) writesOnly = writesOnly && p.flags[f].kind == FlagOp::kWrite;
    uint32_t ordered = 0;
    const uint32_t t = kernelTail(p, op, &ordered);
    if (writesOnly && t != op.begin) {
      die("a write-only flag batch of rank " + std::to_string(rank) + "'s token program writes one word twice");
    }
  }
}

// A two-sided program of several nodes touches no memory and no flag of another node (its cross-node transfers are
// p2p groups, which address only its own memory, and need no cross-node signal), issues all its p2p groups on one
// lane (NCCL matches in host issue order, which is then the lane's order too), and sends or receives at most the
// pace cap per transfer.
void checkTwoSided(const Program& p, const Layout& l) {
  const int node = p.rank / p.ranksPerNode;
  auto local = [&](int rank) { return rank / p.ranksPerNode == node; };
  auto fail = [&](const std::string& what) { die("two-sided program of rank " + std::to_string(p.rank) + ": " + what); };
  if (p.transport != Transport::kTwoSided) fail("not compiled two-sided");
  for (const FlagOp& f : p.flags) {
    if (!local(f.owner)) fail("a flag operation on rank " + std::to_string(f.owner) + " of another node");
  }
  for (const CopySeg& c : p.copies) {
    for (const Addr& a : {c.dst, c.src}) {
      if ((a.mem == Mem::kSlot || a.mem == Mem::kStaging) && !local(a.index)) fail("a copy touches another node");
    }
  }
  int lane = -1;
  for (const Step& st : p.steps) {
    for (uint32_t o = st.begin; o < st.end; ++o) {
      const Op& op = p.ops[o];
      if (op.crossNode != (op.kind == Op::kP2p)) fail("a one-sided cross-node operation");
      if (op.kind != Op::kP2p) continue;
      if (lane >= 0 && lane != static_cast<int>(st.lane)) fail("p2p groups on both lanes");
      lane = static_cast<int>(st.lane);
      for (uint32_t x = op.begin; x < op.end; ++x) {
        if (p.p2p[x].bytes == 0 || p.p2p[x].bytes > l.paceBytes) fail("a p2p transfer of 0 or above paceBytes");
        if (local(p.p2p[x].peer)) fail("a p2p transfer inside the node");
      }
    }
  }
}

void prepare(World& w, const std::vector<std::unique_ptr<Layout>>& layouts, Mode mode, uint64_t seed, uint32_t start,
             const std::vector<Call>& seq, Programs* P) {
  const int W = w.W;
  const Layout& l0 = *layouts[0];
  w.rng.seed(seed);
  w.seq = seq;
  w.slot.resize(W);
  w.ownStaging.resize(W);
  w.out.resize(W);
  w.src.resize(W);
  w.grad.resize(W);
  w.flags.assign(W, std::vector<uint32_t>(word::kWords, 0));
  for (int r = 0; r < W; ++r) {
    for (int k = 0; k < word::kCapAgReady; ++k) w.flags[r][k] = start;  // the state after `start` earlier calls
    w.slot[r].resize(l0.slotBytes);
    w.ownStaging[r].resize(l0.rs.stagingBytes);
    w.out[r].resize(l0.rsOutNumel * 4);
    for (const ParamLayout& p : l0.params) {
      w.src[r].emplace_back();
      w.src[r].back().resize(p.shardBytes);
      w.grad[r].emplace_back();
      w.grad[r].back().resize(p.numel * p.elemSize);
    }
  }
  w.zeros.assign(64, 0);
  Options opt;
  opt.mode = mode;
  opt.zeroBytes = 64;  // small, so padding takes several zero copies
  opt.maxTokenRsChunks = g_tokenRsChunks;
  opt.pairTokens = g_pairTokens;
  opt.transport = g_twoSided ? Transport::kTwoSided : Transport::kOneSided;
  w.net = std::make_unique<model::P2pNet>(
      W, l0.paceBytes,
      [&w](int from, const P2pXfer& s, int to, const P2pXfer& d, int call) { w.moveP2p(from, s, to, d, call); },
      [](const std::string& m) { die(m); });
  P->ag.resize(W);
  P->rs.resize(W);
  P->agT.resize(W);
  P->rsT.resize(W);
  bool agTokens = false, rsTokens = false;
  for (const Call& c : seq) (c.kind == Kind::kAg ? agTokens : rsTokens) |= c.token;
  Options tok = opt;
  tok.mode = Mode::kCaptured;
  tok.maxTokenRsChunks = g_tokenRsChunks;
  for (int r = 0; r < W; ++r) {
    if (compileAllGather(*layouts[r], opt, &P->ag[r]) != tideSuccess) die(std::string("compileAllGather failed: ") + lastError());
    if (compileReduceScatter(*layouts[r], opt, &P->rs[r]) != tideSuccess) die(std::string("compileReduceScatter failed: ") + lastError());
    if (agTokens && compileAllGather(*layouts[r], tok, &P->agT[r]) != tideSuccess) {
      die("compileAllGather (tokens) failed");
    }
    if (rsTokens && compileReduceScatter(*layouts[r], tok, &P->rsT[r]) != tideSuccess) {
      die("compileReduceScatter (tokens) failed");
    }
    if (g_twoSided && layouts[r]->nNodes > 1) {
      checkTwoSided(P->ag[r], *layouts[r]);
      checkTwoSided(P->rs[r], *layouts[r]);
    }
    if (rsTokens) checkWriteBatchesDistinct(P->rsT[r], r);
    // A test build's NCCL_TIDE_AG_SIGNAL_KERNELS=1 carries the AG's write batches as kernels too.
    if (agTokens) checkWriteBatchesDistinct(P->agT[r], r);
    checkPairs(P->agT[r]);
    checkPairs(P->rsT[r]);
    if (g_inPlaceMutant == InPlaceMutant::kMirror) {
      mirrorOutputs(&P->rs[r], *layouts[r]);
      mirrorOutputs(&P->rsT[r], *layouts[r]);
    }
    mutate(&P->ag[r]);
    mutate(&P->rs[r]);
    mutate(&P->agT[r]);
    mutate(&P->rsT[r]);
  }
  // Counters as the comm keeps them: AG and RS epochs, the RS task counter (all equal on every rank).
  uint64_t agE = start, rsE = start, task = start;
  w.lanes.assign(2 * W, {});
  w.head.assign(2 * W, 0);
  w.produced.assign(W, -1);
  if (g_inPlace) {  // the only form the executors take in place (include/tide.h, tideReduceScatter)
    const ParamLayout& p = l0.params[0];
    if (l0.nParams != 1 || p.rowNumel != 1 || p.numel != static_cast<uint64_t>(W) * p.shardNumel) {
      die("--in-place: the layout is not one parameter of W * shardNumel elements");
    }
    for (const Call& c : seq) {
      if (c.kind == Kind::kRs && c.outType != p.dtype) die("--in-place: an RS whose output type is not the gradient's");
    }
  }
  for (size_t c = 0; c < seq.size(); ++c) {
    if (seq[c].kind == Kind::kRs && seq[c].slotStaging && !l0.rs.slotReuseFits) w.seq[c].slotStaging = false;
    if (seq[c].kind == Kind::kAg) {
      w.epochOf.push_back(++agE);
      w.taskOf.push_back(0);
    } else {
      // Token calls move the epoch as the executor does (it is the eager call's sequence number), not the tasks.
      w.epochOf.push_back(++rsE);
      w.taskOf.push_back(task);
      task += seq[c].token ? 0 : P->rs[0].numTasks;
    }
  }
}

const Program& programOf(const World& w, const Programs& P, int c, int r) {
  const bool t = w.seq[c].token;
  return w.seq[c].kind == Kind::kAg ? (t ? P.agT[r] : P.ag[r]) : (t ? P.rsT[r] : P.rs[r]);
}

// What rank r enqueues for call c, as (lane, item), in program order: its inputs rewritten, every step's ops on their
// lanes (deferred groups included: the provider issues group g of every rank before g + 1 of any, which per lane is
// program order again), the end-of-call check. A token program on two lanes has the fork item before its first
// internal-lane operation (a captured graph's two branches start together, after the work before the graph); with
// g_fold every token-program operation goes to the caller's lane instead (direct issue: one stream).
bool g_fold = false;
// --caller-first (groups issue): within each round, the caller lane's items are issued before the internal lane's.
// With one FIFO channel this deadlocks if a round's caller-lane wait needs a write of the same round's internal lane
// (program order issues the internal lane first): what a captured round's two graph branches must never need.
bool g_callerFirst = false;
std::vector<std::pair<int, LaneItem>> itemsOf(const World& w, const Programs& P, int c, int r) {
  const Program& p = programOf(w, P, c, r);
  const bool token = p.mode == Mode::kCaptured;
  std::vector<std::pair<int, LaneItem>> out;
  out.push_back({2 * r, LaneItem{c, nullptr, -2}});
  bool forked = false;
  for (const Step& s : p.steps) {
    const int lane = token && g_fold ? 0 : static_cast<int>(s.lane);
    if (lane == 1 && token && !forked && s.begin < s.end && !g_noFork) {
      out.push_back({2 * r + 1, LaneItem{c, nullptr, -3}});
      forked = true;
    }
    for (uint32_t o = s.begin; o < s.end; ++o) out.push_back({2 * r + lane, LaneItem{c, &p, static_cast<int>(o)}});
  }
  out.push_back({2 * r, LaneItem{c, nullptr, -1}});
  return out;
}

// One scheduler step: the head of a random lane that can run (sticky seeds keep running the last lane, so one rank
// races ahead). False if no lane can run.
bool deviceStep(World& w, bool sticky, int* lastLane) {
  std::vector<int> ready;
  for (int x = 0; x < 2 * w.W; ++x) {
    if (w.head[x] < w.lanes[x].size()) ready.push_back(x);
  }
  if (sticky && *lastLane >= 0 && w.head[*lastLane] < w.lanes[*lastLane].size() && (w.rng() % 16) != 0) {
    ++w.executed;
    if (w.step(*lastLane)) return true;
  }
  for (size_t k = ready.size(); k > 0; --k) {
    std::uniform_int_distribution<size_t> pick(0, k - 1);
    size_t j = pick(w.rng);
    std::swap(ready[j], ready[k - 1]);
    ++w.executed;
    if (w.step(ready[k - 1])) {
      *lastLane = ready[k - 1];
      return true;
    }
  }
  return false;
}

bool lanesLeft(const World& w) {
  for (int x = 0; x < 2 * w.W; ++x) {
    if (w.head[x] < w.lanes[x].size()) return true;
  }
  return false;
}

// One item, for a deadlock report.
std::string describeItem(const World& w, int x, const LaneItem& it) {
  char b[200];
  if (it.op >= 0 && it.prog->ops[it.op].kind == Op::kFlags && it.prog->ops[it.op].begin < it.prog->ops[it.op].end) {
    const FlagOp& f = it.prog->flags[it.prog->ops[it.op].begin + it.sub];
    char name[64];
    wordName(f.word, name, sizeof(name));
    if (f.kind == FlagOp::kWait) {
      snprintf(b, sizeof(b), " [rank %d lane %d call %d: wait rank %d word %d (%s) >= %u, has %u]", x / 2, x % 2,
               it.call, f.owner, f.word, name, f.value(w.epochOf[it.call], w.taskOf[it.call]),
               w.flags[f.owner][f.word]);
    } else {
      snprintf(b, sizeof(b), " [rank %d lane %d call %d: write rank %d word %d (%s)]", x / 2, x % 2, it.call, f.owner,
               f.word, name);
    }
  } else {
    const bool p2p = it.op >= 0 && it.prog->ops[it.op].kind == Op::kP2p;
    snprintf(b, sizeof(b), " [rank %d lane %d call %d: op %d%s%.120s]", x / 2, x % 2, it.call, it.op,
             p2p ? ", p2p group" : "", p2p && it.posted ? w.net->pending(it.p2p).c_str() : "");
  }
  return b;
}

// --channels reports a hang and goes on with the next run (every other failure still exits).
bool g_throwDeadlock = false;
struct Deadlock {
  std::string what;
};

[[noreturn]] void dieDeadlock(const World& w, const char* what) {
  std::string m = std::string("deadlock: ") + what;
  if (!w.chan.empty()) {
    m += "; channel heads:";
    for (size_t c = 0; c < w.chan.size(); ++c) {
      if (w.chan[c].empty()) continue;
      const auto [x, pos] = w.chan[c].front();
      m += " ch" + std::to_string(c) + describeItem(w, x, w.lanes[x][pos]);
    }
  } else {
    m += "; heads:";
    for (int x = 0; x < 2 * w.W; ++x) {
      if (w.head[x] < w.lanes[x].size()) m += describeItem(w, x, w.lanes[x][w.head[x]]);
    }
  }
  if (g_throwDeadlock) throw Deadlock{m};
  die(m);
}

// Runs `seq` over the layouts with programs of `mode`, seeds the scheduler with `seed`. Returns ops executed.
uint64_t runCase(const Case& cs, Mode mode, uint64_t seed, uint32_t start, std::vector<Call> seq) {
  auto layouts = makeLayouts(cs);
  World w(layouts);
  Programs P;
  prepare(w, layouts, mode, seed, start, seq, &P);
  for (size_t c = 0; c < seq.size(); ++c) {
    for (int r = 0; r < cs.W; ++r) {
      for (auto& [lane, it] : itemsOf(w, P, static_cast<int>(c), r)) {
        if (it.op >= 0 && it.prog->ops[it.op].kind == Op::kP2p) {  // issued in program order, as the host does
          const Op& op = it.prog->ops[it.op];
          it.p2p = w.net->issue(r, static_cast<int>(c), it.prog->p2p.data() + op.begin, op.end - op.begin);
        }
        w.lanes[lane].push_back(it);
      }
    }
  }
  const bool sticky = (seed / 2) % 2 == 1;
  int lastLane = -1;
  while (lanesLeft(w)) {
    if (!deviceStep(w, sticky, &lastLane)) dieDeadlock(w, "no lane can run");
  }
  g_p2pIssued += w.net->issued();
  g_p2pMatched += w.net->matched();
  return w.executed;
}

enum class Issue { kCall, kAnnounce, kRounds, kGroups };

// The sequence of the loopback models: `calls` single-node all-gathers, with token RSs between them (token-mixed).
std::vector<Call> queueSeq(const Layout& l0, bool tokens, bool withRs, int calls) {
  std::vector<Call> seq(calls, Call{Kind::kAg, false, tideSum, tideFloat32, tokens});
  if (withRs) {  // token RS between the all-gathers (the route's chunk limit), Slot-Reuse and own staging
    if (l0.rs.numChunks > g_tokenRsChunks) die("token-mixed: the layout has more RS chunks than --token-rs-chunks");
    for (int c = 1; c < calls; c += 2) {
      seq[c] = Call{Kind::kRs, (c / 2) % 2 == 0, c % 4 == 1 ? tideSum : tideAvg,
                    g_inPlace ? l0.params[0].dtype : c % 4 == 1 ? tideFloat32 : tideBfloat16, true};
    }
  }
  return seq;
}

// A rank's items of one call split into rounds: a new round begins at every wait that follows a non-wait (a round is
// "waits*, then non-waits*"; round 0, the announce, is everything before the first wait). Flag runs are split where a
// round boundary falls inside them; each lane keeps its program order.
std::vector<std::vector<std::pair<int, LaneItem>>> roundsOf(const std::vector<std::pair<int, LaneItem>>& items) {
  std::vector<std::vector<std::pair<int, LaneItem>>> rounds(1);
  bool prevWait = false, any = false;
  for (const auto& [lane, it] : items) {
    const bool flags = it.op >= 0 && it.prog->ops[it.op].kind == Op::kFlags;
    const uint32_t n = flags ? it.prog->ops[it.op].end - it.prog->ops[it.op].begin : 0;
    if (!flags || n == 0) {
      rounds.back().push_back({lane, it});
      prevWait = false;
      any = true;
      continue;
    }
    uint32_t from = 0;
    for (uint32_t f = 0; f < n; ++f) {
      const bool wait = it.prog->flags[it.prog->ops[it.op].begin + f].kind == FlagOp::kWait;
      if (wait && any && !prevWait) {  // a round boundary: close this run's part before it
        if (f > from) {
          LaneItem part = it;
          part.sub = from;
          part.subEnd = f;
          rounds.back().push_back({lane, part});
        }
        rounds.emplace_back();
        from = f;
      }
      prevWait = wait;
      any = true;
    }
    LaneItem part = it;
    part.sub = from;
    part.subEnd = n;
    rounds.back().push_back({lane, part});
  }
  return rounds;
}

// A rank's items of one call split by the programs' own issue rounds (Step::group), as BoundProgram::issueTokens
// issues them on loopback: group -1 (the announce) and the inputs in round 0, group g in round g + 1, the end-of-call
// check in the last round.
std::vector<std::vector<std::pair<int, LaneItem>>> groupsOf(const std::vector<std::pair<int, LaneItem>>& items) {
  std::vector<std::vector<std::pair<int, LaneItem>>> rounds(1);
  std::vector<std::pair<int, LaneItem>> fork;  // a fork item, issued with the operation after it
  for (const auto& [lane, it] : items) {
    if (it.op == -3) {
      fork.push_back({lane, it});
      continue;
    }
    size_t r = rounds.size() - 1;  // the check pseudo-op: after everything
    if (it.op == -2) {
      r = 0;
    } else if (it.op >= 0) {
      const Program& p = *it.prog;
      int g = -1;
      for (const Step& st : p.steps) {
        if (static_cast<uint32_t>(it.op) >= st.begin && static_cast<uint32_t>(it.op) < st.end) g = st.group;
      }
      if (p.mode != Mode::kCaptured) die("groups: takes token programs only");
      r = static_cast<size_t>(g + 1);
      if (r + 1 < rounds.size()) die("groups: a program's groups are not in program order");
    }
    if (r >= rounds.size()) rounds.resize(r + 1);
    rounds[r].insert(rounds[r].end(), fork.begin(), fork.end());
    fork.clear();
    rounds[r].push_back({lane, it});
  }
  if (g_callerFirst) {  // each round's caller-lane items before its internal-lane ones (each lane keeps its order)
    for (auto& round : rounds) {
      std::stable_partition(round.begin(), round.end(), [](const std::pair<int, LaneItem>& x) { return x.first % 2 == 0; });
    }
  }
  return rounds;
}

// The host's issue order over `calls` calls of every rank (the loopback: the host issues rank after rank).
//   kCall:     each rank's whole program at its call;
//   kAnnounce: each rank's announce (its inputs and the first flag run's writes up to its first wait) at its call,
//              the rest of every rank, rank after rank, after the last rank's call (BoundProgram::issueTokens);
//   kRounds:   round 0 (the announce) of each rank at its call; after the last rank's call round 1 of every rank
//              (rank 0 .. W - 1), then round 2 of every rank, and so on (roundsOf);
//   kGroups:   the same with the programs' own rounds (groupsOf): what BoundProgram::issueTokens does.
std::vector<std::pair<int, LaneItem>> issueOrder(const World& w, const Programs& P, int calls, Issue issue) {
  std::vector<std::pair<int, LaneItem>> order;
  for (int c = 0; c < calls; ++c) {
    if (issue == Issue::kRounds || issue == Issue::kGroups) {
      std::vector<std::vector<std::vector<std::pair<int, LaneItem>>>> rounds(w.W);
      size_t most = 0;
      for (int r = 0; r < w.W; ++r) {
        rounds[r] = issue == Issue::kRounds ? roundsOf(itemsOf(w, P, c, r)) : groupsOf(itemsOf(w, P, c, r));
        most = std::max(most, rounds[r].size());
      }
      for (size_t k = 0; k < most; ++k) {
        for (int r = 0; r < w.W; ++r) {
          if (k < rounds[r].size()) order.insert(order.end(), rounds[r][k].begin(), rounds[r][k].end());
        }
      }
      continue;
    }
    std::vector<std::vector<std::pair<int, LaneItem>>> rest(w.W);
    for (int r = 0; r < w.W; ++r) {
      auto items = itemsOf(w, P, c, r);
      if (issue == Issue::kCall) {
        order.insert(order.end(), items.begin(), items.end());
        continue;
      }
      // The announce: the inputs, then the first flag run's writes up to its first wait; the rest later.
      size_t k = 0;
      order.push_back(items[k++]);  // produce
      const LaneItem& first = items[k].second;
      const Op& op = first.prog->ops[first.op];
      if (op.kind != Op::kFlags) die("announce-first: the program does not begin with flag operations");
      uint32_t split = 0;
      while (op.begin + split < op.end && first.prog->flags[op.begin + split].kind != FlagOp::kWait) ++split;
      if (split == 0) die("announce-first: the program's first flag operation is a wait");
      LaneItem head = first, tail = first;
      head.subEnd = split;
      tail.sub = split;
      order.push_back({items[k].first, head});
      if (split < op.end - op.begin) rest[r].push_back({items[k].first, tail});
      rest[r].insert(rest[r].end(), items.begin() + static_cast<long>(k) + 1, items.end());
    }
    for (int r = 0; r < w.W; ++r) order.insert(order.end(), rest[r].begin(), rest[r].end());
  }
  return order;
}

// The loopback issue model (--copy-queue; see the header). Single-node all-gathers on the epoch (kInOrder) or token
// (kCaptured) protocol. The host issues item by item, rank after rank, and may stop at any point to let the device
// run; it blocks (and only the device runs) while a copy does not fit in the shared queue. A host blocked while the
// device cannot move is the hang.
uint64_t runQueueCase(const Case& cs, uint32_t cap, bool graphEntries, Issue issue, bool tokens, bool withRs,
                      uint64_t seed, int calls) {
  auto layouts = makeLayouts(cs);
  World w(layouts);
  const std::vector<Call> seq = queueSeq(*layouts[0], tokens, withRs, calls);
  Programs P;
  prepare(w, layouts, Mode::kInOrder, seed, 0, seq, &P);
  w.queueCap = cap;
  const std::vector<std::pair<int, LaneItem>> order = issueOrder(w, P, calls, issue);
  const bool sticky = (seed / 2) % 2 == 1;
  int lastLane = -1;
  size_t i = 0;
  while (i < order.size()) {
    auto& [lane, it] = order[i];
    uint32_t entries = 0;
    if (it.op >= 0 && it.prog->ops[it.op].kind == Op::kCopies) {
      const Op& op = it.prog->ops[it.op];
      entries = graphEntries ? op.end - op.begin : 1;
    }
    // A batch larger than the whole queue is let in alone (the model would otherwise block on it forever).
    if (entries > 0 && w.queueUsed > 0 && w.queueUsed + entries > w.queueCap) {
      if (!deviceStep(w, sticky, &lastLane)) dieDeadlock(w, "the host is blocked on a full copy queue");
      continue;
    }
    w.lanes[lane].push_back(it);
    if (entries > 0) {
      w.queue.push_back(World::Queued{lane, w.lanes[lane].size() - 1, entries});
      w.queueUsed += entries;
    }
    ++i;
    if (w.rng() % 4 == 0) (void)deviceStep(w, sticky, &lastLane);  // the device runs now and then meanwhile
  }
  while (lanesLeft(w)) {
    if (!deviceStep(w, sticky, &lastLane)) dieDeadlock(w, "no lane can run");
  }
  return w.executed;
}

// The shared-channel model (--channels; see the header): every issued operation, waits included, enters one of K
// FIFO channels (rank r's: r % K, or a seeded random one per operation); an operation runs only at the head of its
// channel and of its lane, so a wait at a channel's head blocks everything queued behind it. Each memop is one
// operation; a copy batch one that costs one entry per copy (a graph's memcpy nodes); a reduce and the model's
// input / check pseudo-operations one each. Empty flag runs bind to nothing and are not issued. The host blocks
// while an operation does not fit in its channel (cap entries; 0: unbounded).
uint64_t runChannelCase(const Case& cs, int K, bool randomMap, uint32_t cap, Issue issue, bool tokens, bool withRs,
                        uint64_t seed, int calls) {
  auto layouts = makeLayouts(cs);
  World w(layouts);
  const std::vector<Call> seq = queueSeq(*layouts[0], tokens, withRs, calls);
  Programs P;
  prepare(w, layouts, Mode::kInOrder, seed, 0, seq, &P);
  w.chan.assign(K, {});
  w.chanUsed.assign(K, 0);
  w.chanCap = cap;
  // One item per memop, so that each may land in a channel of its own.
  std::vector<std::pair<int, LaneItem>> order;
  for (const auto& [lane, it] : issueOrder(w, P, calls, issue)) {
    const bool flags = it.op >= 0 && it.prog->ops[it.op].kind == Op::kFlags;
    if (!flags) {
      order.push_back({lane, it});
      order.back().second.cost = it.op >= 0 && it.prog->ops[it.op].kind == Op::kCopies
                                     ? it.prog->ops[it.op].end - it.prog->ops[it.op].begin
                                     : 1;
      continue;
    }
    const uint32_t end = it.subEnd ? it.subEnd : it.prog->ops[it.op].end - it.prog->ops[it.op].begin;
    for (uint32_t f = it.sub; f < end; ++f) {
      LaneItem one = it;
      one.sub = f;
      one.subEnd = f + 1;
      one.cost = 1;
      order.push_back({lane, one});
    }
  }
  const bool sticky = (seed / 2) % 2 == 1;
  int lastLane = -1;
  size_t i = 0;
  while (i < order.size()) {
    auto& [lane, it] = order[i];
    if (it.chan < 0) it.chan = randomMap ? static_cast<int>(w.rng() % K) : (lane / 2) % K;
    if (cap > 0 && w.chanUsed[it.chan] > 0 && w.chanUsed[it.chan] + it.cost > cap) {
      if (!deviceStep(w, sticky, &lastLane)) dieDeadlock(w, "the host is blocked on a full channel");
      continue;
    }
    w.lanes[lane].push_back(it);
    w.chan[it.chan].push_back({lane, w.lanes[lane].size() - 1});
    w.chanUsed[it.chan] += it.cost;
    ++i;
    if (w.rng() % 4 == 0) (void)deviceStep(w, sticky, &lastLane);  // the device runs now and then meanwhile
  }
  while (lanesLeft(w)) {
    if (!deviceStep(w, sticky, &lastLane)) dieDeadlock(w, "no lane can run");
  }
  return w.executed;
}

bool parseIssue(const char* s, Issue* out) {
  if (strcmp(s, "call") == 0) *out = Issue::kCall;
  else if (strcmp(s, "announce") == 0) *out = Issue::kAnnounce;
  else if (strcmp(s, "rounds") == 0) *out = Issue::kRounds;
  else if (strcmp(s, "groups") == 0) *out = Issue::kGroups;
  else return false;
  return true;
}

// PROTOCOL: epoch (kInOrder AGs), token (kCaptured AGs), token-mixed (token AGs and RSs alternating).
bool parseProtocol(const char* s, bool* tokens, bool* mixed) {
  *mixed = strcmp(s, "token-mixed") == 0;
  *tokens = *mixed || strcmp(s, "token") == 0;
  return *tokens || strcmp(s, "epoch") == 0;
}

}  // namespace

// --copy-queue C ENTRIES ISSUE PROTOCOL [seeds] (see the header).
int queueMain(int argc, char** argv) {
  if (argc < 6) {
    die("usage: program_model --copy-queue C batch|graph call|announce|rounds|groups epoch|token|token-mixed [seeds]");
  }
  const uint32_t cap = static_cast<uint32_t>(atoi(argv[2]));
  const bool graph = strcmp(argv[3], "graph") == 0;
  Issue issue = Issue::kCall;
  bool tokens = false, mixed = false;
  if (cap < 1 || (!graph && strcmp(argv[3], "batch") != 0) || !parseIssue(argv[4], &issue) ||
      !parseProtocol(argv[5], &tokens, &mixed)) {
    die("--copy-queue: C >= 1, batch|graph, call|announce|rounds|groups, epoch|token|token-mixed");
  }
  if ((issue == Issue::kRounds || issue == Issue::kGroups) && !tokens) {
    die("--copy-queue: rounds and groups take token programs (token, token-mixed)");
  }
  const int seeds = argc > 6 ? atoi(argv[6]) : 4;
  // Single-node all-gathers like those measured on an H200: 64 parameters at W = 2 and 8, 9 at W = 8, 16 at W = 4.
  const std::vector<uint64_t> p64(64, 300), p9(9, 1000), p16(16, 500);
  std::vector<Case> cases = {{p64, tideBfloat16, 2, 2, 1 << 20, 0},
                             {p16, tideBfloat16, 4, 4, 1 << 20, 0},
                             {p9, tideBfloat16, 8, 8, 1 << 20, 0},
                             {p64, tideBfloat16, 8, 8, 1 << 20, 0}};
  if (g_tokenRsChunks > 2) {  // token RSs of more chunks than buffers: 7 chunks at W = 4, 4 at W = 8
    cases.push_back({p16, tideBfloat16, 4, 4, 4 * 300, 0});
    cases.push_back({p64, tideBfloat16, 8, 8, 4 * 800, 0});
  }
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const int chunks = makeLayouts(cases[ci])[0]->rs.numChunks;
    for (int s = 0; s < seeds; ++s) {
      const uint64_t n = runQueueCase(cases[ci], cap, graph, issue, tokens, mixed, 9000 + 13 * ci + s, mixed ? 5 : 3);
      printf("queue case %zu W=%d P=%zu chunks=%d cap %u %s %s %s seed %d: ok (%" PRIu64 " scheduler steps)\n", ci,
             cases[ci].W, cases[ci].numels.size(), chunks, cap, argv[3], argv[4], argv[5], s, n);
    }
  }
  printf("all cases passed\n");
  return 0;
}

// --channels K MAP C ISSUE PROTOCOL [seeds] (see the header). Every run is reported; a hang does not stop the others.
int channelMain(int argc, char** argv) {
  if (argc < 7) {
    die("usage: program_model --channels K rank|random C call|announce|rounds|groups epoch|token|token-mixed [seeds]");
  }
  const int K = atoi(argv[2]);
  const bool randomMap = strcmp(argv[3], "random") == 0;
  const uint32_t cap = static_cast<uint32_t>(atoi(argv[4]));
  Issue issue = Issue::kCall;
  bool tokens = false, mixed = false;
  if (K < 1 || (!randomMap && strcmp(argv[3], "rank") != 0) || !parseIssue(argv[5], &issue) ||
      !parseProtocol(argv[6], &tokens, &mixed)) {
    die("--channels: K >= 1, rank|random, C >= 0 (0: unbounded), call|announce|rounds|groups, epoch|token|token-mixed");
  }
  if ((issue == Issue::kRounds || issue == Issue::kGroups) && !tokens) {
    die("--channels: rounds and groups take token programs (token, token-mixed)");
  }
  const int seeds = argc > 7 ? atoi(argv[7]) : 4;
  // The --copy-queue layouts (RS of 1 chunk), 5 parameters at W = 8 (a layout that hung on an H200 with
  // announce-first issue), and layouts whose RS takes 2 chunks (the token route's limit).
  const std::vector<uint64_t> p64(64, 300), p9(9, 1000), p16(16, 500), p5(5, 1000);
  const std::vector<Case> base = {{p64, tideBfloat16, 2, 2, 1 << 20, 0},
                                   {p16, tideBfloat16, 4, 4, 1 << 20, 0},
                                   {p9, tideBfloat16, 8, 8, 1 << 20, 0},
                                   {p64, tideBfloat16, 8, 8, 1 << 20, 0},
                                   {p5, tideBfloat16, 8, 8, 1 << 20, 0},
                                   {p64, tideBfloat16, 2, 2, 4 * 4800, 0},
                                   {p16, tideBfloat16, 4, 4, 4 * 1000, 0},
                                   {p64, tideBfloat16, 8, 8, 4 * 1280, 0},
                                   {p5, tideBfloat16, 8, 8, 4 * 400, 0}};
  std::vector<Case> cases = base;
  if (g_tokenRsChunks > 2) {  // token RSs of more chunks than buffers: 7 chunks at W = 4, 4 at W = 8 and 2
    cases.push_back({p16, tideBfloat16, 4, 4, 4 * 300, 0});
    cases.push_back({p64, tideBfloat16, 8, 8, 4 * 800, 0});
    cases.push_back({p5, tideBfloat16, 8, 8, 4 * 200, 0});
    cases.push_back({p64, tideBfloat16, 2, 2, 4 * 1500, 0});
  }
  g_throwDeadlock = true;
  int runs = 0, hung = 0;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const auto ls = makeLayouts(cases[ci]);
    for (int s = 0; s < seeds; ++s) {
      printf("channel case %zu W=%d P=%zu chunks=%d K=%d %s cap %u %s %s seed %d%s: ", ci, cases[ci].W,
             cases[ci].numels.size(), ls[0]->rs.numChunks, K, argv[3], cap, argv[5], argv[6], s,
             ls[0]->rs.slotReuseFits ? "" : " (RS own staging only)");
      ++runs;
      try {
        const uint64_t n =
            runChannelCase(cases[ci], K, randomMap, cap, issue, tokens, mixed, 9000 + 13 * ci + s, mixed ? 5 : 3);
        printf("ok (%" PRIu64 " scheduler steps)\n", n);
      } catch (const Deadlock& d) {
        ++hung;
        printf("HANG (%.400s%s)\n", d.what.c_str(), d.what.size() > 400 ? " ..." : "");
      }
      fflush(stdout);
    }
  }
  if (hung) {
    printf("%d of %d runs hung\n", hung, runs);
    return 3;
  }
  printf("all cases passed\n");
  return 0;
}

// Receives land where the one-sided puts land, and sends read where they read: per rank and memory kind, the bytes
// covered by the two-sided programs' receives (sends) equal those of the one-sided programs' cross-node copy
// destinations (sources), for AG and RS in both issue modes. Returns the bytes compared.
uint64_t checkWhereTheyLand(const std::vector<std::unique_ptr<Layout>>& ls) {
  using Spans = std::map<std::pair<int, int>, std::vector<std::pair<uint64_t, uint64_t>>>;  // (rank, mem) -> spans
  auto merged = [](Spans s) {
    for (auto& [key, v] : s) {
      std::sort(v.begin(), v.end());
      std::vector<std::pair<uint64_t, uint64_t>> m;
      for (const auto& x : v) {
        if (!m.empty() && x.first <= m.back().second) m.back().second = std::max(m.back().second, x.second);
        else m.push_back(x);
      }
      v = m;
    }
    return s;
  };
  auto add = [](Spans& s, int rank, const Addr& a, uint64_t bytes) {
    s[{rank, static_cast<int>(a.mem)}].push_back({a.offset, a.offset + bytes});
  };
  uint64_t bytes = 0;
  for (Mode mode : {Mode::kInOrder, Mode::kDeferred}) {
    for (int coll = 0; coll < 2; ++coll) {
      Spans putTo, putFrom, recvInto, sendFrom;
      for (const auto& l : ls) {
        Options opt;
        opt.mode = mode;
        Program one, two;
        auto compile = coll == 0 ? compileAllGather : compileReduceScatter;
        if (compile(*l, opt, &one) != tideSuccess) die("compile (one-sided) failed");
        opt.transport = Transport::kTwoSided;
        if (compile(*l, opt, &two) != tideSuccess) die("compile (two-sided) failed");
        for (const Op& op : one.ops) {
          for (uint32_t c = op.kind == Op::kCopies && op.crossNode ? op.begin : op.end; c < op.end; ++c) {
            add(putTo, one.copies[c].dst.index, one.copies[c].dst, one.copies[c].bytes);
            add(putFrom, l->rank, one.copies[c].src, one.copies[c].bytes);
          }
        }
        for (const P2pXfer& x : two.p2p) {
          add(x.kind == P2pXfer::kRecv ? recvInto : sendFrom, l->rank, x.addr, x.bytes);
          bytes += x.bytes;
        }
      }
      if (merged(putTo) != merged(recvInto) || merged(putFrom) != merged(sendFrom)) {
        die(std::string(coll == 0 ? "AG" : "RS") + ": two-sided transfers do not cover the bytes the puts move");
      }
    }
  }
  return bytes;
}

// --two-sided [--p2p-swap | --p2p-drop-recv | --p2p-split] [seeds] (see the header): random layouts of several
// node splits, all ranks' two-sided programs over the NCCL p2p model, epoch AG and RS calls back to back.
int twoSidedMain(int argc, char** argv) {
  g_twoSided = true;
  int a = 2;
  if (argc > a && strncmp(argv[a], "--p2p-", 6) == 0) {
    const std::string m = argv[a++];
    g_p2pMutant = m == "--p2p-swap" ? P2pMutant::kSwap : m == "--p2p-drop-recv" ? P2pMutant::kDropRecv
                  : m == "--p2p-split" ? P2pMutant::kSplit : P2pMutant::kNone;
    if (g_p2pMutant == P2pMutant::kNone) die("unknown option " + m);
  }
  const int seeds = argc > a ? atoi(argv[a]) : 3;
  // nodes x ranks per node; layouts per split (fewer for the large worlds)
  const struct { int N, R, layouts; } splits[] = {{2, 4, 4}, {4, 2, 4}, {3, 2, 4}, {2, 3, 2}, {5, 1, 2},
                                                  {2, 1, 2}, {8, 8, 2}, {16, 8, 1}};
  const tideDataType_t dtypes[] = {tideBfloat16, tideFloat16, tideFloat32};
  const uint64_t chunks[] = {8, 64, 300, 1024, 4096, 1 << 20};
  const uint64_t paces[] = {8, 100, 512, 1000, 4096, 1 << 20};
  std::mt19937_64 rng(20240611);
  const Call agC{Kind::kAg, false, tideSum, tideFloat32};
  const std::vector<Call> seq = {agC,
                                 Call{Kind::kRs, true, tideSum, tideFloat32},
                                 Call{Kind::kRs, false, tideAvg, tideBfloat16},
                                 agC,
                                 Call{Kind::kRs, true, tidePremulSum, tideFloat16},
                                 Call{Kind::kRs, false, tideAvg, tideFloat32},
                                 agC};
  int ci = 0;
  for (const auto& sp : splits) {
    const int W = sp.N * sp.R;
    for (int li = 0; li < sp.layouts; ++li, ++ci) {
      Case c;
      c.W = W;
      c.R = sp.R;
      c.dtype = dtypes[rng() % 3];
      const int nParams = 1 + static_cast<int>(rng() % 5);
      for (int i = 0; i < nParams; ++i) c.numels.push_back(1 + rng() % (W >= 64 ? 700 : 3000));  // odd sizes too
      // Large worlds: chunks and pieces of at least 1000 bytes, so that a run takes seconds
      c.chunkBytes = chunks[rng() % 6];
      c.paceBytes = paces[rng() % 6];
      if (W >= 64) c.chunkBytes = std::max<uint64_t>(c.chunkBytes, 1024), c.paceBytes = std::max<uint64_t>(c.paceBytes, 1000);
      const auto ls = makeLayouts(c);
      const uint64_t compared = checkWhereTheyLand(ls);
      printf("two-sided case %d: transfers land where the puts land (%" PRIu64 " bytes)\n", ci, compared);
      for (Mode mode : {Mode::kInOrder, Mode::kDeferred}) {
        for (int s = 0; s < seeds; ++s) {
          const uint32_t start = (s % 2) ? 0xFFFFFFF0u : 0u;
          const uint64_t n = runCase(c, mode, 7000 + 97 * ci + 17 * s + static_cast<int>(mode), start, seq);
          printf("two-sided case %d %dx%d P=%d %s pace %" PRIu64 " chunks=%d steps=%d mode %d seed %d: ok (%" PRIu64
                 " scheduler steps)\n",
                 ci, sp.N, sp.R, nParams, dtype::name(c.dtype), ls[0]->paceBytes, ls[0]->rs.numChunks,
                 ls[0]->schedule.length, static_cast<int>(mode), s, n);
          fflush(stdout);
        }
      }
    }
  }
  printf("p2p transfers issued %" PRIu64 ", matched %" PRIu64 "\n", g_p2pIssued, g_p2pMatched);
  printf("all cases passed\n");
  return 0;
}

// --in-place [--in-place-other-block | --in-place-mirror] [seeds] (see the header): random one-parameter layouts of
// W * shardNumel elements (odd sizes, 1 to 40 chunks) for W = 2, 3, 4, 8 and every node split of W, each dtype the RS
// takes, every RS output in place (rank r's block of its own gradient, output type = gradient type), ops sum, avg
// and premul, Slot-Reuse and own staging, AG calls between. Every layout runs the eager programs in order and
// deferred; several nodes also two-sided; one node also the captured (token) programs, on two lanes and folded,
// eager token calls mixed with epoch calls, and the loopback issue models (the programs' own groups through one
// shared copy queue, and through one FIFO channel for everything). Token RSs may have as many chunks as the layout
// (NCCL_TIDE_TOKEN_RS_CHUNKS raised), so the consumed-token pipeline runs in place too.
int inPlaceMain(int argc, char** argv) {
  g_inPlace = true;
  int a = 2;
  if (argc > a && strncmp(argv[a], "--in-place-", 11) == 0) {
    const std::string m = argv[a++];
    g_inPlaceMutant = m == "--in-place-other-block" ? InPlaceMutant::kOtherBlock
                      : m == "--in-place-mirror"    ? InPlaceMutant::kMirror
                                                    : InPlaceMutant::kNone;
    if (g_inPlaceMutant == InPlaceMutant::kNone) die("unknown option " + m);
  }
  const int seeds = argc > a ? atoi(argv[a]) : 2;
  const struct { int W, R; } splits[] = {{2, 2}, {2, 1}, {3, 3}, {3, 1}, {4, 4}, {4, 2}, {4, 1},
                                         {8, 8}, {8, 4}, {8, 2}, {8, 1}};
  const tideDataType_t dtypes[] = {tideBfloat16, tideFloat16, tideFloat32};
  // Chunk bytes: 32 is the smallest chunk (8 elements), so a shard of a few hundred elements takes dozens of chunks;
  // 512 and 4096 give one to three (the captured program without the consumed-token pipeline, and its edge).
  const uint64_t chunks[] = {32, 64, 96, 512, 4096};
  const uint64_t paces[] = {8, 100, 512, 1 << 20};
  std::mt19937_64 rng(20250704);
  int ci = 0;
  for (const auto& sp : splits) {
    for (int li = 0; li < 6; ++li, ++ci) {
      const int di = li % 3;
      Case c;
      c.W = sp.W;
      c.R = sp.R;
      c.dtype = dtypes[di];
      // The first layout of each split has many chunks (the mirror mutant is caught by its hazard there); the others
      // odd and tiny shards too.
      const uint64_t shard = li == 0 ? 101 + rng() % 200 : (rng() % 4 == 0 ? 1 + rng() % 7 : 1 + rng() % 320);
      c.numels = {shard * static_cast<uint64_t>(sp.W)};
      c.chunkBytes = li == 0 ? 32 : chunks[rng() % 5];
      c.paceBytes = sp.R == sp.W ? 0 : paces[rng() % 4];
      const auto ls = makeLayouts(c);
      const int K = ls[0]->rs.numChunks, N = ls[0]->nNodes;
      const tideDataType_t t = c.dtype;
      const Call agC{Kind::kAg, false, tideSum, tideFloat32};
      const std::vector<Call> eager = {agC,
                                       Call{Kind::kRs, true, tideSum, t},
                                       Call{Kind::kRs, false, tideAvg, t},
                                       agC,
                                       Call{Kind::kRs, true, tidePremulSum, t},
                                       Call{Kind::kRs, false, tideSum, t}};
      char tag[160];
      snprintf(tag, sizeof(tag), "in-place case %d W=%d R=%d %s shard=%" PRIu64 " chunks=%d", ci, sp.W, sp.R,
               dtype::name(t), shard, K);
      auto report = [&](const char* what, int s, uint64_t n) {
        printf("%s %s seed %d: ok (%" PRIu64 " scheduler steps)\n", tag, what, s, n);
        fflush(stdout);
      };
      for (int twoSided = 0; twoSided < (N > 1 ? 2 : 1); ++twoSided) {
        g_twoSided = twoSided == 1;
        for (Mode mode : {Mode::kInOrder, Mode::kDeferred}) {
          for (int s = 0; s < seeds; ++s) {
            const uint32_t start = (s % 2) ? 0xFFFFFFF0u : 0u;
            const uint64_t n = runCase(c, mode, 31000 + 101 * ci + 7 * s + static_cast<int>(mode), start, eager);
            report(g_twoSided ? (mode == Mode::kInOrder ? "two-sided in-order" : "two-sided deferred")
                              : (mode == Mode::kInOrder ? "in-order" : "deferred"),
                   s, n);
          }
        }
      }
      g_twoSided = false;
      if (N > 1) continue;
      g_tokenRsChunks = std::max(2, K);  // every chunk count takes the token route
      if (ls[0]->rs.slotReuseFits) {
        const std::vector<Call> cap = {agC, Call{Kind::kRs, true, tideSum, t}, agC, Call{Kind::kRs, true, tideAvg, t},
                                       Call{Kind::kRs, true, tidePremulSum, t}};
        for (int s = 0; s < 2 * seeds; ++s) {
          g_fold = s % 2 == 1;
          report(g_fold ? "captured folded" : "captured", s, runCase(c, Mode::kCaptured, 32000 + 101 * ci + s, 0, cap));
        }
        g_fold = false;
      }
      const Call agT{Kind::kAg, false, tideSum, tideFloat32, true};
      const std::vector<Call> mixed = {agT,
                                       Call{Kind::kRs, false, tideAvg, t, true},
                                       agC,
                                       Call{Kind::kRs, false, tideSum, t},
                                       Call{Kind::kRs, true, tidePremulSum, t, true},
                                       agT,
                                       Call{Kind::kRs, true, tideSum, t, true}};
      for (Mode mode : {Mode::kInOrder, Mode::kDeferred}) {
        for (int s = 0; s < seeds; ++s) {
          g_fold = s % 2 == 1;
          const uint64_t n = runCase(c, mode, 33000 + 101 * ci + 7 * s + static_cast<int>(mode), 0, mixed);
          report(mode == Mode::kInOrder ? "mixed eager/token in-order" : "mixed eager/token deferred", s, n);
        }
      }
      g_fold = false;
      for (int s = 0; s < seeds; ++s) {
        report("copy-queue groups cap 1",
               s, runQueueCase(c, 1, true, Issue::kGroups, true, true, 34000 + 101 * ci + s, 5));
        report("channels 1 rank groups", s,
               runChannelCase(c, 1, false, 0, Issue::kGroups, true, true, 35000 + 101 * ci + s, 5));
      }
      g_tokenRsChunks = 2;
    }
  }
  printf("output bytes written in place: %" PRIu64 "\n", g_inPlaceOutBytes);
  printf("all cases passed\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 2 && strcmp(argv[1], "--token-rs-chunks") == 0) {  // a leading option, before any other
    g_tokenRsChunks = atoi(argv[2]);
    if (g_tokenRsChunks < 2) die("--token-rs-chunks: N >= 2");
    argv[2] = argv[0];
    argv += 2;
    argc -= 2;
  }
  while (argc > 1 && (strcmp(argv[1], "--pair-tokens") == 0 || strcmp(argv[1], "--single-rs-banks") == 0)) {
    (strcmp(argv[1], "--pair-tokens") == 0 ? g_pairTokens : g_singleBanks) = true;  // after --token-rs-chunks
    argv[1] = argv[0];
    argv += 1;
    argc -= 1;
  }
  while (argc > 1 && strncmp(argv[1], "--kernel-order", 14) == 0) {  // after the options above
    if (strcmp(argv[1], "--kernel-order") == 0) g_kernelOrder = 1;
    else if (strcmp(argv[1], "--kernel-order-swapped") == 0) g_kernelOrder = 2;
    else die(std::string("unknown option ") + argv[1]);
    argv[1] = argv[0];
    argv += 1;
    argc -= 1;
  }
  bool foldAll = false;
  while (argc > 1 && (strcmp(argv[1], "--fold") == 0 || strcmp(argv[1], "--caller-first") == 0)) {
    (strcmp(argv[1], "--fold") == 0 ? foldAll : g_callerFirst) = true;  // leading options for --copy-queue / --channels
    argv[1] = argv[0];
    argv += 1;
    argc -= 1;
  }
  g_fold = foldAll;
  if (argc > 1 && strcmp(argv[1], "--copy-queue") == 0) return queueMain(argc, argv);
  if (argc > 1 && strcmp(argv[1], "--two-sided") == 0) return twoSidedMain(argc, argv);
  if (argc > 1 && strcmp(argv[1], "--channels") == 0) return channelMain(argc, argv);
  if (argc > 1 && strcmp(argv[1], "--in-place") == 0) return inPlaceMain(argc, argv);
  int seeds = 4;
  if (argc > 2 && strcmp(argv[1], "--drop-wait") == 0) {
    g_dropWord = atoi(argv[2]);
    if (argc > 3) seeds = atoi(argv[3]);
  } else if (argc > 1 && (strcmp(argv[1], "--drop-own-token-waits") == 0 || strcmp(argv[1], "--no-fork") == 0)) {
    (argv[1][2] == 'd' ? g_dropOwn : g_noFork) = true;
    if (argc > 2) seeds = atoi(argv[2]);
  } else if (argc > 1) {
    seeds = atoi(argv[1]);
  }
  std::vector<Case> cases = {
      {{1000, 77, 4096, 3}, tideBfloat16, 2, 2, 512, 0},
      {{1000, 77, 4096, 3}, tideBfloat16, 4, 4, 256, 0},
      {{5000}, tideFloat32, 3, 3, 1 << 20, 0},
      {{123, 4567, 89, 1024, 5}, tideFloat16, 8, 4, 1024, 1000},      // 2 x 4
      {{123, 4567, 89, 1024, 5}, tideBfloat16, 8, 2, 512, 700},       // 4 x 2
      {{999, 64, 3001}, tideBfloat16, 6, 2, 300, 512},                // 3 x 2
      {{999, 64, 3001}, tideFloat32, 6, 3, 4096, 256},                // 2 x 3
      {{333, 4096}, tideBfloat16, 5, 1, 256, 1024},                   // 5 x 1
      {{2048, 17}, tideBfloat16, 64, 8, 256, 4096},                   // 8 x 8
      {{2048, 17}, tideBfloat16, 48, 8, 1024, 1 << 20},               // 6 x 8
      {{4097}, tideBfloat16, 64, 64, 512, 0},                         // 1 x 64
      {{7, 13}, tideBfloat16, 3, 3, 8, 0},                            // tiny, odd sizes
      {{7, 13}, tideFloat32, 6, 2, 8, 8},                             // tiny, several nodes
      {{2048, 17}, tideBfloat16, 8, 8, 256, 0},                       // 1 x 8, 5 RS chunks
      {{999, 64, 3001}, tideBfloat16, 6, 6, 4 * 300, 0},              // 1 x 6, 3 RS chunks
  };
  const Call agC{Kind::kAg, false, tideSum, tideFloat32};
  int failures = 0;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    for (Mode mode : {Mode::kInOrder, Mode::kDeferred}) {
      for (int s = 0; s < seeds; ++s) {
        const uint32_t start = (s % 2) ? 0xFFFFFFF0u : 0u;  // odd seeds: counters wrap around 2^32 during the run
        std::vector<Call> seq = {agC,
                                 Call{Kind::kRs, true, tideSum, tideFloat32},
                                 agC,
                                 Call{Kind::kRs, false, tideAvg, tideBfloat16},
                                 Call{Kind::kRs, true, tidePremulSum, tideFloat16},
                                 agC,
                                 Call{Kind::kRs, false, tideSum, tideFloat32}};
        uint64_t n = runCase(c, mode, 1000 * ci + 17 * s + static_cast<int>(mode), start, seq);
        printf("case %zu W=%d R=%d mode %d seed %d start %08x: ok (%" PRIu64 " scheduler steps)\n", ci, c.W, c.R,
               static_cast<int>(mode), s, start, n);
      }
    }
    // Captured programs: single node, at most --token-rs-chunks chunks, slot staging; constant tokens.
    if (c.W == c.R) {
      auto ls = makeLayouts(c);
      const int K = ls[0]->rs.numChunks;
      if (K <= g_tokenRsChunks && ls[0]->rs.slotReuseFits) {
        // Two sequences: AG then RS in the slot region (Slot-Reuse) and back, and back-to-back calls of one kind.
        const std::vector<std::vector<Call>> seqs = {
            {agC, Call{Kind::kRs, true, tideSum, tideFloat32}, agC, Call{Kind::kRs, true, tideAvg, tideBfloat16}},
            {agC, agC, Call{Kind::kRs, true, tideSum, tideFloat32}, Call{Kind::kRs, true, tidePremulSum, tideFloat16},
             agC}};
        // Seeds 2, 3, 6, 7, ...: every token program on one stream (direct issue), the others forked (graphs).
        for (int s = 0; s < 2 * seeds; ++s) {
          g_fold = (s / 2) % 2 == 1;
          uint64_t n = runCase(c, Mode::kCaptured, 77 + s, 0, seqs[s % 2]);
          printf("case %zu W=%d captured chunks=%d seed %d%s: ok (%" PRIu64 " scheduler steps)\n", ci, c.W, K, s,
                 g_fold ? " folded" : "", n);
        }
        g_fold = false;
      }
      // Eager calls on the token route (docs/architecture.md "Eager calls as graph replays") mixed with epoch calls
      // on one comm: AG always takes tokens on one node, RS only with at most --token-rs-chunks chunks (own or slot
      // staging), so a layout with more chunks mixes token AGs with epoch RSs.
      const bool rsTok = K <= g_tokenRsChunks;
      const Call agT{Kind::kAg, false, tideSum, tideFloat32, true};
      const Call rsOwn{Kind::kRs, false, tideAvg, tideBfloat16, rsTok};
      const Call rsSlot{Kind::kRs, true, tidePremulSum, tideFloat16, rsTok};
      const std::vector<Call> mixed = {agT, agC, Call{Kind::kRs, false, tideSum, tideFloat32}, rsOwn, agT, rsSlot,
                                       Call{Kind::kRs, true, tideSum, tideFloat32}, agT, agT, rsOwn, rsOwn, agC};
      for (Mode mode : {Mode::kInOrder, Mode::kDeferred}) {
        for (int s = 0; s < seeds; ++s) {
          const uint32_t start = (s % 2) ? 0xFFFFFFF0u : 0u;
          g_fold = (s / 2) % 2 == 1;
          uint64_t n = runCase(c, mode, 5000 + 31 * s + static_cast<int>(mode), start, mixed);
          printf("case %zu W=%d mixed eager/token chunks=%d mode %d seed %d%s%s: ok (%" PRIu64 " scheduler steps)\n",
                 ci, c.W, K, static_cast<int>(mode), s, rsTok ? "" : " (RS epoch only)", g_fold ? " folded" : "", n);
        }
        g_fold = false;
      }
    }
  }
  printf("token pair operations: %llu\n", static_cast<unsigned long long>(g_pairOps));
  if (g_kernelOrder != 0) printf("kernel tail flags reordered: %llu\n", static_cast<unsigned long long>(g_kernelTailFlags));
  printf("%s\n", failures ? "FAILED" : "all cases passed");
  return failures ? 1 : 0;
}
