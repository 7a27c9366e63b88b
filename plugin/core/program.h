// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Step programs: what one rank runs for one TIDE collective, compiled once per (layout, rank, mode) by pure
// functions of the layout (compileAllGather, compileReduceScatter in program_ag.cc / program_rs.cc).
//
// A program is an ordered list of steps. Each step is a run of operations on one lane (the caller's stream or the
// comm's internal stream) and carries an issue group (deferred issue, below). Operations are flag batches (waits and
// writes of 32-bit flag words in some rank's flag array), copy batches (segments between symbolic buffers), and
// reduces (the fp32 fold of staged inputs). Nothing in a program is a pointer: buffers are symbolic (Mem + index +
// offset) and flag values are symbolic (the call's epoch, the comm's RS task counter, or a constant), so one program
// serves every call; an interpreter binds pointers once per pointer table and patches the values per call.
//
// The protocol these programs implement (flag words, values, why they are deadlock-free and replay-safe) is
// described once, in docs/architecture.md ("Step programs"); the compilers point there instead of repeating it.
// The CUDA interpreter (plugin/cuda/program_exec.cc), the CPU model (tests/native/program_model.cc), the debug dump and the
// pending-wait report all read programs; nothing else derives offsets or flag values.
#ifndef TIDE_CORE_PROGRAM_H_
#define TIDE_CORE_PROGRAM_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "layout.h"
#include "tide.h"

