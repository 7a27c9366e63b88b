#include "copy_batch.h"

#include <algorithm>
#include <atomic>

#include "../core/errors.h"
#include "../core/log.h"
#include "../core/params.h"
#include "cuda_check.h"
#include "prebuilt.h"

namespace tide {
namespace cuda {
namespace {

// Set once the runtime rejected the batch API as unsupported; later calls go straight to cudaMemcpyAsync.
std::atomic<bool> g_batchBroken{false};

}  // namespace

bool useBatchApi(cudaStream_t stream) {
  if (g_batchBroken.load(std::memory_order_relaxed) || !params::agBatch()) return false;
  if (stream == nullptr || stream == cudaStreamLegacy) return false;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  // Capturing: the batch API is not documented as capturable; cudaMemcpyAsync becomes a memcpy graph node.
  return cap == cudaStreamCaptureStatusNone;
}

tideResult_t CopyList::enqueue(cudaStream_t stream, int device) const {
  if (dst_.empty()) return tideSuccess;
  if (useBatchApi(stream)) {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = cudaMemLocationTypeDevice;
    attr.srcLocHint.id = device;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    attr.dstLocHint.id = device;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attrIdx = 0;
    cudaError_t err = cudaMemcpyBatchAsync(const_cast<void* const*>(dst_.data()), src_.data(), bytes_.data(),
                                           dst_.size(), &attr, &attrIdx, 1, stream);
    if (err == cudaSuccess) return tideSuccess;
    if (err != cudaErrorNotSupported && err != cudaErrorCallRequiresNewerDriver) {
      return cudaFail(err, "cudaMemcpyBatchAsync", __FILE__, __LINE__);
    }
    (void)cudaGetLastError();
    if (!g_batchBroken.exchange(true)) {
      TIDE_WARN("Cuda", "cudaMemcpyBatchAsync is not supported here (%s); falling back to cudaMemcpyAsync, which "
                        "may run same-device copies on the SMs",
                cudaGetErrorName(err));
    }
  }
  for (size_t i = 0; i < dst_.size(); ++i) {
    TIDE_CUDA_CHECK(cudaMemcpyAsync(dst_[i], src_[i], bytes_[i], cudaMemcpyDeviceToDevice, stream));
  }
  return tideSuccess;
}

bool batchApiFor(cudaStream_t stream, bool capturing) {
  if (capturing || g_batchBroken.load(std::memory_order_relaxed) || !params::agBatch()) return false;
  return stream != nullptr && stream != cudaStreamLegacy;
}

tideResult_t enqueueCopyBatch(cudaStream_t stream, int device, const CopyBatch& b, bool batchApi) {
  if (b.dst.empty()) return tideSuccess;
  if (batchApi && !g_batchBroken.load(std::memory_order_relaxed)) {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = cudaMemLocationTypeDevice;
    attr.srcLocHint.id = device;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    attr.dstLocHint.id = device;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attrIdx = 0;
    cudaError_t err = cudaMemcpyBatchAsync(const_cast<void* const*>(b.dst.data()), b.src.data(), b.bytes.data(),
                                           b.dst.size(), &attr, &attrIdx, 1, stream);
    if (err == cudaSuccess) return tideSuccess;
    if (err != cudaErrorNotSupported && err != cudaErrorCallRequiresNewerDriver) {
      return cudaFail(err, "cudaMemcpyBatchAsync", __FILE__, __LINE__);
    }
    (void)cudaGetLastError();
    if (!g_batchBroken.exchange(true)) {
      TIDE_WARN("Cuda", "cudaMemcpyBatchAsync is not supported here (%s); falling back to cudaMemcpyAsync, which "
                        "may run same-device copies on the SMs",
                cudaGetErrorName(err));
    }
  }
  for (size_t i = 0; i < b.dst.size(); ++i) {
    TIDE_CUDA_CHECK(cudaMemcpyAsync(b.dst[i], b.src[i], b.bytes[i], cudaMemcpyDeviceToDevice, stream));
  }
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
