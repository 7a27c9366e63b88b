// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Gives the logger the calling thread's CUDA device, the [dev] field of every line (NCCL prints cudaGetDevice's).
#include <cuda_runtime.h>

#include "log.h"

namespace {

int currentDevice() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: the line shows [-]; leave no error behind for the caller
    return -1;
  }
  return device;
}

// Installed at load time: only an atomic store (cudaGetDevice runs when a line is written, never at load).
[[maybe_unused]] const bool kInstalled = (tide::log::setDeviceQuery(&currentDevice), true);

}  // namespace
