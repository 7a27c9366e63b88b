// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Copy-engine copies: a list of device-to-device copies issued as one cudaMemcpyBatchAsync with
// cudaMemcpyFlagPreferOverlapWithCompute (only the hinted batch API keeps same-device copies off the SMs), or as
// cudaMemcpyAsync calls when the batch API is unavailable, the stream is being captured, or the stream is the legacy
// default stream (which the batch API rejects).
#ifndef TIDE_CUDA_COPY_BATCH_H_
#define TIDE_CUDA_COPY_BATCH_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "tide.h"

namespace tide {
namespace cuda {

class CopyList {
 public:
  void clear() {
    dst_.clear();
    src_.clear();
    bytes_.clear();
  }
  void add(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    dst_.push_back(dst);
    src_.push_back(src);
    bytes_.push_back(bytes);
  }
  size_t size() const { return dst_.size(); }

  // Enqueues every copy on stream (device = the stream's device, used as the location hint).
  tideResult_t enqueue(cudaStream_t stream, int device) const;

 private:
  std::vector<void*> dst_;
  std::vector<const void*> src_;
  std::vector<size_t> bytes_;
};

// Which path enqueue() takes for this stream: true for the batch API.
bool useBatchApi(cudaStream_t stream);

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_COPY_BATCH_H_
