// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Host-only multicast gate: reads the environment, never calls any CUDA API.
#include "multicast.h"

#include <cstdlib>

#include "errors.h"
#include "log.h"
#include "params.h"

namespace tide {
namespace {
constexpr const char* kComponent = "Multicast";
}  // namespace

tideResult_t multicastAllowed(int* allowed) {
  if (allowed == nullptr) return fail(tideInvalidArgument, kComponent, "allowed is NULL");
  const char* tide = getenv("NCCL_TIDE_NVLS");
  bool requested = false;
  if (tide != nullptr && !params::parseBool(tide, &requested)) {
    return fail(tideInvalidArgument, kComponent, "NCCL_TIDE_NVLS='%s' is not valid: expected 0 or 1", tide);
  }
  const char* reason = nullptr;
  const char* nccl = getenv("NCCL_NVLS_ENABLE");
  int64_t ncclValue = 0;
  if (!requested) {
    reason = "NCCL_TIDE_NVLS is not 1";
  } else if (nccl != nullptr && (!params::parseInt64(nccl, &ncclValue) || ncclValue == 0)) {
    // Anything but a clean nonzero integer counts as "disabled": the conservative reading of NCCL's own parse.
    reason = "NCCL_NVLS_ENABLE disables NVLS";
  } else if (getenv("TORCH_SYMM_MEM_DISABLE_MULTICAST") != nullptr) {
    reason = "TORCH_SYMM_MEM_DISABLE_MULTICAST is set";
  } else if (getenv("NVSHMEM_DISABLE_NVLS") != nullptr) {
    reason = "NVSHMEM_DISABLE_NVLS is set";
  }
  *allowed = reason == nullptr ? 1 : 0;
  TIDE_TRACE(kComponent, "multicast gate %s%s%s", reason ? "closed: " : "open", reason ? reason : "", "");
  return tideSuccess;
}

}  // namespace tide
