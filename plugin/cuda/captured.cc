// TIDE-AG and TIDE-RS captured into a CUDA graph (single node): a replay-safe flag protocol.
//
// The eager protocol compares flags against per-call values (AG epoch, RS chunk numbers) baked into the memops, so a
// replayed graph would wait for values that never come again. Captured calls therefore use their own bank of flag
// words (flag::kCap*, never touched by eager calls, whose words these calls never touch) as one-shot tokens with
// fixed values:
//
//   word             lives in the array of   written (to a fixed value) by   reset to 0 by
//   capAgReady + d   rank s (the writer-to)  d: "s may write d's slot"        s, right after its wait saw it
//   capAgDone + s    rank d                  s: "s's copies into d landed"    d, right after its wait saw it
//   capRsEnter + d   rank s                  d: "s may push into d's staging" s, right after its wait saw it
//   capRsFull + s    rank d                  s: chunks pushed into d (1, 2)   d, after its wait saw the last chunk
//
// A token is reset only by the word's owner, after its wait has seen the last value the writer sends in this
// collective; the writer sends the next value only after a causal chain through that reset (below), so a wait can
// never see a stale token, and no write is lost to a reset. Everything runs on the caller's stream as one linear
// chain (no side stream, so the capture needs no fork or join), stream memops only (plus the RS reduce kernel):
//
// AG, rank me (every other rank d / s):
//   1. write capAgReady + me = 1 into every d        (my stream reached this AG: my slot may be overwritten)
//   2. wait own capAgReady + d >= 1; reset them to 0  (every d's slot may be written)
//   3. copies of my shards into every rank's slot (as the eager AG)
//   4. write capAgDone + me = 1 into every d          (after the copies: stream order + the write's barrier)
//   5. wait own capAgDone + s >= 1; reset them to 0   (every rank's shards have landed in my slot)
// Why replay-safe: d sends its next ready token to me only in its next collective, i.e. after its step 5, which
// needs my done token, which I write (step 4) after my reset of d's ready token (step 2). s sends its next done token
// to me only after its next step 2, which needs my next ready token, written after my reset of s's done token.
//
// RS, rank me, the layout's numChunks <= 2 chunks, Slot-Reuse staging with one buffer per chunk (nb == numChunks):
//   1. write capRsEnter + me = 1 into every d        (my stream reached this RS: my staging is free, my gradients
//                                                     are final)
//   2. wait own capRsEnter + d >= 1; reset them to 0
//   3. per chunk k: copies of chunk k into every owner's buffer k (as the eager pushes), then write
//      capRsFull + me = k + 1 into every d
//   4. per chunk k: wait own capRsFull + s >= k + 1; reduce kernel of chunk k into out
//   5. reset own capRsFull + s to 0
// No push waits for a reduction (every chunk has its own buffer), so a rank's copies wait only for the other
// ranks' first memop writes. Replay safety as for AG: d's next enter token comes after d's step 4, which needs my
// last full token, written after my reset of d's enter token; s's next full token comes after its next step 2,
// which needs my next enter token, written after my step 5.
//
// Ordering with everything else: a captured collective runs after the rank's earlier work on the stream (its first
// operation is a memop write in stream order) and its stream continues only after every peer's copies into this
// rank have landed and (RS) its own reductions and pushes are done; eager collectives on the same slot or staging
// order the same way through their own words. A rank's eager and captured collectives must therefore be ordered by
// stream (the same stream, or events), and all ranks replay their graphs in the same order relative to each other
// and to their eager calls (the collective call order every rank already keeps).
#include <algorithm>
#include <cinttypes>

#include "../core/errors.h"
#include "../core/log.h"
#include "copy_batch.h"
#include "driver_ops.h"
#include "executors.h"
#include "reduce_kernel.h"

