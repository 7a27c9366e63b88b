// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The LD_PRELOAD interposer: libnccl-tide.so exports ncclAllGather, ncclReduceScatter, ncclAllGatherConfig and
// ncclReduceScatterConfig (plugin/exports.map; nothing else of NCCL's collectives) and forwards each call to the NCCL
// already loaded in the process: dlopen("libnccl.so.2", RTLD_NOLOAD) + dlsym of pncclXxx (nccl::loadedSymbol),
// resolved lazily on the first call. Never RTLD_NEXT: torch loads NCCL as a dependency of an RTLD_LOCAL extension,
// which RTLD_NEXT from a preloaded library does not see.
//
// NCCL_TIDE_ENABLE unset or 0: pure pass-through (the flag is read once and cached; no allocation, no other work).
// NCCL_TIDE_ENABLE=1: each call is classified (docs/usage.md "Eligibility"); an eligible one is run by TIDE
// (interposer_tide.cc), any other is passed through unchanged, and each is counted (interposer_counters.h). Twelve
// more NCCL names serve the TIDE path and are exported too, each a plain forward when TIDE is off:
// ncclGroupStart/ncclGroupEnd/ncclGroupSimulateEnd (grouped calls are recorded and run after the group:
// interposer_group.h),
// ncclRedOpCreatePreMulSum/ncclRedOpDestroy (what a PREMUL_SUM op means: interposer_ops.h), and
// ncclCommFinalize/ncclCommDestroy/ncclCommAbort (TIDE's state of a communicator is released before NCCL's), and
// ncclCommWindowRegister/ncclCommWindowDeregister/ncclCommRegister/ncclCommDeregister (which buffers NCCL maps for
// the peers: an all-gather into a symmetric window needs no copy-out, interposer_windows.h).
//
// No NCCL header: the types are the ABI-stable ones of nccl.h (enums are ints, handles pointers); the Config
// variants (NCCL >= 2.31.2) take the ncclCollConfig_t pointer opaquely, so this builds against 2.28.9 headers too.
#include <dlfcn.h>
#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "../core/api_guard.h"
#include "../core/errors.h"
#include "../core/export.h"
#include "../core/log.h"
#include "../core/params.h"
#include "../nccl/nccl_lib.h"
#include "interposer_counters.h"
#include "interposer_group.h"
#include "interposer_ops.h"
#include "interposer_tide.h"
#include "interposer_windows.h"

namespace {

namespace ip = tide::interposer;
using ncclResult_t = int;
using ncclComm_t = void*;
using cudaStream_t = void*;
constexpr ncclResult_t kSystemError = 2;   // ncclSystemError
constexpr ncclResult_t kInvalidUsage = 5;  // ncclInvalidUsage
constexpr const char* kComponent = "Interposer";

using AllGatherFn = ncclResult_t (*)(const void*, void*, size_t, int, ncclComm_t, cudaStream_t);
using ReduceScatterFn = ncclResult_t (*)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
using AllGatherConfigFn = ncclResult_t (*)(const void*, void*, size_t, int, ncclComm_t, cudaStream_t, const void*);
using ReduceScatterConfigFn = ncclResult_t (*)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t,
                                               const void*);
using VoidFn = ncclResult_t (*)();
using CommFn = ncclResult_t (*)(ncclComm_t);
using PreMulSumFn = ncclResult_t (*)(int*, void*, int, int, ncclComm_t);
using OpDestroyFn = ncclResult_t (*)(int, ncclComm_t);
using AsyncErrorFn = ncclResult_t (*)(ncclComm_t, ncclResult_t*);
using SimulateEndFn = ncclResult_t (*)(void*);
using WindowRegisterFn = ncclResult_t (*)(ncclComm_t, void*, size_t, void**, int);
using WindowDeregisterFn = ncclResult_t (*)(ncclComm_t, void*);
using RegisterFn = ncclResult_t (*)(ncclComm_t, void*, size_t, void**);
using DeregisterFn = ncclResult_t (*)(ncclComm_t, void*);

