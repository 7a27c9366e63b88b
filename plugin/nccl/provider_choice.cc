// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "provider_choice.h"

#include <cstdio>

#include "../core/errors.h"

namespace tide {
namespace nccl {
namespace {

constexpr const char* kComponent = "Nccl";

// Why `lib` cannot hold windows (empty when it can): its version, or the entry points it lacks.
void windowGap(const Lib& lib, char* out, size_t len) {
  out[0] = '\0';
  if (lib.windowCapable) return;
  if (lib.effectiveVersion < 22902) {
    snprintf(out, len, "NCCL %d.%d.%d is older than 2.29.2 (no ncclGetPeerDevicePointer)", lib.major, lib.minor,
             lib.patch);
    return;
  }
  const struct {
    const char* name;
    bool present;
  } needs[] = {{"ncclMemAlloc/ncclMemFree", lib.has(kMemAlloc)},
               {"ncclCommWindowRegister/ncclCommWindowDeregister", lib.has(kWindowRegister)},
               {"ncclGetPeerDevicePointer", lib.has(kLsaPointers)},
               {"ncclCommSplit", lib.commSplit != nullptr},
               {"ncclCommDestroy", lib.commDestroy != nullptr},
               {"ncclCommAbort", lib.commAbort != nullptr}};
  size_t used = static_cast<size_t>(
      snprintf(out, len, "NCCL %d.%d.%d does not export", lib.major, lib.minor, lib.patch));
  for (const auto& n : needs) {
    if (n.present || used >= len) continue;
    used += static_cast<size_t>(snprintf(out + used, len - used, " %s", n.name));
  }
}

}  // namespace

const char* providerName(ProviderKind k) { return k == ProviderKind::kWindow ? "window" : "ipc"; }

tideResult_t chooseProvider(params::ProviderSetting setting, const Lib* lib, ProviderChoice* out) {
  *out = ProviderChoice{};
  char gap[192] = {0};
  if (lib == nullptr) {
    snprintf(gap, sizeof(gap), "a comm on a caller's bootstrap has no NCCL communicator to register windows on");
  } else {
    windowGap(*lib, gap, sizeof(gap));
  }
  switch (setting) {
    case params::kProviderIpc:
      out->forced = true;
      snprintf(out->why, sizeof(out->why), "NCCL_TIDE_PROVIDER=ipc");
      return tideSuccess;
    case params::kProviderWindow:
      if (gap[0] != '\0') {
        return fail(tideUnsupported, kComponent,
                    "NCCL_TIDE_PROVIDER=window: the window provider needs NCCL >= 2.29.2 with ncclMemAlloc, "
                    "ncclCommWindowRegister and ncclGetPeerDevicePointer, on a comm created on an NCCL communicator "
                    "(tideCommCreate), but %s; unset NCCL_TIDE_PROVIDER (auto) or set ipc",
                    gap);
      }
      out->kind = ProviderKind::kWindow;
      out->forced = true;
      snprintf(out->why, sizeof(out->why), "NCCL_TIDE_PROVIDER=window");
      return tideSuccess;
    case params::kProviderAuto:
    default:
      if (gap[0] != '\0') {
        snprintf(out->why, sizeof(out->why), "%s", gap);
        return tideSuccess;
      }
      out->kind = ProviderKind::kWindow;
      snprintf(out->why, sizeof(out->why), "NCCL %d.%d.%d has windows with host-side peer pointers (>= 2.29.2)",
               lib->major, lib->minor, lib->patch);
      return tideSuccess;
  }
}

tideResult_t windowFallback(const ProviderChoice& choice, const std::string& unavailable, std::string* why) {
  if (choice.forced) {
    return fail(tideUnsupported, kComponent,
                "NCCL_TIDE_PROVIDER=window: %s; unset NCCL_TIDE_PROVIDER (auto) to use CUDA IPC there, or set ipc",
                unavailable.c_str());
  }
  *why = "NCCL has no windows for this comm's TIDE nodes: " + unavailable;
  return tideSuccess;
}

}  // namespace nccl
}  // namespace tide
