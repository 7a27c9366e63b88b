// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "comm.h"

#include <cinttypes>

#include "../core/eager_route.h"
#include "../core/errors.h"
#include "../core/handles.h"
#include "../core/log.h"
#include "../core/params.h"
#include "cuda_check.h"
#include "driver_ops.h"
#include "graph_replay.h"
#include "signal_kernel.h"
#include "program_exec.h"
#include "reduce_kernel.h"

namespace tide {
namespace cuda {

tideResult_t commInit(tideComm* comm) {
  TIDE_CUDA_CHECK(cudaSetDevice(comm->device));
  TIDE_CUDA_CHECK(cudaStreamCreateWithFlags(&comm->sideStream, cudaStreamNonBlocking));
  int mc = 0;
  (void)tideMulticastAllowed(&mc);
  comm->multicastGate = mc != 0;
  TIDE_CUDA_CHECK(cudaStreamCreateWithFlags(&comm->dumpStream, cudaStreamNonBlocking));
  TIDE_CHECK(preloadReduceKernels());
  TIDE_CHECK(preloadSignalKernel());
  TIDE_CHECK(devicePace(comm->device, comm->worldSize == 1, &comm->reducePace));
  TIDE_CHECK(params::status(params::kEagerGraphs));
  comm->eagerGraphs = params::eagerGraphs();
  TIDE_CHECK(params::status(params::kTokenRsChunks));
  comm->tokenRsChunks = params::tokenRsChunks();
  comm->pairTokens = params::pairTokens() && wideMemOps(comm->device);
  if (params::pairTokens() && !comm->pairTokens && comm->rank == 0) {
    TIDE_INFO("Cuda", "token pairs off: device %d has no 64-bit stream memory operations (or the driver lacks "
                      "cuStreamBatchMemOp / cuDeviceGetAttribute); token waits go one 32-bit word at a time",
              comm->device);
  }
  TIDE_CHECK(params::status(params::kRanksPerNode));
  const int over = params::ranksPerNodeOverride();
  if (over > 0 && comm->worldSize % over != 0) {
    return fail(tideInvalidArgument, "Cuda",
                "NCCL_TIDE_RANKS_PER_NODE=%d does not divide the world size %d; set a divisor (or 0 to discover)", over,
                comm->worldSize);
  }
  const int providerNodes = comm->provider->nodeRanks();
  comm->ranksPerNode = providerNodes > 0 ? providerNodes : over > 0 ? over : comm->worldSize;
  if (over > 0 && comm->rank == 0) {
    TIDE_INFO("Cuda", "virtual nodes: %d ranks per node (NCCL_TIDE_RANKS_PER_NODE), %d nodes, provider %s", over,
              comm->worldSize / over, comm->provider->name());
  }
  TIDE_CHECK(params::status(params::kInterNode));
  internode::World w;
  w.worldSize = comm->worldSize;
  w.ranksPerNode = comm->ranksPerNode;
  w.peerMapsAllRanks = comm->provider->traits().peerMapsAllRanks;
  w.overNccl = comm->ncclLib != nullptr && comm->ncclComm != nullptr;
  w.provider = comm->provider->name();
  char line[512];
  TIDE_CHECK(internode::choose(params::interNode(), w, &comm->interNode, line, sizeof(line)));
  comm->transport = makeTransport(comm->interNode, comm->ncclLib, comm->ncclComm);
  TIDE_INFO("Cuda", "rank %d: %s", comm->rank, line);
  return tideSuccess;
}

bool mapsPeer(const tideComm* comm, int peer) {
  return comm->provider->traits().peerMapsAllRanks || peer / comm->ranksPerNode == comm->rank / comm->ranksPerNode;
}

prog::Transport programTransport(const tideComm* comm) {
  return comm->interNode == internode::Transport::kSendRecv ? prog::Transport::kTwoSided : prog::Transport::kOneSided;
}

tideResult_t queryCapture(cudaStream_t stream, const char* what, CaptureState* out) {
  *out = CaptureState{};
  // The legacy default stream is never captured, and querying it while another stream captures in global mode
  // would itself be an illegal call that invalidates that capture: skip it (the executors reject or handle it).
  if (stream == nullptr || stream == cudaStreamLegacy) return tideSuccess;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaError_t err = cudaStreamGetCaptureInfo(stream, &st, &id);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(tideInvalidArgument, "Cuda", "%s: stream %p is not a valid CUDA stream (%s)", what,
                static_cast<void*>(stream), cudaGetErrorName(err));
  }
  if (st == cudaStreamCaptureStatusInvalidated) {
    return fail(tideUnsupported, "Cuda",
                "%s: the stream's CUDA graph capture has been invalidated (by an earlier error); nothing was "
                "enqueued",
                what);
  }
  out->active = (st == cudaStreamCaptureStatusActive);
  out->id = id;
  return tideSuccess;
}

tideResult_t checkUsable(const tideComm* comm, const char* what) {
  if (comm->broken.empty()) return tideSuccess;
  return fail(tideInvalidUsage, "Cuda",
              "%s: rank %d's comm is unusable: %s. Destroy (or tideCommAbort) this comm and every peer's", what,
              comm->rank, comm->broken.c_str());
}

tideResult_t markCallFailed(tideComm* comm, CollKind kind, uint64_t epoch, tideResult_t res) {
  if (res == tideSuccess) return res;
  const char* coll = kind == CollKind::kAllGather ? "all-gather" : "reduce-scatter";
  if (comm->broken.empty()) {
    char why[512];
    snprintf(why, sizeof(why), "its %s epoch %" PRIu64 " failed while it was being enqueued (%s: %s)", coll, epoch,
             tideGetErrorString(res), tideGetLastError());
    comm->broken = why;
  }
  char cause[320];
  snprintf(cause, sizeof(cause), "%s: %s", tideGetErrorString(res), tideGetLastError());
  if (SharedQueues* q = comm->provider->sharedQueues()) q->callFailed(kind, epoch, cause);
  TIDE_WARN("Cuda", "rank %d: %s epoch %" PRIu64 " failed part-way; this comm refuses every later call", comm->rank,
            coll, epoch);
  return res;
}

tideResult_t checkCapturable(const tideComm* comm, const CaptureState& cap, const char* what) {
  if (!cap.active || comm->provider->traits().capturable) return tideSuccess;
  return fail(tideUnsupported, "Cuda",
              "%s: the stream is being captured into a CUDA graph, and collectives of the %s provider cannot be "
              "captured (docs/architecture.md \"CUDA graphs\"). Run this collective outside the capture (nothing was "
              "enqueued; the capture is still valid)",
              what, comm->provider->name());
}

bool eagerTokens(const tideComm* comm, const LayoutView& view, bool reduceScatter) {
  prog::RouteInputs in;
  in.enabled = comm->eagerGraphs;
  in.providerCapturable = comm->provider->traits().capturable;
  in.coll = reduceScatter ? prog::Coll::kReduceScatter : prog::Coll::kAllGather;
  in.nNodes = view.info.nNodes;
  in.rsNumChunks = view.info.rsNumChunks;
  in.rsTokenMaxChunks = comm->tokenRsChunks;
  return prog::eagerUsesTokens(in);
}

bool captureStreamOf(tideComm* comm, cudaStream_t* out, std::string* why) {
  if (comm->captureStream == nullptr) {
    cudaStream_t s = nullptr;
    cudaError_t err;
    {
      RelaxedThreadMode relaxed;  // another thread's global-mode capture must not see this as unsafe
      err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      *why = std::string("cudaStreamCreateWithFlags: ") + cudaGetErrorName(err);
      return false;
    }
    comm->captureStream = s;
  }
  *out = comm->captureStream;
  return true;
}

bool captureForkOf(tideComm* comm, cudaStream_t capturing, CaptureFork* out, std::string* why) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaError_t err = cudaStreamGetCaptureInfo(capturing, &st, &id);
  if (err != cudaSuccess || st != cudaStreamCaptureStatusActive) {
    (void)cudaGetLastError();
    *why = err != cudaSuccess ? std::string("cudaStreamGetCaptureInfo: ") + cudaGetErrorName(err)
                              : std::string("the stream is not being captured");
    return false;
  }
  cudaStream_t side = nullptr;
  for (cudaStream_t s : comm->captureSides) {
    cudaStreamCaptureStatus ss = cudaStreamCaptureStatusNone;
    unsigned long long sid = 0;
    if (cudaStreamGetCaptureInfo(s, &ss, &sid) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    if (ss == cudaStreamCaptureStatusNone || (ss == cudaStreamCaptureStatusActive && sid == id)) {
      side = s;
      break;
    }
  }
  const char* call = "cudaEventCreateWithFlags";
  err = cudaSuccess;
  {
    RelaxedThreadMode relaxed;
    if (comm->forkEvent == nullptr) err = cudaEventCreateWithFlags(&comm->forkEvent, cudaEventDisableTiming);
    if (err == cudaSuccess && comm->joinEvent == nullptr) {
      err = cudaEventCreateWithFlags(&comm->joinEvent, cudaEventDisableTiming);
    }
    if (err == cudaSuccess && side == nullptr) {
      call = "cudaStreamCreateWithFlags";
      err = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
      if (err == cudaSuccess) comm->captureSides.push_back(side);
    }
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    *why = std::string(call) + ": " + cudaGetErrorName(err);
    return false;
  }
  out->side = side;
  out->fork = comm->forkEvent;
  out->join = comm->joinEvent;
  return true;
}

void commRelease(tideComm* comm) {
  if (comm->sideStream) (void)cudaStreamDestroy(comm->sideStream);
  comm->lastAg = tideComm::LastCall{};
  comm->lastRs = tideComm::LastCall{};
  comm->layoutCache.clear();  // destroys the bound programs and with them the eager route's graphs
  comm->sideStream = nullptr;
  if (comm->captureStream) (void)cudaStreamDestroy(comm->captureStream);
  comm->captureStream = nullptr;
  // A side stream still joined to a user's open capture is destroyed with the comm too: such a capture cannot be
  // completed without the comm anyway.
  for (cudaStream_t s : comm->captureSides) (void)cudaStreamDestroy(s);
  comm->captureSides.clear();
  if (comm->forkEvent) (void)cudaEventDestroy(comm->forkEvent);
  if (comm->joinEvent) (void)cudaEventDestroy(comm->joinEvent);
  comm->forkEvent = comm->joinEvent = nullptr;
  (void)cudaGetLastError();
}

tideComm_t registerComm(std::unique_ptr<tideComm> comm) {
  std::shared_ptr<tideComm> shared(comm.release());
  return static_cast<tideComm_t>(const_cast<void*>(handles::add(HandleKind::kComm, shared)));
}

tideResult_t checkComm(tideComm_t handle, const char* fn, CommRef* out) {
  TIDE_CHECK(checkHandle(handle, HandleKind::kComm, fn, "comm", out));
  if (!(*out)->provider) return fail(tideInvalidUsage, "API", "%s: comm is not initialized", fn);
  return tideSuccess;
}

tideResult_t checkOpen(const tideComm* comm, tideComm_t handle, const char* fn) {
  if (!comm->closed) return tideSuccess;
  return fail(tideInvalidArgument, "API", "%s: comm %p was destroyed by another thread while this call waited for it",
              fn, static_cast<void*>(handle));
}

tideResult_t layoutEntry(tideComm* comm, tideLayout_t layout, bool capturing, tideComm::CacheEntry** out) {
  tideLayoutInfo_t info{};
  info.size = sizeof(info);
  info.version = TIDE_LAYOUT_INFO_VERSION;
  TIDE_CHECK(tideLayoutGetInfo(layout, &info));
  auto it = comm->layoutCache.find(layout);
  if (it != comm->layoutCache.end() && it->second.hash == info.hash && it->second.view->info.nParams == info.nParams &&
      it->second.view->info.rank == info.rank) {
    *out = &it->second;
    return tideSuccess;
  }
  auto v = std::make_shared<LayoutView>();
  v->info = info;
  v->params.resize(v->info.nParams);
  for (int i = 0; i < v->info.nParams; ++i) {
    tideParamInfo_t& p = v->params[i];
    p.size = sizeof(p);
    p.version = TIDE_PARAM_INFO_VERSION;
    TIDE_CHECK(tideLayoutGetParam(layout, i, &p));
    if (p.elemSize > v->maxElemSize) v->maxElemSize = p.elemSize;
    if (p.dtype != v->params[0].dtype) v->uniformDtype = false;
  }
  // The switch of the eager graph route and the token RS chunk limit pick the wire protocol of eager calls, so ranks
  // agree on them with the layout (all are exchanged; the mismatch report shows the layouts' real hashes and each
  // rank's settings). Agreed triples are remembered by one key (salted only for a limit other than the default).
  uint64_t agreeKey = comm->eagerGraphs ? v->info.hash ^ 0x7e1de0ff6a9f3c5bull : v->info.hash;
  if (comm->tokenRsChunks != params::kTokenRsChunksDefault) {
    agreeKey ^= 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(comm->tokenRsChunks);
  }
  if (comm->agreedLayouts.count(agreeKey) == 0) {
    if (capturing && comm->provider->traits().agreementExchanges) {
      return fail(tideUnsupported, "Cuda",
                  "the stream is being captured into a CUDA graph, and this layout (hash %016llx) has not been used by "
                  "an eager collective on this comm yet: its first use checks it against every rank's layout, an "
                  "exchange that cannot run inside a capture. Run one eager all-gather or reduce-scatter with it before "
                  "capturing (nothing was enqueued; the capture is still valid)",
                  static_cast<unsigned long long>(v->info.hash));
    }
    TIDE_CHECK(comm->provider->agreeOnLayout(v->info.hash, comm->eagerGraphs, comm->tokenRsChunks));
    comm->agreedLayouts.insert(agreeKey);
  }
  if (comm->layoutCache.size() > 256) comm->layoutCache.clear();  // bound programs in flight are kept by their users
  tideComm::CacheEntry& e = comm->layoutCache[layout];
  e = tideComm::CacheEntry{v->info.hash, v, std::make_shared<ExecCache>()};
  *out = &e;
  return tideSuccess;
}

tideResult_t checkLayoutAndStream(tideComm* comm, const LayoutView& view, cudaStream_t stream, const char* what) {
  const tideLayoutInfo_t& in = view.info;
  if (in.worldSize != comm->worldSize || in.rank != comm->rank) {
    return fail(tideInvalidArgument, "Cuda",
                "%s: layout is for rank %d of %d but the comm is rank %d of %d (create one layout per rank)", what,
                in.rank, in.worldSize, comm->rank, comm->worldSize);
  }
  if (!comm->provider->traits().peerMapsAllRanks && comm->ranksPerNode % in.ranksPerNode != 0) {
    return fail(tideUnsupported, "Cuda",
                "%s: the layout's nodes of %d ranks span the comm's TIDE nodes of %d ranks, whose memory the %s "
                "provider does not map across nodes; create the layout with a ranksPerNode that divides %d (steps "
                "between its nodes then run over the comm's sendrecv transport)",
                what, in.ranksPerNode, comm->ranksPerNode, comm->provider->name(), comm->ranksPerNode);
  }
  if (in.nNodes > 1 && (in.worldSize % in.ranksPerNode != 0 || in.nNodes != in.worldSize / in.ranksPerNode)) {
    return fail(tideInternalError, "Cuda", "%s: layout has %d nodes of %d ranks but %d ranks", what, in.nNodes,
                in.ranksPerNode, in.worldSize);
  }
  if (in.ranksPerNode > flag::kMaxLocalRanks) {
    return fail(tideUnsupported, "Cuda", "%s: %d ranks per node exceed the supported %d", what, in.ranksPerNode,
                flag::kMaxLocalRanks);
  }
  // cuStreamGetCtx, not cudaStreamGetDevice: the latter is illegal while a capture is active and invalidates a
  // global-mode capture (seen on the H200 with CUDA 13.0). The caller made the comm's device current.
  bool inCurrent = false;
  int dev = -1;
  TIDE_CHECK(streamContext(stream, what, &inCurrent, &dev));
  if (!inCurrent) {
    if (dev != comm->device) {
      return fail(tideInvalidArgument, "Cuda", "%s: stream belongs to device %d but the comm runs on device %d",
                  what, dev, comm->device);
    }
    return fail(tideInvalidArgument, "Cuda",
                "%s: stream belongs to a CUDA context of device %d other than the primary context the comm uses; "
                "create the stream in the primary context (the runtime API's default)",
                what, dev);
  }
  return tideSuccess;
}

tideResult_t checkDevicePointer(const tideComm* comm, const void* p, size_t align, const char* what) {
  if (p == nullptr) return fail(tideInvalidArgument, "Cuda", "%s is NULL", what);
  if (align > 1 && reinterpret_cast<uintptr_t>(p) % align != 0) {
    return fail(tideInvalidArgument, "Cuda", "%s (%p) is not aligned to %zu bytes", what, p, align);
  }
  cudaPointerAttributes attr{};
  cudaError_t err;
  {
    RelaxedThreadMode relaxed;  // the pointer queries must not invalidate a global-mode capture
    err = cudaPointerGetAttributes(&attr, p);
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(tideInvalidArgument, "Cuda", "%s (%p) is not a CUDA pointer (%s)", what, p, cudaGetErrorName(err));
  }
  if (attr.type == cudaMemoryTypeDevice) {
    if (attr.device != comm->device) {
      return fail(tideInvalidArgument, "Cuda", "%s (%p) is memory of device %d but the comm runs on device %d", what,
                  p, attr.device, comm->device);
    }
    return tideSuccess;
  }
  if (attr.type == cudaMemoryTypeManaged) return tideSuccess;
  return fail(tideInvalidArgument, "Cuda", "%s (%p) is not device memory (%s)", what, p,
              attr.type == cudaMemoryTypeHost ? "pinned host memory" : "unregistered host memory");
}

tideResult_t slotRegion(tideComm* comm, const void* local, size_t bytes, int peer, const char* what, void** out) {
  if (comm->worldSize == 1 && peer == comm->rank) {
    // A live slot resolves to itself; so does any other device memory of this device: no peer maps it, no other rank
    // writes it, so there is nothing to translate and no mapping whose lifetime TIDE would have to manage.
    TIDE_CHECK(checkDevicePointer(comm, local, 1, what));
    *out = const_cast<void*>(local);
    return tideSuccess;
  }
  if (comm->peerRegions.find(local, bytes, peer, out)) return tideSuccess;
  return comm->provider->peerPtr(local, bytes, peer, what, out);
}

}  // namespace cuda
}  // namespace tide

tideComm::~tideComm() {
  // Not in commRelease: a tideCommDebugDump on another thread may hold this comm until here.
  if (dumpStream && !dumpStreamStuck.load()) (void)cudaStreamDestroy(dumpStream);
  (void)cudaGetLastError();
}