namespace tide {
namespace prog {

// Flag words of one rank's array (uint32 each, zero at creation). docs/architecture.md "Step programs" says who
// writes which value when.
namespace word {
constexpr int kAgReady = 0;
constexpr int kRsEnter = 1;
constexpr int kRsConsumed = 2;
constexpr int kRsPushDone = 3;
constexpr int kRsPrev = 4;
constexpr int kRsFinal = 5;
constexpr int kAgFinish = 6;
// Where this rank's last token (kCaptured) AG / RS is: 1 entered, 2 past its ready / enter waits, 0 finished (or
// none yet). Written only by the rank into its own array, never waited on: the token words are reset to 0 after
// their wait, so only these tell tideCommGetPendingWaits which of a token program's waits can still be pending.
constexpr int kCapAgPhase = 7;
constexpr int kCapRsPhase = 8;
constexpr int kAgRail = 16;     // + round
constexpr int kMaxRounds = 32;
constexpr int kAgDone = 64;     // + source local rank
constexpr int kRsFull = 128;    // + source local rank
constexpr int kMaxLocalRanks = 64;
constexpr int kCapAgReady = 256;  // + local rank (captured calls only)
constexpr int kCapAgDone = 320;
constexpr int kCapRsEnter = 384;
// RS full and consumed tokens of chunk k (value k + 1, from the rank the index names) live in the bank of k's
// parity: chunk k + 2 of the same buffer can only be pushed (and reduced) after chunk k's wait passed, so each word
// holds 0 or the one value its waiter waits for (what token pairs need; docs/architecture.md "Token pairs").
constexpr int kCapRsFull = 448;  // even chunks
// + the owner's local rank: "I have reduced chunk k" (value k + 1), written by the owner into every pusher's array;
// only token RS programs of more chunks than staging buffers use it (program_rs.cc, capturedPipelined).
constexpr int kCapRsConsumed = 512;  // even chunks
constexpr int kCapRsFullOdd = 576;
constexpr int kCapRsConsumedOdd = 640;
constexpr int kWords = 704;
inline int capRsFull(int chunk) { return chunk % 2 ? kCapRsFullOdd : kCapRsFull; }
inline int capRsConsumed(int chunk) { return chunk % 2 ? kCapRsConsumedOdd : kCapRsConsumed; }
}  // namespace word

enum class Coll : uint8_t { kAllGather = 0, kReduceScatter = 1 };

// How the program is issued (a property of the provider and of the call, chosen by the interpreter):
//   kInOrder:  every step at call time, in program order, each on its lane (one rank per process: no wait of this
//              process is enqueued before the operation of this process that satisfies it).
//   kDeferred: steps of group -1 at call time (caller lane); steps of group g >= 0 are handed to the provider, which
//              issues group g of every rank before group g + 1 of any (loopback: ranks share copy-engine queues).
//   kCaptured: single node, replay-safe constant tokens (CUDA graph capture), every step on the caller lane.
enum class Mode : uint8_t { kInOrder = 0, kDeferred = 1, kCaptured = 2 };

enum class Lane : uint8_t { kCaller = 0, kInternal = 1 };

// Symbolic memory. index: parameter (kSrc, kGrad) or rank (kSlot, kStaging); offset in bytes.
enum class Mem : uint8_t {
  kSrc = 0,      // this rank's shard of parameter index (packed send buffer + sendOffset, or shardPtrs[index])
  kGrad = 1,     // this rank's full gradient of parameter index
  kSlot = 2,     // rank index's slot region (the layout's slotBytes), as this rank addresses it
  kStaging = 3,  // rank index's RS staging (the layout's rsStagingBytes), as this rank addresses it
  kOut = 4,      // this rank's packed RS output
  kZeros = 5,    // a buffer of zeros of at least Options::zeroBytes
  kMulticast = 6 // the multicast address of this rank's slot region (only in programs compiled with multicast)
};
struct Addr {
  Mem mem = Mem::kZeros;
  int32_t index = 0;
  uint64_t offset = 0;
};

// Symbolic flag values: base + delta (mod 2^32). kEpoch: the call's sequence number for its collective kind (AG or
// RS epoch of the comm, the same on every rank). kTask: the comm's RS task counter before the call (task t of the
// call has number task + t + 1). kConst: delta itself (captured tokens).
enum class Val : uint8_t { kEpoch = 0, kTask = 1, kConst = 2 };

struct FlagOp {
  enum Kind : uint8_t { kWait = 0, kWrite = 1 } kind = kWait;
  Val base = Val::kConst;
  int32_t owner = 0;  // whose flag array
  int32_t word = 0;
  int64_t delta = 0;
  // This op and the next of its batch are one token pair (Options::pairTokens): same kind and owner, words `word`
  // (even) and word + 1, constant values, and, for waits, words that hold only 0 or the value waited for until the
  // owner resets them. An interpreter with 64-bit memops issues the two as one (a wait for equality of both words,
  // a write of both), one operation instead of two; read one by one they mean what they always mean.
  bool pairNext = false;
  uint32_t value(uint64_t epoch, uint64_t task) const {
    uint64_t b = base == Val::kEpoch ? epoch : base == Val::kTask ? task : 0;
    return static_cast<uint32_t>(b + static_cast<uint64_t>(delta));
  }
};

// How the operations that cross a node boundary are carried (Options::transport; docs/protocol.md "Across nodes").
enum class Transport : uint8_t {
  // Puts into the peer's memory (copy batches with Op::crossNode) and flag signals / waits with the peer: every
  // rank's memory peer-mapped (loopback, CUDA IPC), or one-sided RMA (ncclPutSignal / ncclWaitSignal).
  kOneSided = 0,
  // Grouped sends and receives (ncclSend / ncclRecv, two-sided): Op::kP2p groups; the receiver posts a receive into
  // its own memory where the put would have landed, and the group's completion in stream order replaces the
  // cross-node signals and waits. Built by plugin/core/p2p_plan.h.
  kTwoSided = 1,
};

// One side of a two-sided transfer, in this rank's own memory (addr: Mem::kSlot or Mem::kStaging of this rank):
// send `bytes` at addr to `peer`, or receive `bytes` from `peer` into addr. Like NCCL, a pair's sends and receives
// match in issue order.
struct P2pXfer {
  enum Kind : uint8_t { kSend = 0, kRecv = 1 } kind = kSend;
  int32_t peer = 0;
  Addr addr;
  uint64_t bytes = 0;
};

struct CopySeg {
  Addr dst, src;
  uint64_t bytes = 0;
};

// out[k] = post(prev[k] + fold_s pre(x_s[k])) over n elements (include/tide.h's order: left fold over the nInputs
// inputs, input s at inputs + s * stride bytes; pre = the call's PREMUL scale if applyPremul; prev absent if !hasPrev;
// post = divide by the world size if applyAvg and the call's op is AVG). Inputs are the call's gradient type unless
// inputsFp32; out is the call's output type if outFinal, else fp32.
struct ReduceOp {
  Addr inputs;
  uint64_t stride = 0;
  int nInputs = 0;
  bool inputsFp32 = false;
  bool hasPrev = false;
  Addr prev;
  Addr out;
  bool outFinal = true;
  bool applyPremul = true;
  bool applyAvg = true;
  uint64_t n = 0;
};

// One operation: a run [begin, end) of flagOps, copies or p2p transfers, or one reduce (begin = its index).
// kP2p: one NCCL group on the step's lane (ncclGroupStart, each transfer's ncclSend / ncclRecv in order,
// ncclGroupEnd); the operations after it on the lane run once every transfer of the group has completed.
struct Op {
  enum Kind : uint8_t { kFlags = 0, kCopies = 1, kReduce = 2, kP2p = 3 } kind = kFlags;
  // Crosses a node boundary (a put, or a signal / wait of one; every kP2p group): issued through the inter-node
  // transport.
  bool crossNode = false;
  int32_t peer = -1;  // crossNode, except kP2p (whose transfers name their peers): the other rank
  uint32_t begin = 0, end = 0;
};

struct Step {
  Lane lane = Lane::kCaller;
  // kDeferred: issue group (-1: at call time). kCaptured: issue round (-1: the announce, g: round g + 1; 2 rounds,
  // or K + 1 for an RS of K > 2 chunks), used by providers whose ranks share hardware queues (docs/architecture.md
  // "Issue rounds"); others ignore it.
  int32_t group = -1;
  uint32_t begin = 0, end = 0;  // ops
};

struct Program {
  Coll coll = Coll::kAllGather;
  Mode mode = Mode::kInOrder;
  int rank = 0, worldSize = 0, ranksPerNode = 0, nNodes = 0;
  int numGroups = 0;        // kDeferred: groups 0 .. numGroups - 1; kCaptured: issue rounds after the announce
  uint64_t numTasks = 0;    // RS: how far the call advances the comm's task counter
  int numChunks = 0;        // RS: pipeline chunks of the layout
  int numBuffers = 0;       // RS: staging buffers
  bool usesInternalLane = false;
  bool needsStaging = false;  // RS: reads kStaging
  Transport transport = Transport::kOneSided;  // as compiled (only several nodes have kP2p operations)
  std::vector<Step> steps;
  std::vector<Op> ops;
  std::vector<FlagOp> flags;
  std::vector<CopySeg> copies;
  std::vector<ReduceOp> reduces;
  std::vector<P2pXfer> p2p;
};

struct Options {
  Mode mode = Mode::kInOrder;
  uint64_t zeroBytes = 1 << 20;  // size of the zero buffer that fills RS padding (Mem::kZeros)
  bool multicast = false;        // AG, single node, kInOrder: one write per parameter to Mem::kMulticast
  // RS, kCaptured: the most pipeline chunks a token program may have (NCCL_TIDE_TOKEN_RS_CHUNKS). Up to 2 there is
  // one staging buffer per chunk; beyond, 2 buffers and the consumed tokens (docs/architecture.md "CUDA graphs").
  int maxTokenRsChunks = 2;
  // kCaptured: the tokens (AG ready and done, RS enter, full and consumed) waited for, and the barrier tokens reset,
  // in pairs of words that both have a writer (FlagOp::pairNext): at W = 8 the AG's 45 memop operations become 33
  // (docs/architecture.md "Token pairs"). Local to the rank: the words written to peers are the same either way.
  bool pairTokens = false;
  // Several nodes: the cross-node operations as one-sided puts and signals, or as two-sided p2p groups.
  Transport transport = Transport::kOneSided;
};

// The program of layout.rank. Errors (tideUnsupported with a message that says what to change): a mode the layout
// cannot take (captured with several nodes, captured RS with more than Options::maxTokenRsChunks chunks), more ranks
// per node than flag words, more rounds than rail words, schedules longer than maxSteps.
tideResult_t compileAllGather(const Layout& layout, const Options& opt, Program* out);
tideResult_t compileReduceScatter(const Layout& layout, const Options& opt, Program* out);

// The trailing writes of flag operation `op` that a CUDA graph may carry as a signal kernel instead of memops
// (plugin/cuda/signal_kernel.h; docs/architecture.md "Trailing resets"): the longest run of writes at the end of the
// batch whose words are all distinct (a kernel's stores have no order among themselves), never starting inside a
// token pair. Returns its first index into p.flags (op.end: none; op.begin: the whole batch). *ordered: how many of
// its first writes go to the program's own rank's words; the kernel stores those before the rest (a barrier and a
// system fence between), which keeps a batch's resets of its own tokens ahead of the tokens it then sends.
uint32_t kernelTail(const Program& p, const Op& op, uint32_t* ordered);

// A readable listing of a program (one line per operation), for the debug dump and tests.
void describe(const Program& p, std::vector<char>* text);

// Where a flag word's meaning is documented, for reports: "AG ready", "RS full from local rank 3", ...
void wordName(int word, char* buf, size_t len);

}  // namespace prog
}  // namespace tide

#endif  // TIDE_CORE_PROGRAM_H_
