// TIDE-RS on one node: copy-engine pushes into each owner's staging (phase 1), a short-lived reduce kernel per chunk
// on the owner (phase 2), pipelined over the chunks of the packed output.
//
// Chunks: the layout cuts each rank's packed output into numChunks ranges of chunkNumel output elements. Chunk k of
// owner d holds, for every parameter i overlapping the range, gradient elements d*shard_i + q of every rank (q the
// position inside the shard; elements at or past numel_i are padding and are filled with zeros from a zero buffer,
// so the kernel folds dense inputs). Staging (caller's Slot-Reuse region or the provider's own buffer) holds
// nb = (numChunks > 1 ? 2 : 1) buffers of R inputs, input s at buffer + s * chunkNumel * elemSize.
//
// Flags (values: the comm's RS epoch e, and a global chunk counter g that every rank advances identically):
//   caller stream S: write own enter = e; for each chunk k: wait own full[s] >= g_k for all s, reduce kernel, write
//                    own consumed = g_k; finally wait own pushDone >= e (the side stream has read every gradient).
//   side stream P:   for each chunk k: wait, for every owner d, enter(d) >= e (k < nb: d entered this call, so all
//                    its earlier chunks are reduced and its staging region is free) or consumed(d) >= g_{k-nb} (the
//                    buffer's previous chunk is reduced); CE batch of the chunk into every owner; write full[me] = g_k
//                    into every owner's flags; at the end write own pushDone = e.
// Phase 1 of chunk k+1 (on P) therefore overlaps phase 2 of chunk k (on S). The side stream is ordered after the
// caller's earlier work by the wait on enter(me), and the caller's later work after the pushes by pushDone: flags,
// not events, because the provider may issue phase 1 later (loopback issues every virtual rank's pushes chunk-major
// once all ranks have called: they share the device's copy-engine queues, see PeerProvider::schedulePushes).
// Providers that do not defer (IPC: one rank per process) get the two streams' operations interleaved in host issue
// order, so that every wait is enqueued after the operation of this process that satisfies it.
// Layouts of several (virtual) nodes share the checks and the staging set-up here, then go to
// reduceScatterMultiNode (internode_rs.cc); the single-node enqueue below is unchanged.
#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cmath>

#include "../core/dtype.h"
#include "../core/errors.h"
#include "../core/log.h"
#include "copy_batch.h"
#include "cuda_check.h"
#include "driver_ops.h"
#include "executors.h"
#include "reduce_kernel.h"

