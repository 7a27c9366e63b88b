// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "nccl_lib.h"

#include <dlfcn.h>
#include <sched.h>

#include <chrono>
#include <mutex>

#include "../core/errors.h"
#include "../core/fork_guard.h"
#include "../core/log.h"
#include "../core/params.h"

namespace tide {
namespace nccl {
namespace {

constexpr const char* kComponent = "Nccl";
constexpr int kMinVersion = 22800;     // 2.28.0
constexpr int kNewestKnownMinor = 32;  // 2.32.x
constexpr int kWindowVersion = 22902;  // 2.29.2: ncclGetPeerDevicePointer

std::mutex gMu;
Lib gLib;
bool gResolved = false;
[[maybe_unused]] const bool gForkGuarded = forkguard::guard(forkguard::kNcclBinding, &gMu);

int versionCode(int major, int minor, int patch) {
  return (major <= 2 && minor <= 8) ? major * 1000 + minor * 100 + patch : major * 10000 + minor * 100 + patch;
}

template <typename F>
void sym(void* handle, const char* name, F* out) {
  dlerror();
  *out = reinterpret_cast<F>(dlsym(handle, name));
}

// The NCCL of this process: never load one ourselves (a second copy would not know the caller's communicators).
// RTLD_NOLOAD finds it whether it was loaded RTLD_GLOBAL or RTLD_LOCAL (torch), unlike RTLD_NEXT.
void* openLoaded() {
  void* h = dlopen("libnccl.so.2", RTLD_NOLOAD | RTLD_NOW);
  if (h == nullptr) h = dlopen("libnccl.so", RTLD_NOLOAD | RTLD_NOW);
  return h;
}

tideResult_t load(Lib* lib) {
  void* h = openLoaded();
  if (h == nullptr) {
    return fail(tideUnsupported, kComponent,
                "no NCCL library (libnccl.so.2) is loaded in this process; TIDE uses the NCCL of the framework and "
                "never loads a second copy: import torch (with CUDA) or load libnccl.so.2 before creating a TIDE "
                "communicator");
  }
  lib->handle = h;
  sym(h, "ncclGetVersion", &lib->getVersion);
  if (lib->getVersion == nullptr) {
    return fail(tideUnsupported, kComponent, "the loaded libnccl.so.2 has no ncclGetVersion: not an NCCL library");
  }
  int code = 0;
  if (lib->getVersion(&code) != kNcclSuccess || code <= 0) {
    return fail(tideUnsupported, kComponent, "ncclGetVersion of the loaded libnccl.so.2 failed");
  }
  lib->runtimeVersion = code;
  if (code < 10000) {  // encoding of 2.8 and older: X*1000 + Y*100 + Z
    lib->major = code / 1000;
    lib->minor = (code % 1000) / 100;
    lib->patch = code % 100;
  } else {
    lib->major = code / 10000;
    lib->minor = (code % 10000) / 100;
    lib->patch = code % 100;
  }
  if (lib->major > 2) {  // a newer major, not an old NCCL: "upgrade" would be wrong advice
    return fail(tideUnsupported, kComponent,
                "the loaded NCCL is %d.%d.%d (code %d), a major version newer than TIDE was tested with; TIDE "
                "supports NCCL 2.28.x through 2.32.x: load an NCCL 2.x in that range (pip install "
                "\"nvidia-nccl-cu13<3\", or a PyTorch built with one)",
                lib->major, lib->minor, lib->patch, code);
  }
  if (lib->major != 2 || code < kMinVersion) {
    return fail(tideUnsupported, kComponent,
                "the loaded NCCL is %d.%d.%d (code %d); TIDE supports NCCL 2.28.x through 2.32.x: upgrade NCCL "
                "(pip install -U nvidia-nccl-cu13, or a PyTorch built with NCCL >= 2.28)",
                lib->major, lib->minor, lib->patch, code);
  }
  lib->effectiveVersion = code;
  if (lib->minor > kNewestKnownMinor) {
    TIDE_WARN(kComponent,
              "NCCL %d.%d.%d is newer than the newest version TIDE knows (2.%d.x); treating it as 2.%d (features "
              "are still looked up symbol by symbol)",
              lib->major, lib->minor, lib->patch, kNewestKnownMinor, kNewestKnownMinor);
    lib->effectiveVersion = versionCode(2, kNewestKnownMinor, 99);
  }

  // 2.28 base: all required.
  struct Req {
    const char* name;
    bool ok;
  };
  sym(h, "ncclGetErrorString", &lib->getErrorString);
  sym(h, "ncclCommCount", &lib->commCount);
  sym(h, "ncclCommUserRank", &lib->commUserRank);
  sym(h, "ncclCommCuDevice", &lib->commCuDevice);
  sym(h, "ncclCommGetAsyncError", &lib->commGetAsyncError);
  sym(h, "ncclAllGather", &lib->allGather);
  sym(h, "ncclSend", &lib->send);
  sym(h, "ncclRecv", &lib->recv);
  sym(h, "ncclGroupStart", &lib->groupStart);
  sym(h, "ncclGroupEnd", &lib->groupEnd);
  sym(h, "ncclCommSplit", &lib->commSplit);
  sym(h, "ncclCommDestroy", &lib->commDestroy);
  sym(h, "ncclCommAbort", &lib->commAbort);
  const Req required[] = {
      {"ncclGetErrorString", lib->getErrorString != nullptr}, {"ncclCommCount", lib->commCount != nullptr},
      {"ncclCommUserRank", lib->commUserRank != nullptr},     {"ncclCommCuDevice", lib->commCuDevice != nullptr},
      {"ncclCommGetAsyncError", lib->commGetAsyncError != nullptr},
      {"ncclAllGather", lib->allGather != nullptr},           {"ncclSend", lib->send != nullptr},
      {"ncclRecv", lib->recv != nullptr},                     {"ncclGroupStart", lib->groupStart != nullptr},
      {"ncclGroupEnd", lib->groupEnd != nullptr},
  };
  for (const Req& r : required) {
    if (!r.ok) {
      return fail(tideUnsupported, kComponent, "the loaded NCCL %d.%d.%d does not export %s (required since 2.28)",
                  lib->major, lib->minor, lib->patch, r.name);
    }
  }

  // Optional entry points, by feature: a feature counts only if every one of its symbols is there.
  sym(h, "ncclMemAlloc", &lib->memAlloc);
  sym(h, "ncclMemFree", &lib->memFree);
  if (lib->memAlloc && lib->memFree) lib->features |= kMemAlloc;
  sym(h, "ncclCommWindowRegister", &lib->commWindowRegister);
  sym(h, "ncclCommWindowDeregister", &lib->commWindowDeregister);
  if (lib->commWindowRegister && lib->commWindowDeregister) lib->features |= kWindowRegister;
  sym(h, "ncclWinGetUserPtr", &lib->winGetUserPtr);
  if (lib->winGetUserPtr) lib->features |= kWinGetUserPtr;
  sym(h, "ncclGetLsaDevicePointer", &lib->getLsaDevicePointer);
  sym(h, "ncclGetPeerDevicePointer", &lib->getPeerDevicePointer);
  if (lib->getLsaDevicePointer && lib->getPeerDevicePointer) lib->features |= kLsaPointers;
  sym(h, "ncclGetLsaMultimemDevicePointer", &lib->getLsaMultimemDevicePointer);
  if (lib->getLsaMultimemDevicePointer) lib->features |= kLsaMultimem;
  sym(h, "ncclPutSignal", &lib->putSignal);
  sym(h, "ncclSignal", &lib->signal);
  sym(h, "ncclWaitSignal", &lib->waitSignal);
  if (lib->putSignal && lib->signal && lib->waitSignal) lib->features |= kPutSignal;
  sym(h, "ncclCommQueryProperties", &lib->commQueryProperties);
  if (lib->commQueryProperties) lib->features |= kQueryProperties;
  sym(h, "ncclAllGatherConfig", &lib->allGatherConfig);
  sym(h, "ncclReduceScatterConfig", &lib->reduceScatterConfig);
  if (lib->allGatherConfig && lib->reduceScatterConfig) lib->features |= kCollConfig;

  // Provider: windows need the host-side peer pointer queries of 2.29.2, and a communicator per TIDE node when a comm
  // has several (windowCapable); NCCL_TIDE_PROVIDER=auto tries them there (plugin/nccl/provider_choice.h), CUDA IPC
  // otherwise. Between nodes: grouped ncclSend / ncclRecv (the one transport built: one-sided puts are not).
  const uint64_t windowNeeds = kMemAlloc | kWindowRegister | kLsaPointers;
  lib->windowCapable = lib->effectiveVersion >= kWindowVersion && lib->has(static_cast<Feature>(windowNeeds)) &&
                       lib->commSplit && lib->commDestroy && lib->commAbort;
  lib->provider = lib->windowCapable ? "window" : "ipc";
  lib->transport = "sendrecv";

  Dl_info info{};
  const char* path = (dladdr(reinterpret_cast<void*>(lib->getVersion), &info) && info.dli_fname) ? info.dli_fname
                                                                                                  : "libnccl.so.2";
  int hv = headerVersion();
  TIDE_INFO(kComponent,
            "NCCL library %d.%d.%d (code %d) at %s; headers at build time %d; features 0x%llx; provider %s, "
            "inter-node transport %s",
            lib->major, lib->minor, lib->patch, code, path, hv, static_cast<unsigned long long>(lib->features),
            lib->provider, lib->transport);
  return tideSuccess;
}

}  // namespace

int headerVersion() {
#ifdef TIDE_NCCL_HEADER_VERSION
  return TIDE_NCCL_HEADER_VERSION;
#else
  return 0;
#endif
}

tideResult_t resolve(const Lib** out) {
  std::lock_guard<std::mutex> lock(gMu);
  if (!gResolved) {
    Lib lib;
    tideResult_t r = load(&lib);
    if (r != tideSuccess) {
      if (lib.handle) dlclose(lib.handle);  // drops only the reference RTLD_NOLOAD took
      return r;
    }
    gLib = lib;
    gResolved = true;
  }
  *out = &gLib;
  return tideSuccess;
}

void* loadedSymbol(const char* name) {
  void* h = openLoaded();
  if (h == nullptr) return nullptr;
  dlerror();
  void* p = dlsym(h, name);
  // The reference RTLD_NOLOAD took is kept on success: the caller keeps using the function.
  if (p == nullptr) dlclose(h);
  return p;
}

tideResult_t ncclFail(const Lib& lib, ncclResult_t r, const char* what) {
  const char* s = lib.getErrorString ? lib.getErrorString(r) : nullptr;
  return fail(tideNcclError, kComponent, "%s failed: %s (NCCL error %d)", what, s ? s : "unknown error", r);
}

tideResult_t settledResult(const Lib& lib, ncclComm_t comm, ncclResult_t r, const char* what, ncclResult_t* out) {
  const uint64_t boundMs = params::timeoutMs();
  const auto start = std::chrono::steady_clock::now();
  while (r == kNcclInProgress) {
    if (boundMs > 0 && std::chrono::steady_clock::now() - start > std::chrono::milliseconds(boundMs)) {
      return fail(tideTimeout, kComponent, "%s still in progress after %llu ms (NCCL_TIDE_TIMEOUT_MS)", what,
                  static_cast<unsigned long long>(boundMs));
    }
    sched_yield();
    const ncclResult_t q = lib.commGetAsyncError(comm, &r);
    if (q != kNcclSuccess) return ncclFail(lib, q, "ncclCommGetAsyncError");
  }
  *out = r;
  return tideSuccess;
}

tideResult_t settle(const Lib& lib, ncclComm_t comm, ncclResult_t r, const char* what) {
  ncclResult_t settled = kNcclSuccess;
  TIDE_CHECK(settledResult(lib, comm, r, what, &settled));
  return settled == kNcclSuccess ? tideSuccess : ncclFail(lib, settled, what);
}

}  // namespace nccl
}  // namespace tide