enum Entry : int {
  kAllGather = 0,
  kReduceScatter,
  kAllGatherConfig,
  kReduceScatterConfig,
  kGroupStart,
  kGroupEnd,
  kCommFinalize,
  kCommDestroy,
  kCommAbort,
  kRedOpCreatePreMulSum,
  kRedOpDestroy,
  kGroupSimulateEnd,
  kCommWindowRegister,
  kCommWindowDeregister,
  kCommRegister,
  kCommDeregister,
  kCommGetAsyncError,  // not exported: the wait for a nonblocking group's launch
  kNumEntries
};
const char* const kRealNames[kNumEntries] = {
    "pncclAllGather",   "pncclReduceScatter", "pncclAllGatherConfig", "pncclReduceScatterConfig",
    "pncclGroupStart",  "pncclGroupEnd",      "pncclCommFinalize",    "pncclCommDestroy",
    "pncclCommAbort",   "pncclRedOpCreatePreMulSum", "pncclRedOpDestroy", "pncclGroupSimulateEnd",
    "pncclCommWindowRegister", "pncclCommWindowDeregister", "pncclCommRegister", "pncclCommDeregister",
    "pncclCommGetAsyncError"};
const char* const kPublicNames[kNumEntries] = {
    "ncclAllGather",   "ncclReduceScatter", "ncclAllGatherConfig", "ncclReduceScatterConfig",
    "ncclGroupStart",  "ncclGroupEnd",      "ncclCommFinalize",    "ncclCommDestroy",
    "ncclCommAbort",   "ncclRedOpCreatePreMulSum", "ncclRedOpDestroy", "ncclGroupSimulateEnd",
    "ncclCommWindowRegister", "ncclCommWindowDeregister", "ncclCommRegister", "ncclCommDeregister",
    "ncclCommGetAsyncError"};

std::atomic<void*> gReal[kNumEntries];
std::atomic<bool> gWarned[kNumEntries];

bool ownAddress(void* p) {
  // Our own exported function (or anything else in this library): calling it would recurse.
  Dl_info self{}, other{};
  if (!dladdr(reinterpret_cast<void*>(&ownAddress), &self)) return false;
  if (!dladdr(p, &other)) return false;
  return self.dli_fbase == other.dli_fbase;
}

// The real entry point, or nullptr after one WARN (no NCCL loaded; this NCCL lacks it; it resolves to us).
// A failure is not cached: NCCL may be loaded later.
void* real(Entry e) {
  void* p = gReal[e].load(std::memory_order_acquire);
  if (p != nullptr) return p;
  p = tide::nccl::loadedSymbol(kRealNames[e]);
  const char* why = nullptr;
  if (p == nullptr) {
    why = (tide::nccl::loadedSymbol("ncclGetVersion") == nullptr)
              ? "no NCCL library (libnccl.so.2) is loaded in this process; libnccl-tide.so never loads one: load "
                "NCCL (e.g. import torch with CUDA) before calling it, or do not preload libnccl-tide.so"
              : (e == kAllGatherConfig || e == kReduceScatterConfig)
                    ? "the loaded libnccl.so.2 does not export it (the Config collectives need NCCL >= 2.31.2)"
                    : "the loaded libnccl.so.2 does not export it";
  } else if (ownAddress(p)) {
    why = "it resolves to libnccl-tide.so itself (is libnccl-tide.so installed as libnccl.so.2?)";
    p = nullptr;
  }
  if (p == nullptr) {
    if (!gWarned[e].exchange(true)) {
      TIDE_WARN(kComponent, "%s: cannot forward to NCCL's %s: %s; returning %s", kPublicNames[e], kRealNames[e], why,
                e == kAllGatherConfig || e == kReduceScatterConfig ? "ncclInvalidUsage" : "ncclSystemError");
    }
    return nullptr;
  }
  gReal[e].store(p, std::memory_order_release);
  return p;
}

// NCCL_TIDE_ENABLE, read once: -1 unknown, 0 off, 1 on.
std::atomic<int> gEnabled{-1};

inline bool enabled() {
  int v = gEnabled.load(std::memory_order_relaxed);
  if (__builtin_expect(v >= 0, 1)) return v != 0;
  v = tide::params::interposerEnabled() ? 1 : 0;
  gEnabled.store(v, std::memory_order_relaxed);
  if (v) {
    TIDE_INFO(kComponent, "NCCL_TIDE_ENABLE=1: eligible ncclAllGather/ncclReduceScatter calls run through TIDE "
                          "(min bytes %llu, bf16/fp16 reduce-scatter %s)",
              static_cast<unsigned long long>(tide::params::interposerMinBytes()),
              tide::params::rsAccumFp32() ? "with fp32 accumulation (NCCL_TIDE_RS_ACCUM=FP32)" : "left to NCCL");
  }
  return v != 0;
}

