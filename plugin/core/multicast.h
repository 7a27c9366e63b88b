// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The NVLink multicast gate (tideMulticastAllowed, include/tide.h). TIDE never creates multicast objects; it may
// use multicast addresses that NCCL hands out, and only when this gate is open.
#ifndef TIDE_CORE_MULTICAST_H_
#define TIDE_CORE_MULTICAST_H_

#include "tide.h"

namespace tide {

// *allowed = 1 iff NCCL_NVLS_ENABLE is unset or a nonzero integer, TORCH_SYMM_MEM_DISABLE_MULTICAST and
// NVSHMEM_DISABLE_NVLS are unset (set to anything, even "0", closes the gate), and NCCL_TIDE_NVLS=1.
// The variables are re-read at every call so that disabling always wins. An NCCL_TIDE_NVLS that does not parse is
// tideInvalidArgument (and *allowed is not written).
tideResult_t multicastAllowed(int* allowed);

}  // namespace tide

#endif  // TIDE_CORE_MULTICAST_H_
