// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// C API entry points of the CUDA data path (include/tide.h, "Communicators and the CUDA data path").
//
// Nothing here runs at load time: the CUDA runtime is first touched by tideLoopbackCreate, so the library loads and
// its host functions work on a machine without a GPU. Each entry point checks its handles, then hands over to
// plugin/cuda, which validates everything else before it enqueues any work.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "api_guard.h"
#include "c_enum.h"
#include "cuda/comm.h"
#include "cuda/cuda_check.h"
#include "cuda/executors.h"
#include "cuda/loopback.h"
#include "cuda/pending.h"
#include "cuda/program_exec.h"
#include "errors.h"
#include "handles.h"
#include "log.h"
#include "params.h"
#include "tide.h"

namespace {

using tide::cuda::CommRef;

// A live layout handle for the duration of a call (the CUDA executors read it through the public queries).
tideResult_t checkLayoutHandle(tideLayout_t layout, const char* fn, std::shared_ptr<const void>* keep) {
  std::shared_ptr<void> obj;
  TIDE_CHECK(tide::checkHandle(layout, tide::HandleKind::kLayout, fn, "layout", &obj));
  *keep = obj;
  return tideSuccess;
}

// Makes the comm's device current for the duration of a call, and restores the caller's afterwards.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device) {
      if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
    }
  }
  ~ScopedDevice() {
    int cur = -1;
    if (prev_ >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev_) (void)cudaSetDevice(prev_);
    (void)cudaGetLastError();
  }

 private:
  int prev_ = -1;
};

// Sets comm->phase for the duration of an entry point ("idle" afterwards); the executors refine it.
class PhaseGuard {
 public:
  PhaseGuard(tideComm* comm, const char* phase) : comm_(comm) { comm_->phase.store(phase, std::memory_order_relaxed); }
  ~PhaseGuard() { comm_->phase.store("idle", std::memory_order_relaxed); }

 private:
  tideComm* comm_;
};

void appendf(std::string* out, const char* fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  *out += line;
}

// Flag words of every owner as `rank` sees them, read on a helper thread through a stream of its own, bounded by
// `timeoutMs`: a readback stuck behind blocked work must not hang the caller. The helper keeps its buffers alive
// (shared) if it outlives the wait.
struct FlagReadback {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  cudaError_t err = cudaSuccess;
  std::vector<uint32_t> words;
};

bool readFlags(tideComm* comm, int timeoutMs, std::vector<uint32_t>* words, std::string* why) {
  namespace fl = tide::cuda::flag;
  const int W = comm->worldSize;
  std::vector<const uint32_t*> src(W);
  for (int d = 0; d < W; ++d) src[d] = comm->provider->flags(d);
  auto rb = std::make_shared<FlagReadback>();
  rb->words.assign(static_cast<size_t>(W) * fl::kWords, 0);
  const int device = comm->device;
  // The comm's own readback stream (commInit), unless an earlier readback on it did not finish: then a fresh one.
  cudaStream_t shared = comm->dumpStreamStuck.load() ? nullptr : comm->dumpStream;
  try {
    std::thread([rb, src, device, shared] {
      cudaError_t err = cudaSetDevice(device);
      cudaStream_t s = shared;
      if (err == cudaSuccess && s == nullptr) err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      for (size_t d = 0; d < src.size() && err == cudaSuccess; ++d) {
        if (src[d] == nullptr) continue;  // another TIDE node's flags, not mapped here: left 0
        err = cudaMemcpyAsync(rb->words.data() + d * fl::kWords, src[d], sizeof(uint32_t) * fl::kWords,
                              cudaMemcpyDeviceToHost, s);
      }
      if (err == cudaSuccess) err = cudaStreamSynchronize(s);
      if (s && s != shared) (void)cudaStreamDestroy(s);
      (void)cudaGetLastError();
      std::lock_guard<std::mutex> lock(rb->mu);
      rb->err = err;
      rb->done = true;
      rb->cv.notify_all();
    }).detach();
  } catch (const std::exception& e) {
    *why = std::string("could not start the readback thread: ") + e.what();
    return false;
  }
  std::unique_lock<std::mutex> lock(rb->mu);
  if (!rb->cv.wait_for(lock, std::chrono::milliseconds(timeoutMs), [&] { return rb->done; })) {
    // The helper may still use the comm's stream: abandon it (never destroyed; later dumps use fresh streams).
    if (shared) comm->dumpStreamStuck.store(true);
    *why = "readback did not finish within " + std::to_string(timeoutMs) + " ms (a copy on " +
           (shared ? "the comm's readback stream" : "a fresh stream") +
           " is blocked: copy engines or the context are stuck; the next dump uses a fresh stream)";
    return false;
  }
  if (rb->err != cudaSuccess) {
    *why = std::string("readback failed: ") + cudaGetErrorName(rb->err);
    return false;
  }
  *words = rb->words;
  return true;
}

