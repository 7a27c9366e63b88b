// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// TIDE-AG on the CUDA path: argument checks, then the layout's step program (plugin/core/program_ag.cc) bound to the
// call's pointers and issued by the interpreter (program_exec.h). The protocol is in docs/architecture.md ("Step
// programs"). A call whose pointers equal those of a recent call reuses that binding: its pointer checks, peer
// addresses and driver arguments were made then (the provider's memory generation and the comm's peer regions' are
// part of the key, so a slot allocated or freed, or a window registered or deregistered, since invalidates it).
#include <cinttypes>
#include <cstdio>
#include <string>

#include "../core/errors.h"
#include "../core/log.h"
#include "driver_ops.h"
#include "executors.h"
#include "program_exec.h"

namespace tide {
namespace cuda {
namespace {

std::atomic<bool> g_mcNoticeLogged{false};

// Everything a new pointer set needs: pointer checks, peer addresses, overlap; then the binding.
tideResult_t bindAllGather(tideComm* comm, const LayoutView& v, std::shared_ptr<const prog::Program> program,
                           const void* sendbuff, const void* const* shardPtrs, void* slot, void* mc,
                           std::shared_ptr<BoundProgram>* out) {
  const int W = comm->worldSize, me = comm->rank, nParams = v.info.nParams;
  Binding b;
  b.src.resize(nParams);
  if (sendbuff != nullptr) {
    TIDE_CHECK(checkDevicePointer(comm, sendbuff, v.maxElemSize, "tideAllGather: sendbuff"));
    for (int i = 0; i < nParams; ++i) b.src[i] = static_cast<const char*>(sendbuff) + v.params[i].sendOffset;
  } else {
    for (int i = 0; i < nParams; ++i) {
      char what[64];
      snprintf(what, sizeof(what), "tideAllGather: shardPtrs[%d]", i);
      TIDE_CHECK(checkDevicePointer(comm, shardPtrs[i], v.params[i].elemSize, what));
      b.src[i] = static_cast<const char*>(shardPtrs[i]);
    }
  }
  b.slotOf.assign(W, nullptr);
  for (int r = 0; r < W; ++r) {
    if (!mapsPeer(comm, r)) continue;  // another TIDE node: reached through the sendrecv transport only
    void* p = nullptr;
    TIDE_CHECK(slotRegion(comm, slot, v.info.slotBytes, r, "tideAllGather: slot", &p));
    b.slotOf[r] = static_cast<char*>(p);
  }
  // The sources must not overlap the region every rank writes (except this rank's own shard, in place).
  const char* lo = b.slotOf[me];
  const char* hi = lo + v.info.slotBytes;
  for (int i = 0; i < nParams; ++i) {
    const tideParamInfo_t& p = v.params[i];
    const uint64_t shardBytes = p.shardNumel * p.elemSize;
    const char* own = b.slotOf[me] + p.slotOffset + static_cast<uint64_t>(me) * shardBytes;
    if (b.src[i] < hi && b.src[i] + shardBytes > lo && b.src[i] != own) {
      return fail(tideInvalidArgument, "Cuda",
                  "tideAllGather: the shard of parameter %d overlaps the slot being gathered into (only the rank's "
                  "own shard position may be used as its source, in place)",
                  i);
    }
  }
  size_t zb = 0;
  b.zeros = static_cast<const char*>(comm->provider->zeros(&zb));
  b.multicast = static_cast<char*>(mc);
  return BoundProgram::bind(comm, std::move(program), b, out);
}

}  // namespace

tideResult_t allGather(tideComm* comm, tideLayout_t layout, const void* sendbuff, const void* const* shardPtrs,
                       void* slot, cudaStream_t stream, const CaptureState& cap) {
  static const char* kWhat = "tideAllGather";
  TIDE_CHECK(checkUsable(comm, kWhat));
  TIDE_CHECK(checkCapturable(comm, cap, kWhat));
  tideComm::CacheEntry* ent = nullptr;
  TIDE_CHECK(layoutEntry(comm, layout, cap.active, &ent));
  const LayoutView& v = *ent->view;
  TIDE_CHECK(checkLayoutAndStream(comm, v, stream, kWhat));
  const int me = comm->rank;
  const int nParams = v.info.nParams;
  if (sendbuff == nullptr && shardPtrs == nullptr) {
    return fail(tideInvalidArgument, "Cuda", "tideAllGather: sendbuff and shardPtrs are both NULL");
  }
  if (slot == nullptr) return fail(tideInvalidArgument, "Cuda", "tideAllGather: slot is NULL");
  if (reinterpret_cast<uintptr_t>(slot) % TIDE_SLOT_ALIGN != 0) {
    return fail(tideInvalidArgument, "Cuda", "tideAllGather: slot (%p) is not aligned to TIDE_SLOT_ALIGN (%d)", slot,
                TIDE_SLOT_ALIGN);
  }
  Provider* provider = comm->provider.get();
  SharedQueues* queues = provider->sharedQueues();
  const bool multi = v.info.nNodes > 1;
  if (cap.active && multi) {
    return fail(tideUnsupported, "Cuda",
                "%s: the stream is being captured into a CUDA graph, and layouts of several nodes (%d nodes of %d "
                "ranks) cannot be captured: their rail schedule is issued in steps across ranks and carries per-call "
                "epochs. Run this all-gather outside the capture (nothing was enqueued; the capture is still valid)",
                kWhat, v.info.nNodes, v.info.ranksPerNode);
  }
  // Eager calls of a single-node layout take the token protocol when the graph route is on (the same decision on
  // every rank: docs/architecture.md "Eager calls as graph replays"); they never use multicast, which the token
  // program does not have (and no provider offers yet), so that the choice cannot differ between ranks.
  const bool tokens = cap.active || eagerTokens(comm, v, false);
  prog::Options opt;
  size_t zeroBytes = 0;
  (void)provider->zeros(&zeroBytes);
  opt.zeroBytes = zeroBytes;
  opt.mode = tokens ? prog::Mode::kCaptured
                    : (multi && queues != nullptr ? prog::Mode::kDeferred : prog::Mode::kInOrder);
  opt.pairTokens = comm->pairTokens;
  opt.transport = programTransport(comm);
  void* mc = nullptr;
  if (!tokens && !multi && comm->multicastGate) {
    mc = provider->multicastPtr(slot, v.info.slotBytes);
    if (mc == nullptr && !g_mcNoticeLogged.exchange(true)) {
      TIDE_INFO("Cuda", "multicast gate is open but the %s provider has no multicast address: multicast all-gather "
                        "unsupported here, using unicast copy-engine writes",
                provider->name());
    }
    opt.multicast = mc != nullptr;
  }

  std::vector<uintptr_t>& key = comm->keyScratch;
  key.clear();
  key.push_back(provider->memoryGeneration());
  key.push_back(comm->peerRegions.generation());
  key.push_back(reinterpret_cast<uintptr_t>(slot));
  key.push_back(reinterpret_cast<uintptr_t>(mc));
  key.push_back(reinterpret_cast<uintptr_t>(sendbuff));
  if (sendbuff == nullptr) {
    for (int i = 0; i < nParams; ++i) key.push_back(reinterpret_cast<uintptr_t>(shardPtrs[i]));
  }
  const int coll = static_cast<int>(prog::Coll::kAllGather), mode = static_cast<int>(opt.mode);
  std::shared_ptr<BoundProgram> bound = ent->exec->find(coll, mode, opt.multicast, key);
  if (!bound) {
    std::shared_ptr<const prog::Program> program;
    tideResult_t r = ent->exec->program(layout, prog::Coll::kAllGather, opt, &program);
    if (r != tideSuccess) {
      if (cap.active) {
        const std::string why = tideGetLastError();  // copied: fail() below rewrites the last-error buffer
        return fail(r, "Cuda",
                    "%s: the stream is being captured into a CUDA graph: %s. Run this all-gather outside the capture "
                    "(nothing was enqueued; the capture is still valid)",
                    kWhat, why.c_str());
      }
      return r;
    }
    TIDE_CHECK(bindAllGather(comm, v, std::move(program), sendbuff, shardPtrs, slot, mc, &bound));
    ent->exec->insert(coll, mode, opt.multicast, key, bound);
  }

  TIDE_CHECK(driverOpsInit());
  CallValues cv;
  cv.batchApi = batchApiFor(stream, cap.active);
  if (cap.active) {
    if (queues != nullptr) TIDE_CHECK(queues->checkCapture(CollKind::kAllGather, cap.id));
    return BoundProgram::issue(bound, cv, stream, prog::Coll::kAllGather);
  }
  const uint64_t epoch = comm->agEpoch + 1;
  TIDE_CHECK(provider->checkStream(CollKind::kAllGather, epoch, stream));
  comm->agEpoch = epoch;
  cv.epoch = epoch;
  comm->lastAg = tideComm::LastCall{bound, epoch, 0};
  comm->phase.store("tideAllGather: enqueueing", std::memory_order_relaxed);
  // Token programs carry no epoch; the epoch still counts every eager call alike on every rank (checkStream, the
  // debug dump), and the epoch programs only ever wait for values >= theirs, so skipped values are harmless.
  // From here the epoch has advanced: a failure leaves this rank out of step with its peers (markCallFailed).
  TIDE_CHECK(markCallFailed(comm, CollKind::kAllGather, epoch,
                            tokens ? BoundProgram::issueTokens(bound, cv, stream)
                                   : BoundProgram::issue(bound, cv, stream, prog::Coll::kAllGather)));
  TIDE_TRACE("Cuda", "AG rank %d epoch %" PRIu64 ": program of %zu steps%s%s", me, epoch,
             bound->program().steps.size(), tokens ? ", token protocol " : "", tokens ? bound->lastTokenIssue() : "");
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
