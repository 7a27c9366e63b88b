// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The NCCL library this process already uses, resolved at run time by version (never linked, never loaded twice).
//
// libnccl-tide.so does not link libnccl: the framework (torch, ...) has loaded one already, and a second copy would
// have its own communicators and globals. resolve() finds it with dlopen("libnccl.so.2", RTLD_NOLOAD), reads
// ncclGetVersion, refuses anything older than 2.28 and, for 2.33 or newer, warns and behaves as for 2.32. Entry
// points newer than 2.28 are looked up one by one with dlsym; a feature is present only if all of its symbols are,
// and a missing one is never called.
//
// No NCCL header is included: the few types used are declared here from NCCL's public API (nccl.h), so the same
// source builds against 2.28.9 and 2.32.3 headers (or none). Host-only: no CUDA either.
#ifndef TIDE_NCCL_NCCL_LIB_H_
#define TIDE_NCCL_NCCL_LIB_H_

#include <cstddef>
#include <cstdint>

#include "tide.h"

namespace tide {
namespace nccl {

// Public NCCL types, as declared by nccl.h (ABI-stable since 2.x): enums are ints, handles are pointers.
using ncclResult_t = int;
using ncclComm_t = void*;
using ncclWindow_t = void*;
using cudaStream_t = void*;
constexpr int kNcclSuccess = 0;
constexpr int kNcclInProgress = 7;
constexpr int kNcclUint8 = 1;  // ncclDataType_t ncclUint8
// ncclCommWindowRegister's winFlags: NCCL_WIN_DEFAULT. The window provider registers plain windows: peer pointers
// need nothing more, while NCCL_WIN_COLL_SYMMETRIC sets up NCCL's symmetric kernels, which on an NVLS system create
// an NVLink multicast team (TIDE never causes multicast objects to be created).
constexpr int kNcclWinDefault = 0;

// The leading fields of ncclConfig_t (nccl.h), unchanged since NCCL 2.14: what TIDE passes to ncclCommSplit. NCCL
// copies `size` bytes of it and gives every field that `version` predates its default, so this prefix, with version
// 2.14.0, is a valid config for every NCCL TIDE supports: a blocking communicator, everything else NCCL's default.
struct ConfigPrefix {
  size_t size = sizeof(ConfigPrefix);
  unsigned int magic = 0xcafebeef;  // NCCL_API_MAGIC
  unsigned int version = 21400;     // NCCL_VERSION(2, 14, 0): the fields below, nothing newer
  int blocking = 1;
  int cgaClusterSize = INT32_MIN;  // NCCL_CONFIG_UNDEF_INT (and a 2.14 config's is reset to the default anyway)
};

// Feature bits (same values as TIDE_NCCL_FEATURE_* in tide.h).
enum Feature : uint64_t {
  kMemAlloc = 1u << 0,         // ncclMemAlloc, ncclMemFree (2.19)
  kWindowRegister = 1u << 1,   // ncclCommWindowRegister, ncclCommWindowDeregister (2.27.3)
  kWinGetUserPtr = 1u << 2,    // ncclWinGetUserPtr (2.29.2)
  kLsaPointers = 1u << 3,      // ncclGetLsaDevicePointer, ncclGetPeerDevicePointer (2.29.2)
  kLsaMultimem = 1u << 4,      // ncclGetLsaMultimemDevicePointer (2.29.2)
  kPutSignal = 1u << 5,        // ncclPutSignal, ncclSignal, ncclWaitSignal (2.29.2)
  kQueryProperties = 1u << 6,  // ncclCommQueryProperties (2.29.2)
  kCollConfig = 1u << 7,       // ncclAllGatherConfig, ncclReduceScatterConfig (2.31.2)
};

struct Lib {
  void* handle = nullptr;
  int runtimeVersion = 0;    // ncclGetVersion, e.g. 22809
  int effectiveVersion = 0;  // runtimeVersion, or 2.32.99 for a newer minor (behaves as 2.32)
  int major = 0, minor = 0, patch = 0;
  uint64_t features = 0;
  const char* provider = "";   // the provider tideCommCreate tries with NCCL_TIDE_PROVIDER=auto: "window" or "ipc"
  // >= 2.29.2 with ncclMemAlloc/Free, ncclCommWindowRegister/Deregister, ncclGetPeerDevicePointer and
  // ncclCommSplit/Destroy/Abort: what the window provider needs (plugin/cuda/window_provider.h).
  bool windowCapable = false;
  const char* transport = "";  // "putsignal" or "sendrecv"