// ncclDataType_t sizes (nccl.h): Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, Bfloat16,
// Float8e4m3, Float8e5m2.
size_t dtypeBytes(int dtype) {
  static const size_t kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return (dtype >= 0 && dtype < static_cast<int>(sizeof(kSizes) / sizeof(kSizes[0]))) ? kSizes[dtype] : 0;
}

std::atomic<bool> gReasonLogged[ip::kNumReasons];
constexpr const char* kEligibleText = "eligible: run by TIDE unless TIDE is off for the communicator";

void logReasonOnce(ip::Reason r, const char* name, const char* detail) {
  if (r == ip::kNoCudaBuild) {
    if (!gReasonLogged[r].exchange(true)) {
      TIDE_WARN(kComponent, "NCCL_TIDE_ENABLE=1, but %s; every call goes to NCCL (said once)", ip::reasonText(r));
    }
  } else if (!gReasonLogged[r].exchange(true)) {
    const bool more = detail != nullptr && detail[0] != '\0';
    TIDE_INFO(kComponent, "%s call %s%s%s%s (each reason is logged once at INFO; NCCL_TIDE_DEBUG=TRACE logs every "
              "call)", name, r == ip::kTaken ? kEligibleText : "to NCCL: ", r == ip::kTaken ? "" : ip::reasonText(r),
              more ? ": " : "", more ? detail : "");
  }
}

// The eligibility decision (docs/usage.md "Eligibility"); kTaken = eligible. Fills c.resolved for a reduce-scatter.
ip::Reason classify(Entry e, ip::group::Call* c) {
  const size_t elem = dtypeBytes(c->dtype);
  const bool rs = c->coll == ip::kCollReduceScatter;
  const bool half = c->dtype == ip::ops::kNcclFloat16 || c->dtype == ip::ops::kNcclBfloat16;
  const char* detail = nullptr;
  ip::Reason r = ip::kTaken;
  if (rs) c->resolved = ip::ops::resolve(c->comm, c->op, c->dtype);
  if (e == kAllGatherConfig || e == kReduceScatterConfig) {
    r = ip::kConfigCall;
  } else if (elem == 0) {
    r = ip::kUnknownDtype;
  } else if (c->count == 0) {
    r = ip::kEmpty;
  } else if (c->bytes == UINT64_MAX) {
    r = ip::kCountTooLarge;  // NCCL refuses it; TIDE must not try (a failed layout would turn it off)
  } else if (rs && !half && c->dtype != ip::ops::kNcclFloat32) {
    r = ip::kRsDtypeNotFloat;
  } else if (rs && c->resolved.kind == ip::ops::Resolved::kNotTide) {
    r = ip::kRsOpNotTide;
    detail = c->resolved.why;
  } else if (c->bytes < tide::params::interposerMinBytes()) {
    r = ip::kBelowThreshold;  // per-rank bytes
  } else if (rs && half && !tide::params::rsAccumFp32()) {
    r = ip::kRsHalfWithoutFp32Accum;
  }
#ifndef TIDE_HAVE_CUDA
  if (r == ip::kTaken) r = ip::kNoCudaBuild;
#endif
  TIDE_TRACE(kComponent, "%s comm %p count %zu dtype %d op %d: %s%s%s", kPublicNames[e], c->comm, c->count, c->dtype,
             c->op, r == ip::kTaken ? kEligibleText : ip::reasonText(r), detail ? ": " : "", detail ? detail : "");
  logReasonOnce(r, kPublicNames[e], detail != nullptr ? detail : "");
  return r;
}

ip::group::Call callOf(ip::Coll coll, const void* send, void* recv, size_t count, int dtype, int op, ncclComm_t comm,
                       cudaStream_t stream) {
  ip::group::Call c;
  c.coll = coll;
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.dtype = dtype;
  c.op = op;
  c.comm = comm;
  c.stream = stream;
  const size_t elem = dtypeBytes(dtype);
  // 0 for an unknown type; UINT64_MAX where count * elem does not fit (classify refuses it)
  c.bytes = count < UINT64_MAX / (elem == 0 ? 1 : elem) ? count * elem : UINT64_MAX;
  return c;
}

ncclResult_t forwardComm(Entry e, ncclComm_t comm) {
  auto f = reinterpret_cast<CommFn>(real(e));
  return f == nullptr ? kSystemError : f(comm);
}

// No exception may cross into the application's C code (allocations in the recorder and the tables): an entry point
// that would throw answers ncclSystemError instead, with one WARN.
template <typename F>
ncclResult_t guarded(const char* name, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    TIDE_WARN(kComponent, "%s: %s; returning ncclSystemError", name, e.what());
    return kSystemError;
  }
}

