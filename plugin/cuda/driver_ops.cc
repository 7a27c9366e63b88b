// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "driver_ops.h"

#include <cuda.h>  // driver types only; no symbol of libcuda is linked

#include <algorithm>
#include <mutex>

#include "../core/errors.h"
#include "../core/log.h"
#include "cuda_check.h"
#include "prebuilt.h"

namespace tide {
namespace cuda {
namespace {

using BatchMemOpFn = CUresult (*)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);
using ValueOp32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using GetErrorNameFn = CUresult (*)(CUresult, const char**);
using StreamGetCtxFn = CUresult (*)(CUstream, CUcontext*);
using CtxGetCurrentFn = CUresult (*)(CUcontext*);
using CtxPushFn = CUresult (*)(CUcontext);
using CtxPopFn = CUresult (*)(CUcontext*);
using CtxGetDeviceFn = CUresult (*)(CUdevice*);
using MemGetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
using DeviceGetAttributeFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);

struct DriverOps {
  BatchMemOpFn batchMemOp = nullptr;
  ValueOp32Fn waitValue32 = nullptr;
  ValueOp32Fn writeValue32 = nullptr;
  GetErrorNameFn getErrorName = nullptr;
  StreamGetCtxFn streamGetCtx = nullptr;
  CtxGetCurrentFn ctxGetCurrent = nullptr;
  CtxPushFn ctxPush = nullptr;
  CtxPopFn ctxPop = nullptr;
  CtxGetDeviceFn ctxGetDevice = nullptr;
  MemGetAddressRangeFn memGetAddressRange = nullptr;  // optional: strided copies are split at allocations with it
  DeviceGetAttributeFn deviceGetAttribute = nullptr;  // optional: without it no token pairs (wideMemOps)
  tideResult_t status = tideSuccess;
};

DriverOps g_ops;
std::once_flag g_once;

// The v2 memop entry points date from CUDA 11.7 and are the default from 12.0; ask for the 12.0 ABI.
constexpr unsigned int kAbiVersion = 12000;

template <typename Fn>
bool resolve(const char* name, Fn* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, kAbiVersion, cudaEnableDefault, &q);
  if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || fn == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  *out = reinterpret_cast<Fn>(fn);
  return true;
}

void resolveAll() {
  bool ok = resolve("cuStreamBatchMemOp", &g_ops.batchMemOp);
  ok = resolve("cuStreamWaitValue32", &g_ops.waitValue32) && ok;
  ok = resolve("cuStreamWriteValue32", &g_ops.writeValue32) && ok;
  (void)resolve("cuGetErrorName", &g_ops.getErrorName);
  ok = resolve("cuStreamGetCtx", &g_ops.streamGetCtx) && ok;
  ok = resolve("cuCtxGetCurrent", &g_ops.ctxGetCurrent) && ok;
  ok = resolve("cuCtxPushCurrent", &g_ops.ctxPush) && ok;
  ok = resolve("cuCtxPopCurrent", &g_ops.ctxPop) && ok;
  ok = resolve("cuCtxGetDevice", &g_ops.ctxGetDevice) && ok;
  (void)resolve("cuMemGetAddressRange", &g_ops.memGetAddressRange);
  (void)resolve("cuDeviceGetAttribute", &g_ops.deviceGetAttribute);
  if (!ok || g_ops.waitValue32 == nullptr || g_ops.writeValue32 == nullptr) {
    g_ops.status = fail(tideUnsupported, "Cuda",
                        "the CUDA driver does not provide stream memory operations (cuStreamWaitValue32/"
                        "cuStreamWriteValue32) or the context queries (cuStreamGetCtx, cuCtxGetCurrent, "
                        "cuCtxPushCurrent/PopCurrent, cuCtxGetDevice) of driver API 12.0; update the NVIDIA driver");
  }
}

tideResult_t driverFail(CUresult res, const char* what) {
  const char* name = "CUDA_ERROR_UNKNOWN";
  if (g_ops.getErrorName) g_ops.getErrorName(res, &name);
  (void)cudaGetLastError();
  return fail(tideCudaError, "Cuda", "%s failed: %s (%d)", what, name ? name : "?", static_cast<int>(res));
}

}  // namespace

