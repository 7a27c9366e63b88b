// TIDE-AG on one node: copy-engine writes of this rank's shards into every rank's slot, ordered by flags.
//
// Per call (epoch e = the comm's AG sequence number, equal on every rank because all ranks call in the same order),
// all on the caller's stream, no kernel:
//   1. write own ready = e            (everything earlier on this stream, e.g. reads of the slot, is done)
//   2. wait ready(peer) >= e for every peer       (the peer's slot may be overwritten)
//   3. CE batch: shard_i -> slot(peer) + slotOffset_i + rank * shardBytes_i, for every peer and itself
//   4. write done[rank] = e into every peer's flags   (after the copies: stream order + the write's memory barrier)
//   5. wait own done[s] >= e for every peer s         (every rank's shards have landed in this rank's slot)
// With the multicast gate open and a provider that hands out a multicast address of the slot, step 3 becomes one
// CE write per parameter to that address (never the case for loopback, which has none).
// Layouts of several (virtual) nodes go to allGatherMultiNode (internode_ag.cc) after the same argument checks.
#include <atomic>
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "../core/errors.h"
#include "../core/log.h"
#include "copy_batch.h"
#include "cuda_check.h"
#include "driver_ops.h"
#include "executors.h"

namespace tide {
namespace cuda {
namespace {

std::atomic<bool> g_mcNoticeLogged{false};

}  // namespace

tideResult_t allGather(tideComm* comm, tideLayout_t layout, const void* sendbuff, const void* const* shardPtrs,
                       void* slot, cudaStream_t stream, const CaptureState& cap) {
  static const char* kWhat = "tideAllGather";
  TIDE_CHECK(checkCapturable(comm, cap, kWhat));
  std::shared_ptr<const LayoutView> viewPtr;
  TIDE_CHECK(layoutView(comm, layout, cap.active, &viewPtr));
  const LayoutView& v = *viewPtr;
  TIDE_CHECK(checkLayoutAndStream(comm, v, stream, kWhat));
  const int W = comm->worldSize;
  const int me = comm->rank;
  const int nParams = v.info.nParams;

  // Sources.
  std::vector<const char*> src(nParams);
  if (sendbuff != nullptr) {
    TIDE_CHECK(checkDevicePointer(comm, sendbuff, v.maxElemSize, "tideAllGather: sendbuff"));
    for (int i = 0; i < nParams; ++i) src[i] = static_cast<const char*>(sendbuff) + v.params[i].sendOffset;
  } else {
    if (shardPtrs == nullptr) {
      return fail(tideInvalidArgument, "Cuda", "tideAllGather: sendbuff and shardPtrs are both NULL");
    }
    for (int i = 0; i < nParams; ++i) {
      char what[64];
      snprintf(what, sizeof(what), "tideAllGather: shardPtrs[%d]", i);
      TIDE_CHECK(checkDevicePointer(comm, shardPtrs[i], v.params[i].elemSize, what));
      src[i] = static_cast<const char*>(shardPtrs[i]);
    }
  }

  // Destinations: this rank's slot region and every peer's copy of it.
  if (slot == nullptr) return fail(tideInvalidArgument, "Cuda", "tideAllGather: slot is NULL");
  if (reinterpret_cast<uintptr_t>(slot) % TIDE_SLOT_ALIGN != 0) {
    return fail(tideInvalidArgument, "Cuda", "tideAllGather: slot (%p) is not aligned to TIDE_SLOT_ALIGN (%d)", slot,
                TIDE_SLOT_ALIGN);
  }
  std::vector<char*> dstSlot(W);
  for (int r = 0; r < W; ++r) {
    void* p = nullptr;
    TIDE_CHECK(comm->provider->peerPtr(me, slot, v.info.slotBytes, r, "tideAllGather: slot", &p));
    dstSlot[r] = static_cast<char*>(p);
  }
  // The sources must not overlap the region every rank writes (except this rank's own shard, in place).
  for (int i = 0; i < nParams; ++i) {
    const tideParamInfo_t& p = v.params[i];
    uint64_t shardBytes = p.shardNumel * p.elemSize;
    const char* lo = dstSlot[me];
    const char* hi = lo + v.info.slotBytes;
    const char* own = dstSlot[me] + p.slotOffset + static_cast<uint64_t>(me) * shardBytes;
    if (src[i] < hi && src[i] + shardBytes > lo && src[i] != own) {
      return fail(tideInvalidArgument, "Cuda",
                  "tideAllGather: the shard of parameter %d overlaps the slot being gathered into (only the rank's "
                  "own shard position may be used as its source, in place)",
                  i);
    }
  }

  // Captured into a CUDA graph: the replay-safe token protocol (captured.cc), single node only.
  if (cap.active) {
    if (v.info.nNodes > 1) {
      return fail(tideUnsupported, "Cuda",
                  "%s: the stream is being captured into a CUDA graph, and layouts of several nodes (%d nodes of %d "
                  "ranks) cannot be captured: their rail schedule is issued in steps across ranks and carries "
                  "per-call epochs. Run this all-gather outside the capture (nothing was enqueued; the capture is "
                  "still valid)",
                  kWhat, v.info.nNodes, v.info.ranksPerNode);
    }
    TIDE_CHECK(driverOpsInit());
    TIDE_CHECK(comm->provider->checkCapture(me, CollKind::kAllGather, cap.id));
    return allGatherCaptured(comm, v, src, dstSlot, stream, cap);
  }

  // Several (virtual) nodes: the rail schedule over nodes, then the node-local fan-out (internode_ag.cc).
  if (v.info.nNodes > 1) return allGatherMultiNode(comm, viewPtr, layout, src, dstSlot, stream);

  int mcAllowed = 0;
  (void)tideMulticastAllowed(&mcAllowed);
  void* mc = nullptr;
  if (mcAllowed) {
    mc = comm->provider->multicastPtr(me, slot, v.info.slotBytes);
    if (mc == nullptr && !g_mcNoticeLogged.exchange(true)) {
      TIDE_INFO("Cuda", "multicast gate is open but the %s provider has no multicast address: multicast all-gather "
                        "unsupported here, using unicast copy-engine writes",
                comm->provider->name());
    }
  }

  TIDE_CHECK(driverOpsInit());
  const uint64_t epoch = comm->agEpoch + 1;
  TIDE_CHECK(comm->provider->checkStream(me, CollKind::kAllGather, epoch, stream));
  comm->agEpoch = epoch;
  const uint32_t e = static_cast<uint32_t>(epoch);

  // 1-2: announce, then wait for every peer's slot.
  std::vector<FlagOp> ops;
  ops.reserve(2 * W);
  ops.push_back({FlagOp::kWrite, comm->provider->flags(me, me) + flag::kAgReady, e});
  for (int r = 0; r < W; ++r) {
    if (r != me) ops.push_back({FlagOp::kWait, comm->provider->flags(me, r) + flag::kAgReady, e});
  }
  TIDE_CHECK(enqueueFlagOps(stream, ops));

  // 3: the copies.
  CopyList copies;
  for (int i = 0; i < nParams; ++i) {
    const tideParamInfo_t& p = v.params[i];
    uint64_t shardBytes = p.shardNumel * p.elemSize;
    uint64_t off = p.slotOffset + static_cast<uint64_t>(me) * shardBytes;
    if (mc != nullptr) {
      copies.add(static_cast<char*>(mc) + off, src[i], shardBytes);
      continue;
    }
    for (int k = 0; k < W; ++k) {
      int r = (me + k) % W;  // start with self, then the next ranks: spreads the writes over destinations
      char* dst = dstSlot[r] + off;
      if (dst != src[i]) copies.add(dst, src[i], shardBytes);
    }
  }
  TIDE_CHECK(copies.enqueue(stream, comm->device));

  // 4-5: completion.
  ops.clear();
  for (int r = 0; r < W; ++r) {
    if (r != me) ops.push_back({FlagOp::kWrite, comm->provider->flags(me, r) + flag::kAgDone + me, e});
  }
  for (int s = 0; s < W; ++s) {
    if (s != me) ops.push_back({FlagOp::kWait, comm->provider->flags(me, me) + flag::kAgDone + s, e});
  }
  TIDE_CHECK(enqueueFlagOps(stream, ops));
  TIDE_TRACE("Cuda", "AG rank %d epoch %" PRIu64 ": %zu copies, %s", me, epoch, copies.size(),
             useBatchApi(stream) ? "batch" : "memcpy");
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