namespace tide {
namespace cuda {

tideResult_t reduceScatter(tideComm* comm, tideLayout_t layout, const void* const* grads, void* out,
                           tideDataType_t outType, tideRedOp_t op, float scale, void* staging, cudaStream_t stream,
                           const CaptureState& cap) {
  static const char* kWhat = "tideReduceScatter";
  TIDE_CHECK(checkCapturable(comm, cap, kWhat));
  std::shared_ptr<const LayoutView> viewPtr;
  TIDE_CHECK(layoutView(comm, layout, cap.active, &viewPtr));
  const LayoutView& v = *viewPtr;
  TIDE_CHECK(checkLayoutAndStream(comm, v, stream, kWhat));
  const int W = comm->worldSize;
  const int R = v.info.ranksPerNode;  // == W on a single node
  const int N = v.info.nNodes;
  const int me = comm->rank;
  const int nParams = v.info.nParams;

  // Arguments.
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
  const size_t inElem = dtype::size(inType), outElem = dtype::size(outType);
  if (grads == nullptr) return fail(tideInvalidArgument, "Cuda", "%s: grads is NULL", kWhat);
  for (int i = 0; i < nParams; ++i) {
    char what[64];
    snprintf(what, sizeof(what), "%s: grads[%d]", kWhat, i);
    TIDE_CHECK(checkDevicePointer(comm, grads[i], inElem, what));
  }
  TIDE_CHECK(checkDevicePointer(comm, out, outElem, "tideReduceScatter: out"));

  // Staging geometry: nb buffers of R inputs of chunkNumel elements (plus, with several nodes, one fp32 chunk for
  // the running sum across nodes, as rs_plan.cc sizes it).
  const uint64_t chunk = v.info.rsChunkNumel;
  const int numChunks = v.info.rsNumChunks;
  const int nb = numChunks > 1 ? 2 : 1;
  const uint64_t srcStride = chunk * inElem;
  const uint64_t bufBytes = static_cast<uint64_t>(R) * srcStride + (N > 1 ? chunk * sizeof(float) : 0);
  // Pipeline steps: one per chunk on a single node; one per (chunk, owner node) pair with several nodes.
  const uint64_t numTasks = static_cast<uint64_t>(numChunks) * static_cast<uint64_t>(N);
  if (numTasks > static_cast<uint64_t>(INT_MAX)) {
    return fail(tideUnsupported, "Cuda", "%s: %d chunks x %d nodes exceed INT_MAX pipeline steps; raise rsChunkBytes",
                kWhat, numChunks, N);
  }
  const uint64_t need = bufBytes * nb;
  if (need > v.info.rsStagingBytes) {
    return fail(tideInternalError, "Cuda", "%s: staging needs %" PRIu64 " bytes but the layout reserves %" PRIu64,
                kWhat, need, v.info.rsStagingBytes);
  }
  const uint64_t outBytes = v.info.rsOutNumel * outElem;
  std::vector<char*> stagingOf(W);
  if (staging != nullptr) {
    if (reinterpret_cast<uintptr_t>(staging) % TIDE_SLOT_ALIGN != 0) {
      return fail(tideInvalidArgument, "Cuda", "%s: staging (%p) is not aligned to TIDE_SLOT_ALIGN (%d)", kWhat, staging,
                  TIDE_SLOT_ALIGN);
    }
    for (int d = 0; d < W; ++d) {
      void* p = nullptr;
      TIDE_CHECK(comm->provider->peerPtr(me, staging, v.info.rsStagingBytes, d, "tideReduceScatter: staging", &p));
      stagingOf[d] = static_cast<char*>(p);
    }
    const char* o = static_cast<const char*>(out);
    if (o < stagingOf[me] + v.info.rsStagingBytes && o + outBytes > stagingOf[me]) {
      return fail(tideInvalidArgument, "Cuda", "%s: out overlaps the staging region", kWhat);
    }
  }
  // Gradients are read while the output is written (by the kernel, chunk by chunk): they must not overlap.
  {
    const char* o = static_cast<const char*>(out);
    for (int i = 0; i < nParams; ++i) {
      const char* g = static_cast<const char*>(grads[i]);
      if (g < o + outBytes && g + v.params[i].numel * inElem > o) {
        return fail(tideInvalidArgument, "Cuda", "%s: out overlaps grads[%d]", kWhat, i);
      }
    }
  }

  // Captured into a CUDA graph: the replay-safe token protocol (captured.cc) for what it covers; everything else is
  // refused here, before anything is enqueued or any counter moves (the capture stays valid).
  if (cap.active) {
    if (N > 1) {
      return fail(tideUnsupported, "Cuda",
                  "%s: the stream is being captured into a CUDA graph, and layouts of several nodes (%d nodes of %d "
                  "ranks) cannot be captured (their pipeline is issued in steps across ranks and carries per-call task "
                  "numbers). Run this reduce-scatter outside the capture (nothing was enqueued; the capture is still "
                  "valid)",
                  kWhat, N, R);
    }
    if (staging == nullptr) {
      return fail(tideUnsupported, "Cuda",
                  "%s: the stream is being captured into a CUDA graph, and a captured reduce-scatter needs Slot-Reuse "
                  "staging (pass a slot region of rsStagingBytes as staging): the comm's own staging may have to "
                  "grow, which allocates and is collective, and cannot happen inside a capture (nothing was "
                  "enqueued; the capture is still valid)",
                  kWhat);
    }
    if (numChunks < 1 || numChunks > 2) {
      return fail(tideUnsupported, "Cuda",
                  "%s: the stream is being captured into a CUDA graph, and a captured reduce-scatter takes at most 2 "
                  "pipeline chunks (one staging buffer each, so no push waits for a reduction), but this layout has "
                  "%d chunks of %" PRIu64 " elements; create the layout with a larger rsChunkBytes so that it has "
                  "at most 2 (nothing was enqueued; the capture is still valid)",
                  kWhat, numChunks, chunk);
    }
    TIDE_CHECK(driverOpsInit());
    TIDE_CHECK(comm->provider->checkCapture(me, CollKind::kReduceScatter, cap.id));
    RsCall c;
    c.comm = comm;
    c.v = &v;
    c.grads = grads;
    c.out = out;
    c.inType = inType;
    c.outType = outType;
    c.op = op;
    c.scale = scale;
    c.stagingOf = std::move(stagingOf);
    c.chunk = chunk;
    c.numChunks = numChunks;
    c.nb = nb;
    c.srcStride = srcStride;
    c.bufBytes = bufBytes;
    c.inElem = inElem;
    c.outElem = outElem;
    c.stream = stream;
    return reduceScatterCaptured(c, cap);
  }

  TIDE_CHECK(driverOpsInit());
  const uint64_t epoch = comm->rsEpoch + 1;
  TIDE_CHECK(comm->provider->checkStream(me, CollKind::kReduceScatter, epoch, stream));
  if (staging == nullptr) {
    comm->phase.store("tideReduceScatter: own staging (collective growth: cudaMalloc, exchange, IPC open)",
                      std::memory_order_relaxed);
    for (int d = 0; d < W; ++d) {
      void* p = nullptr;
      TIDE_CHECK(comm->provider->ownStaging(me, d, need, epoch, &p));
      stagingOf[d] = static_cast<char*>(p);
    }
  }
  comm->rsEpoch = epoch;
  const uint64_t g0 = comm->rsChunkSeq;  // chunk (task) k has global number g0 + k + 1
  comm->rsChunkSeq += numTasks;
  comm->lastRs = tideComm::RsRecord{epoch, g0, static_cast<int>(numTasks), nb, staging == nullptr};
  const uint32_t e = static_cast<uint32_t>(epoch);
  if (N > 1) {
    // Several (virtual) nodes: node-local reduction per (chunk, owner node), then the running fp32 sum along the
    // owner's rail in node order (internode_rs.cc).
    RsCall c;
    c.comm = comm;
    c.v = &v;
    c.grads = grads;
    c.out = out;
    c.inType = inType;
    c.outType = outType;
    c.op = op;
    c.scale = scale;
    c.stagingOf = std::move(stagingOf);
    c.epoch = e;
    c.g0 = g0;
    c.chunk = chunk;
    c.numChunks = numChunks;
    c.nb = nb;
    c.srcStride = srcStride;
    c.bufBytes = bufBytes;
    c.inElem = inElem;
    c.outElem = outElem;
    c.stream = stream;
    return reduceScatterMultiNode(c);
  }
  PeerProvider* pp = comm->provider.get();
  uint32_t* own = pp->flags(me, me);
  size_t zeroBytes = 0;
  const char* zeros = static_cast<const char*>(pp->zeros(&zeroBytes));

  // Phase 1 is planned now and issued by the provider (at once, or interleaved with the other ranks' pushes).
  struct PushPlan {
    cudaStream_t side;
    int device;
    std::vector<std::vector<FlagOp>> before, after;  // per chunk: waits for the owners' buffers; full[me] writes
    std::vector<CopyList> copies;                      // per chunk
    uint32_t* pushDone;
    uint32_t epoch;
  };
  auto plan = std::make_shared<PushPlan>();
  plan->side = comm->sideStream;
  plan->device = comm->device;
  plan->before.resize(numChunks);
  plan->after.resize(numChunks);
  plan->copies.resize(numChunks);
  plan->pushDone = own + flag::kRsPushDone;
  plan->epoch = e;
  int pi = 0;  // first parameter that can overlap the current chunk
  for (int k = 0; k < numChunks; ++k) {
    const uint64_t c0 = static_cast<uint64_t>(k) * chunk;
    const uint64_t c1 = std::min(c0 + chunk, v.info.rsOutNumel);
    const uint32_t gk = static_cast<uint32_t>(g0 + k + 1);
    const int b = k % nb;
    std::vector<FlagOp>& ops = plan->before[k];
    for (int d = 0; d < W; ++d) {
      uint32_t* fd = pp->flags(me, d);
      if (k < nb) {
        // enter(me) also orders the side stream after the caller's earlier work (the gradients). consumed >= g0:
        // d may have run its previous reduce-scatter on another stream.
        ops.push_back({FlagOp::kWait, fd + flag::kRsEnter, e});
        ops.push_back({FlagOp::kWait, fd + flag::kRsConsumed, static_cast<uint32_t>(g0)});
      } else {
        ops.push_back({FlagOp::kWait, fd + flag::kRsConsumed, static_cast<uint32_t>(g0 + (k - nb) + 1)});
      }
    }
    CopyList& copies = plan->copies[k];
    while (pi < nParams && v.params[pi].rsOutOffset + v.params[pi].shardNumel <= c0) ++pi;
    for (int dd = 0; dd < W; ++dd) {
      const int d = (me + dd) % W;
      char* dst = stagingOf[d] + static_cast<uint64_t>(b) * bufBytes + static_cast<uint64_t>(me) * srcStride;
      for (int i = pi; i < nParams && v.params[i].rsOutOffset < c1; ++i) {
        const tideParamInfo_t& p = v.params[i];
        const uint64_t lo = std::max(c0, p.rsOutOffset), hi = std::min(c1, p.rsOutOffset + p.shardNumel);
        if (lo >= hi) continue;
        const uint64_t q = lo - p.rsOutOffset;                          // position inside the shard
        const uint64_t j = static_cast<uint64_t>(d) * p.shardNumel + q;  // gradient element
        const uint64_t count = hi - lo;
        const uint64_t valid = j >= p.numel ? 0 : std::min(count, p.numel - j);
        char* to = dst + (lo - c0) * inElem;
        copies.add(to, static_cast<const char*>(grads[i]) + j * inElem, valid * inElem);
        for (uint64_t z = valid * inElem; z < count * inElem; z += zeroBytes) {
          copies.add(to + z, zeros, std::min<uint64_t>(zeroBytes, count * inElem - z));
        }
      }
    }
    for (int d = 0; d < W; ++d) plan->after[k].push_back({FlagOp::kWrite, pp->flags(me, d) + flag::kRsFull + me, gk});
  }

  // Caller's stream: enter, then phase 2 per chunk (wait for every input, reduce, release the buffer), then wait
  // until this rank's pushes are done (the caller owns its gradients again).
  auto enqueueReduce = [&](int k) -> tideResult_t {
    const uint64_t c0 = static_cast<uint64_t>(k) * chunk;
    const uint64_t c1 = std::min(c0 + chunk, v.info.rsOutNumel);
    const uint32_t gk = static_cast<uint32_t>(g0 + k + 1);
    std::vector<FlagOp> ops;
    for (int s = 0; s < W; ++s) ops.push_back({FlagOp::kWait, own + flag::kRsFull + s, gk});
    TIDE_CHECK(enqueueFlagOps(stream, ops));
    ReduceArgs a;
    a.staging = stagingOf[me] + static_cast<uint64_t>(k % nb) * bufBytes;
    a.srcStride = srcStride;
    a.nSrc = R;
    a.n = c1 - c0;
    a.out = static_cast<char*>(out) + c0 * outElem;
    a.inType = inType;
    a.outType = outType;
    a.op = op;
    a.scale = scale;
    a.divisor = static_cast<float>(W);
    TIDE_CHECK(launchReduce(a, stream));
    return enqueueFlagOps(stream, {FlagOp{FlagOp::kWrite, own + flag::kRsConsumed, gk}});
  };
  // Side stream: phase 1 of chunk k (k == numChunks: the final pushDone write).
  PeerProvider::IssueFn issue = [plan, numChunks](int k) -> tideResult_t {
    if (k == numChunks) {
      return enqueueFlagOps(plan->side, {FlagOp{FlagOp::kWrite, plan->pushDone, plan->epoch}});
    }
    TIDE_CHECK(enqueueFlagOps(plan->side, plan->before[k]));
    TIDE_CHECK(plan->copies[k].enqueue(plan->side, plan->device));
    return enqueueFlagOps(plan->side, plan->after[k]);
  };
  comm->phase.store("tideReduceScatter: enqueueing", std::memory_order_relaxed);
  TIDE_CHECK(enqueueFlagOps(stream, {FlagOp{FlagOp::kWrite, own + flag::kRsEnter, e}}));
  if (pp->defersPushes()) {
    // The provider issues phase 1 later (loopback: chunk-major across virtual ranks once all have submitted).
    for (int k = 0; k < numChunks; ++k) TIDE_CHECK(enqueueReduce(k));
    TIDE_CHECK(enqueueFlagOps(stream, {FlagOp{FlagOp::kWait, own + flag::kRsPushDone, e}}));
    TIDE_CHECK(pp->schedulePushes(me, epoch, numChunks, std::move(issue)));
  } else {
    // One rank per process: interleave the two streams in host issue order so that no wait of this process is
    // enqueued before the operation of this process that satisfies it (enter before the pushes that wait for it,
    // pushes of chunk k before its reduction, the reduction of chunk k before the push of chunk k + nb that reuses
    // its buffer, the pushDone write before the caller's wait). Then a CUDA call that implicitly waits for this
    // process's queued work (lazy module loading, an allocation, a driver-internal serialization point) can only
    // wait for work that is already enqueued here or that the peers enqueue on their own: never for work this host
    // thread has yet to enqueue. (docs/notes/multiprocess-rs-hang.md)
    for (int k = 0; k < nb && k < numChunks; ++k) TIDE_CHECK(issue(k));
    for (int k = 0; k < numChunks; ++k) {
      TIDE_CHECK(enqueueReduce(k));
      if (k + nb < numChunks) TIDE_CHECK(issue(k + nb));
    }
    TIDE_CHECK(issue(numChunks));
    TIDE_CHECK(enqueueFlagOps(stream, {FlagOp{FlagOp::kWait, own + flag::kRsPushDone, e}}));
  }
  TIDE_TRACE("Cuda", "RS rank %d epoch %" PRIu64 ": %d chunks of %" PRIu64 " elements, staging %s", me, epoch,
             numChunks, chunk, staging ? "slot" : "own");
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
