// Flag writes by a one-warp kernel, for flag batches inside CUDA graphs (the RS's rounds and captures).
//
// Why: in a launched graph every memop node after the first costs the host about 0.8 us, a kernel node a few
// hundredths (benchmarks/host_cost_probe.cu, session 24 run 24.1), and a Llama-8B RS of 4 chunks on the token
// protocol carries 14 memop nodes per rank, 7 of them writes only. Waits stay memops (a spinning kernel would hold
// an SM); only write-only batches become kernels, and only in RS programs, which run a kernel anyway (the reduce):
// the all-gather stays free of SMs. Issued directly (not in a graph), a memop batch (1.8 us) is cheaper than a
// kernel launch (about 4), so direct issue keeps memops.
//
// Ordering, as a memop write's (CU_STREAM_WRITE_VALUE_DEFAULT), against the work before it: the kernel starts only
// after that work on its stream (or graph edge) has completed, and each store is a system-scope release after a
// system-scope fence. Not within the batch: a memop batch applies its writes one after another, the threads of one
// launch store in any order. So a batch may become a kernel only if its words are distinct (program_exec.cc checks
// at bind; the RS programs' write batches always are) and no reader relies on the order of two writes in it.
#ifndef TIDE_CUDA_SIGNAL_KERNEL_H_
#define TIDE_CUDA_SIGNAL_KERNEL_H_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tide.h"

namespace tide {
namespace cuda {

// The n 32-bit write operations of `writes` (a write-only memop batch's prebuilt parameters; device-visible
// addresses: own or peer-mapped flag words), in as many launches of at most kSignalsPerLaunch writes as needed.
constexpr int kSignalsPerLaunch = 32;  // one warp
tideResult_t enqueueSignals(cudaStream_t stream, const CUstreamBatchMemOpParams* writes, size_t n);

// Loads the kernel into the current device's context now (as preloadReduceKernels: a first launch under lazy
// loading waits for the device's work in flight, which may be flag waits nobody has satisfied yet).
tideResult_t preloadSignalKernel();

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_SIGNAL_KERNEL_H_