  // 2.28 base (required).
  ncclResult_t (*getVersion)(int*) = nullptr;
  const char* (*getErrorString)(ncclResult_t) = nullptr;
  ncclResult_t (*commCount)(ncclComm_t, int*) = nullptr;
  ncclResult_t (*commUserRank)(ncclComm_t, int*) = nullptr;
  ncclResult_t (*commCuDevice)(ncclComm_t, int*) = nullptr;
  ncclResult_t (*commGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*allGather)(const void*, void*, size_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*send)(const void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*recv)(void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*groupStart)() = nullptr;
  ncclResult_t (*groupEnd)() = nullptr;
  // In every supported NCCL, needed only by the window provider (a communicator per TIDE node).
  ncclResult_t (*commSplit)(ncclComm_t, int, int, ncclComm_t*, ConfigPrefix*) = nullptr;
  ncclResult_t (*commDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*commAbort)(ncclComm_t) = nullptr;
  // Optional, by feature.
  ncclResult_t (*memAlloc)(void**, size_t) = nullptr;
  ncclResult_t (*memFree)(void*) = nullptr;
  ncclResult_t (*commWindowRegister)(ncclComm_t, void*, size_t, ncclWindow_t*, int) = nullptr;
  ncclResult_t (*commWindowDeregister)(ncclComm_t, ncclWindow_t) = nullptr;
  ncclResult_t (*winGetUserPtr)(ncclComm_t, ncclWindow_t, void**) = nullptr;
  ncclResult_t (*getLsaDevicePointer)(ncclWindow_t, size_t, int, void**) = nullptr;
  ncclResult_t (*getPeerDevicePointer)(ncclWindow_t, size_t, int, void**) = nullptr;
  ncclResult_t (*getLsaMultimemDevicePointer)(ncclWindow_t, size_t, void**) = nullptr;
  ncclResult_t (*putSignal)(const void*, size_t, int, int, ncclWindow_t, size_t, int, int, unsigned int, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*signal)(int, int, int, unsigned int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*waitSignal)(int, void*, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*commQueryProperties)(ncclComm_t, void*) = nullptr;
  void* allGatherConfig = nullptr;      // present-only (TIDE does not call the per-collective config API yet)
  void* reduceScatterConfig = nullptr;  // present-only

  bool has(Feature f) const { return (features & f) == f; }
};

// Resolves the process's NCCL once (a success is cached; a failure is retried on the next call, e.g. after the
// framework has loaded NCCL). Errors: tideUnsupported (no libnccl loaded, version out of range, a 2.28 symbol
// missing), with a message saying what to do.
tideResult_t resolve(const Lib** out);

// One symbol of the NCCL already loaded in this process (the same dlopen("libnccl.so.2", RTLD_NOLOAD) as resolve(),
// without its version gate), or nullptr when no libnccl is loaded or it lacks `name`. For the interposer
// (plugin/api/interposer.cc), which forwards to the caller's NCCL whatever its version.
void* loadedSymbol(const char* name);

// NCCL_VERSION_CODE of the nccl.h seen at build time (0 if the build had none).
int headerVersion();

// "ncclXxx failed: <ncclGetErrorString> (<code>)" as tideNcclError.
tideResult_t ncclFail(const Lib& lib, ncclResult_t r, const char* what);

// NCCL's final result of a call `what` on `comm` that returned r: for a nonblocking communicator's ncclInProgress,
// polls ncclCommGetAsyncError until the operation settles, at most NCCL_TIDE_TIMEOUT_MS (0: as long as it takes).
// tideSuccess with *out that result (kNcclSuccess or NCCL's error), or tideTimeout / the failed query's error.
tideResult_t settledResult(const Lib& lib, ncclComm_t comm, ncclResult_t r, const char* what, ncclResult_t* out);

// settledResult as a TIDE result: tideSuccess, or ncclFail's error for NCCL's.
tideResult_t settle(const Lib& lib, ncclComm_t comm, ncclResult_t r, const char* what);

}  // namespace nccl
}  // namespace tide

#endif  // TIDE_NCCL_NCCL_LIB_H_