namespace tide {
namespace cuda {

tideResult_t allGatherCaptured(tideComm* comm, const LayoutView& v, const std::vector<const char*>& src,
                               const std::vector<char*>& slotOf, cudaStream_t stream, const CaptureState& cap) {
  PeerProvider* pp = comm->provider.get();
  const int W = comm->worldSize;
  const int me = comm->rank;
  uint32_t* own = pp->flags(me, me);

  std::vector<FlagOp> ops;
  ops.reserve(3 * W);
  for (int d = 0; d < W; ++d) {
    if (d != me) ops.push_back({FlagOp::kWrite, pp->flags(me, d) + flag::kCapAgReady + me, 1u});
  }
  for (int d = 0; d < W; ++d) {
    if (d != me) ops.push_back({FlagOp::kWait, own + flag::kCapAgReady + d, 1u});
  }
  for (int d = 0; d < W; ++d) {
    if (d != me) ops.push_back({FlagOp::kWrite, own + flag::kCapAgReady + d, 0u});
  }
  TIDE_CHECK(enqueueFlagOps(stream, ops));

  CopyList copies;
  for (int i = 0; i < v.info.nParams; ++i) {
    const tideParamInfo_t& p = v.params[i];
    const uint64_t shardBytes = p.shardNumel * p.elemSize;
    const uint64_t off = p.slotOffset + static_cast<uint64_t>(me) * shardBytes;
    for (int k = 0; k < W; ++k) {
      const int r = (me + k) % W;
      char* dst = slotOf[r] + off;
      if (dst != src[i]) copies.add(dst, src[i], shardBytes);
    }
  }
  TIDE_CHECK(copies.enqueue(stream, comm->device));

  ops.clear();
  for (int d = 0; d < W; ++d) {
    if (d != me) ops.push_back({FlagOp::kWrite, pp->flags(me, d) + flag::kCapAgDone + me, 1u});
  }
  for (int s = 0; s < W; ++s) {
    if (s != me) ops.push_back({FlagOp::kWait, own + flag::kCapAgDone + s, 1u});
  }
  for (int s = 0; s < W; ++s) {
    if (s != me) ops.push_back({FlagOp::kWrite, own + flag::kCapAgDone + s, 0u});
  }
  TIDE_CHECK(enqueueFlagOps(stream, ops));
  TIDE_TRACE("Cuda", "AG rank %d captured (capture %llu): %zu copies", me, cap.id, copies.size());
  return tideSuccess;
}

tideResult_t reduceScatterCaptured(const RsCall& c, const CaptureState& cap) {
  tideComm* comm = c.comm;
  const LayoutView& v = *c.v;
  PeerProvider* pp = comm->provider.get();
  const int W = comm->worldSize;
  const int me = comm->rank;
  const int nParams = v.info.nParams;
  uint32_t* own = pp->flags(me, me);
  size_t zeroBytes = 0;
  const char* zeros = static_cast<const char*>(pp->zeros(&zeroBytes));
  if (c.nb != c.numChunks) {
    return fail(tideInternalError, "Cuda", "tideReduceScatter (captured): %d chunks but %d staging buffers",
                c.numChunks, c.nb);
  }

  // 1-2: enter.
  std::vector<FlagOp> ops;
  for (int d = 0; d < W; ++d) {
    if (d != me) ops.push_back({FlagOp::kWrite, pp->flags(me, d) + flag::kCapRsEnter + me, 1u});
  }
  for (int d = 0; d < W; ++d) {
    if (d != me) ops.push_back({FlagOp::kWait, own + flag::kCapRsEnter + d, 1u});
  }
  for (int d = 0; d < W; ++d) {
    if (d != me) ops.push_back({FlagOp::kWrite, own + flag::kCapRsEnter + d, 0u});
  }
  TIDE_CHECK(enqueueFlagOps(c.stream, ops));

  // 3: the pushes, chunk k into every owner's buffer k (the eager executor's copy list).
  int pi = 0;
  for (int k = 0; k < c.numChunks; ++k) {
    const uint64_t c0 = static_cast<uint64_t>(k) * c.chunk;
    const uint64_t c1 = std::min(c0 + c.chunk, v.info.rsOutNumel);
    CopyList copies;
    while (pi < nParams && v.params[pi].rsOutOffset + v.params[pi].shardNumel <= c0) ++pi;
    for (int dd = 0; dd < W; ++dd) {
      const int d = (me + dd) % W;
      char* dst = c.stagingOf[d] + static_cast<uint64_t>(k) * c.bufBytes + static_cast<uint64_t>(me) * c.srcStride;
      for (int i = pi; i < nParams && v.params[i].rsOutOffset < c1; ++i) {
        const tideParamInfo_t& p = v.params[i];
        const uint64_t lo = std::max(c0, p.rsOutOffset), hi = std::min(c1, p.rsOutOffset + p.shardNumel);
        if (lo >= hi) continue;
        const uint64_t q = lo - p.rsOutOffset;
        const uint64_t j = static_cast<uint64_t>(d) * p.shardNumel + q;
        const uint64_t count = hi - lo;
        const uint64_t valid = j >= p.numel ? 0 : std::min(count, p.numel - j);
        char* to = dst + (lo - c0) * c.inElem;
        copies.add(to, static_cast<const char*>(c.grads[i]) + j * c.inElem, valid * c.inElem);
        for (uint64_t z = valid * c.inElem; z < count * c.inElem; z += zeroBytes) {
          copies.add(to + z, zeros, std::min<uint64_t>(zeroBytes, count * c.inElem - z));
        }
      }
    }
    TIDE_CHECK(copies.enqueue(c.stream, comm->device));
    ops.clear();
    for (int d = 0; d < W; ++d) {
      if (d != me) ops.push_back({FlagOp::kWrite, pp->flags(me, d) + flag::kCapRsFull + me, static_cast<uint32_t>(k + 1)});
    }
    TIDE_CHECK(enqueueFlagOps(c.stream, ops));
  }

  // 4-5: the reductions, then release the full tokens.
  for (int k = 0; k < c.numChunks; ++k) {
    const uint64_t c0 = static_cast<uint64_t>(k) * c.chunk;
    const uint64_t c1 = std::min(c0 + c.chunk, v.info.rsOutNumel);
    ops.clear();
    for (int s = 0; s < W; ++s) {
      if (s != me) ops.push_back({FlagOp::kWait, own + flag::kCapRsFull + s, static_cast<uint32_t>(k + 1)});
    }
    TIDE_CHECK(enqueueFlagOps(c.stream, ops));
    ReduceArgs a;
    a.staging = c.stagingOf[me] + static_cast<uint64_t>(k) * c.bufBytes;
    a.srcStride = c.srcStride;
    a.nSrc = v.info.ranksPerNode;
    a.n = c1 - c0;
    a.out = static_cast<char*>(c.out) + c0 * c.outElem;
    a.inType = c.inType;
    a.outType = c.outType;
    a.op = c.op;
    a.scale = c.scale;
    a.divisor = static_cast<float>(W);
    TIDE_CHECK(launchReduce(a, c.stream));
  }
  ops.clear();
  for (int s = 0; s < W; ++s) {
    if (s != me) ops.push_back({FlagOp::kWrite, own + flag::kCapRsFull + s, 0u});
  }
  TIDE_CHECK(enqueueFlagOps(c.stream, ops));
  TIDE_TRACE("Cuda", "RS rank %d captured (capture %llu): %d chunks", me, cap.id, c.numChunks);
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
