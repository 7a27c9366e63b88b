// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// A rank's device buffer of zeros (PeerMemory::zeros): copy engines read it to fill padding, a longer padding run
// with several copies of it. Local memory, never shared with peers. Nothing frees it by itself: its provider releases
// it only when no queued work can still read it (a cudaFree would wait behind stuck work, which leaves it to process
// exit).
#ifndef TIDE_CUDA_ZERO_BUFFER_H_
#define TIDE_CUDA_ZERO_BUFFER_H_

#include <cuda_runtime.h>

#include <cstddef>

namespace tide {
namespace cuda {

class ZeroBuffer {
 public:
  // Allocates and zeroes it on the current device. The memset runs on the legacy stream, which non-blocking streams
  // do not wait for: the caller synchronizes the device before the first use.
  cudaError_t allocate() {
    cudaError_t err = cudaMalloc(&ptr_, kBytes);
    return err == cudaSuccess ? cudaMemset(ptr_, 0, kBytes) : err;
  }
  void release() {
    if (ptr_) (void)cudaFree(ptr_);
    ptr_ = nullptr;
  }
  const void* get(size_t* bytes) const {
    *bytes = kBytes;
    return ptr_;
  }

 private:
  static constexpr size_t kBytes = size_t(1) << 20;
  void* ptr_ = nullptr;
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_ZERO_BUFFER_H_
