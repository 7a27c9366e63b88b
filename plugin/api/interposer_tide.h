// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The TIDE path of the LD_PRELOAD interposer (plugin/api/interposer.cc decides eligibility; this runs the call).
//
// One TIDE comm per ncclComm_t, created collectively on the first eligible call (NCCL semantics: every rank makes
// that call) and released when the application finalizes, destroys or aborts the NCCL communicator. Any failure
// turns TIDE off for that communicator (one WARN with the reason); the call and every later one go to NCCL.
#ifndef TIDE_API_INTERPOSER_TIDE_H_
#define TIDE_API_INTERPOSER_TIDE_H_

#include <cstddef>

#include "interposer_counters.h"
#include "interposer_ops.h"
#include "tide.h"

namespace tide {
namespace interposer {

// What the try functions return when the caller must pass the call to NCCL unchanged (TIDE is off for this comm, or
// this call cannot be taken; logged). Any other value is the ncclResult_t of the call, which TIDE took: 0, or
// ncclUnhandledCudaError when a CUDA call failed after the peers were already committed to TIDE's collective (NCCL
// can then no longer take it without hanging them).
constexpr int kPassToNccl = -1;
constexpr int kNcclUnhandledCudaError = 1;

// Flat all-gather of `bytes` per rank. On kPassToNccl, *why says why.
int tryAllGather(const void* sendbuff, void* recvbuff, size_t bytes, void* ncclComm, void* stream, Reason* why);

// Flat reduce-scatter of `count` elements of ncclDtype (fp32, fp16 or bf16) per rank, fp32 accumulation, with the
// op as resolved (sum, premultiplied sum, or NCCL's average: a premultiply by T(1/W)); out of place or in NCCL's
// in-place form (recvbuff = sendbuff + rank * count elements). On kPassToNccl, *why says why.
int tryReduceScatter(const void* sendbuff, void* recvbuff, size_t count, int ncclDtype, const ops::Resolved& op,
                     void* ncclComm, void* stream, Reason* why);

// The stream is being captured into a CUDA graph (false in a build without CUDA).
bool streamCapturing(void* stream);

// Called before NCCL deregisters the application's window at `base` (nullptr: a window the interposer never
// recorded): the comm forgets the peers' addresses it learnt of it.
void forgetRegion(void* ncclComm, void* base);

// Called before NCCL finalizes or destroys (collective: TIDE's resources are released with the peers) or aborts
// (not collective: nothing that could wait for a peer is done, TIDE's memory of that comm is left allocated) the
// communicator. A no-op for a communicator TIDE never touched.
void releaseComm(void* ncclComm, bool collective);

}  // namespace interposer
}  // namespace tide

#endif  // TIDE_API_INTERPOSER_TIDE_H_
