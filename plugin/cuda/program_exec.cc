// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "program_exec.h"

#include <algorithm>
#include <cstring>

#include "../core/errors.h"
#include "../core/handles.h"
#include "../core/layout.h"
#include "../core/log.h"
#include "../core/params.h"
#include "graph_replay.h"
#include "signal_kernel.h"

namespace tide {
namespace cuda {
namespace {

char* resolve(const Binding& b, const prog::Addr& a) {
  switch (a.mem) {
    case prog::Mem::kSrc: return const_cast<char*>(b.src[a.index]) + a.offset;
    case prog::Mem::kGrad: return const_cast<char*>(b.grad[a.index]) + a.offset;
    case prog::Mem::kSlot: return b.slotOf[a.index] + a.offset;
    case prog::Mem::kStaging: return b.stagingOf[a.index] + a.offset;
    case prog::Mem::kOut: return b.out + a.offset * b.outElem;
    case prog::Mem::kZeros: return const_cast<char*>(b.zeros);
    case prog::Mem::kMulticast: return b.multicast + a.offset;
  }
  return nullptr;
}

CollKind kindOf(prog::Coll c) { return c == prog::Coll::kAllGather ? CollKind::kAllGather : CollKind::kReduceScatter; }

// What a graph bakes in beyond the binding: the reduce's types, op and scale (an AG has none of these, and its
// values are then always the defaults). Not the epoch or task: token programs carry constants only.
uint64_t valuesKey(const CallValues& v) {
  uint32_t scale = 0, divisor = 0;
  static_assert(sizeof(float) == sizeof(uint32_t), "float is 32 bits");
  memcpy(&scale, &v.scale, sizeof(scale));
  memcpy(&divisor, &v.divisor, sizeof(divisor));
  uint64_t k = static_cast<uint64_t>(v.inType) | static_cast<uint64_t>(v.outType) << 8 |
               static_cast<uint64_t>(v.op) << 16;
  k = k * 0x9e3779b97f4a7c15ull ^ scale;
  return k * 0x9e3779b97f4a7c15ull ^ divisor;
}

// captureGraph, once more if it failed because the runtime refused a strided run's 2D copy during it (a refusal may
// invalidate the capture; from then on runs go row by row, copyRunsRefused).
bool captureWithRunsFallback(cudaStream_t s, const std::function<bool(cudaStream_t)>& enqueue, cudaGraphExec_t* out,
                             std::string* why) {
  const bool refusedBefore = copyRunsRefused();
  if (captureGraph(s, enqueue, out, why)) return true;
  return !refusedBefore && copyRunsRefused() && captureGraph(s, enqueue, out, why);
}

// A flag op of the program as one cuStreamBatchMemOp parameter array: every address through the provider, a token
// pair as one 64-bit operation.
MemOpBatch bindFlags(const prog::Program& p, const prog::Op& op, RankOrdering* ordering) {
  MemOpBatch m;
  // The batch's trailing writes that a graph may carry as a signal kernel, as flag indices (prog::kernelTail)
  // and then as indices of params (a pair is one of them).
  uint32_t ordered = 0;
  const uint32_t tail = prog::kernelTail(p, op, &ordered);
  m.kernelFrom = SIZE_MAX;
  for (uint32_t f = op.begin; f < op.end; ++f) {
    if (f >= tail && m.kernelFrom == SIZE_MAX) m.kernelFrom = m.params.size();
    if (f >= tail && f < tail + ordered) m.kernelOrdered = m.params.size() + 1 - m.kernelFrom;
    const prog::FlagOp& x = p.flags[f];
    uint32_t* a = ordering->flags(x.owner) + x.word;
    // A token pair (compiled only where the comm's device has 64-bit memops): one operation for both words.
    const prog::FlagOp* y = x.pairNext && f + 1 < op.end ? &p.flags[f + 1] : nullptr;
    if (y != nullptr && y->kind == x.kind && y->owner == x.owner && y->word == x.word + 1 &&
        x.base == prog::Val::kConst && y->base == prog::Val::kConst && reinterpret_cast<uintptr_t>(a) % 8 == 0) {
      m.addPair(x, p.flags[f + 1], a);
      ++f;
    } else {
      prog::FlagOp one = x;
      one.pairNext = false;  // issued alone: its value is patched per call like any other
      m.add(one, a);
    }
  }
  if (m.kernelFrom == SIZE_MAX) m.kernelFrom = m.params.size();
  return m;
}

// Every slot, staging and flag array the program addresses has an address here (a rank on another TIDE node has
// none without peerMapsAllRanks: two-sided programs never address one), and p2p transfers are in the rank's own
// memory. tideInternalError naming the first that is not: a compiler bug, never a user error.
tideResult_t checkAddressed(const tideComm* comm, const prog::Program& p, const Binding& b) {
  auto base = [&](const prog::Addr& a) -> const char* {
    if (a.mem == prog::Mem::kSlot) return a.index < static_cast<int>(b.slotOf.size()) ? b.slotOf[a.index] : nullptr;
    if (a.mem == prog::Mem::kStaging) {
      return a.index < static_cast<int>(b.stagingOf.size()) ? b.stagingOf[a.index] : nullptr;
    }
    return "";  // the rank's own buffers
  };
  auto missing = [&](const prog::Addr& a, const char* what) {
    return fail(tideInternalError, "Cuda",
                "rank %d's %s program addresses rank %d's %s (%s), which this rank does not map (another TIDE node)",
                comm->rank, p.coll == prog::Coll::kAllGather ? "AG" : "RS", a.index,
                a.mem == prog::Mem::kSlot ? "slot" : "staging", what);
  };
  for (const prog::CopySeg& c : p.copies) {
    if (base(c.dst) == nullptr) return missing(c.dst, "a copy's destination");
    if (base(c.src) == nullptr) return missing(c.src, "a copy's source");
  }
  for (const prog::ReduceOp& r : p.reduces) {
    if (base(r.inputs) == nullptr) return missing(r.inputs, "a reduce's inputs");
    if (r.hasPrev && base(r.prev) == nullptr) return missing(r.prev, "a reduce's running sum");
    if (base(r.out) == nullptr) return missing(r.out, "a reduce's output");
  }
  for (const prog::P2pXfer& x : p.p2p) {
    if ((x.addr.mem != prog::Mem::kSlot && x.addr.mem != prog::Mem::kStaging) || x.addr.index != comm->rank) {
      return fail(tideInternalError, "Cuda", "rank %d's p2p transfer with rank %d is not in its own slot or staging",
                  comm->rank, x.peer);
    }
    if (base(x.addr) == nullptr) return missing(x.addr, "a p2p transfer");
  }
  for (const prog::FlagOp& f : p.flags) {
    if (comm->provider->flags(f.owner) == nullptr) {
      return fail(tideInternalError, "Cuda",
                  "rank %d's program addresses rank %d's flags, which this rank does not map (another TIDE node)",
                  comm->rank, f.owner);
    }
  }
  if (!p.p2p.empty()) {
    if (comm->ncclLib == nullptr || comm->ncclComm == nullptr) {
      return fail(tideInternalError, "Cuda", "a two-sided program on a comm without an NCCL communicator");
    }
    if (p.mode != prog::Mode::kInOrder) {
      return fail(tideUnsupported, "Cuda",
                  "two-sided (sendrecv) programs are issued in program order at the call only; this one was compiled "
                  "for deferred or captured issue");
    }
  }
  return tideSuccess;
}

// A p2p op of the program as NCCL calls: each transfer in the rank's own slot or staging (checkAddressed).
std::vector<nccl::P2pCall> bindP2p(const prog::Program& p, const prog::Op& op, const Binding& b) {
  std::vector<nccl::P2pCall> calls;
  for (uint32_t k = op.begin; k < op.end; ++k) {
    const prog::P2pXfer& x = p.p2p[k];
    nccl::P2pCall c;
    c.send = x.kind == prog::P2pXfer::kSend;
    c.peer = x.peer;
    c.buf = resolve(b, x.addr);
    c.bytes = x.bytes;
    calls.push_back(c);
  }
  return calls;
}

// A copy op of the program as one copy batch: segments already in place dropped, adjacent ones merged, strided runs
// planned for the per-copy path (captures: fewer memcpy nodes).
CopyBatch bindCopies(const prog::Program& p, const prog::Op& op, const Binding& b) {
  CopyBatch c;
  std::vector<uint32_t> group;  // the destination buffer of each entry: where strided runs may form
  for (uint32_t k = op.begin; k < op.end; ++k) {
    const prog::CopySeg& s = p.copies[k];
    char* d = resolve(b, s.dst);
    const char* from = resolve(b, s.src);
    if (d == from) continue;  // a shard already in place
    // Adjacent in both source and destination (e.g. gradients that happen to be contiguous): one entry. Each
    // entry of a copy batch costs the host about 3.5 us.
    if (!c.dst.empty() && static_cast<char*>(c.dst.back()) + c.bytes.back() == d &&
        static_cast<const char*>(c.src.back()) + c.bytes.back() == from && s.src.mem != prog::Mem::kZeros) {
      c.bytes.back() += s.bytes;
      continue;
    }
    c.dst.push_back(d);
    c.src.push_back(from);
    c.bytes.push_back(s.bytes);
    if (op.crossNode) c.peerDst.push_back(s.dst);
    group.push_back(static_cast<uint32_t>(s.dst.mem) << 24 | static_cast<uint32_t>(s.dst.index));
  }
  if (!c.dst.empty()) c.planRuns(group);
  return c;
}

}  // namespace

tideResult_t BoundProgram::bind(tideComm* comm, std::shared_ptr<const prog::Program> program, const Binding& b,
                                std::shared_ptr<BoundProgram>* out) {
  auto bp = std::make_shared<BoundProgram>();
  bp->comm_ = comm;
  bp->prog_ = std::move(program);
  const prog::Program& p = *bp->prog_;
  bp->signalKernels_ = p.coll == prog::Coll::kReduceScatter ? params::signalKernels() : params::agSignalKernels();
  bp->mergeFlags_ = params::mergeFlagBatches();
  TIDE_CHECK(checkAddressed(comm, p, b));
  bp->steps_.reserve(p.steps.size());
  for (const prog::Step& st : p.steps) {
    StepItems si;
    si.lane = st.lane;
    si.group = st.group;
    for (uint32_t o = st.begin; o < st.end; ++o) {
      const prog::Op& op = p.ops[o];
      Item it{op.kind, op.crossNode ? op.peer : -1, 0};
      if (op.kind == prog::Op::kFlags) {
        if (op.begin == op.end) continue;
        it.index = static_cast<int>(bp->memops_.size());
        bp->memops_.push_back(bindFlags(p, op, comm->provider.get()));
      } else if (op.kind == prog::Op::kCopies) {
        CopyBatch c = bindCopies(p, op, b);
        if (c.dst.empty()) continue;
        it.index = static_cast<int>(bp->copies_.size());
        bp->copies_.push_back(std::move(c));
      } else if (op.kind == prog::Op::kP2p) {
        if (op.begin == op.end) continue;
        it.index = static_cast<int>(bp->p2p_.size());
        bp->p2p_.push_back(bindP2p(p, op, b));
      } else {
        it.index = static_cast<int>(bp->reduces_.size());
        bp->reduces_.push_back(bindReduce(p.reduces[op.begin], b));
      }
      si.items.push_back(it);
    }
    bp->steps_.push_back(std::move(si));
  }
  // Each reduce's deadline is the next one's arrival (reduce_kernel.h, followingBytes); the last has none.
  for (size_t i = 0; i + 1 < bp->reduces_.size(); ++i) bp->reduces_[i].next = static_cast<int>(i + 1);
  if (p.mode == prog::Mode::kDeferred || (p.mode == prog::Mode::kCaptured && p.numGroups > 0)) {
    TIDE_CHECK(bp->mapGroups());
  }
  *out = std::move(bp);
  return tideSuccess;
}

BoundProgram::BoundReduce BoundProgram::bindReduce(const prog::ReduceOp& r, const Binding& b) {
  BoundReduce br;
  br.op = r;
  br.args.staging = resolve(b, r.inputs);
  br.args.srcStride = r.stride;
  br.args.nSrc = r.nInputs;
  br.args.n = r.n;
  br.args.out = resolve(b, r.out);
  br.args.prev = r.hasPrev ? reinterpret_cast<const float*>(resolve(b, r.prev)) : nullptr;
  if (r.nInputs == 1 && r.inputsFp32 && !r.hasPrev) {
    br.asCopy.dst.push_back(br.args.out);
    br.asCopy.src.push_back(br.args.staging);
    br.asCopy.bytes.push_back(r.n * sizeof(float));
  }
  return br;
}

tideResult_t BoundProgram::mapGroups() {
  // Each group's steps are contiguous in program order (program_*.cc emit them group by group).
  const prog::Program& p = *prog_;
  groupRange_.assign(p.numGroups, {0, 0});
  std::vector<bool> seen(p.numGroups, false);
  for (size_t i = 0; i < steps_.size(); ++i) {
    const int g = steps_[i].group;
    if (g < 0) continue;
    if (g >= p.numGroups) {
      return fail(tideInternalError, "Cuda", "program step %zu has group %d of %d", i, g, p.numGroups);
    }
    auto& r = groupRange_[g];
    if (!seen[g]) {
      seen[g] = true;
      r = {static_cast<int>(i), static_cast<int>(i) + 1};
    } else if (r.second == static_cast<int>(i)) {
      r.second = static_cast<int>(i) + 1;
    } else {
      return fail(tideInternalError, "Cuda", "program group %d is not contiguous", g);
    }
  }
  return tideSuccess;
}

tideResult_t BoundProgram::issueStep(const StepItems& s, const CallValues& v, cudaStream_t caller, cudaStream_t side) {
  tideComm* comm = comm_;
  cudaStream_t stream = s.lane == prog::Lane::kCaller ? caller : side;
  for (const Item& it : s.items) {
    const bool localFlags = it.kind == prog::Op::kFlags && it.peer < 0;
    // In a graph with signal kernels a batch's trailing writes go as a kernel (signal_kernel.h), the operations
    // before them (kernelFrom of them) as memops, held to merge with the batches next to them.
    const size_t memopsOf = !localFlags ? 0
                            : v.inGraph && signalKernels_ ? memops_[it.index].kernelFrom
                                                          : memops_[it.index].params.size();
    const bool hold = localFlags && v.inGraph && mergeFlags_ && memopsOf > 0;
    // Held batches precede whatever else comes next (on either stream); another held batch joins them if it is on
    // the same stream.
    if (v.inGraph && (!hold || capFlagsStream_ != stream)) TIDE_CHECK(flushCapturedFlags());
    switch (it.kind) {
      case prog::Op::kFlags: {
        MemOpBatch& m = memops_[it.index];
        m.patch(v.epoch, v.task);
        if (it.peer >= 0) {
          TIDE_CHECK(comm->transport->flags(stream, it.peer, m));
          break;
        }
        if (hold) {  // one memop node with the batches next to it (its ops run in order, as theirs did)
          capFlagsStream_ = stream;
          capFlags_.params.insert(capFlags_.params.end(), m.params.begin(), m.params.begin() + memopsOf);
        } else {
          TIDE_CHECK(enqueueMemOps(stream, m.params.data(), memopsOf));
        }
        if (memopsOf < m.params.size()) {  // the kernel after the memops it follows in program order
          TIDE_CHECK(flushCapturedFlags());
          TIDE_CHECK(enqueueSignals(stream, m.params.data() + memopsOf, m.params.size() - memopsOf,
                                    m.kernelOrdered));
        }
        break;
      }
      case prog::Op::kCopies:
        if (it.peer >= 0) {
          TIDE_CHECK(comm->transport->put(stream, it.peer, copies_[it.index], v.batchApi, comm->device));
        } else {
          TIDE_CHECK(enqueueCopyBatch(stream, comm->device, copies_[it.index], v.batchApi));
        }
        break;
      case prog::Op::kReduce: {
        BoundReduce& br = reduces_[it.index];
        const prog::ReduceOp& r = br.op;
        ReduceArgs& a = br.args;
        a.inType = r.inputsFp32 ? tideFloat32 : v.inType;
        a.outType = r.outFinal ? v.outType : tideFloat32;
        tideRedOp_t op = v.op;
        if ((op == tideAvg && !r.applyAvg) || (op == tidePremulSum && !r.applyPremul)) op = tideSum;
        a.op = op;
        a.scale = v.scale;
        a.divisor = v.divisor;
        if (br.next < 0) {
          a.followingBytes = 0;  // the last reduce: the drain
        } else {
          // What arrives before the next reduce can start; never 0 (the drain) for an empty one.
          const BoundReduce& nx = reduces_[br.next];
          const uint64_t f = reduceArrivingBytes(nx.args.nSrc, nx.args.n, nx.op.inputsFp32 ? tideFloat32 : v.inType,
                                                 nx.op.hasPrev);
          a.followingBytes = static_cast<int64_t>(f > 0 ? f : 1);
        }
        if (!br.asCopy.dst.empty() && a.outType == tideFloat32 && op == tideSum) {
          TIDE_CHECK(enqueueCopyBatch(stream, comm->device, br.asCopy, v.batchApi));
        } else {
          TIDE_CHECK(launchReduce(a, stream, comm->reducePace));
        }
        break;
      }
      case prog::Op::kP2p: {  // one NCCL group on the lane: what follows on it runs once the group has completed
        const std::vector<nccl::P2pCall>& calls = p2p_[it.index];
        TIDE_CHECK(comm->transport->sendRecv(stream, calls.data(), calls.size()));
        break;
      }
    }
  }
  return tideSuccess;
}

BoundProgram::~BoundProgram() { destroyGraph(graph_); }

void BoundProgram::copyCounts(size_t* entries, size_t* perCopyIssues) const {
  *entries = *perCopyIssues = 0;
  for (const CopyBatch& c : copies_) {
    *entries += c.size();
    *perCopyIssues += c.runs.empty() || copyRunsRefused() ? c.size() : c.runs.size();
  }
}

tideResult_t BoundProgram::flushCapturedFlags() {
  if (capFlags_.params.empty()) return tideSuccess;
  tideResult_t r = enqueueMemOps(capFlagsStream_, capFlags_);
  capFlags_.params.clear();
  capFlagsStream_ = nullptr;
  return r;
}

tideResult_t BoundProgram::issueSteps(int first, int end, const CallValues& v, cudaStream_t caller,
                                      cudaStream_t side) {
  for (int i = first; i < end; ++i) TIDE_CHECK(issueStep(steps_[i], v, caller, side));
  return tideSuccess;
}

tideResult_t BoundProgram::issueTokenRange(int first, int end, const CallValues& v, cudaStream_t stream,
                                           bool capturing) {
  if (!capturing) return issueSteps(first, end, v, stream, stream);
  CallValues g = v;
  g.inGraph = true;
  capFlags_.params.clear();  // nothing held from a capture that failed partway
  capFlagsStream_ = nullptr;
  // One fork and join per issue round: no wait of a round depends on a write of the same round (program_rs.cc), so
  // the graph never relies on one branch progressing while the other waits (docs/architecture.md "More chunks than
  // buffers").
  for (int i = first; i < end;) {
    int j = i + 1;
    while (j < end && steps_[j].group == steps_[i].group) ++j;
    TIDE_CHECK(issueRoundForked(i, j, g, stream));
    i = j;
  }
  return flushCapturedFlags();
}

tideResult_t BoundProgram::issueRoundForked(int first, int end, const CallValues& v, cudaStream_t stream) {
  int fork = end;  // the first internal-lane step
  bool caller = false;
  for (int i = first; i < end; ++i) {
    if (steps_[i].lane == prog::Lane::kInternal) {
      if (fork == end) fork = i;
    } else if (fork != end) {
      caller = true;  // a caller's step after the fork point: the two lanes overlap
    }
  }
  if (fork == end || !caller) return issueSteps(first, end, v, stream, stream);
  // The steps before the first internal one on the capturing stream, then the fork (the internal branch starts
  // after them, as in program order), the rest on their lanes, the join.
  TIDE_CHECK(issueSteps(first, fork, v, stream, stream));
  TIDE_CHECK(flushCapturedFlags());  // before the fork: held batches precede the internal branch
  CaptureFork f;
  std::string why;
  if (!captureForkOf(comm_, stream, &f, &why)) {
    return fail(tideCudaError, "Cuda", "forking the internal lane of a captured token program: %s", why.c_str());
  }
  cudaError_t err = cudaEventRecord(f.fork, stream);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(f.side, f.fork, 0);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(tideCudaError, "Cuda", "forking the internal lane of a captured token program: %s",
                cudaGetErrorName(err));
  }
  tideResult_t r = issueSteps(fork, end, v, stream, f.side);
  if (r == tideSuccess) r = flushCapturedFlags();  // before the join, on whichever lane holds them
  // Joined whatever happened: a capture whose forked stream was not joined back cannot end.
  cudaError_t joined = cudaEventRecord(f.join, f.side);
  if (joined == cudaSuccess) joined = cudaStreamWaitEvent(stream, f.join, 0);
  if (joined != cudaSuccess) {
    (void)cudaGetLastError();
    if (r == tideSuccess) {
      r = fail(tideCudaError, "Cuda", "joining the internal lane of a captured token program: %s",
               cudaGetErrorName(joined));
    }
  }
  return r;
}

bool BoundProgram::RoundGraphs::any() const {
  for (cudaGraphExec_t g : graphs) {
    if (g) return true;
  }
  return false;
}

BoundProgram::RoundGraphs::~RoundGraphs() {
  for (cudaGraphExec_t g : graphs) destroyGraph(g);
}

bool BoundProgram::roundNeedsGraph(int g) const {
  const auto& r = groupRange_[g];
  for (int i = r.first; i < r.second; ++i) {
    for (const Item& it : steps_[i].items) {
      if (it.kind != prog::Op::kFlags) return true;
    }
  }
  return false;  // flag batches only: one cuStreamBatchMemOp each, cheaper to issue than a graph launch
}

tideResult_t BoundProgram::issueRound(int g, const CallValues& v, cudaStream_t stream,
                                      const std::shared_ptr<RoundGraphs>& graphs) {
  if (graphs && graphs->graphs[g]) {
    std::string why;
    TIDE_TRACE("Cuda", "rank %d: launching the graph of round %d", comm_->rank, g + 1);
    if (launchGraph(graphs->graphs[g], stream, &why)) {
      TIDE_TRACE("Cuda", "rank %d: round %d launched", comm_->rank, g + 1);
      return tideSuccess;
    }
    // A refused launch enqueued nothing: this round directly, and no graphs from now on.
    amort_.captureFailed();
    roundGraphs_.reset();
    lastIssue_.store("issued directly", std::memory_order_relaxed);
    noteGraphFallback("launching a captured round of a bound program", why);
  }
  const auto& r = groupRange_[g];
  return issueTokenRange(r.first, r.second, v, stream, false);
}

tideResult_t BoundProgram::issueTokens(const std::shared_ptr<BoundProgram>& self, const CallValues& v,
                                       cudaStream_t stream) {
  BoundProgram& bp = *self;
  const prog::Program& p = *bp.prog_;
  if (p.mode != prog::Mode::kCaptured) {
    return fail(tideInternalError, "Cuda", "issueTokens: not a token program");
  }
  SharedQueues* queues = bp.comm_->provider->sharedQueues();
  if (queues == nullptr || p.numGroups == 0) {
    std::lock_guard<std::mutex> lock(bp.issueMu_);
    return bp.issueTokenSteps(v, stream);
  }
  // Shared hardware queues (loopback): the announce now, rounds 1..numGroups once every rank has announced (the
  // provider calls back, possibly from another rank's call, round-major over the ranks). How this call is issued
  // (graphs or directly) is decided, and any capture made, now; the lock is not held while the provider may call
  // back into this binding.
  const CollKind kind = kindOf(p.coll);
  const int last = p.numGroups - 1;
  TIDE_CHECK(queues->precheckSteps(kind, v.epoch, last, true));
  std::shared_ptr<RoundGraphs> graphs;
  {
    std::lock_guard<std::mutex> lock(bp.issueMu_);
    using Issue = prog::GraphAmortizer::Issue;
    Issue how = bp.amort_.next(valuesKey(v));
    std::string why;
    cudaStream_t capStream = nullptr;
    if (how == Issue::kCapture && !captureStreamOf(bp.comm_, &capStream, &why)) {
      bp.amort_.captureFailed();
      noteGraphFallback("creating the private capture stream", why);
      how = Issue::kDirect;
    }
    if (how == Issue::kCapture) {
      bp.roundGraphs_.reset();  // captured with other values (or none yet); a pending round keeps its own
      auto fresh = std::make_shared<RoundGraphs>();
      fresh->graphs.assign(p.numGroups, nullptr);
      CallValues cv = v;
      cv.batchApi = false;  // the batch API is not capturable: one memcpy node per copy
      bool ok = true;
      for (int g = 0; g <= last && ok; ++g) {
        if (!bp.roundNeedsGraph(g)) continue;
        TIDE_TRACE("Cuda", "rank %d: capturing round %d of a %s token program", bp.comm_->rank, g + 1,
                   p.coll == prog::Coll::kAllGather ? "AG" : "RS");
        const auto& r = bp.groupRange_[g];
        ok = captureWithRunsFallback(capStream, [&](cudaStream_t s) {
          return bp.issueTokenRange(r.first, r.second, cv, s, true) == tideSuccess;
        }, &fresh->graphs[g], &why);
      }
      if (ok) {
        bp.roundGraphs_ = std::move(fresh);
        bp.lastIssue_.store("captured into a graph and replayed from it", std::memory_order_relaxed);
      } else {
        bp.amort_.captureFailed();
        noteGraphFallback("capturing a round of a bound program", why);
        how = Issue::kDirect;
      }
    } else if (how == Issue::kReplay && bp.roundGraphs_) {
      bp.lastIssue_.store("replayed from a graph", std::memory_order_relaxed);
    } else {
      how = Issue::kDirect;
    }
    if (how == Issue::kDirect) bp.lastIssue_.store("issued directly", std::memory_order_relaxed);
    else graphs = bp.roundGraphs_;
    for (const StepItems& s : bp.steps_) {
      if (s.group < 0) TIDE_CHECK(bp.issueStep(s, v, stream, stream));  // the announce
    }
  }
  SharedQueues::IssueFn fn = [self, v, stream, graphs](int g) -> tideResult_t {
    BoundProgram& b = *self;
    std::lock_guard<std::mutex> lock(b.issueMu_);
    return b.issueRound(g, v, stream, graphs);
  };
  return queues->scheduleSteps(kind, v.epoch, last, std::move(fn));
}

tideResult_t BoundProgram::issueTokenSteps(const CallValues& v, cudaStream_t stream) {
  BoundProgram& bp = *this;
  using Issue = prog::GraphAmortizer::Issue;
  Issue how = bp.amort_.next(valuesKey(v));
  std::string why;
  bool justCaptured = false;
  cudaStream_t capStream = nullptr;
  if (how == Issue::kCapture && !captureStreamOf(bp.comm_, &capStream, &why)) {
    bp.amort_.captureFailed();
    noteGraphFallback("creating the private capture stream", why);
    how = Issue::kDirect;
  }
  if (how == Issue::kCapture) {
    destroyGraph(bp.graph_);  // captured with other values (or none yet); one still running is freed when it ends
    bp.graph_ = nullptr;
    CallValues cv = v;
    cv.batchApi = false;  // the batch API is not capturable: one memcpy node per copy
    cudaGraphExec_t g = nullptr;
    // TRACE lines around each driver call that could block: the last one logged names the call of a hang.
    TIDE_TRACE("Cuda", "rank %d: capturing a %s token program (%zu copy batches, %zu reduces)", bp.comm_->rank,
               bp.prog_->coll == prog::Coll::kAllGather ? "AG" : "RS", bp.copies_.size(), bp.reduces_.size());
    const int n = static_cast<int>(bp.steps_.size());
    if (captureWithRunsFallback(
            capStream, [&](cudaStream_t s) { return bp.issueTokenRange(0, n, cv, s, true) == tideSuccess; }, &g,
            &why)) {
      TIDE_TRACE("Cuda", "rank %d: captured and instantiated", bp.comm_->rank);
      bp.graph_ = g;
      justCaptured = true;
      how = Issue::kReplay;
    } else {
      bp.amort_.captureFailed();
      noteGraphFallback("capturing a bound program", why);
      how = Issue::kDirect;
    }
  }
  if (how == Issue::kReplay) {
    TIDE_TRACE("Cuda", "rank %d: launching its graph", bp.comm_->rank);
    if (launchGraph(bp.graph_, stream, &why)) {
      TIDE_TRACE("Cuda", "rank %d: graph launched", bp.comm_->rank);
      bp.lastIssue_.store(justCaptured ? "captured into a graph and replayed from it" : "replayed from a graph",
                          std::memory_order_relaxed);
      return tideSuccess;
    }
    // A refused launch enqueued nothing: issue the same program directly, and never again from a graph.
    bp.amort_.captureFailed();
    destroyGraph(bp.graph_);
    bp.graph_ = nullptr;
    noteGraphFallback("launching a captured bound program", why);
  }
  bp.lastIssue_.store("issued directly", std::memory_order_relaxed);
  return bp.issueTokenRange(0, static_cast<int>(bp.steps_.size()), v, stream, false);
}

tideResult_t BoundProgram::issue(const std::shared_ptr<BoundProgram>& self, const CallValues& v, cudaStream_t stream,
                                 prog::Coll coll) {
  BoundProgram& bp = *self;
  const prog::Program& p = *bp.prog_;
  const int n = static_cast<int>(bp.steps_.size());
  if (p.mode == prog::Mode::kCaptured) {  // a capture of the caller's (issue() takes token programs only then)
    std::lock_guard<std::mutex> lock(bp.issueMu_);
    return bp.issueTokenRange(0, n, v, stream, true);
  }
  if (p.mode != prog::Mode::kDeferred) {
    std::lock_guard<std::mutex> lock(bp.issueMu_);
    return bp.issueSteps(0, n, v, stream, bp.comm_->sideStream);
  }
  // Deferred: the provider first checks that the groups can be issued (so that no caller-stream wait is enqueued
  // for work that will never come), then the call-time steps, then the groups through the provider.
  SharedQueues* queues = bp.comm_->provider->sharedQueues();
  if (queues == nullptr) {
    return fail(tideInternalError, "Cuda", "a deferred program on a provider without shared queues");
  }
  const int last = p.numGroups - 1;
  TIDE_CHECK(queues->precheckSteps(kindOf(coll), v.epoch, last, false));
  {
    std::lock_guard<std::mutex> lock(bp.issueMu_);
    for (const StepItems& s : bp.steps_) {
      if (s.group < 0) TIDE_CHECK(bp.issueStep(s, v, stream, bp.comm_->sideStream));
    }
  }
  // Each group's steps, issued when the provider calls back (possibly from another rank's call); the values are
  // carried by the closure, so a later call of this rank cannot change them.
  SharedQueues::IssueFn fn = [self, v, stream](int g) -> tideResult_t {
    BoundProgram& b = *self;
    std::lock_guard<std::mutex> lock(b.issueMu_);
    const auto& r = b.groupRange_[g];
    return b.issueSteps(r.first, r.second, v, stream, b.comm_->sideStream);
  };
  return queues->scheduleSteps(kindOf(coll), v.epoch, last, std::move(fn));
}

tideResult_t ExecCache::program(tideLayout_t layout, prog::Coll coll, const prog::Options& opt,
                                std::shared_ptr<const prog::Program>* out) {
  auto& slot = programs[static_cast<int>(coll)][static_cast<int>(opt.mode)][opt.multicast ? 1 : 0];
  if (!slot) {
    auto p = std::make_shared<prog::Program>();
    std::shared_ptr<const tide::Layout> l;  // the core's immutable layout behind the checked handle
    TIDE_CHECK(checkHandle(layout, HandleKind::kLayout, coll == prog::Coll::kAllGather ? "tideAllGather"
                                                                                       : "tideReduceScatter",
                           "layout", &l));
    TIDE_CHECK(coll == prog::Coll::kAllGather ? prog::compileAllGather(*l, opt, p.get())
                                              : prog::compileReduceScatter(*l, opt, p.get()));
    slot = std::move(p);
  }
  *out = slot;
  return tideSuccess;
}

std::shared_ptr<BoundProgram> ExecCache::find(int coll, int mode, int mc, const std::vector<uintptr_t>& key) {
  for (size_t i = bound.size(); i > 0; --i) {
    Bound& b = bound[i - 1];
    if (b.coll == coll && b.mode == mode && b.mc == mc && b.key == key) {
      if (i != bound.size()) std::swap(b, bound.back());
      return bound.back().bound;
    }
  }
  return nullptr;
}

void ExecCache::insert(int coll, int mode, int mc, const std::vector<uintptr_t>& key, std::shared_ptr<BoundProgram> b) {
  if (bound.size() >= kMaxBound) bound.erase(bound.begin());
  Bound e;
  e.coll = coll;
  e.mode = mode;
  e.mc = mc;
  e.key = key;
  e.bound = std::move(b);
  bound.push_back(std::move(e));
}

}  // namespace cuda
}  // namespace tide
