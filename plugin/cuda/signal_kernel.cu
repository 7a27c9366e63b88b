#include "signal_kernel.h"

#include "../core/errors.h"
#include "cuda_check.h"

namespace tide {
namespace cuda {
namespace {

struct SignalArgs {
  uint32_t* addr[kSignalsPerLaunch];
  uint32_t value[kSignalsPerLaunch];
  int n;
};

__global__ void __launch_bounds__(kSignalsPerLaunch) signalKernel(SignalArgs a) {
  const int i = threadIdx.x;
  if (i >= a.n) return;
  __threadfence_system();
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(a.addr[i]), "r"(a.value[i]) : "memory");
}

}  // namespace

tideResult_t enqueueSignals(cudaStream_t stream, const CUstreamBatchMemOpParams* writes, size_t n) {
  for (size_t at = 0; at < n; at += kSignalsPerLaunch) {
    SignalArgs a;
    a.n = static_cast<int>(n - at < static_cast<size_t>(kSignalsPerLaunch) ? n - at : kSignalsPerLaunch);
    for (int i = 0; i < a.n; ++i) {
      a.addr[i] = reinterpret_cast<uint32_t*>(static_cast<uintptr_t>(writes[at + i].writeValue.address));
      a.value[i] = writes[at + i].writeValue.value;
    }
    signalKernel<<<1, kSignalsPerLaunch, 0, stream>>>(a);
    TIDE_CUDA_CHECK(cudaGetLastError());
  }
  return tideSuccess;
}

tideResult_t preloadSignalKernel() {
  cudaFuncAttributes attr;
  TIDE_CUDA_CHECK(cudaFuncGetAttributes(&attr, signalKernel));
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