tideResult_t driverOpsInit() {
  std::call_once(g_once, resolveAll);
  if (g_ops.status != tideSuccess) {
    return fail(g_ops.status, "Cuda", "stream memory operations are unavailable (see the first warning)");
  }
  return tideSuccess;
}

tideResult_t enqueueFlagOps(cudaStream_t stream, const std::vector<FlagOp>& ops) {
  if (ops.empty()) return tideSuccess;
  TIDE_CHECK(driverOpsInit());
  CUstream s = reinterpret_cast<CUstream>(stream);
  if (g_ops.batchMemOp != nullptr) {
    std::vector<CUstreamBatchMemOpParams> params(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      CUstreamBatchMemOpParams& p = params[i];
      p = CUstreamBatchMemOpParams{};
      if (ops[i].kind == FlagOp::kWait) {
        p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
        p.waitValue.address = reinterpret_cast<CUdeviceptr>(ops[i].addr);
        p.waitValue.value = ops[i].value;
        p.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
      } else {
        p.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
        p.writeValue.address = reinterpret_cast<CUdeviceptr>(ops[i].addr);
        p.writeValue.value = ops[i].value;
        p.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
      }
    }
    // The driver caps the ops of one batch (256 on current drivers); stay well under it.
    constexpr size_t kMaxBatch = 128;
    for (size_t at = 0; at < params.size(); at += kMaxBatch) {
      unsigned int n = static_cast<unsigned int>(std::min(kMaxBatch, params.size() - at));
      CUresult res = g_ops.batchMemOp(s, n, params.data() + at, 0);
      if (res != CUDA_SUCCESS) return driverFail(res, "cuStreamBatchMemOp");
    }
    return tideSuccess;
  }
  for (const FlagOp& op : ops) {
    CUdeviceptr addr = reinterpret_cast<CUdeviceptr>(op.addr);
    CUresult res = (op.kind == FlagOp::kWait) ? g_ops.waitValue32(s, addr, op.value, CU_STREAM_WAIT_VALUE_GEQ)
                                               : g_ops.writeValue32(s, addr, op.value, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (res != CUDA_SUCCESS) return driverFail(res, op.kind == FlagOp::kWait ? "cuStreamWaitValue32" : "cuStreamWriteValue32");
  }
  return tideSuccess;
}

bool wideMemOps(int device) {
  if (driverOpsInit() != tideSuccess || g_ops.batchMemOp == nullptr || g_ops.deviceGetAttribute == nullptr) return false;
  int v = 0;
  // A CUdevice is the runtime's device ordinal (the driver API's cuDeviceGet(&d, ordinal) returns the ordinal).
  if (g_ops.deviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, static_cast<CUdevice>(device)) !=
      CUDA_SUCCESS) {
    (void)cudaGetLastError();
    return false;
  }
  return v != 0;
}

void MemOpBatch::addPair(const prog::FlagOp& lo, const prog::FlagOp& hi, uint32_t* addr) {
  CUstreamBatchMemOpParams p{};
  const cuuint64_t v = static_cast<cuuint64_t>(hi.value(0, 0)) << 32 | lo.value(0, 0);  // constants; little endian
  if (lo.kind == prog::FlagOp::kWait) {
    p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
    p.waitValue.address = reinterpret_cast<CUdeviceptr>(addr);
    p.waitValue.value64 = v;
    p.waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;  // each word holds 0 or its token: equal = both reached
  } else {
    p.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
    p.writeValue.address = reinterpret_cast<CUdeviceptr>(addr);
    p.writeValue.value64 = v;
    p.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  }
  params.push_back(p);
  ops.push_back(lo);
}

void MemOpBatch::add(const prog::FlagOp& op, uint32_t* addr) {
  CUstreamBatchMemOpParams p{};
  if (op.kind == prog::FlagOp::kWait) {
    p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    p.waitValue.address = reinterpret_cast<CUdeviceptr>(addr);
    p.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  } else {
    p.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    p.writeValue.address = reinterpret_cast<CUdeviceptr>(addr);
    p.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  }
  params.push_back(p);
  ops.push_back(op);
}

