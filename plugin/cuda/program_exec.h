// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The thin CUDA interpreter of step programs (plugin/core/program.h; docs/architecture.md "Step programs").
//
// bind() turns a rank's program and the call's pointers into prebuilt driver arguments: one cuStreamBatchMemOp
// parameter array per flag batch, one cudaMemcpyBatchAsync array triple per copy batch (in-place segments dropped),
// one ReduceArgs per reduce. A bound program is kept (per layout, per pointer set) and reused while the pointers stay
// the same; a call only patches the flag values (epoch, RS task base) and the reduce's op/type/scale, then issues.
// Issue: every step at call time in program order (kInOrder, kCaptured), or the call-time steps now and the issue
// groups through the provider's SharedQueues::scheduleSteps (kDeferred). Every operation that crosses a node boundary
// goes through the comm's InterNodeTransport (internode_transport.h): a one-sided program's puts and flag batches, a
// two-sided program's p2p groups (prog::Op::kP2p; in program order at the call, kInOrder only). Eager calls on the
// token route (issueTokens) replay a CUDA graph of the bound program (graph_replay.h) once the same binding and call
// values repeat; docs/architecture.md "Eager calls as graph replays".
#ifndef TIDE_CUDA_PROGRAM_EXEC_H_
#define TIDE_CUDA_PROGRAM_EXEC_H_

#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "../core/eager_route.h"
#include "../core/program.h"
#include "../nccl/p2p_group.h"
#include "comm.h"
#include "prebuilt.h"
#include "reduce_kernel.h"

namespace tide {
namespace cuda {

// What a program's symbolic buffers mean for one call. Pointers as the calling rank addresses them.
struct Binding {
  std::vector<const char*> src;   // [P] this rank's shards (AG)
  std::vector<const char*> grad;  // [P] this rank's gradients (RS)
  std::vector<char*> slotOf;      // [W] (AG) every rank's slot region (nullptr: a rank this rank does not map)
  std::vector<char*> stagingOf;   // [W] (RS) every rank's staging (likewise)
  char* out = nullptr;            // (RS) packed output
  size_t outElem = 0;             // (RS) bytes per output element (the output type is patched per call)
  const char* zeros = nullptr;
  char* multicast = nullptr;
};

// Per-call values a bound program is patched with.
struct CallValues {
  uint64_t epoch = 0;
  uint64_t task = 0;
  tideDataType_t inType = tideFloat32, outType = tideFloat32;
  tideRedOp_t op = tideSum;
  float scale = 1.0f;
  float divisor = 1.0f;
  bool batchApi = true;
  bool inGraph = false;  // issued into a capture (set by issueTokenRange): flag batches' trailing writes may be kernels
};

class BoundProgram {
 public:
  BoundProgram() = default;
  ~BoundProgram();  // destroys the graph of the eager route (the driver frees one still running when it completes)
  BoundProgram(const BoundProgram&) = delete;
  BoundProgram& operator=(const BoundProgram&) = delete;

  // Builds the driver arguments. `program` must outlive this object (it lives in the same cache entry).
  static tideResult_t bind(tideComm* comm, std::shared_ptr<const prog::Program> program, const Binding& b,
                           std::shared_ptr<BoundProgram>* out);

  const prog::Program& program() const { return *prog_; }

  // Issues the whole call: steps of group -1 (all of them unless the program is deferred) on their lanes now, and
  // for a deferred program the groups through the provider. stream = the caller's stream.
  static tideResult_t issue(const std::shared_ptr<BoundProgram>& self, const CallValues& v, cudaStream_t stream,
                            prog::Coll kind);

  // An eager call of a token (kCaptured) program: replays this binding's graph, or captures it first, or issues the
  // steps directly (prog::GraphAmortizer decides; a capture or launch failure falls back to direct issue, logged
  // once). Each is the same operations in the same order on `stream`, so the choice is this rank's alone.
  // On a provider whose ranks share hardware queues (RankOrdering::sharedQueues: loopback) the program is issued in
  // its rounds (the steps' groups; docs/architecture.md "Issue rounds"): the announce (group -1) now, rounds 1 and 2
  // through scheduleSteps, round-major over the ranks once every rank has announced, each round that holds copies or
  // reduces from a graph of that round. Every wait is then enqueued after the writes it waits for, in whatever
  // queues the device puts them.
  static tideResult_t issueTokens(const std::shared_ptr<BoundProgram>& self, const CallValues& v, cudaStream_t stream);
  bool hasGraph() const { return graph_ != nullptr || (roundGraphs_ && roundGraphs_->any()); }
  // How the last issueTokens call went, for the debug dump and traces: "issued directly", "captured into a graph
  // and replayed from it", "replayed from a graph", or "" when issueTokens was never called.
  const char* lastTokenIssue() const { return lastIssue_.load(std::memory_order_relaxed); }
  // Copy entries of the binding's copy batches (after in-place drops and merges of adjacent segments; a reduce's
  // fp32 copy not counted), and the copies the per-copy path issues for them (a capture's memcpy nodes: one per
  // strided run, plugin/core/copy_runs.h; one per entry once 2D copies were refused), for the dump.
  void copyCounts(size_t* entries, size_t* perCopyIssues) const;