// NCCL, TIDE and the group's end as the group recorder sees them.
class Hooks : public ip::group::Hooks {
 public:
  int forward(const ip::group::Call& c, ip::Reason why) override {
    count(c, why);
    if (c.coll == ip::kCollAllGather) {
      auto f = reinterpret_cast<AllGatherFn>(real(kAllGather));
      return f == nullptr ? kSystemError : f(c.send, c.recv, c.count, c.dtype, c.comm, c.stream);
    }
    auto f = reinterpret_cast<ReduceScatterFn>(real(kReduceScatter));
    return f == nullptr ? kSystemError : f(c.send, c.recv, c.count, c.dtype, c.op, c.comm, c.stream);
  }
  void count(const ip::group::Call& c, ip::Reason why) override {
    ip::count(c.comm, c.coll, why, c.bytes);
    if (why >= ip::kGroupOfSeveralComms) logReasonOnce(why, c.coll == ip::kCollAllGather ? "ncclAllGather"
                                                                                         : "ncclReduceScatter", "");
  }
  int runTide(const ip::group::Call& c, ip::Reason* why) override {
    int r = c.coll == ip::kCollAllGather ? ip::tryAllGather(c.send, c.recv, c.bytes, c.comm, c.stream, why)
                                         : ip::tryReduceScatter(c.send, c.recv, c.count, c.dtype, c.resolved, c.comm,
                                                                c.stream, why);
    if (r != ip::kPassToNccl) ip::count(c.comm, c.coll, ip::kTaken, c.bytes);
    return r;
  }
  int realGroupEnd() override {
    auto f = reinterpret_cast<VoidFn>(real(kGroupEnd));
    return f == nullptr ? kSystemError : f();
  }
  int realGroupSimulateEnd() override {
    auto f = reinterpret_cast<SimulateEndFn>(real(kGroupSimulateEnd));
    return f == nullptr ? kSystemError : f(simInfo);
  }
  int waitLaunched(void* comm) override {
    auto f = reinterpret_cast<AsyncErrorFn>(real(kCommGetAsyncError));
    if (f == nullptr) return kSystemError;
    ncclResult_t state = ip::group::kNcclInProgress;
    for (;;) {
      ncclResult_t q = f(comm, &state);
      if (q != 0) return q;
      if (state != ip::group::kNcclInProgress) return state;
      sched_yield();
    }
  }
  bool capturing(void* stream) override { return ip::streamCapturing(stream); }
  int destroyOp(void* comm, int op) override {
    auto f = reinterpret_cast<OpDestroyFn>(real(kRedOpDestroy));
    int r = f == nullptr ? kSystemError : f(op, comm);
    if (r == 0) ip::ops::destroyed(comm, op);
    return r;
  }
  void* simInfo = nullptr;  // ncclGroupSimulateEnd's ncclSimInfo_t*
};

// An all-gather or reduce-scatter with TIDE on: recorded inside a group, else run by TIDE if eligible, else NCCL's.
ncclResult_t dispatch(Entry e, ip::group::Call c) {
  Hooks hooks;
  const ip::Reason why = classify(e, &c);
  if (ip::group::open()) return ip::group::call(c, why == ip::kTaken, why, hooks);
  if (why != ip::kTaken) return hooks.forward(c, why);
  ip::Reason passed = ip::kTaken;
  const int r = hooks.runTide(c, &passed);
  return r == ip::kPassToNccl ? hooks.forward(c, passed) : r;
}

// Inside a group NCCL finalizes at the group's end, and TIDE's collective teardown (its own NCCL calls) cannot run
// inside the application's group: TIDE lets go of the communicator as on abort.
ncclResult_t release(Entry e, ncclComm_t comm) {
  if (__builtin_expect(enabled(), 0)) {
    int r = 0;
    if (ip::group::open()) {
      Hooks hooks;
      r = ip::group::commGoing(comm, hooks);
    }
    ip::releaseComm(comm, /*collective=*/!ip::group::open());
    if (r != 0) return r;
  }
  return forwardComm(e, comm);
}

}  // namespace

