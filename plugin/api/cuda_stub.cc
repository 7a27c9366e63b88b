// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The CUDA data path of include/tide.h for a library built without CUDA: every call explains how to get it.
// Compiled only when the CUDA data path is not built; plugin/api/cuda_api.cc replaces it.
#include "api_guard.h"
#include "errors.h"
#include "tide.h"

namespace {

tideResult_t unsupported(const char* fn) {
  return tide::fail(tideUnsupported, "API",
                    "%s: this libnccl-tide.so was built without CUDA; rebuild with nvcc on PATH (or "
                    "-DTIDE_BUILD_CUDA=ON, e.g. CMAKE_ARGS=-DTIDE_BUILD_CUDA=ON pip install .)",
                    fn);
}

}  // namespace

extern "C" {

// Like the CUDA build, a failure with a valid nRanks leaves comms[0 .. nRanks-1] NULL (include/tide.h).
TIDE_EXPORT tideResult_t tideLoopbackCreate(int nRanks, int, tideComm_t* comms) {
  if (comms != nullptr && nRanks >= 2 && nRanks <= 8) {
    for (int r = 0; r < nRanks; ++r) comms[r] = nullptr;
  }
  return unsupported(__func__);
}

// Destroy(NULL) is a no-op in every build; no non-NULL comm can exist without CUDA.
TIDE_EXPORT tideResult_t tideCommDestroy(tideComm_t comm) {
  if (comm == nullptr) return tideSuccess;
  return unsupported(__func__);
}

// Abort(NULL), like Destroy(NULL), is a no-op in every build.
TIDE_EXPORT tideResult_t tideCommAbort(tideComm_t comm) {
  if (comm == nullptr) return tideSuccess;
  return unsupported(__func__);
}

TIDE_EXPORT tideResult_t tideCommGetRank(tideComm_t, int*, int*) { return unsupported(__func__); }
TIDE_EXPORT tideResult_t tideCommGetRanksPerNode(tideComm_t, int*) { return unsupported(__func__); }

TIDE_EXPORT tideResult_t tideSlotAlloc(tideComm_t, size_t, void**) { return unsupported(__func__); }

TIDE_EXPORT tideResult_t tideSlotFree(tideComm_t, void*) { return unsupported(__func__); }

TIDE_EXPORT tideResult_t tideAllGather(tideComm_t, tideLayout_t, const void*, const void* const*, void*, void*) {
  return unsupported(__func__);
}

TIDE_EXPORT tideResult_t tideReduceScatter(tideComm_t, tideLayout_t, const void* const*, void*, tideDataType_t,
                                           tideRedOp_t, float, void*, void*) {
  return unsupported(__func__);
}

TIDE_EXPORT tideResult_t tideCommDebugDump(tideComm_t, char* buf, size_t bytes) {
  if (buf != nullptr && bytes > 0) buf[0] = '\0';
  return unsupported(__func__);
}

TIDE_EXPORT tideResult_t tideCommGetPendingWaits(tideComm_t, tidePendingWait_t*, int, int* count) {
  if (count != nullptr) *count = 0;
  return unsupported(__func__);
}

}  // extern "C"
