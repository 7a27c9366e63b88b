// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The LD_PRELOAD interposer: libnccl-tide.so exports ncclAllGather, ncclReduceScatter, ncclAllGatherConfig and
// ncclReduceScatterConfig (plugin/exports.map; nothing else of NCCL's) and forwards each call to the NCCL already
// loaded in the process: dlopen("libnccl.so.2", RTLD_NOLOAD) + dlsym of pncclXxx (nccl::loadedSymbol), resolved
// lazily on the first call. Never RTLD_NEXT: torch loads NCCL as a dependency of an RTLD_LOCAL extension, which
// RTLD_NEXT from a preloaded library does not see.
//
// NCCL_TIDE_ENABLE unset or 0: pure pass-through (the flag is read once and cached; no allocation, no other work).
// NCCL_TIDE_ENABLE=1: each call is classified (docs/usage.md "Eligibility"); an eligible one is run by TIDE
// (interposer_tide.cc), any other is passed through unchanged. Grouping is tracked per thread by interposing
// ncclGroupStart/ncclGroupEnd (TIDE takes only ungrouped calls), and ncclCommFinalize/ncclCommDestroy/ncclCommAbort
// release TIDE's state of a communicator before NCCL's: two needs of the TIDE path that no other NCCL entry point
// serves, so these five names are exported as well (plugin/exports.map), each a plain forward when TIDE is off.
//
// No NCCL header: the types are the ABI-stable ones of nccl.h (enums are ints, handles pointers); the Config
// variants (NCCL >= 2.31.2) take the ncclCollConfig_t pointer opaquely, so this builds against 2.28.9 headers too.
#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "../core/export.h"
#include "../core/log.h"
#include "../core/params.h"
#include "../nccl/nccl_lib.h"
#include "interposer_tide.h"

namespace {

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
  kNumEntries
};
const char* const kRealNames[kNumEntries] = {"pncclAllGather",     "pncclReduceScatter", "pncclAllGatherConfig",
                                             "pncclReduceScatterConfig", "pncclGroupStart", "pncclGroupEnd",
                                             "pncclCommFinalize",  "pncclCommDestroy",   "pncclCommAbort"};
const char* const kPublicNames[kNumEntries] = {"ncclAllGather",     "ncclReduceScatter", "ncclAllGatherConfig",
                                               "ncclReduceScatterConfig", "ncclGroupStart", "ncclGroupEnd",
                                               "ncclCommFinalize",  "ncclCommDestroy",   "ncclCommAbort"};

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

// ncclGroupStart/End nesting depth of this thread (NCCL's groups are per thread).
thread_local int tGroupDepth = 0;

// ncclDataType_t sizes (nccl.h): Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, Bfloat16,
// Float8e4m3, Float8e5m2.
size_t dtypeBytes(int dtype) {
  static const size_t kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return (dtype >= 0 && dtype < static_cast<int>(sizeof(kSizes) / sizeof(kSizes[0]))) ? kSizes[dtype] : 0;
}
constexpr int kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclBfloat16 = 9;

enum Reason : int {
  kEligible = 0,
  kConfigCall,
  kUnknownDtype,
  kBelowThreshold,
  kRsOpNotSum,
  kRsDtypeNotFloat,
  kRsHalfWithoutFp32Accum,
  kInGroup,
  kNoCudaBuild,
  kNumReasons
};
const char* const kReasonText[kNumReasons] = {
    "eligible: run by TIDE unless TIDE is off for the communicator",
    "a ...Config call (per-collective config is honoured only by NCCL)",
    "unknown ncclDataType_t",
    "smaller than NCCL_TIDE_ENABLE_MIN_BYTES",
    "reduce-scatter with an op other than ncclSum",
    "reduce-scatter in a type other than fp32/fp16/bf16",
    "bf16/fp16 reduce-scatter without NCCL_TIDE_RS_ACCUM=FP32 (TIDE accumulates in fp32 only)",
    "inside ncclGroupStart/ncclGroupEnd (TIDE takes only ungrouped calls)",
    "this libnccl-tide.so is not a CUDA build: nothing can be run by TIDE",
};
std::atomic<bool> gReasonLogged[kNumReasons];

// The eligibility decision (docs/usage.md). count is per rank (sendcount / recvcount).
Reason classify(Entry e, size_t count, int dtype, int op, ncclComm_t comm) {
  Reason r = kEligible;
  size_t elem = dtypeBytes(dtype);
  const bool rs = e == kReduceScatter || e == kReduceScatterConfig;
  if (e == kAllGatherConfig || e == kReduceScatterConfig) {
    r = kConfigCall;
  } else if (elem == 0) {
    r = kUnknownDtype;
  } else if (rs && op != 0) {
    r = kRsOpNotSum;
  } else if (rs && dtype != kNcclFloat16 && dtype != kNcclFloat32 && dtype != kNcclBfloat16) {
    r = kRsDtypeNotFloat;
  } else if (static_cast<unsigned __int128>(count) * elem < tide::params::interposerMinBytes()) {
    r = kBelowThreshold;  // per-rank bytes
  } else if (rs && dtype != kNcclFloat32 && !tide::params::rsAccumFp32()) {
    r = kRsHalfWithoutFp32Accum;
  } else if (tGroupDepth > 0) {
    r = kInGroup;
  }
#ifndef TIDE_HAVE_CUDA
  if (r == kEligible) r = kNoCudaBuild;
#endif
  TIDE_TRACE(kComponent, "%s comm %p count %zu dtype %d: %s", kPublicNames[e], comm, count, dtype, kReasonText[r]);
  if (r == kNoCudaBuild && !gReasonLogged[r].exchange(true)) {
    TIDE_WARN(kComponent, "NCCL_TIDE_ENABLE=1, but %s; every call goes to NCCL (said once)", kReasonText[r]);
  } else if (!gReasonLogged[r].exchange(true)) {
    TIDE_INFO(kComponent, "%s call classified: %s (each reason is logged once at INFO; NCCL_TIDE_DEBUG=TRACE logs "
              "every call)", kPublicNames[e], kReasonText[r]);
  }
  return r;
}