 private:
  struct Item {
    prog::Op::Kind kind;
    int peer;           // cross-node: the transport's peer, else -1
    int index;          // into memops / copies / reduces / p2p
  };
  struct StepItems {
    prog::Lane lane;
    int group;
    std::vector<Item> items;
  };
  struct BoundReduce {
    ReduceArgs args;       // staging/out/prev/n/nSrc/srcStride bound; types and op patched per call
    prog::ReduceOp op;
    CopyBatch asCopy;      // the fp32 -> fp32 "narrow" of a final sum: a copy-engine copy instead of a kernel
    int next = -1;         // the reduce after it in program order (its inputs arrive while this one runs), or -1
  };

  // A reduce op with the call's pointers (its successor, types and op are set later).
  static BoundReduce bindReduce(const prog::ReduceOp& r, const Binding& b);
  // groupRange_ of a deferred program or of a token program's rounds; tideInternalError if a group is not contiguous.
  tideResult_t mapGroups();
  // One step on its lane's stream: `caller` or `side` (the comm's sideStream for epoch programs; see
  // issueTokenRange for token programs).
  tideResult_t issueStep(const StepItems& s, const CallValues& v, cudaStream_t caller, cudaStream_t side);
  // Steps [first, end) in program order; the caller holds issueMu_.
  tideResult_t issueSteps(int first, int end, const CallValues& v, cudaStream_t caller, cudaStream_t side);
  // Steps [first, end) of a token program. Issued directly (!capturing) both lanes go to `stream` in program order,
  // which the compilers make a valid schedule on one stream. Into a capture, each issue round (the steps of one
  // group) with steps on both lanes forks: its internal-lane steps go to a side stream of the comm between an event
  // recorded on `stream` and one recorded back (captureForkOf), so within a round the graph holds two branches that
  // meet only at the program's flags, and the rounds follow each other.
  tideResult_t issueTokenRange(int first, int end, const CallValues& v, cudaStream_t stream, bool capturing);
  tideResult_t issueRoundForked(int first, int end, const CallValues& v, cudaStream_t stream);
  // The whole token program from this binding's graph of it, or directly (issueTokens on providers that do not defer).
  tideResult_t issueTokenSteps(const CallValues& v, cudaStream_t stream);
  // The graphs of a token program's issue rounds (one per group that holds copies or reduces; null for the others),
  // shared with the closures of calls not yet issued, so that a recapture cannot free a graph a pending round uses.
  struct RoundGraphs {
    std::vector<cudaGraphExec_t> graphs;
    bool any() const;
    ~RoundGraphs();
  };
  // Round g of a token program (issueTokens, rounds): from `graphs` if given and it has one, else directly.
  tideResult_t issueRound(int g, const CallValues& v, cudaStream_t stream, const std::shared_ptr<RoundGraphs>& graphs);
  bool roundNeedsGraph(int g) const;

  tideComm* comm_ = nullptr;
  std::shared_ptr<const prog::Program> prog_;
  std::vector<StepItems> steps_;
  std::vector<MemOpBatch> memops_;
  std::vector<CopyBatch> copies_;
  std::vector<BoundReduce> reduces_;
  std::vector<std::vector<nccl::P2pCall>> p2p_;  // each kP2p op's group, pointers resolved
  std::vector<std::pair<int, int>> groupRange_;  // deferred groups and token rounds: steps [first, second) of each
  // Write-only flag batches in graphs as kernel nodes: RS with params::signalKernels(), AG with
  // params::agSignalKernels() (the measured choices; a test build's switches select the other side).
  bool signalKernels_ = false;
  // params::mergeFlagBatches(): while capturing (under issueMu_), flag batches are held here and enqueued as one
  // memop node when something else is issued (flushCapturedFlags), so adjacent batches on one stream become one node.
  bool mergeFlags_ = false;
  MemOpBatch capFlags_;
  cudaStream_t capFlagsStream_ = nullptr;
  tideResult_t flushCapturedFlags();
  std::mutex issueMu_;  // deferred groups of two epochs may be issued from two threads
  // Eager token route, under issueMu_: when to capture, and the graph (captured with amort_'s current values).
  prog::GraphAmortizer amort_;
  cudaGraphExec_t graph_ = nullptr;               // the whole program (providers that do not defer)
  std::shared_ptr<RoundGraphs> roundGraphs_;      // its rounds (providers that defer)
  // A static string. Atomic: written under issueMu_, possibly by another rank's thread (loopback rounds), and read
  // without it (the executors' trace line, tideCommDebugDump of another thread).
  std::atomic<const char*> lastIssue_{""};
};

// Per layout (tideComm::CacheEntry): its compiled programs and its recently bound pointer sets.
struct ExecCache {
  // [coll][mode][multicast]
  std::shared_ptr<const prog::Program> programs[2][3][2];
  struct Bound {
    int coll = 0, mode = 0, mc = 0;
    std::vector<uintptr_t> key;  // every pointer the binding depends on, plus the provider's memory generation
    std::shared_ptr<BoundProgram> bound;
  };
  std::vector<Bound> bound;  // most recently used last
  static constexpr size_t kMaxBound = 8;

  // The compiled program (compiled on first use). Errors: the compiler's (tideUnsupported with what to change).
  tideResult_t program(tideLayout_t layout, prog::Coll coll, const prog::Options& opt,
                       std::shared_ptr<const prog::Program>* out);
  // The bound program for exactly this key, or nullptr (moved to most recently used).
  std::shared_ptr<BoundProgram> find(int coll, int mode, int mc, const std::vector<uintptr_t>& key);
  void insert(int coll, int mode, int mc, const std::vector<uintptr_t>& key, std::shared_ptr<BoundProgram> b);
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_PROGRAM_EXEC_H_
