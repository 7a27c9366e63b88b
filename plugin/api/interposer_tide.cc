// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The TIDE path of the LD_PRELOAD interposer: per-communicator state and the accelerated flat collectives.
//
// A flat NCCL collective is a one-parameter TIDE layout of W * count elements (rank r's block = its shard):
// * reduce-scatter: tideReduceScatter reads the send buffer directly (push to the owners' staging, fp32
//   accumulation) and writes recvbuff, also in NCCL's in-place form (recvbuff is the rank's own block of
//   sendbuff); no copy and no registration of the application's buffers;
// * all-gather: TIDE's peers write into peer-mapped memory only. A receive buffer inside a window the application
//   registered with NCCL_WIN_COLL_SYMMETRIC is peer-mapped by NCCL: the peers write straight into it, at the
//   addresses NCCL gives for it (interposer_windows.h). Any other application buffer is not, so the gather lands in
//   a TIDE slot of this comm ("bounce slot") and one copy moves it to recvbuff: transport stays off the SMs, but
//   that copy-out is a same-device copy, which the driver runs on SMs (docs/usage.md). A layout-aware call
//   (tideAllGather on a slot) has no copy-out either.
// Collective steps (comm creation, bounce-slot growth, RS staging growth) happen on calls every rank makes in the
// same order with the same sizes, so every rank takes them together.
#include "interposer_tide.h"

#include <atomic>
#include <cinttypes>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "api_guard.h"
#include "errors.h"
#include "fork_guard.h"
#include "handles.h"
#include "interposer_counters.h"
#include "interposer_windows.h"
#include "log.h"
#include "nccl/nccl_lib.h"

#ifdef TIDE_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/comm.h"
#include "cuda/copy_batch.h"
#endif

namespace tide {
namespace interposer {
namespace {

constexpr const char* kComponent = "Interposer";

#ifdef TIDE_HAVE_CUDA

struct LayoutKey {
  int kind;  // 0 all-gather (bytes, tideInt8), 1 reduce-scatter
  int dtype;
  uint64_t count;
  bool operator==(const LayoutKey& o) const { return kind == o.kind && dtype == o.dtype && count == o.count; }
};
struct LayoutKeyHash {
  size_t operator()(const LayoutKey& k) const {
    return std::hash<uint64_t>()(k.count * 31 + static_cast<uint64_t>(k.kind * 16 + k.dtype));
  }
};

struct CommState {
  std::mutex mu;
  bool off = false;  // TIDE is off for this communicator (creation or a call failed, or it was aborted)
  tideComm_t comm = nullptr;
  int rank = 0, world = 0, ranksPerNode = 0, device = 0;
  void* bounce = nullptr;  // all-gather bounce slot
  size_t bounceBytes = 0;
  // Recorded after each copy-out of the bounce slot; the next all-gather's stream waits for it before it lets peers
  // write the slot again (NCCL orders calls on one communicator even across streams, so callers may rely on it).
  cudaEvent_t copyOutDone = nullptr;
  uint64_t taken = 0;
  std::unordered_map<LayoutKey, tideLayout_t, LayoutKeyHash> layouts;