tideDataType_t tideTypeOf(int ncclDtype) {
  return ncclDtype == kNcclBfloat16 ? tideBfloat16 : ncclDtype == kNcclFloat16 ? tideFloat16 : tideFloat32;
}

ncclResult_t forwardComm(Entry e, ncclComm_t comm) {
  auto f = reinterpret_cast<CommFn>(real(e));
  return f == nullptr ? kSystemError : f(comm);
}

}  // namespace

extern "C" {

TIDE_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, int datatype,
                                       ncclComm_t comm, cudaStream_t stream) {
  if (__builtin_expect(enabled(), 0) && classify(kAllGather, sendcount, datatype, 0, comm) == kEligible) {
    int r = tide::interposer::tryAllGather(sendbuff, recvbuff, sendcount * dtypeBytes(datatype), comm, stream);
    if (r != tide::interposer::kPassToNccl) return r;
  }
  auto f = reinterpret_cast<AllGatherFn>(real(kAllGather));
  if (f == nullptr) return kSystemError;
  return f(sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

TIDE_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, int datatype,
                                           int op, ncclComm_t comm, cudaStream_t stream) {
  if (__builtin_expect(enabled(), 0) && classify(kReduceScatter, recvcount, datatype, op, comm) == kEligible) {
    int r = tide::interposer::tryReduceScatter(sendbuff, recvbuff, recvcount, tideTypeOf(datatype), comm, stream);
    if (r != tide::interposer::kPassToNccl) return r;
  }
  auto f = reinterpret_cast<ReduceScatterFn>(real(kReduceScatter));
  if (f == nullptr) return kSystemError;
  return f(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

// NCCL >= 2.31.2 signatures; `config` is a const ncclCollConfig_t*, forwarded untouched.
TIDE_EXPORT ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount, int datatype,
                                             ncclComm_t comm, cudaStream_t stream, const void* config) {
  if (__builtin_expect(enabled(), 0)) classify(kAllGatherConfig, sendcount, datatype, 0, comm);
  auto f = reinterpret_cast<AllGatherConfigFn>(real(kAllGatherConfig));
  if (f == nullptr) return kInvalidUsage;
  return f(sendbuff, recvbuff, sendcount, datatype, comm, stream, config);
}

TIDE_EXPORT ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                 int datatype, int op, ncclComm_t comm, cudaStream_t stream,
                                                 const void* config) {
  if (__builtin_expect(enabled(), 0)) classify(kReduceScatterConfig, recvcount, datatype, op, comm);
  auto f = reinterpret_cast<ReduceScatterConfigFn>(real(kReduceScatterConfig));
  if (f == nullptr) return kInvalidUsage;
  return f(sendbuff, recvbuff, recvcount, datatype, op, comm, stream, config);
}

TIDE_EXPORT ncclResult_t ncclGroupStart(void) {
  auto f = reinterpret_cast<VoidFn>(real(kGroupStart));
  if (f == nullptr) return kSystemError;
  ncclResult_t r = f();
  if (r == 0) ++tGroupDepth;
  return r;
}

TIDE_EXPORT ncclResult_t ncclGroupEnd(void) {
  auto f = reinterpret_cast<VoidFn>(real(kGroupEnd));
  if (f == nullptr) return kSystemError;
  // NCCL closes the group level even when the group's operations fail.
  if (tGroupDepth > 0) --tGroupDepth;
  return f();
}

// TIDE's state of a communicator goes before NCCL's: finalize and destroy are collective in NCCL too, so TIDE's
// collective teardown (slot frees, comm destroy over this communicator) runs while every rank is there; abort is
// not, so TIDE only lets go (interposer_tide.h).
TIDE_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (__builtin_expect(enabled(), 0)) tide::interposer::releaseComm(comm, /*collective=*/true);
  return forwardComm(kCommFinalize, comm);
}

TIDE_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (__builtin_expect(enabled(), 0)) tide::interposer::releaseComm(comm, /*collective=*/true);
  return forwardComm(kCommDestroy, comm);
}

TIDE_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (__builtin_expect(enabled(), 0)) tide::interposer::releaseComm(comm, /*collective=*/false);
  return forwardComm(kCommAbort, comm);
}

}  // extern "C"