extern "C" {

TIDE_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, int datatype,
                                       ncclComm_t comm, cudaStream_t stream) {
  if (__builtin_expect(enabled(), 0)) {
    return guarded("ncclAllGather", [&] {
      return dispatch(kAllGather, callOf(ip::kCollAllGather, sendbuff, recvbuff, sendcount, datatype, 0, comm, stream));
    });
  }
  auto f = reinterpret_cast<AllGatherFn>(real(kAllGather));
  if (f == nullptr) return kSystemError;
  return f(sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

TIDE_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, int datatype,
                                           int op, ncclComm_t comm, cudaStream_t stream) {
  if (__builtin_expect(enabled(), 0)) {
    return guarded("ncclReduceScatter", [&] {
      return dispatch(kReduceScatter,
                      callOf(ip::kCollReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm, stream));
    });
  }
  auto f = reinterpret_cast<ReduceScatterFn>(real(kReduceScatter));
  if (f == nullptr) return kSystemError;
  return f(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

// NCCL >= 2.31.2 signatures; `config` is a const ncclCollConfig_t*, forwarded untouched.
TIDE_EXPORT ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount, int datatype,
                                             ncclComm_t comm, cudaStream_t stream, const void* config) {
  if (__builtin_expect(enabled(), 0)) {
    auto c = callOf(ip::kCollAllGather, sendbuff, recvbuff, sendcount, datatype, 0, comm, stream);
    const ip::Reason why = classify(kAllGatherConfig, &c);
    Hooks hooks;
    // In a group it counts towards the group's communicators and streams, like any other call.
    if (ip::group::open()) (void)ip::group::call(c, false, why, hooks, /*forward=*/false);
    ip::count(comm, c.coll, why, c.bytes);
  }
  auto f = reinterpret_cast<AllGatherConfigFn>(real(kAllGatherConfig));
  if (f == nullptr) return kInvalidUsage;
  return f(sendbuff, recvbuff, sendcount, datatype, comm, stream, config);
}

TIDE_EXPORT ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                 int datatype, int op, ncclComm_t comm, cudaStream_t stream,
                                                 const void* config) {
  if (__builtin_expect(enabled(), 0)) {
    auto c = callOf(ip::kCollReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
    const ip::Reason why = classify(kReduceScatterConfig, &c);
    Hooks hooks;
    if (ip::group::open()) (void)ip::group::call(c, false, why, hooks, /*forward=*/false);
    ip::count(comm, c.coll, why, c.bytes);
  }
  auto f = reinterpret_cast<ReduceScatterConfigFn>(real(kReduceScatterConfig));
  if (f == nullptr) return kInvalidUsage;
  return f(sendbuff, recvbuff, recvcount, datatype, op, comm, stream, config);
}

TIDE_EXPORT ncclResult_t ncclGroupStart(void) {
  auto f = reinterpret_cast<VoidFn>(real(kGroupStart));
  if (f == nullptr) return kSystemError;
  ncclResult_t r = f();
  if (r == 0 && enabled()) ip::group::started();
  return r;
}

TIDE_EXPORT ncclResult_t ncclGroupEnd(void) {
  if (__builtin_expect(enabled(), 0)) {
    return guarded("ncclGroupEnd", [] {
      Hooks hooks;
      const int r = ip::group::ended(hooks);
      if (!ip::group::open()) ip::windows::groupEnded(r == 0);
      return r;
    });
  }
  auto f = reinterpret_cast<VoidFn>(real(kGroupEnd));
  if (f == nullptr) return kSystemError;
  return f();
}

// `simInfo` is an ncclSimInfo_t* (NCCL >= 2.22), passed untouched.
TIDE_EXPORT ncclResult_t ncclGroupSimulateEnd(void* simInfo) {
  if (__builtin_expect(enabled(), 0)) {
    return guarded("ncclGroupSimulateEnd", [&] {
      Hooks hooks;
      hooks.simInfo = simInfo;
      return ip::group::simulatedEnd(hooks);
    });
  }
  auto f = reinterpret_cast<SimulateEndFn>(real(kGroupSimulateEnd));
  if (f == nullptr) return kSystemError;
  return f(simInfo);
}

// `op` is an ncclRedOp_t*, `residence` an ncclScalarResidence_t. A host scalar is read now, as NCCL reads it.
TIDE_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(int* op, void* scalar, int datatype, int residence,
                                                  ncclComm_t comm) {
  auto f = reinterpret_cast<PreMulSumFn>(real(kRedOpCreatePreMulSum));
  if (f == nullptr) return kSystemError;
  ncclResult_t r = f(op, scalar, datatype, residence, comm);
  if (r == 0 && op != nullptr && enabled()) {
    return guarded("ncclRedOpCreatePreMulSum", [&] {
      ip::ops::created(comm, *op, scalar, datatype, residence);
      return 0;
    });
  }
  return r;
}

TIDE_EXPORT ncclResult_t ncclRedOpDestroy(int op, ncclComm_t comm) {
  if (__builtin_expect(enabled(), 0)) {
    // A recorded call of the open group still needs the op: NCCL destroys it when the group has run.
    if (ip::ops::known(comm, op) && ip::group::postponeDestroy(comm, op)) return 0;
    Hooks hooks;
    return hooks.destroyOp(comm, op);
  }
  auto f = reinterpret_cast<OpDestroyFn>(real(kRedOpDestroy));
  if (f == nullptr) return kSystemError;
  return f(op, comm);
}

// TIDE's state of a communicator goes before NCCL's: finalize and destroy are collective in NCCL too, so TIDE's
// collective teardown (slot frees, comm destroy over this communicator) runs while every rank is there; abort is
// not, so TIDE only lets go (interposer_tide.h).
TIDE_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return guarded("ncclCommFinalize", [&] { return release(kCommFinalize, comm); });
}

TIDE_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return guarded("ncclCommDestroy", [&] { return release(kCommDestroy, comm); });
}

