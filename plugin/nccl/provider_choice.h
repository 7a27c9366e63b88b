// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Which provider a comm keeps the memory of its node's ranks in (plugin/cuda/provider.h), from NCCL_TIDE_PROVIDER
// and what the loaded NCCL offers. Host-only, so that the choice and its refusals are testable without a GPU
// (tests/native/nccl_windows_test.cc against stub libnccl builds).
//
//   ipc     TIDE's own cudaMalloc memory, mapped by the node's ranks through CUDA IPC (every NCCL; bootstrap comms).
//   window  ncclMemAlloc memory registered with ncclCommWindowRegister, the peers' addresses from
//           ncclGetPeerDevicePointer (NCCL >= 2.29.2; only on an NCCL communicator).
//
// auto picks window where the NCCL has it, else ipc. A window choice is a first try: tideCommCreate falls back to
// ipc, on every rank alike, when NCCL gives no window or peer address for the node's ranks (WindowProvider::create,
// plugin/nccl/window_memory.h); a forced window fails there instead (windowFallback).
#ifndef TIDE_NCCL_PROVIDER_CHOICE_H_
#define TIDE_NCCL_PROVIDER_CHOICE_H_

#include <cstddef>
#include <string>

#include "../core/params.h"
#include "nccl_lib.h"

namespace tide {
namespace nccl {

enum class ProviderKind { kIpc = 0, kWindow = 1 };

// "ipc" or "window".
const char* providerName(ProviderKind k);

struct ProviderChoice {
  ProviderKind kind = ProviderKind::kIpc;
  bool forced = false;  // NCCL_TIDE_PROVIDER named it: no fallback
  char why[256] = {0};  // for the INFO line: why this provider
};

// The provider for `setting` on a comm over an NCCL communicator (lib: the process's NCCL) or, with lib == nullptr,
// on a caller's bootstrap. tideUnsupported (saying what to change) for window forced where it cannot be: NCCL older
// than 2.29.2 or without the window entry points, or a bootstrap comm.
tideResult_t chooseProvider(params::ProviderSetting setting, const Lib* lib, ProviderChoice* out);

// After a window choice found no windows for the comm's nodes (`unavailable`: the NCCL call that said no, with its
// result): auto falls back to ipc, *why then saying why for tideCommCreate's INFO line; a forced window fails with
// tideUnsupported naming the same call and saying to unset NCCL_TIDE_PROVIDER. Every rank gets the same outcome.
tideResult_t windowFallback(const ProviderChoice& choice, const std::string& unavailable, std::string* why);

}  // namespace nccl
}  // namespace tide

#endif  // TIDE_NCCL_PROVIDER_CHOICE_H_