  ~CommState() {
    for (auto& kv : layouts) (void)tideLayoutDestroy(kv.second);
    if (copyOutDone != nullptr) (void)cudaEventDestroy(copyOutDone);
  }
};

using StateMap = std::unordered_map<void*, std::shared_ptr<CommState>>;
std::mutex gMu;
StateMap* gStates = new StateMap();  // never freed: see forgetStatesInChild

// In a child forked while other threads were in calls: a communicator's lock may be held by a thread that does not
// exist here, and its TIDE comm belongs to the parent's CUDA context, which the child cannot use. So the child keeps
// each known communicator with TIDE off (its calls go to NCCL) and never touches the parent's states (leaked: their
// destructors would call CUDA).
void forgetStatesInChild() {
  auto* fresh = new StateMap();
  for (const auto& kv : *gStates) {
    auto off = std::make_shared<CommState>();
    off->off = true;
    fresh->emplace(kv.first, std::move(off));
  }
  gStates = fresh;
}
[[maybe_unused]] const bool gStatesForkGuarded =
    forkguard::guard(forkguard::kInterposerStates, &gMu, forgetStatesInChild);

// Layouts attached with tideAttachLayout, keyed by (communicator, buffer). Its own lock: attaching never waits for
// a communicator's call in progress.
struct AttachKey {
  void* comm;
  const void* buffer;
  bool operator==(const AttachKey& o) const { return comm == o.comm && buffer == o.buffer; }
};
struct AttachKeyHash {
  size_t operator()(const AttachKey& k) const {
    return std::hash<const void*>()(k.comm) * 31 + std::hash<const void*>()(k.buffer);
  }
};
// A layout handle of the interposer's own (handles::retain): the caller may destroy its handle while attached, and a
// detach on another thread may drop the attachment while a call uses it; neither frees the layout under the call.
struct OwnedLayout {
  tideLayout_t h = nullptr;
  OwnedLayout() = default;
  explicit OwnedLayout(tideLayout_t handle) : h(handle) {}
  OwnedLayout(const OwnedLayout&) = delete;
  OwnedLayout& operator=(const OwnedLayout&) = delete;
  OwnedLayout(OwnedLayout&& o) noexcept : h(o.h) { o.h = nullptr; }
  OwnedLayout& operator=(OwnedLayout&& o) noexcept {
    std::swap(h, o.h);
    return *this;
  }
  ~OwnedLayout() {
    if (h != nullptr) (void)handles::remove(h, HandleKind::kLayout);
  }
};

tideLayout_t retainLayout(tideLayout_t layout) {
  return static_cast<tideLayout_t>(const_cast<void*>(handles::retain(layout, HandleKind::kLayout)));
}

std::mutex gAttachMu;
std::unordered_map<AttachKey, OwnedLayout, AttachKeyHash> gAttached;
[[maybe_unused]] const bool gAttachForkGuarded = forkguard::guard(forkguard::kInterposerAttach, &gAttachMu);

// The call's own reference to the layout attached to (comm, buffer); empty if none.
OwnedLayout attachedLayout(void* ncclComm, const void* buffer) {
  std::lock_guard<std::mutex> lock(gAttachMu);
  auto it = gAttached.find(AttachKey{ncclComm, buffer});
  return it == gAttached.end() ? OwnedLayout() : OwnedLayout(retainLayout(it->second.h));
}

void dropAttachments(void* ncclComm) {
  std::lock_guard<std::mutex> lock(gAttachMu);
  for (auto it = gAttached.begin(); it != gAttached.end();) {
    it = it->first.comm == ncclComm ? gAttached.erase(it) : std::next(it);
  }
}

// What an attached layout needs of a call; false (with the reason logged once at INFO) if the call does not match
// it, which then runs as a flat call.
struct AttachedView {
  tideLayoutInfo_t info{};
  std::vector<tideParamInfo_t> params;
};

bool viewOf(tideLayout_t layout, AttachedView* v) {
  v->info.size = sizeof(v->info);
  v->info.version = TIDE_LAYOUT_INFO_VERSION;
  if (tideLayoutGetInfo(layout, &v->info) != tideSuccess) return false;
  v->params.resize(static_cast<size_t>(v->info.nParams));
  for (int i = 0; i < v->info.nParams; ++i) {
    tideParamInfo_t& p = v->params[static_cast<size_t>(i)];
    p.size = sizeof(p);
    p.version = TIDE_PARAM_INFO_VERSION;
    if (tideLayoutGetParam(layout, i, &p) != tideSuccess) return false;
  }
  return true;
}

// The notices said once: flags, not std::call_once, whose state a fork during the call would leave in progress.
std::atomic<bool> gAttachMismatchNoticed{false};

void attachMismatch(const char* what) {
  if (!gAttachMismatchNoticed.exchange(true)) {
    TIDE_INFO(kComponent, "a call on a buffer with an attached layout does not match it (%s): it runs as a flat "
                          "call (said once; TRACE logs each)", what);
  }
  TIDE_TRACE(kComponent, "attached layout not used: %s", what);
}

std::shared_ptr<CommState> stateOf(void* ncclComm, bool create) {
  std::lock_guard<std::mutex> lock(gMu);
  auto it = gStates->find(ncclComm);
  if (it != gStates->end()) return it->second;
  if (!create) return nullptr;
  auto s = std::make_shared<CommState>();
  gStates->emplace(ncclComm, s);
  return s;
}

// Turns TIDE off for this communicator; every later call goes to NCCL. One WARN per communicator.
void turnOff(CommState* s, void* ncclComm, const char* what, tideResult_t r) {
  s->off = true;
  TIDE_WARN(kComponent,
            "TIDE is off for NCCL communicator %p from now on (this and every later call go to NCCL): %s failed: "
            "%s: %s",
            ncclComm, what, tideGetErrorString(r), tideGetLastError());
}

// The comm, created on first use. False (and off) if that fails.
bool ensureComm(CommState* s, void* ncclComm) {
  if (s->comm != nullptr) return true;
  tideResult_t r = tideCommCreate(static_cast<struct ncclComm*>(ncclComm), nullptr, &s->comm);
  if (r != tideSuccess) {
    s->comm = nullptr;
    turnOff(s, ncclComm, "tideCommCreate", r);
    return false;
  }
  (void)tideCommGetRank(s->comm, &s->rank, &s->world);
  (void)tideCommGetRanksPerNode(s->comm, &s->ranksPerNode);
  tide::cuda::CommRef ref;
  if (tide::cuda::checkComm(s->comm, "interposer", &ref) == tideSuccess) s->device = ref->device;
  const char* provider = "?";
  (void)tideCommGetProvider(s->comm, &provider);
  TIDE_INFO(kComponent, "NCCL communicator %p: TIDE takes its eligible calls (rank %d of %d, provider %s)", ncclComm,
            s->rank, s->world, provider);
  return true;
}

tideResult_t layoutFor(CommState* s, int kind, tideDataType_t dtype, uint64_t count, tideLayout_t* out) {
  LayoutKey key{kind, static_cast<int>(dtype), count};
  auto it = s->layouts.find(key);
  if (it != s->layouts.end()) {
    *out = it->second;
    return tideSuccess;
  }
  uint64_t numel = 0;
  if (__builtin_mul_overflow(count, static_cast<uint64_t>(s->world), &numel)) {
    return fail(tideInvalidArgument, kComponent, "count %" PRIu64 " times %d ranks overflows", count, s->world);
  }
  tideLayoutDesc_t d{};
  d.size = sizeof(d);
  d.version = TIDE_LAYOUT_DESC_VERSION;
  d.nParams = 1;
  d.numels = &numel;
  d.rowNumels = nullptr;
  d.dtypes = &dtype;
  d.worldSize = s->world;
  d.ranksPerNode = s->ranksPerNode;  // the comm's TIDE nodes: a layout must not span them
  d.rank = s->rank;
  tideLayout_t l = nullptr;
  TIDE_CHECK(tideLayoutCreate(&d, nullptr, &l));
  if (s->layouts.size() >= 64) {  // a long tail of distinct sizes: keep the cache bounded
    for (auto& kv : s->layouts) (void)tideLayoutDestroy(kv.second);
    s->layouts.clear();
  }
  s->layouts.emplace(key, l);
  *out = l;
  return tideSuccess;
}

// Grows the bounce slot to at least `bytes` (collective: every rank grows at the same call). Power-of-two sizes
// keep the number of collective reallocations logarithmic in the largest call.
tideResult_t ensureBounce(CommState* s, size_t bytes) {
  if (s->bounceBytes >= bytes) return tideSuccess;
  size_t want = 1 << 20;
  while (want < bytes) want <<= 1;
  if (s->bounce != nullptr) {
    // cudaFree inside the slot free synchronizes the device, so the last all-gather's copy-out has finished.
    TIDE_CHECK(tideSlotFree(s->comm, s->bounce));
    s->bounce = nullptr;
    s->bounceBytes = 0;
  }
  TIDE_CHECK(tideSlotAlloc(s->comm, want, &s->bounce));
  s->bounceBytes = want;
  return tideSuccess;
}

// Why an all-gather keeps the bounce slot and the copy-out; kDirect: it is gathered straight into recvbuff.
enum class Target { kDirect, kNotRegistered, kWindowNotSymmetric, kLocalRegistration, kSeveralNodes, kMisaligned,
                    kOverlap, kNoPeerPointerCall, kNoPeerAddress, kCount };
const char* const kTargetText[] = {
    "gathered straight into recvbuff",
    "recvbuff is not in a window registered on this communicator (ncclCommWindowRegister)",
    "recvbuff is in a window registered without NCCL_WIN_COLL_SYMMETRIC: its offset may differ between ranks",
    "recvbuff is registered with ncclCommRegister, a local registration that maps nothing for the peers",
    "the communicator spans several TIDE nodes",
    "recvbuff is not aligned to TIDE_SLOT_ALIGN",
    "sendbuff overlaps recvbuff other than in place",
    "the loaded NCCL has no ncclGetPeerDevicePointer (NCCL >= 2.29.2)",
    "ncclGetPeerDevicePointer gave no address for a peer of the window",
};
static_assert(sizeof(kTargetText) / sizeof(kTargetText[0]) == static_cast<size_t>(Target::kCount), "one text each");
std::atomic<bool> gTargetNoticed[static_cast<size_t>(Target::kCount)];

void noticeCopyOut(Target t) {
  if (!gTargetNoticed[static_cast<size_t>(t)].exchange(true)) {
    TIDE_INFO(kComponent, "an all-gather is gathered into TIDE's bounce slot and copied out to recvbuff (a "
                          "same-device copy, on SMs): %s (said once; docs/usage.md \"All-gathers without the "
                          "copy-out\")", kTargetText[static_cast<size_t>(t)]);
  }
}

using PeerPointerFn = int (*)(void* window, size_t offset, int peer, void** out);

// Where this all-gather can gather: straight into recvbuff when it lies in a symmetric window of this communicator
// whose peers' addresses NCCL gives (learnt once per window, kept in the comm's peer regions until the window is
// deregistered). Under NCCL's contract for such windows every rank decides alike (interposer_windows.h).
Target targetOf(CommState* s, void* ncclComm, const void* sendbuff, void* recvbuff, size_t bytes, size_t total) {
  if (s->ranksPerNode != s->world) return Target::kSeveralNodes;
  if (reinterpret_cast<uintptr_t>(recvbuff) % TIDE_SLOT_ALIGN != 0) return Target::kMisaligned;
  windows::Hit hit;
  switch (windows::lookup(ncclComm, recvbuff, total, &hit)) {
    case windows::Kind::kNone: return Target::kNotRegistered;
    case windows::Kind::kWindow: return Target::kWindowNotSymmetric;
    case windows::Kind::kLocalRegistration: return Target::kLocalRegistration;
    case windows::Kind::kSymmetricWindow: break;
  }
  const char* in = static_cast<const char*>(sendbuff);
  const char* out = static_cast<const char*>(recvbuff);
  if (in < out + total && out < in + bytes && in != out + static_cast<size_t>(s->rank) * bytes) {
    return Target::kOverlap;
  }
  tide::cuda::CommRef ref;
  if (tide::cuda::checkComm(s->comm, "interposer", &ref) != tideSuccess) return Target::kNotRegistered;
  if (ref->peerRegions.has(hit.base)) return Target::kDirect;
  auto peerPointer = reinterpret_cast<PeerPointerFn>(nccl::loadedSymbol("ncclGetPeerDevicePointer"));
  if (peerPointer == nullptr) return Target::kNoPeerPointerCall;
  std::vector<char*> peers(static_cast<size_t>(s->world), nullptr);
  for (int q = 0; q < s->world; ++q) {
    void* p = hit.base;
    if (q != s->rank && (peerPointer(hit.win, 0, q, &p) != 0 || p == nullptr)) return Target::kNoPeerAddress;
    peers[static_cast<size_t>(q)] = static_cast<char*>(p);
  }
  ref->peerRegions.add(hit.base, hit.size, std::move(peers));
  TIDE_INFO(kComponent, "NCCL communicator %p: all-gathers into the symmetric window at %p (%zu bytes) are gathered "
                        "straight into it", ncclComm, static_cast<void*>(hit.base), hit.size);
  return Target::kDirect;
}

bool capturing(void* stream) {
  // The legacy default stream cannot be captured, and querying it during another thread's global-mode capture
  // would invalidate that capture.
  if (stream == nullptr || stream == reinterpret_cast<void*>(cudaStreamLegacy)) return false;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;  // no usable device or stream: comm creation or the call itself reports why
  }
  return st != cudaStreamCaptureStatusNone;
}

// Common entry: the comm's state, locked, with a comm; nullptr (and *why) if the call must go to NCCL.
std::shared_ptr<CommState> enter(void* ncclComm, void* stream, std::unique_lock<std::mutex>* lock, Reason* why) {
  auto s = stateOf(ncclComm, true);
  std::unique_lock<std::mutex> l(s->mu);
  *why = kTideOff;
  if (s->off) return nullptr;
  if (capturing(stream)) {
    // Not an error: TIDE captures only single-node calls with Slot-Reuse staging and agreed layouts
    // (docs/architecture.md "CUDA graphs"), while the interposer uses own staging and a bounce slot.
    *why = kCaptured;
    return nullptr;
  }
  if (!ensureComm(s.get(), ncclComm)) return nullptr;
  *lock = std::move(l);
  return s;
}

#endif  // TIDE_HAVE_CUDA

}  // namespace

#ifdef TIDE_HAVE_CUDA

bool streamCapturing(void* stream) { return capturing(stream); }

int tryAllGather(const void* sendbuff, void* recvbuff, size_t bytes, void* ncclComm, void* stream, Reason* why) {
  std::unique_lock<std::mutex> lock;
  auto s = enter(ncclComm, stream, &lock, why);
  if (!s) return kPassToNccl;
  auto cs = static_cast<cudaStream_t>(stream);
  const size_t total = bytes * static_cast<size_t>(s->world);
  // A layout attached to recvbuff (tideAttachLayout) places by the layout; else one flat parameter.
  tideLayout_t layout = nullptr;
  size_t copyBytes = total;
  OwnedLayout attached = attachedLayout(ncclComm, recvbuff);
  if (tideLayout_t att = attached.h) {
    AttachedView v;
    if (!viewOf(att, &v)) {
      attachMismatch("its layout cannot be read");
    } else if (v.info.worldSize != s->world || v.info.rank != s->rank) {
      attachMismatch("the layout's world size or rank is not the communicator's");
    } else if (bytes < v.info.sendBytes) {
      attachMismatch("all-gather: sendcount times the element size is below the layout's sendBytes");
    } else if (v.info.slotBytes > total) {
      attachMismatch("all-gather: the layout's slotBytes exceed the receive buffer");
    } else {
      layout = att;
      copyBytes = v.info.slotBytes;
    }
  }
  tideResult_t r = layout != nullptr ? tideSuccess : layoutFor(s.get(), 0, tideInt8, bytes, &layout);
  const Target target = targetOf(s.get(), ncclComm, sendbuff, recvbuff, bytes, total);
  if (target == Target::kDirect) {
    if (r == tideSuccess) r = tideAllGather(s->comm, layout, sendbuff, nullptr, recvbuff, stream);
    if (r != tideSuccess) {
      turnOff(s.get(), ncclComm, "the TIDE all-gather", r);
      *why = kTideOff;
      return kPassToNccl;
    }
    ++s->taken;
    TIDE_TRACE(kComponent, "ncclAllGather on %p (%zu bytes per rank) taken by TIDE (call %" PRIu64 "), gathered "
               "straight into recvbuff", ncclComm, bytes, s->taken);
    return 0;
  }
  noticeCopyOut(target);
  if (r == tideSuccess) r = ensureBounce(s.get(), total);
  if (r == tideSuccess && s->copyOutDone == nullptr &&
      cudaEventCreateWithFlags(&s->copyOutDone, cudaEventDisableTiming) != cudaSuccess) {
    s->copyOutDone = nullptr;
    r = fail(tideCudaError, kComponent, "cudaEventCreateWithFlags: %s", cudaGetErrorString(cudaGetLastError()));
  }
  if (r == tideSuccess && cudaStreamWaitEvent(cs, s->copyOutDone, 0) != cudaSuccess) {
    r = fail(tideCudaError, kComponent, "cudaStreamWaitEvent: %s", cudaGetErrorString(cudaGetLastError()));
  }
  if (r == tideSuccess) r = tideAllGather(s->comm, layout, sendbuff, nullptr, s->bounce, stream);
  if (r != tideSuccess) {
    // Nothing of this call was enqueued: NCCL can still take it on every rank.
    turnOff(s.get(), ncclComm, "the TIDE all-gather", r);
    *why = kTideOff;
    return kPassToNccl;
  }
  // From here the peers are inside TIDE's all-gather with us: handing this call to NCCL would hang them, so a
  // failure is returned as NCCL's own error for a failed CUDA call.
  cuda::CopyList out;
  out.add(recvbuff, s->bounce, copyBytes);
  r = out.enqueue(cs, s->device);
  if (r == tideSuccess && cudaEventRecord(s->copyOutDone, cs) != cudaSuccess) {
    r = fail(tideCudaError, kComponent, "cudaEventRecord: %s", cudaGetErrorString(cudaGetLastError()));
  }
  if (r != tideSuccess) {
    turnOff(s.get(), ncclComm, "the copy-out of the TIDE all-gather (this call fails with ncclUnhandledCudaError)",
            r);
    return kNcclUnhandledCudaError;
  }
  ++s->taken;
  countCopyOut(ncclComm, bytes);
  TIDE_TRACE(kComponent, "ncclAllGather on %p (%zu bytes per rank) taken by TIDE (call %" PRIu64 "), copied out "
             "from the bounce slot: %s", ncclComm, bytes, s->taken, kTargetText[static_cast<size_t>(target)]);
  return 0;
}

int tryReduceScatter(const void* sendbuff, void* recvbuff, size_t count, int ncclDtype, const ops::Resolved& op,
                     void* ncclComm, void* stream, Reason* why) {
  std::unique_lock<std::mutex> lock;
  auto s = enter(ncclComm, stream, &lock, why);
  if (!s) return kPassToNccl;
  const tideDataType_t dtype = ncclDtype == ops::kNcclBfloat16 ? tideBfloat16
                               : ncclDtype == ops::kNcclFloat16 ? tideFloat16
                                                                : tideFloat32;
  size_t elem = 0;
  (void)tideDataTypeSize(dtype, &elem);
  const auto in = reinterpret_cast<uintptr_t>(sendbuff), out = reinterpret_cast<uintptr_t>(recvbuff);
  const uintptr_t blockBytes = static_cast<uintptr_t>(count) * elem;
  const uintptr_t inBytes = blockBytes * static_cast<uintptr_t>(s->world);
  const bool inPlace = out == in + static_cast<uintptr_t>(s->rank) * blockBytes;
  if (!inPlace && out < in + inBytes && in < out + blockBytes) {
    // Only NCCL's in-place form is defined; any other overlap is the application's to explain to NCCL.
    *why = kRsOverlapNotInPlace;
    return kPassToNccl;
  }
  // NCCL's arithmetic: each rank premultiplies its own input; ncclAvg premultiplies by T(1/W).
  tideRedOp_t tideOp = tideSum;
  float scale = 1.0f;
  if (op.kind == ops::Resolved::kPremul) {
    tideOp = tidePremulSum;
    scale = op.scale;
  } else if (op.kind == ops::Resolved::kAvg) {
    tideOp = tidePremulSum;
    scale = ops::avgScale(s->world, ncclDtype);
  }
  // A layout attached to sendbuff (tideAttachLayout): every parameter's full gradient at its slot offset; else one
  // flat parameter.
  tideLayout_t layout = nullptr;
  std::vector<const void*> grads(1, sendbuff);
  // In place, the output is the flat call's own block: an attached layout's packed output would be elsewhere.
  OwnedLayout attached = inPlace ? OwnedLayout() : attachedLayout(ncclComm, sendbuff);
  if (tideLayout_t att = attached.h) {
    AttachedView v;
    bool sameType = viewOf(att, &v);
    for (const tideParamInfo_t& p : v.params) sameType = sameType && p.dtype == dtype;
    if (!sameType) {
      attachMismatch("reduce-scatter: the call's type is not the layout's gradient type");
    } else if (v.info.worldSize != s->world || v.info.rank != s->rank) {
      attachMismatch("the layout's world size or rank is not the communicator's");
    } else if (count < v.info.rsOutNumel) {
      attachMismatch("reduce-scatter: recvcount is below the layout's rsOutNumel");
    } else if (v.info.slotBytes > inBytes) {
      attachMismatch("reduce-scatter: the layout's slotBytes exceed the send buffer");
    } else {
      layout = att;
      grads.resize(v.params.size());
      for (size_t i = 0; i < v.params.size(); ++i) {
        grads[i] = static_cast<const char*>(sendbuff) + v.params[i].slotOffset;
      }
    }
  }
  tideResult_t r = layout != nullptr ? tideSuccess : layoutFor(s.get(), 1, dtype, count, &layout);
  if (r == tideSuccess) {
    r = tideReduceScatter(s->comm, layout, grads.data(), recvbuff, dtype, tideOp, scale, nullptr, stream);
  }
  if (r != tideSuccess) {
    // tideReduceScatter enqueues nothing when it fails: NCCL can still take the call on every rank.
    turnOff(s.get(), ncclComm, "the TIDE reduce-scatter", r);
    *why = kTideOff;
    return kPassToNccl;
  }
  ++s->taken;
  TIDE_TRACE(kComponent, "ncclReduceScatter on %p (%zu bytes per rank) taken by TIDE (call %" PRIu64 ")", ncclComm,
             static_cast<size_t>(blockBytes), s->taken);
  return 0;
}

void releaseComm(void* ncclComm, bool collective) {
  dropAttachments(ncclComm);  // also when TIDE never took a call on it
  ops::forgetComm(ncclComm);
  windows::forgetComm(ncclComm);
  char counts[256];
  summary(ncclComm, counts, sizeof(counts));
  // Once per communicator: a finalize and then a destroy release it twice.
  if (forget(ncclComm)) TIDE_INFO(kComponent, "NCCL communicator %p released: %s", ncclComm, counts);
  std::shared_ptr<CommState> s;
  {
    std::lock_guard<std::mutex> lock(gMu);
    auto it = gStates->find(ncclComm);
    if (it == gStates->end()) return;
    s = it->second;
    gStates->erase(it);  // a later communicator at the same address starts afresh
  }
  std::lock_guard<std::mutex> lock(s->mu);
  if (s->comm == nullptr) return;
  if (!collective) {
    // Abort: peers may be gone, so nothing collective (slot free, comm destroy both exchange with every rank).
    TIDE_INFO(kComponent, "NCCL communicator %p aborted: its TIDE comm is abandoned without collective teardown "
                          "(%zu bytes of bounce slot and the staging stay allocated)",
              ncclComm, s->bounceBytes);
    s->comm = nullptr;
    return;
  }
  // TIDE work of this comm may still be queued on the application's streams: tideSlotFree and tideCommDestroy wait
  // for the comm's device (bounded by NCCL_TIDE_TIMEOUT_MS) before they free anything.
  if (s->bounce != nullptr && tideSlotFree(s->comm, s->bounce) != tideSuccess) {
    TIDE_WARN(kComponent, "releasing the TIDE bounce slot of NCCL communicator %p failed: %s", ncclComm,
              tideGetLastError());
  }
  s->bounce = nullptr;
  if (tideCommDestroy(s->comm) != tideSuccess) {
    TIDE_WARN(kComponent, "destroying the TIDE comm of NCCL communicator %p failed: %s", ncclComm,
              tideGetLastError());
  }
  s->comm = nullptr;
  TIDE_INFO(kComponent, "NCCL communicator %p: TIDE comm released", ncclComm);
}

void forgetRegion(void* ncclComm, void* base) {
  if (base == nullptr) return;
  auto s = stateOf(ncclComm, false);
  if (!s) return;
  std::lock_guard<std::mutex> lock(s->mu);
  tide::cuda::CommRef ref;
  if (s->comm != nullptr && tide::cuda::checkComm(s->comm, "interposer", &ref) == tideSuccess) {
    ref->peerRegions.remove(base);
  }
}

#else  // no CUDA: nothing can be taken

int tryAllGather(const void*, void*, size_t, void*, void*, Reason* why) {
  *why = kNoCudaBuild;
  return kPassToNccl;
}
int tryReduceScatter(const void*, void*, size_t, int, const ops::Resolved&, void*, void*, Reason* why) {
  *why = kNoCudaBuild;
  return kPassToNccl;
}
bool streamCapturing(void*) { return false; }
void forgetRegion(void*, void*) {}
void releaseComm(void* ncclComm, bool) {
  ops::forgetComm(ncclComm);
  windows::forgetComm(ncclComm);
  forget(ncclComm);
}

#endif  // TIDE_HAVE_CUDA

}  // namespace interposer
}  // namespace tide

