// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The CUDA executors of TIDE-AG and TIDE-RS. Both validate everything before enqueueing anything, then issue the
// layout's step program (program_exec.h) on the caller's stream and the comm's internal stream (ordered by flags).
#ifndef TIDE_CUDA_EXECUTORS_H_
#define TIDE_CUDA_EXECUTORS_H_

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "comm.h"

namespace tide {
namespace cuda {

// cap: whether `stream` is being captured into a CUDA graph (queryCapture). Captured calls are first refused if the
// provider cannot capture (checkCapturable), then validated like eager ones (with capture-safe queries), then
// refused if their shape cannot be captured (tideUnsupported, nothing enqueued) or issued as the replay-safe
// program (prog::Mode::kCaptured). They skip the provider's per-call stream/health check (checkStream: IPC's parent-NCCL
// async-error query). Eager calls (cap.active false) of a program that can be captured run the same token program
// when NCCL_TIDE_EAGER_GRAPHS is on (eagerTokens, BoundProgram::issueTokens: replayed from a graph the library
// captured); the others, and every call with the switch off, run the epoch programs.
tideResult_t allGather(tideComm* comm, tideLayout_t layout, const void* sendbuff, const void* const* shardPtrs,
                       void* slot, cudaStream_t stream, const CaptureState& cap);

tideResult_t reduceScatter(tideComm* comm, tideLayout_t layout, const void* const* grads, void* out,
                           tideDataType_t outType, tideRedOp_t op, float scale, void* staging, cudaStream_t stream,
                           const CaptureState& cap);

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_EXECUTORS_H_