TIDE_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (__builtin_expect(enabled(), 0)) ip::releaseComm(comm, /*collective=*/false);
  return forwardComm(kCommAbort, comm);
}

// `win` is an ncclWindow_t*. Inside a group NCCL fills it when the group ends.
TIDE_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, void** win, int winFlags) {
  auto f = reinterpret_cast<WindowRegisterFn>(real(kCommWindowRegister));
  if (f == nullptr) return kSystemError;
  ncclResult_t r = f(comm, buff, size, win, winFlags);
  if (r == 0 && win != nullptr && enabled()) {
    return guarded("ncclCommWindowRegister", [&] {
      if (ip::group::open()) {
        ip::windows::registeredInGroup(comm, buff, size, win, winFlags);
      } else {
        ip::windows::registered(comm, buff, size, *win, winFlags);
      }
      return 0;
    });
  }
  return r;
}

// TIDE forgets the window (and the peers' addresses it learnt of it) before NCCL unmaps it.
TIDE_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, void* win) {
  if (__builtin_expect(enabled(), 0)) {
    const ncclResult_t r = guarded("ncclCommWindowDeregister", [&] {
      ip::forgetRegion(comm, ip::windows::deregistered(comm, win));
      return 0;
    });
    if (r != 0) return r;
  }
  auto f = reinterpret_cast<WindowDeregisterFn>(real(kCommWindowDeregister));
  return f == nullptr ? kSystemError : f(comm, win);
}

TIDE_EXPORT ncclResult_t ncclCommRegister(ncclComm_t comm, void* buff, size_t size, void** handle) {
  auto f = reinterpret_cast<RegisterFn>(real(kCommRegister));
  if (f == nullptr) return kSystemError;
  ncclResult_t r = f(comm, buff, size, handle);
  if (r == 0 && handle != nullptr && enabled()) {
    return guarded("ncclCommRegister", [&] {
      ip::windows::registeredLocal(comm, buff, size, *handle);
      return 0;
    });
  }
  return r;
}

TIDE_EXPORT ncclResult_t ncclCommDeregister(ncclComm_t comm, void* handle) {
  if (__builtin_expect(enabled(), 0)) {
    const ncclResult_t r = guarded("ncclCommDeregister", [&] {
      ip::windows::deregisteredLocal(comm, handle);
      return 0;
    });
    if (r != 0) return r;
  }
  auto f = reinterpret_cast<DeregisterFn>(real(kCommDeregister));
  return f == nullptr ? kSystemError : f(comm, handle);
}

TIDE_EXPORT tideResult_t tideInterposerGetCounters(struct ncclComm* ncclComm, tideInterposerCounters_t* out) {
  if (out == nullptr) {
    return tide::fail(tideInvalidArgument, kComponent, "tideInterposerGetCounters: out is NULL");
  }
  TIDE_API_BEGIN
  if (out->size != sizeof(*out) || out->version != TIDE_INTERPOSER_COUNTERS_VERSION) {
    return tide::fail(tideInvalidArgument, kComponent,
                      "tideInterposerGetCounters: out->size %zu / version %u, expected %zu / %d (set both before the "
                      "call)", out->size, out->version, sizeof(*out), TIDE_INTERPOSER_COUNTERS_VERSION);
  }
  ip::read(ncclComm, out);
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT const char* tideInterposerReasonString(int reason) {
  return reason >= 1 ? ip::reasonText(static_cast<ip::Reason>(reason)) : nullptr;
}

}  // extern "C"
