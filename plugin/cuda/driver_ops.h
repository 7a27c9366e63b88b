// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Stream memory operations (flag writes and waits) through driver entry points resolved at run time.
//
// The library never links -lcuda: cuStreamBatchMemOp / cuStreamWriteValue32 / cuStreamWaitValue32 are looked up
// with cudaGetDriverEntryPointByVersion on first use (never at load time, so the library loads without a GPU).
// Waits use CU_STREAM_WAIT_VALUE_GEQ, which compares cyclically ((int32_t)(*addr - value) >= 0), so the epoch
// counters may wrap. Writes use the default flags (with a memory barrier: every write issued earlier in the stream,
// copies included, is visible before the flag is). CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER is not an option:
// cuStreamBatchMemOp is the v2 API, which does not support that flag (cuda.h; measured on an H100:
// CUDA_ERROR_INVALID_VALUE for a batch carrying it).
#ifndef TIDE_CUDA_DRIVER_OPS_H_
#define TIDE_CUDA_DRIVER_OPS_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "tide.h"

namespace tide {
namespace cuda {

// One flag operation: wait until *addr >= value (cyclic), or write value to *addr.
struct FlagOp {
  enum Kind { kWait, kWrite } kind;
  uint32_t* addr;
  uint32_t value;
};

// Resolves the entry points (once per process). tideUnsupported if the driver lacks them.
tideResult_t driverOpsInit();

// Whether `device` takes 64-bit operations in cuStreamBatchMemOp (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)
// and the driver has cuStreamBatchMemOp (token pairs, prog::FlagOp::pairNext, are issued only through it).
bool wideMemOps(int device);

// Enqueues ops on stream, in order, as one cuStreamBatchMemOp (falls back to one call per op).
tideResult_t enqueueFlagOps(cudaStream_t stream, const std::vector<FlagOp>& ops);

// The allocation holding device address p (cuMemGetAddressRange): true with its base and size; false if the driver
// cannot tell (or lacks the entry point). Legal during stream capture (no stream is touched).
bool addressRange(const void* p, uintptr_t* base, size_t* size);

// Whether `stream` belongs to the calling thread's current CUDA context (*inCurrent), and if not, the device of the
// stream's context (*device). Through cuStreamGetCtx, which is legal while the stream (or any other) is being
// captured into a CUDA graph; cudaStreamGetDevice (cuStreamGetDevice) is not, and invalidates a global-mode
// capture. tideInvalidArgument if the driver does not know the stream; what names the caller in messages.
tideResult_t streamContext(cudaStream_t stream, const char* what, bool* inCurrent, int* device);

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_DRIVER_OPS_H_
