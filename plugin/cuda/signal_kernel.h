// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Flag writes by a one-warp kernel, for flag batches inside CUDA graphs (the RS's rounds and captures; the AG's only
// where a test build's NCCL_TIDE_AG_SIGNAL_KERNELS=1 selects it: params.h).
//
// Why: in a launched graph every memop node after the first costs the host about 0.8 us and every memop operation
// about 0.25 (a replay census of benchmarks/host_issue.py), a kernel node a few hundredths
// (benchmarks/host_cost_probe.cu). Waits stay memops (a spinning kernel would hold an SM); only writes become kernels: a batch's trailing
// writes (prog::kernelTail). A one-warp kernel of a few stores is the only SM work this puts on the all-gather.
// Issued directly (not in a graph), a memop batch (1.8 us) is cheaper than a kernel launch (about 4), so direct
// issue keeps memops.
//
// Ordering, as a memop write's (CU_STREAM_WRITE_VALUE_DEFAULT), against the work before it: the kernel starts only
// after that work on its stream (or graph edge) has completed, and each store is a system-scope release after a
// system-scope fence. Within the batch only as `ordered` says: a memop batch applies its writes one after another,
// the threads of one launch store in any order. So only a batch's trailing writes to distinct words
// (prog::kernelTail, at bind) may become a kernel, the waits and writes before them staying memops, and no reader
// may rely on the order of two of them beyond the ordered prefix (tests/native/program_model.cc --kernel-order).
#ifndef TIDE_CUDA_SIGNAL_KERNEL_H_
#define TIDE_CUDA_SIGNAL_KERNEL_H_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tide.h"

namespace tide {
namespace cuda {

// The n write operations of `writes` (prebuilt memop parameters, 32-bit or 64-bit (a token pair: two stores);
// device-visible addresses: own or peer-mapped flag words), in as many launches of at most kSignalsPerLaunch stores
// as needed. The first `ordered` writes are stored, and fenced, before any of the others (prog::kernelTail: a
// batch's resets of its own tokens before the tokens it sends); within either part, in no particular order.
constexpr int kSignalsPerLaunch = 32;  // one warp
tideResult_t enqueueSignals(cudaStream_t stream, const CUstreamBatchMemOpParams* writes, size_t n, size_t ordered);

// Loads the kernel into the current device's context now (as preloadReduceKernels: a first launch under lazy
// loading waits for the device's work in flight, which may be flag waits nobody has satisfied yet).
tideResult_t preloadSignalKernel();

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_SIGNAL_KERNEL_H_
