// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "copy_batch.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "../core/errors.h"
#include "../core/log.h"
#include "cuda_check.h"
#include "driver_ops.h"
#include "prebuilt.h"

namespace tide {
namespace cuda {
namespace {

// Set once the runtime rejected the batch API as unsupported; later calls go straight to cudaMemcpyAsync.
std::atomic<bool> g_batchBroken{false};
// Set once the runtime refused a 2D copy of a strided run; later runs go row by row.
std::atomic<bool> g_runsBroken{false};

// One strided run: a 2D copy, or its rows one by one once 2D copies were refused (said once).
tideResult_t enqueueRun(cudaStream_t stream, const CopyRun& r) {
  void* dst = reinterpret_cast<void*>(r.dst);
  const void* src = reinterpret_cast<const void*>(r.src);
  if (r.rows > 1 && !g_runsBroken.load(std::memory_order_relaxed)) {
    const cudaError_t err = cudaMemcpy2DAsync(dst, r.dpitch, src, r.spitch, r.width, r.rows, cudaMemcpyDeviceToDevice,
                                              stream);
    if (err == cudaSuccess) return tideSuccess;
    if (err != cudaErrorInvalidValue && err != cudaErrorInvalidPitchValue) {
      return cudaFail(err, "cudaMemcpy2DAsync", __FILE__, __LINE__);
    }
    (void)cudaGetLastError();
    if (!g_runsBroken.exchange(true)) {
      TIDE_WARN("Cuda", "cudaMemcpy2DAsync refused a strided run of %llu rows of %llu bytes (%s); copying strided runs "
                        "row by row from now on (one copy per row: more graph nodes, same bytes)",
                static_cast<unsigned long long>(r.rows), static_cast<unsigned long long>(r.width),
                cudaGetErrorName(err));
    }
  }
  for (uint64_t k = 0; k < r.rows; ++k) {
    TIDE_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + k * r.dpitch, static_cast<const char*>(src) + k * r.spitch,
                                    r.width, cudaMemcpyDeviceToDevice, stream));
  }
  return tideSuccess;
}

}  // namespace

// One cudaMemcpyBatchAsync of n copies with cudaMemcpyFlagPreferOverlapWithCompute (*done = true), or *done = false
// once the runtime says the batch API is unsupported (said once; the caller copies one by one). Other errors fail.
static tideResult_t batchCopy(void* const* dst, const void* const* src, const size_t* bytes, size_t n, int device,
                              cudaStream_t stream, bool* done) {
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.srcLocHint.type = cudaMemLocationTypeDevice;
  attr.srcLocHint.id = device;
  attr.dstLocHint.type = cudaMemLocationTypeDevice;
  attr.dstLocHint.id = device;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attrIdx = 0;
  cudaError_t err = cudaMemcpyBatchAsync(const_cast<void**>(dst), const_cast<const void**>(src),
                                         const_cast<size_t*>(bytes), n, &attr, &attrIdx, 1, stream);
  *done = err == cudaSuccess;
  if (*done) return tideSuccess;
  if (err != cudaErrorNotSupported && err != cudaErrorCallRequiresNewerDriver) {
    return cudaFail(err, "cudaMemcpyBatchAsync", __FILE__, __LINE__);
  }
  (void)cudaGetLastError();
  if (!g_batchBroken.exchange(true)) {
    TIDE_WARN("Cuda", "cudaMemcpyBatchAsync is not supported here (%s); falling back to cudaMemcpyAsync, which "
                      "may run same-device copies on the SMs",
              cudaGetErrorName(err));
  }
  return tideSuccess;
}

bool copyRunsRefused() { return g_runsBroken.load(std::memory_order_relaxed); }

void CopyBatch::planRuns(const std::vector<uint32_t>& group) {
  runs.clear();
  std::vector<uint64_t> d(dst.size()), s(src.size()), n(bytes.size());
  for (size_t i = 0; i < dst.size(); ++i) {
    d[i] = reinterpret_cast<uintptr_t>(dst[i]);
    s[i] = reinterpret_cast<uintptr_t>(src[i]);
    n[i] = bytes[i];
  }
  std::vector<CopyRun> r = stridedRuns(d.data(), s.data(), n.data(), group.data(), d.size(), kMaxCopyPitch);
  if (r.size() == dst.size()) return;  // nothing merged
  // A 2D copy reads one allocation and writes one: split runs whose rows are separate allocations that happen to
  // lie at a constant stride (shards or gradients from the caching allocator).
  r = splitAtAllocations(r, [](uint64_t a, uint64_t* base, uint64_t* size) {
    uintptr_t b = 0;
    size_t n = 0;
    if (!addressRange(reinterpret_cast<const void*>(static_cast<uintptr_t>(a)), &b, &n)) return false;
    *base = b;
    *size = n;
    return true;
  });
  if (r.size() < dst.size()) runs = std::move(r);
}

bool useBatchApi(cudaStream_t stream) {
  if (g_batchBroken.load(std::memory_order_relaxed)) return false;
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
    bool done = false;
    TIDE_CHECK(batchCopy(const_cast<void* const*>(dst_.data()), src_.data(), bytes_.data(), dst_.size(), device, stream,
                         &done));
    if (done) return tideSuccess;
  }
  for (size_t i = 0; i < dst_.size(); ++i) {
    TIDE_CUDA_CHECK(cudaMemcpyAsync(dst_[i], src_[i], bytes_[i], cudaMemcpyDeviceToDevice, stream));
  }
  return tideSuccess;
}

bool batchApiFor(cudaStream_t stream, bool capturing) {
  if (capturing || g_batchBroken.load(std::memory_order_relaxed)) return false;
  return stream != nullptr && stream != cudaStreamLegacy;
}

tideResult_t enqueueCopyBatch(cudaStream_t stream, int device, const CopyBatch& b, bool batchApi) {
  if (b.dst.empty()) return tideSuccess;
  if (batchApi && !g_batchBroken.load(std::memory_order_relaxed)) {
    bool done = false;
    TIDE_CHECK(batchCopy(const_cast<void* const*>(b.dst.data()), b.src.data(), b.bytes.data(), b.dst.size(), device,
                         stream, &done));
    if (done) return tideSuccess;
  }
  if (!b.runs.empty()) {
    for (const CopyRun& r : b.runs) TIDE_CHECK(enqueueRun(stream, r));
    return tideSuccess;
  }
  for (size_t i = 0; i < b.dst.size(); ++i) {
    TIDE_CUDA_CHECK(cudaMemcpyAsync(b.dst[i], b.src[i], b.bytes[i], cudaMemcpyDeviceToDevice, stream));
  }
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