tideResult_t enqueueMemOps(cudaStream_t stream, CUstreamBatchMemOpParams* ops, size_t count) {
  if (count == 0) return tideSuccess;
  CUstream s = reinterpret_cast<CUstream>(stream);
  if (g_ops.batchMemOp != nullptr) {
    constexpr size_t kMaxBatch = 128;  // the driver caps one batch (256 on current drivers)
    for (size_t at = 0; at < count; at += kMaxBatch) {
      unsigned int n = static_cast<unsigned int>(std::min(kMaxBatch, count - at));
      CUresult res = g_ops.batchMemOp(s, n, ops + at, 0);
      if (res != CUDA_SUCCESS) return driverFail(res, "cuStreamBatchMemOp");
    }
    return tideSuccess;
  }
  for (size_t i = 0; i < count; ++i) {
    const CUstreamBatchMemOpParams& p = ops[i];
    if (p.operation != CU_STREAM_MEM_OP_WAIT_VALUE_32 && p.operation != CU_STREAM_MEM_OP_WRITE_VALUE_32) {
      // Token pairs are compiled only where cuStreamBatchMemOp exists (wideMemOps): never here.
      return fail(tideInternalError, "Cuda", "a 64-bit flag operation without cuStreamBatchMemOp");
    }
    const bool wait = p.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32;
    CUresult res = wait ? g_ops.waitValue32(s, p.waitValue.address, p.waitValue.value, CU_STREAM_WAIT_VALUE_GEQ)
                        : g_ops.writeValue32(s, p.writeValue.address, p.writeValue.value, p.writeValue.flags);
    if (res != CUDA_SUCCESS) return driverFail(res, wait ? "cuStreamWaitValue32" : "cuStreamWriteValue32");
  }
  return tideSuccess;
}

bool addressRange(const void* p, uintptr_t* base, size_t* size) {
  std::call_once(g_once, resolveAll);
  if (g_ops.memGetAddressRange == nullptr) return false;
  CUdeviceptr b = 0;
  size_t n = 0;
  if (g_ops.memGetAddressRange(&b, &n, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS || n == 0) return false;
  *base = static_cast<uintptr_t>(b);
  *size = n;
  return true;
}

tideResult_t streamContext(cudaStream_t stream, const char* what, bool* inCurrent, int* device) {
  TIDE_CHECK(driverOpsInit());
  *inCurrent = false;
  *device = -1;
  CUcontext streamCtx = nullptr;
  CUcontext current = nullptr;
  CUresult res = g_ops.streamGetCtx(reinterpret_cast<CUstream>(stream), &streamCtx);
  if (res != CUDA_SUCCESS) {
    const char* name = "CUDA_ERROR_UNKNOWN";
    if (g_ops.getErrorName) g_ops.getErrorName(res, &name);
    return fail(tideInvalidArgument, "Cuda", "%s: stream %p is not a valid CUDA stream (cuStreamGetCtx: %s)", what,
                static_cast<void*>(stream), name ? name : "?");
  }
  res = g_ops.ctxGetCurrent(&current);
  if (res != CUDA_SUCCESS) return driverFail(res, "cuCtxGetCurrent");
  if (streamCtx == current) {
    *inCurrent = true;
    return tideSuccess;
  }
  // Only on the error path: which device the stream's context belongs to, for the caller's message.
  res = g_ops.ctxPush(streamCtx);
  if (res != CUDA_SUCCESS) return driverFail(res, "cuCtxPushCurrent");
  CUdevice dev = -1;
  CUresult got = g_ops.ctxGetDevice(&dev);
  CUcontext popped = nullptr;
  res = g_ops.ctxPop(&popped);
  if (res != CUDA_SUCCESS) return driverFail(res, "cuCtxPopCurrent");
  if (got != CUDA_SUCCESS) return driverFail(got, "cuCtxGetDevice");
  *device = static_cast<int>(dev);
  return tideSuccess;
}

}  // namespace cuda
}  // namespace tide