std::string debugDump(tideComm* comm) {
  namespace fl = tide::cuda::flag;
  std::string out;
  const int W = comm->worldSize, me = comm->rank;
  const char* phase = comm->phase.load(std::memory_order_relaxed);
  appendf(&out, "TIDE comm dump: rank %d of %d, provider %s, device %d, %d ranks per node, inter-node %s\n", me, W,
          comm->provider->name(), comm->device, comm->ranksPerNode, tide::internode::name(comm->interNode));
  std::unique_lock<std::mutex> lock(comm->mu, std::try_to_lock);
  const bool busy = !lock.owns_lock();
  if (!busy && comm->closed) {
    out += "  the comm was destroyed or aborted by another thread\n";
    return out;
  }
  appendf(&out, "  host: %s%s\n", busy ? "a call is in progress on another thread: " : "", phase ? phase : "?");
  if (!busy) {
    if (!comm->broken.empty()) appendf(&out, "  unusable: %s\n", comm->broken.c_str());
    appendf(&out, "  last AG epoch %llu; last RS epoch %llu (tasks from %llu)\n",
            static_cast<unsigned long long>(comm->lastAg.epoch), static_cast<unsigned long long>(comm->lastRs.epoch),
            static_cast<unsigned long long>(comm->lastRs.task + 1));
    for (const tideComm::LastCall* lc : {&comm->lastAg, &comm->lastRs}) {
      if (!lc->bound) continue;
      const tide::prog::Program& p = lc->bound->program();
      const bool tokens = p.mode == tide::prog::Mode::kCaptured;
      size_t entries = 0, perCopy = 0;
      lc->bound->copyCounts(&entries, &perCopy);
      appendf(&out, "  last %s program: %zu steps, %d nodes of %d ranks, %s issue%s%s; %zu copy entries, %zu as "
              "graph copy nodes\n",  // the last: what a capture of the binding makes of its copies (strided runs)
              p.coll == tide::prog::Coll::kAllGather ? "AG" : "RS", p.steps.size(), p.nNodes, p.ranksPerNode,
              p.mode == tide::prog::Mode::kDeferred ? "deferred (internal stream, issued across ranks)"
                                                    : (tokens ? "token-protocol" : "in-order"),
              tokens ? ": " : "", tokens ? lc->bound->lastTokenIssue() : "", entries, perCopy);
    }
  }
  std::vector<uint32_t> words;
  std::string why;
  if (!readFlags(comm, 3000, &words, &why)) {
    appendf(&out, "  flags: %s\n", why.c_str());
    return out;
  }
  for (int d = 0; d < W; ++d) {
    if (!tide::cuda::mapsPeer(comm, d)) {
      appendf(&out, "  flags of rank %d: not mapped here (another TIDE node)\n", d);
      continue;
    }
    const uint32_t* f = words.data() + static_cast<size_t>(d) * fl::kWords;
    appendf(&out, "  flags of rank %d: agReady %u rsEnter %u rsConsumed %u rsPushDone %u rsPrev %u rsFinal %u "
                  "agFinish %u\n",
            d, f[fl::kAgReady], f[fl::kRsEnter], f[fl::kRsConsumed], f[fl::kRsPushDone], f[fl::kRsPrev],
            f[fl::kRsFinal], f[fl::kAgFinish]);
  }
  if (busy) return out;
  // What this rank's last collectives wait for: the first unreached wait of each stream, from their programs.
  std::vector<tide::cuda::PendingWait> pending;
  tide::cuda::pendingWaits(comm, words, &pending);
  for (const tide::cuda::PendingWait& p : pending) {
    char name[64];
    tide::prog::wordName(p.word, name, sizeof(name));
    appendf(&out, "  PENDING %s (%s stream, step %d: %s): %s of rank %d >= %u (is %u) from rank %d\n",
            p.collective == 0 ? "AG" : "RS", p.lane == 0 ? "caller" : "internal", p.step, name, p.name, p.owner,
            p.expected, p.seen, p.writer);
  }
  if (pending.empty()) out += "  no wait of this rank's last AG/RS is pending (its flags reached their final values)\n";
  return out;
}

}  // namespace

