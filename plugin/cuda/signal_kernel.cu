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

tideResult_t enqueueSignals(cudaStream_t stream, uint32_t* const* addrs, const uint32_t* values, size_t n) {
  for (size_t at = 0; at < n; at += kSignalsPerLaunch) {
    SignalArgs a;
    a.n = static_cast<int>(n - at < static_cast<size_t>(kSignalsPerLaunch) ? n - at : kSignalsPerLaunch);
    for (int i = 0; i < a.n; ++i) {
      a.addr[i] = addrs[at + i];
      a.value[i] = values[at + i];
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
