// The LD_PRELOAD interposer (DESIGN.md section 4 item 3, issue 5): libnccl-tide.so exports ncclAllGather,
// ncclReduceScatter, ncclAllGatherConfig and ncclReduceScatterConfig (plugin/exports.map; nothing else of NCCL's)
// and forwards each call to the NCCL already loaded in the process: dlopen("libnccl.so.2", RTLD_NOLOAD) + dlsym of
// pncclXxx (nccl::loadedSymbol), resolved lazily on the first call. Never RTLD_NEXT: torch loads NCCL as a
// dependency of an RTLD_LOCAL extension, which RTLD_NEXT from a preloaded library does not see.
//
// NCCL_TIDE_ENABLE unset or 0: pure pass-through (the flag is read once and cached; no allocation, no other work).
// NCCL_TIDE_ENABLE=1: each call is classified (docs/usage.md "Eligibility") and the reason logged, then passed
// through unchanged: in 0.1 the TIDE data path is not wired into the interposer (it needs the NCCL binding's
// tideComm, pending its GPU validation), so one WARN says so and nothing is accelerated.
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

enum Entry : int { kAllGather = 0, kReduceScatter, kAllGatherConfig, kReduceScatterConfig, kNumEntries };
const char* const kRealNames[kNumEntries] = {"pncclAllGather", "pncclReduceScatter", "pncclAllGatherConfig",
                                             "pncclReduceScatterConfig"};
const char* const kPublicNames[kNumEntries] = {"ncclAllGather", "ncclReduceScatter", "ncclAllGatherConfig",
                                               "ncclReduceScatterConfig"};

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
              : "the loaded libnccl.so.2 does not export it (the Config collectives need NCCL >= 2.31.2)";
  } else if (ownAddress(p)) {
    why = "it resolves to libnccl-tide.so itself (is libnccl-tide.so installed as libnccl.so.2?)";
    p = nullptr;
  }
  if (p == nullptr) {
    if (!gWarned[e].exchange(true)) {
      TIDE_WARN(kComponent, "%s: cannot forward to NCCL's %s: %s; returning %s", kPublicNames[e], kRealNames[e], why,
                e >= kAllGatherConfig ? "ncclInvalidUsage" : "ncclSystemError");
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
    TIDE_INFO(kComponent, "NCCL_TIDE_ENABLE=1: ncclAllGather/ncclReduceScatter calls are classified (min bytes %llu)",
              static_cast<unsigned long long>(tide::params::interposerMinBytes()));
  }
  return v != 0;
}

// ncclDataType_t sizes (nccl.h): Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, Bfloat16,
// Float8e4m3, Float8e5m2.
size_t dtypeBytes(int dtype) {
  static const size_t kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return (dtype >= 0 && dtype < static_cast<int>(sizeof(kSizes) / sizeof(kSizes[0]))) ? kSizes[dtype] : 0;
}

enum Reason : int {
  kEligible = 0,
  kConfigCall,
  kUnknownDtype,
  kBelowThreshold,
  kRsOpNotSum,
  kRsDtypeNotFloat,
  kNumReasons
};
const char* const kReasonText[kNumReasons] = {
    "eligible by size, dtype and op (0.1: passed to NCCL anyway, the TIDE path is not available in this build)",
    "a ...Config call (per-collective config is honoured only by NCCL in 0.1)",
    "unknown ncclDataType_t",
    "smaller than NCCL_TIDE_ENABLE_MIN_BYTES",
    "reduce-scatter with an op other than ncclSum",
    "reduce-scatter in a type other than fp32/fp16/bf16",
};
std::atomic<bool> gReasonLogged[kNumReasons];
std::atomic<bool> gPathWarned{false};

// The eligibility decision (docs/usage.md). `bytes` is the size of the gathered output (AG) or of the full
// reduce-scatter input. Grouping cannot be seen from here (ncclGroupStart/End are not interposed), which is one of
// the reasons the 0.1 interposer takes no call.
void classify(Entry e, size_t count, int dtype, int op, ncclComm_t comm) {
  Reason r = kEligible;
  size_t elem = dtypeBytes(dtype);
  if (e == kAllGatherConfig || e == kReduceScatterConfig) {
    r = kConfigCall;
  } else if (elem == 0) {
    r = kUnknownDtype;
  } else if ((e == kReduceScatter) && op != 0) {
    r = kRsOpNotSum;
  } else if ((e == kReduceScatter) && dtype != 6 && dtype != 7 && dtype != 9) {
    r = kRsDtypeNotFloat;
  } else if (static_cast<unsigned __int128>(count) * elem < tide::params::interposerMinBytes()) {
    r = kBelowThreshold;  // per-rank bytes; a multi-rank call is larger still, this only under-counts
  }
  TIDE_TRACE(kComponent, "%s comm %p count %zu dtype %d: %s; passed to NCCL", kPublicNames[e], comm, count, dtype,
             kReasonText[r]);
  if (!gReasonLogged[r].exchange(true)) {
    TIDE_INFO(kComponent, "%s call classified: %s; passed to NCCL (each reason is logged once at INFO; "
              "NCCL_TIDE_DEBUG=TRACE logs every call)", kPublicNames[e], kReasonText[r]);
  }
  if (!gPathWarned.exchange(true)) {
    TIDE_WARN(kComponent, "NCCL_TIDE_ENABLE=1, but the TIDE path of the interposer is not available in this build "
              "(0.1): every ncclAllGather/ncclReduceScatter call is passed to NCCL unchanged");
  }
}

}  // namespace

extern "C" {

TIDE_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, int datatype,
                                       ncclComm_t comm, cudaStream_t stream) {
  if (__builtin_expect(enabled(), 0)) classify(kAllGather, sendcount, datatype, 0, comm);
  auto f = reinterpret_cast<AllGatherFn>(real(kAllGather));
  if (f == nullptr) return kSystemError;
  return f(sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

TIDE_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, int datatype,
                                           int op, ncclComm_t comm, cudaStream_t stream) {
  if (__builtin_expect(enabled(), 0)) classify(kReduceScatter, recvcount, datatype, op, comm);
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

}  // extern "C"