extern "C" {

TIDE_EXPORT tideResult_t tideLoopbackCreate(int nRanks, int device, tideComm_t* comms) {
  TIDE_API_BEGIN
  if (comms == nullptr) return tide::fail(tideInvalidArgument, "API", "tideLoopbackCreate: comms is NULL");
  if (nRanks < 2 || nRanks > tide::cuda::LoopbackWorld::kMaxRanks) {
    return tide::fail(tideInvalidArgument, "API", "tideLoopbackCreate: nRanks is %d; a loopback world has 2..%d ranks",
                      nRanks, tide::cuda::LoopbackWorld::kMaxRanks);
  }
  // Every failure from here leaves comms[0 .. nRanks-1] NULL, in this build and in the host-only one.
  for (int r = 0; r < nRanks; ++r) comms[r] = nullptr;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return tide::fail(tideUnsupported, "API", "tideLoopbackCreate: no CUDA device is available (%s)",
                      err == cudaSuccess ? "device count is 0" : cudaGetErrorName(err));
  }
  if (device < 0 || device >= count) {
    return tide::fail(tideInvalidArgument, "API", "tideLoopbackCreate: device %d does not exist (%d devices)", device,
                      count);
  }
  ScopedDevice scoped(device);
  std::vector<std::shared_ptr<tide::cuda::LoopbackRank>> ranks;
  TIDE_CHECK(tide::cuda::LoopbackWorld::create(nRanks, device, &ranks));
  std::vector<std::unique_ptr<tideComm>> made;
  for (int r = 0; r < nRanks; ++r) {
    std::unique_ptr<tideComm> c(new tideComm());
    c->rank = r;
    c->worldSize = nRanks;
    c->device = device;
    c->provider = ranks[r];
    tideResult_t res = tide::cuda::commInit(c.get());
    if (res != tideSuccess) {
      tide::cuda::commRelease(c.get());
      for (auto& m : made) tide::cuda::commRelease(m.get());
      return res;
    }
    made.push_back(std::move(c));
  }
  std::vector<tideComm_t> handles;
  handles.reserve(static_cast<size_t>(nRanks));
  for (int r = 0; r < nRanks; ++r) handles.push_back(tide::cuda::registerComm(std::move(made[r])));
  for (int r = 0; r < nRanks; ++r) comms[r] = handles[r];
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideCommDestroy(tideComm_t handle) {
  TIDE_API_BEGIN
  if (handle == nullptr) return tideSuccess;
  // Unregistered first: a second destroy, and every later call, fails cleanly naming the handle.
  CommRef comm = std::static_pointer_cast<tideComm>(tide::handles::remove(handle, tide::HandleKind::kComm));
  if (!comm) return tide::handles::failBad(handle, tide::HandleKind::kComm, __func__, "comm");
  ScopedDevice scoped(comm->device);
  {
    // Waits for a call in progress on another thread; calls that got the comm but not its lock yet fail (closed).
    std::lock_guard<std::mutex> lock(comm->mu);
    comm->closed = true;
    tide::cuda::commRelease(comm.get());
  }
  // The last reference (normally this one) frees the object and its provider references: the last comm of a loopback
  // world frees the world's memory, with the comm's device current.
  comm.reset();
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideCommAbort(tideComm_t handle) {
  TIDE_API_BEGIN
  if (handle == nullptr) return tideSuccess;
  CommRef comm;
  TIDE_CHECK(tide::checkHandle(handle, tide::HandleKind::kComm, __func__, "comm", &comm));
  // Bound for every wait of the abort (include/tide.h): NCCL_TIDE_TIMEOUT_MS, or a short fixed one when it is 0.
  constexpr uint64_t kAbortBoundWhenUnboundedMs = 2000;
  uint64_t bound = tide::params::timeoutMs();  // an invalid value reads as 0 (and is warned about once)
  if (bound == 0) bound = kAbortBoundWhenUnboundedMs;
  // Another thread may be inside a call on this comm (stuck in an exchange, say): wait for it, bounded.
  std::unique_lock<std::mutex> lock(comm->mu, std::defer_lock);
  const auto start = std::chrono::steady_clock::now();
  while (!lock.try_lock()) {
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    if (static_cast<uint64_t>(waited) >= bound) {
      const char* phase = comm->phase.load(std::memory_order_relaxed);
      return tide::fail(tideTimeout, "API",
                        "tideCommAbort: another thread has been inside a call on this comm (%s) for more than %llu "
                        "ms; the comm was not released (its handle stays valid)",
                        phase ? phase : "?", static_cast<unsigned long long>(bound));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Another thread may have destroyed or aborted it while this one waited for the lock.
  if (comm->closed || !tide::handles::remove(handle, tide::HandleKind::kComm)) {
    lock.unlock();
    return tide::handles::failBad(handle, tide::HandleKind::kComm, __func__, "comm");
  }
  comm->closed = true;
  {
    ScopedDevice scoped(comm->device);
    const bool idle = comm->provider ? comm->provider->abort(bound) : true;
    // Destroying streams and events does not wait for their work (CUDA releases them once it completes).
    tide::cuda::commRelease(comm.get());
    TIDE_INFO("API", "tideCommAbort: rank %d of %d released%s", comm->rank, comm->worldSize,
              idle ? "" : " (device work still pending: its memory is left to process exit)");
    lock.unlock();
    comm.reset();  // normally the last reference: frees the object (and the world's memory with the last comm)
  }
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideCommGetRank(tideComm_t handle, int* rank, int* worldSize) {
  TIDE_API_BEGIN
  CommRef comm;
  TIDE_CHECK(tide::cuda::checkComm(handle, "tideCommGetRank", &comm));
  if (rank == nullptr && worldSize == nullptr) {
    return tide::fail(tideInvalidArgument, "API", "tideCommGetRank: rank and worldSize are both NULL");
  }
  if (rank) *rank = comm->rank;
  if (worldSize) *worldSize = comm->worldSize;
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideCommGetRanksPerNode(tideComm_t handle, int* ranksPerNode) {
  TIDE_API_BEGIN
  CommRef comm;
  TIDE_CHECK(tide::cuda::checkComm(handle, "tideCommGetRanksPerNode", &comm));
  if (ranksPerNode == nullptr) return tide::fail(tideInvalidArgument, "API", "tideCommGetRanksPerNode: NULL output");
  *ranksPerNode = comm->ranksPerNode;
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideSlotAlloc(tideComm_t handle, size_t bytes, void** ptr) {
  TIDE_API_BEGIN
  CommRef comm;
  TIDE_CHECK(tide::cuda::checkComm(handle, "tideSlotAlloc", &comm));
  if (ptr == nullptr) return tide::fail(tideInvalidArgument, "API", "tideSlotAlloc: ptr is NULL");
  *ptr = nullptr;
  std::lock_guard<std::mutex> lock(comm->mu);
  TIDE_CHECK(tide::cuda::checkOpen(comm.get(), handle, "tideSlotAlloc"));
  PhaseGuard phase(comm.get(), "tideSlotAlloc (collective: cudaMalloc, exchange, IPC open)");
  return comm->provider->slotAlloc(bytes, ptr);
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideSlotFree(tideComm_t handle, void* ptr) {
  TIDE_API_BEGIN
  CommRef comm;
  TIDE_CHECK(tide::cuda::checkComm(handle, "tideSlotFree", &comm));
  if (ptr == nullptr) return tideSuccess;
  std::lock_guard<std::mutex> lock(comm->mu);
  TIDE_CHECK(tide::cuda::checkOpen(comm.get(), handle, "tideSlotFree"));
  PhaseGuard phase(comm.get(), "tideSlotFree (collective: device synchronize, barriers)");
  return comm->provider->slotFree(ptr);
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideAllGather(tideComm_t handle, tideLayout_t layout, const void* sendbuff,
                                       const void* const* shardPtrs, void* slot, void* stream) {
  TIDE_API_BEGIN
  CommRef comm;
  TIDE_CHECK(tide::cuda::checkComm(handle, "tideAllGather", &comm));
  std::shared_ptr<const void> keepLayout;
  TIDE_CHECK(checkLayoutHandle(layout, "tideAllGather", &keepLayout));
  // First, before any state changes: is the stream being captured into a CUDA graph (the replay-safe path; what it
  // cannot do is refused at capture time with the capture still valid)?
  tide::cuda::CaptureState cap;
  TIDE_CHECK(tide::cuda::queryCapture(static_cast<cudaStream_t>(stream), "tideAllGather", &cap));
  std::lock_guard<std::mutex> lock(comm->mu);
  TIDE_CHECK(tide::cuda::checkOpen(comm.get(), handle, "tideAllGather"));
  ScopedDevice scoped(comm->device);
  PhaseGuard phase(comm.get(), "tideAllGather");
  return tide::cuda::allGather(comm.get(), layout, sendbuff, shardPtrs, slot, static_cast<cudaStream_t>(stream), cap);
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideReduceScatter(tideComm_t handle, tideLayout_t layout, const void* const* grads,
                                           void* out, tideDataType_t outType, tideRedOp_t op, float scale,
                                           void* staging, void* stream) {
  TIDE_API_BEGIN
  CommRef comm;
  TIDE_CHECK(tide::cuda::checkComm(handle, "tideReduceScatter", &comm));
  std::shared_ptr<const void> keepLayout;
  TIDE_CHECK(checkLayoutHandle(layout, "tideReduceScatter", &keepLayout));
  // Range-check the caller's ints before they are used as enums (core/c_enum.h), as tideHostReduceScatter does.
  const int rawOut = tide::rawEnum(outType), rawOp = tide::rawEnum(op);
  if (!tide::enumInRange(rawOp, tideNumRedOps)) {
    return tide::fail(tideInvalidArgument, "API", "tideReduceScatter: op is %d; use tideSum, tideAvg or tidePremulSum",
                      rawOp);
  }
  if (!tide::enumInRange(rawOut, tideNumDataTypes)) {
    return tide::fail(tideInvalidArgument, "API",
                      "tideReduceScatter: outType is %d (unknown); use tideFloat32, tideBfloat16 or tideFloat16",
                      rawOut);
  }
  tide::cuda::CaptureState cap;
  TIDE_CHECK(tide::cuda::queryCapture(static_cast<cudaStream_t>(stream), "tideReduceScatter", &cap));
  std::lock_guard<std::mutex> lock(comm->mu);
  TIDE_CHECK(tide::cuda::checkOpen(comm.get(), handle, "tideReduceScatter"));
  ScopedDevice scoped(comm->device);
  PhaseGuard phase(comm.get(), "tideReduceScatter");
  return tide::cuda::reduceScatter(comm.get(), layout, grads, out, static_cast<tideDataType_t>(rawOut),
                                   static_cast<tideRedOp_t>(rawOp), scale, staging, static_cast<cudaStream_t>(stream),
                                   cap);
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideCommGetPendingWaits(tideComm_t handle, tidePendingWait_t* waits, int capacity,
                                                 int* count) {
  TIDE_API_BEGIN
  if (count == nullptr) return tide::fail(tideInvalidArgument, "API", "tideCommGetPendingWaits: count is NULL");
  *count = 0;
  if (capacity < 0 || (waits == nullptr && capacity > 0)) {
    return tide::fail(tideInvalidArgument, "API", "tideCommGetPendingWaits: waits is NULL or capacity (%d) < 0",
                      capacity);
  }
  for (int i = 0; i < capacity; ++i) {
    if (waits[i].size != sizeof(tidePendingWait_t) || waits[i].version != TIDE_PENDING_WAIT_VERSION) {
      return tide::fail(tideInvalidArgument, "API",
                        "tideCommGetPendingWaits: waits[%d] has size %zu / version %u; set sizeof(tidePendingWait_t) "
                        "and TIDE_PENDING_WAIT_VERSION",
                        i, waits[i].size, waits[i].version);
    }
  }
  CommRef comm;
  TIDE_CHECK(tide::cuda::checkComm(handle, "tideCommGetPendingWaits", &comm));
  std::unique_lock<std::mutex> lock(comm->mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    return tide::fail(tideInvalidUsage, "API", "tideCommGetPendingWaits: a call is in progress on this comm");
  }
  TIDE_CHECK(tide::cuda::checkOpen(comm.get(), handle, "tideCommGetPendingWaits"));
  std::vector<uint32_t> words;
  std::string why;
  if (!readFlags(comm.get(), 3000, &words, &why)) {
    return tide::fail(tideCudaError, "API", "tideCommGetPendingWaits: %s", why.c_str());
  }
  std::vector<tide::cuda::PendingWait> pending;
  tide::cuda::pendingWaits(comm.get(), words, &pending);
  const int n = std::min<int>(capacity, static_cast<int>(pending.size()));
  for (int i = 0; i < n; ++i) {
    const tide::cuda::PendingWait& p = pending[i];
    tidePendingWait_t& w = waits[i];
    w.collective = p.collective;
    w.stream = p.lane;
    w.step = p.step;
    w.owner = p.owner;
    w.word = p.word;
    w.writer = p.writer;
    w.expected = p.expected;
    w.seen = p.seen;
    snprintf(w.name, sizeof(w.name), "%s", p.name);
  }
  *count = static_cast<int>(pending.size());
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideCommDebugDump(tideComm_t handle, char* buf, size_t bytes) {
  TIDE_API_BEGIN
  if (buf == nullptr || bytes == 0) {
    return tide::fail(tideInvalidArgument, "API", "tideCommDebugDump: buf is NULL or bytes is 0");
  }
  buf[0] = '\0';
  CommRef comm;
  TIDE_CHECK(tide::cuda::checkComm(handle, "tideCommDebugDump", &comm));
  std::string text = debugDump(comm.get());
  snprintf(buf, bytes, "%s", text.c_str());
  return tideSuccess;
  TIDE_API_END
}

}  // extern "C"