extern "C" {

TIDE_EXPORT tideResult_t tideAttachLayout(struct ncclComm* ncclComm, void* buffer, tideLayout_t layout) {
  TIDE_API_BEGIN
  if (ncclComm == nullptr || buffer == nullptr || layout == nullptr) {
    return tide::fail(tideInvalidArgument, "Interposer", "tideAttachLayout: %s is NULL",
                      ncclComm == nullptr ? "ncclComm" : buffer == nullptr ? "buffer" : "layout");
  }
  // A destroyed, garbage or foreign handle fails here (both builds), not at a later call.
  std::shared_ptr<void> live;
  TIDE_CHECK(tide::checkHandle(layout, tide::HandleKind::kLayout, "tideAttachLayout", "layout", &live));
#ifdef TIDE_HAVE_CUDA
  tide::interposer::OwnedLayout own(tide::interposer::retainLayout(layout));
  if (own.h == nullptr) return tide::handles::failBad(layout, tide::HandleKind::kLayout, "tideAttachLayout", "layout");
  std::lock_guard<std::mutex> lock(tide::interposer::gAttachMu);
  tide::interposer::gAttached[tide::interposer::AttachKey{ncclComm, buffer}] = std::move(own);
  return tideSuccess;
#else
  return tide::fail(tideUnsupported, "Interposer", "tideAttachLayout: this libnccl-tide.so is not a CUDA build");
#endif
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideDetachLayout(struct ncclComm* ncclComm, void* buffer) {
  TIDE_API_BEGIN
  if (ncclComm == nullptr || buffer == nullptr) {
    return tide::fail(tideInvalidArgument, "Interposer", "tideDetachLayout: %s is NULL",
                      ncclComm == nullptr ? "ncclComm" : "buffer");
  }
#ifdef TIDE_HAVE_CUDA
  std::lock_guard<std::mutex> lock(tide::interposer::gAttachMu);
  if (tide::interposer::gAttached.erase(tide::interposer::AttachKey{ncclComm, buffer}) == 0) {
    return tide::fail(tideInvalidArgument, "Interposer", "tideDetachLayout: no layout is attached to %p on %p", buffer,
                      static_cast<void*>(ncclComm));
  }
  return tideSuccess;
#else
  return tide::fail(tideInvalidArgument, "Interposer", "tideDetachLayout: no layout is attached to %p on %p", buffer,
                    static_cast<void*>(ncclComm));
#endif
  TIDE_API_END
}

}  // extern "C"
