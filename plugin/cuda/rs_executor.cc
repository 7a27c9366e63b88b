// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// TIDE-RS on the CUDA path: argument checks, then the layout's step program (plugin/core/program_rs.cc: node-local
// copy-engine pushes into each owner's staging, the short-lived reduce kernel per chunk, and with several nodes the
// running fp32 sum along each rail) bound to the call's pointers and issued by the interpreter (program_exec.h). The
// protocol, the staging geometry (the layout's RsPlan) and the issue orders are in docs/architecture.md ("Step
// programs"). A call whose pointers (gradients, output, staging) equal those of a recent call reuses that binding.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <string>

#include "../core/dtype.h"
#include "../core/errors.h"
#include "../core/log.h"
#include "../core/memory_ranges.h"
#include "driver_ops.h"
#include "executors.h"
#include "program_exec.h"

namespace tide {
namespace cuda {
namespace {

constexpr const char* kWhat = "tideReduceScatter";

// The call's values against the layout: op, output type, scale, one reducible gradient dtype, non-null pointers.
tideResult_t checkArguments(const LayoutView& v, const void* const* grads, const void* out, tideDataType_t outType,
                            tideRedOp_t op, float scale) {
  const int nParams = v.info.nParams;
  if (static_cast<int>(op) < 0 || static_cast<int>(op) >= static_cast<int>(tideNumRedOps)) {
    return fail(tideInvalidArgument, "Cuda", "%s: op is %d; use tideSum, tideAvg or tidePremulSum", kWhat,
                static_cast<int>(op));
  }
  if (!dtype::reducible(outType)) {
    return fail(tideInvalidArgument, "Cuda", "%s: outType %d is not tideFloat32, tideBfloat16 or tideFloat16", kWhat,
                static_cast<int>(outType));
  }
  if (!std::isfinite(scale)) return fail(tideInvalidArgument, "Cuda", "%s: scale is not finite", kWhat);
  const tideDataType_t inType = v.params[0].dtype;
  for (int i = 0; i < nParams; ++i) {
    if (!dtype::reducible(v.params[i].dtype)) {
      return fail(tideInvalidArgument, "Cuda", "%s: parameter %d has dtype %d; reduce-scatter takes bf16, fp16 or fp32",
                  kWhat, i, static_cast<int>(v.params[i].dtype));
    }
  }
  if (!v.uniformDtype) {
    for (int i = 0; i < nParams; ++i) {
      if (v.params[i].dtype != inType) {
        return fail(tideUnsupported, "Cuda",
                    "%s: the CUDA reduce-scatter needs one gradient dtype per layout, but parameter 0 is %s and "
                    "parameter %d is %s; split the group by dtype (or use the host executor)",
                    kWhat, dtype::name(inType), i, dtype::name(v.params[i].dtype));
      }
    }
  }
  if (grads == nullptr) return fail(tideInvalidArgument, "Cuda", "%s: grads is NULL", kWhat);
  if (out == nullptr) return fail(tideInvalidArgument, "Cuda", "%s: out is NULL", kWhat);
  return tideSuccess;
}

// Captured into a CUDA graph: what the replay-safe protocol cannot take is refused here, before anything is enqueued
// or any counter moves (the capture stays valid).
tideResult_t checkCaptureShape(const tideComm* comm, const LayoutView& v, const void* staging) {
  if (v.info.nNodes > 1) {
    return fail(tideUnsupported, "Cuda",
                "%s: the stream is being captured into a CUDA graph, and layouts of several nodes (%d nodes of %d "
                "ranks) cannot be captured (their pipeline is issued in steps across ranks and carries per-call task "
                "numbers). Run this reduce-scatter outside the capture (nothing was enqueued; the capture is still "
                "valid)",
                kWhat, v.info.nNodes, v.info.ranksPerNode);
  }
  if (staging == nullptr) {
    return fail(tideUnsupported, "Cuda",
                "%s: the stream is being captured into a CUDA graph, and a captured reduce-scatter needs Slot-Reuse "
                "staging (pass a slot region of rsStagingBytes as staging): the comm's own staging may have to "
                "grow, which allocates and is collective, and cannot happen inside a capture (nothing was "
                "enqueued; the capture is still valid)",
                kWhat);
  }
  if (v.info.rsNumChunks > 2 && comm->provider->sharedQueues() != nullptr) {
    return fail(tideUnsupported, "Cuda",
                "%s: the stream is being captured into a CUDA graph, and on a %s world a captured reduce-scatter "
                "takes at most 2 pipeline chunks (this layout has %d): with more, a push waits for the other ranks' "
                "reductions, and a rank's whole graph launched ahead of the next rank's can fill the copy queues "
                "the ranks share (docs/architecture.md \"More chunks than buffers\"). Create the layout with a "
                "larger rsChunkBytes, or run this reduce-scatter outside the capture (nothing was enqueued; the "
                "capture is still valid; eager calls of such a layout issue the token protocol in rounds when "
                "NCCL_TIDE_TOKEN_RS_CHUNKS allows it, else the epoch protocol)",
                kWhat, comm->provider->name(), v.info.rsNumChunks);
  }
  return tideSuccess;
}

// The layout's program for this call's protocol (compiled on first use); a compiler refusal while capturing says
// that the capture is still valid.
tideResult_t programFor(tideComm* comm, tideComm::CacheEntry* ent, tideLayout_t layout, bool tokens, bool capturing,
                        std::shared_ptr<const prog::Program>* program, prog::Options* opt) {
  size_t zeroBytes = 0;
  (void)comm->provider->zeros(&zeroBytes);
  opt->zeroBytes = zeroBytes;
  opt->mode = tokens ? prog::Mode::kCaptured
                     : (comm->provider->sharedQueues() != nullptr ? prog::Mode::kDeferred : prog::Mode::kInOrder);
  opt->maxTokenRsChunks = comm->tokenRsChunks;
  opt->pairTokens = comm->pairTokens;
  opt->transport = programTransport(comm);
  tideResult_t r = ent->exec->program(layout, prog::Coll::kReduceScatter, *opt, program);
  if (r == tideSuccess || !capturing) return r;
  const std::string why = tideGetLastError();  // copied: fail() below rewrites the last-error buffer
  return fail(r, "Cuda",
              "%s: the stream is being captured into a CUDA graph: %s (nothing was enqueued; the capture is still "
              "valid)",
              kWhat, why.c_str());
}

// The comm's own staging of every rank this rank maps (the others stay nullptr) for RS epoch `epoch`, as this rank
// addresses it (collective: every rank of the epoch asks for it, and it may grow).
tideResult_t ownStagingOf(tideComm* comm, uint64_t bytes, uint64_t epoch, std::vector<char*>* own) {
  comm->phase.store("tideReduceScatter: own staging (collective growth: cudaMalloc, exchange, IPC open)",
                    std::memory_order_relaxed);
  for (int d = 0; d < comm->worldSize; ++d) {
    if (!mapsPeer(comm, d)) continue;
    void* p = nullptr;
    TIDE_CHECK(comm->provider->ownStaging(d, bytes, epoch, &p));
    (*own)[d] = static_cast<char*>(p);
  }
  return tideSuccess;
}

// Everything a new pointer set needs: pointer checks, peer addresses of the staging, overlaps; then the binding.
// own: every rank's own staging when staging is NULL.
tideResult_t bindReduceScatter(tideComm* comm, const LayoutView& v, std::shared_ptr<const prog::Program> program,
                               const void* const* grads, void* out, tideDataType_t outType, void* staging,
                               const std::vector<char*>& own, std::shared_ptr<BoundProgram>* bound) {
  const int W = comm->worldSize, me = comm->rank, nParams = v.info.nParams;
  const size_t inElem = dtype::size(v.params[0].dtype), outElem = dtype::size(outType);
  const uint64_t outBytes = v.info.rsOutNumel * outElem;
  Binding b;
  b.grad.resize(nParams);
  for (int i = 0; i < nParams; ++i) {
    char what[64];
    snprintf(what, sizeof(what), "%s: grads[%d]", kWhat, i);
    TIDE_CHECK(checkDevicePointer(comm, grads[i], inElem, what));
    b.grad[i] = static_cast<const char*>(grads[i]);
  }
  TIDE_CHECK(checkDevicePointer(comm, out, outElem, "tideReduceScatter: out"));
  b.stagingOf.assign(W, nullptr);
  const char* o = static_cast<const char*>(out);
  if (staging != nullptr) {
    for (int d = 0; d < W; ++d) {
      if (!mapsPeer(comm, d)) continue;  // another TIDE node: reached through the sendrecv transport only
      void* p = nullptr;
      TIDE_CHECK(slotRegion(comm, staging, v.info.rsStagingBytes, d, "tideReduceScatter: staging", &p));
      b.stagingOf[d] = static_cast<char*>(p);
    }
    if (o < b.stagingOf[me] + v.info.rsStagingBytes && o + outBytes > b.stagingOf[me]) {
      return fail(tideInvalidArgument, "Cuda", "%s: out overlaps the staging region", kWhat);
    }
  } else {
    b.stagingOf = own;
  }
  // Gradients are read while the output is written (by the kernel, chunk by chunk): they must not overlap, except
  // in NCCL's in-place form, the output exactly this rank's own block of its one gradient (memory_ranges.h). There
  // every program pushes the own block into staging like any other and reduces only staging: the own block's
  // elements of chunk k are pushed before chunk k is reduced and written, and nothing reads them afterwards
  // (tests/native/program_model.cc --in-place checks it for every mode and node split).
  const tideParamInfo_t& p0 = v.params[0];
  const bool inPlace = isInPlaceReduceScatter(nParams, p0.numel, p0.rowNumel, p0.shardNumel, inElem,
                                              outType == p0.dtype, W, me, grads[0], out);
  for (int i = 0; i < nParams && !inPlace; ++i) {
    const char* g = static_cast<const char*>(grads[i]);
    if (g < o + outBytes && g + v.params[i].numel * inElem > o) {
      return fail(tideInvalidArgument, "Cuda", "%s: out overlaps grads[%d]", kWhat, i);
    }
  }
  b.out = static_cast<char*>(out);
  b.outElem = outElem;
  size_t zeroBytes = 0;
  b.zeros = static_cast<const char*>(comm->provider->zeros(&zeroBytes));
  return BoundProgram::bind(comm, std::move(program), b, bound);
}

}  // namespace

tideResult_t reduceScatter(tideComm* comm, tideLayout_t layout, const void* const* grads, void* out,
                           tideDataType_t outType, tideRedOp_t op, float scale, void* staging, cudaStream_t stream,
                           const CaptureState& cap) {
  TIDE_CHECK(checkUsable(comm, kWhat));
  TIDE_CHECK(checkCapturable(comm, cap, kWhat));
  tideComm::CacheEntry* ent = nullptr;
  TIDE_CHECK(layoutEntry(comm, layout, cap.active, &ent));
  const LayoutView& v = *ent->view;
  TIDE_CHECK(checkLayoutAndStream(comm, v, stream, kWhat));
  TIDE_CHECK(checkArguments(v, grads, out, outType, op, scale));
  if (cap.active) TIDE_CHECK(checkCaptureShape(comm, v, staging));
  const int W = comm->worldSize;

  // Eager calls whose program can be captured (one node, at most NCCL_TIDE_TOKEN_RS_CHUNKS chunks) take the token
  // protocol when the graph route is on: the same decision on every rank (docs/architecture.md "Eager calls as graph
  // replays"). Unlike a capture, an eager token call may use the comm's own staging: its growth runs here, at call
  // time, outside any capture.
  const bool tokens = cap.active || eagerTokens(comm, v, true);
  prog::Options opt;
  std::shared_ptr<const prog::Program> program;
  TIDE_CHECK(programFor(comm, ent, layout, tokens, cap.active, &program, &opt));
  if (staging != nullptr && reinterpret_cast<uintptr_t>(staging) % TIDE_SLOT_ALIGN != 0) {
    return fail(tideInvalidArgument, "Cuda", "%s: staging (%p) is not aligned to TIDE_SLOT_ALIGN (%d)", kWhat, staging,
                TIDE_SLOT_ALIGN);
  }

  TIDE_CHECK(driverOpsInit());
  const uint64_t epoch = comm->rsEpoch + 1;
  if (!cap.active) TIDE_CHECK(comm->provider->checkStream(CollKind::kReduceScatter, epoch, stream));
  std::vector<char*>& own = comm->stagingScratch;
  own.assign(W, nullptr);
  if (staging == nullptr) TIDE_CHECK(ownStagingOf(comm, v.info.rsStagingBytes, epoch, &own));

  // The binding of this pointer set: reused, or made now.
  std::vector<uintptr_t>& key = comm->keyScratch;
  key.clear();
  key.push_back(comm->provider->memoryGeneration());
  key.push_back(comm->peerRegions.generation());
  key.push_back(reinterpret_cast<uintptr_t>(out));
  // The output type, not only its size: a bound in-place call (output type = gradient type) must not serve a call of
  // another type of the same size at the same pointers, which overlaps and is refused.
  key.push_back(static_cast<uintptr_t>(outType));
  key.push_back(reinterpret_cast<uintptr_t>(staging));
  if (staging == nullptr) {
    for (int d = 0; d < W; ++d) key.push_back(reinterpret_cast<uintptr_t>(own[d]));
  }
  for (int i = 0; i < v.info.nParams; ++i) key.push_back(reinterpret_cast<uintptr_t>(grads[i]));
  const int coll = static_cast<int>(prog::Coll::kReduceScatter), mode = static_cast<int>(opt.mode);
  std::shared_ptr<BoundProgram> bound = ent->exec->find(coll, mode, 0, key);
  if (!bound) {
    TIDE_CHECK(bindReduceScatter(comm, v, std::move(program), grads, out, outType, staging, own, &bound));
    ent->exec->insert(coll, mode, 0, key, bound);
  }

  CallValues cv;
  cv.inType = v.params[0].dtype;
  cv.outType = outType;
  cv.op = op;
  cv.scale = scale;
  cv.divisor = static_cast<float>(W);
  cv.batchApi = batchApiFor(stream, cap.active);
  if (cap.active) {
    if (SharedQueues* q = comm->provider->sharedQueues()) TIDE_CHECK(q->checkCapture(CollKind::kReduceScatter, cap.id));
    return BoundProgram::issue(bound, cv, stream, prog::Coll::kReduceScatter);
  }
  comm->rsEpoch = epoch;
  cv.epoch = epoch;
  cv.task = comm->rsChunkSeq;  // task t of this call has number task + t + 1
  comm->rsChunkSeq += bound->program().numTasks;
  comm->lastRs = tideComm::LastCall{bound, epoch, cv.task};
  comm->phase.store("tideReduceScatter: enqueueing", std::memory_order_relaxed);
  // A token program has numTasks 0 (the task counter is the eager pipeline's); the epoch counts every eager call.
  // From here the epoch has advanced: a failure leaves this rank out of step with its peers (markCallFailed).
  TIDE_CHECK(markCallFailed(comm, CollKind::kReduceScatter, epoch,
                            tokens ? BoundProgram::issueTokens(bound, cv, stream)
                                   : BoundProgram::issue(bound, cv, stream, prog::Coll::kReduceScatter)));
  TIDE_TRACE("Cuda", "RS rank %d epoch %" PRIu64 ": %d chunks, program of %zu steps, staging %s%s%s", comm->rank, epoch,
             v.info.rsNumChunks, bound->program().steps.size(), staging ? "slot" : "own",
             tokens ? ", token protocol " : "", tokens ? bound->lastTokenIssue() : "");
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
