// C API entry points of the CUDA data path (include/tide.h, "Communicators and the CUDA data path").
//
// Nothing here runs at load time: the CUDA runtime is first touched by tideLoopbackCreate, so the library loads and
// its host functions work on a machine without a GPU. Each entry point checks its handles, then hands over to
// plugin/cuda, which validates everything else before it enqueues any work.
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <new>

#include "api_guard.h"
#include "cuda/comm.h"
#include "cuda/cuda_check.h"
#include "cuda/executors.h"
#include "cuda/loopback.h"
#include "errors.h"
#include "log.h"
#include "tide.h"

namespace {

tideResult_t checkComm(tideComm_t comm, const char* fn) {
  if (comm == nullptr) return tide::fail(tideInvalidArgument, "API", "%s: comm is NULL", fn);
  if (!comm->provider) return tide::fail(tideInvalidUsage, "API", "%s: comm is not initialized", fn);
  return tideSuccess;
}

// Makes the comm's device current for the duration of a call, and restores the caller's afterwards.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device) {
      if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
    }
  }
  ~ScopedDevice() {
    int cur = -1;
    if (prev_ >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev_) (void)cudaSetDevice(prev_);
    (void)cudaGetLastError();
  }

 private:
  int prev_ = -1;
};

}  // namespace

extern "C" {

TIDE_EXPORT tideResult_t tideLoopbackCreate(int nRanks, int device, tideComm_t* comms) {
  TIDE_API_BEGIN
  if (comms == nullptr) return tide::fail(tideInvalidArgument, "API", "tideLoopbackCreate: comms is NULL");
  if (nRanks < 2 || nRanks > tide::cuda::LoopbackProvider::kMaxRanks) {
    return tide::fail(tideInvalidArgument, "API", "tideLoopbackCreate: nRanks is %d; a loopback world has 2..%d ranks",
                      nRanks, tide::cuda::LoopbackProvider::kMaxRanks);
  }
  for (int r = 0; r < nRanks; ++r) comms[r] = nullptr;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return tide::fail(tideUnsupported, "API", "tideLoopbackCreate: no CUDA device is available (%s)",
                      err == cudaSuccess ? "device count is 0" : cudaGetErrorName(err));
  }
  if (device < 0 || device >= count) {
    return tide::fail(tideInvalidArgument, "API", "tideLoopbackCreate: device %d does not exist (%d devices)", device,
                      count);
  }
  ScopedDevice scoped(device);
  std::shared_ptr<tide::cuda::LoopbackProvider> world;
  TIDE_CHECK(tide::cuda::LoopbackProvider::create(nRanks, device, &world));
  std::vector<std::unique_ptr<tideComm>> made;
  for (int r = 0; r < nRanks; ++r) {
    std::unique_ptr<tideComm> c(new tideComm());
    c->rank = r;
    c->worldSize = nRanks;
    c->device = device;
    c->provider = world;
    tideResult_t res = tide::cuda::commInit(c.get());
    if (res != tideSuccess) {
      tide::cuda::commRelease(c.get());
      for (auto& m : made) tide::cuda::commRelease(m.get());
      return res;
    }
    made.push_back(std::move(c));
  }
  for (int r = 0; r < nRanks; ++r) comms[r] = made[r].release();
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideCommDestroy(tideComm_t comm) {
  TIDE_API_BEGIN
  if (comm == nullptr) return tideSuccess;
  {
    ScopedDevice scoped(comm->device);
    tide::cuda::commRelease(comm);
    comm->provider.reset();  // the last comm of a loopback world frees the world's memory
  }
  delete comm;
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideCommGetRank(tideComm_t comm, int* rank, int* worldSize) {
  TIDE_API_BEGIN
  TIDE_CHECK(checkComm(comm, "tideCommGetRank"));
  if (rank == nullptr && worldSize == nullptr) {
    return tide::fail(tideInvalidArgument, "API", "tideCommGetRank: rank and worldSize are both NULL");
  }
  if (rank) *rank = comm->rank;
  if (worldSize) *worldSize = comm->worldSize;
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideSlotAlloc(tideComm_t comm, size_t bytes, void** ptr) {
  TIDE_API_BEGIN
  TIDE_CHECK(checkComm(comm, "tideSlotAlloc"));
  if (ptr == nullptr) return tide::fail(tideInvalidArgument, "API", "tideSlotAlloc: ptr is NULL");
  *ptr = nullptr;
  std::lock_guard<std::mutex> lock(comm->mu);
  return comm->provider->slotAlloc(comm->rank, bytes, ptr);
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideSlotFree(tideComm_t comm, void* ptr) {
  TIDE_API_BEGIN
  TIDE_CHECK(checkComm(comm, "tideSlotFree"));
  if (ptr == nullptr) return tideSuccess;
  std::lock_guard<std::mutex> lock(comm->mu);
  return comm->provider->slotFree(comm->rank, ptr);
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideAllGather(tideComm_t comm, tideLayout_t layout, const void* sendbuff,
                                       const void* const* shardPtrs, void* slot, void* stream) {
  TIDE_API_BEGIN
  TIDE_CHECK(checkComm(comm, "tideAllGather"));
  if (layout == nullptr) return tide::fail(tideInvalidArgument, "API", "tideAllGather: layout is NULL");
  std::lock_guard<std::mutex> lock(comm->mu);
  ScopedDevice scoped(comm->device);
  return tide::cuda::allGather(comm, layout, sendbuff, shardPtrs, slot, static_cast<cudaStream_t>(stream));
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideReduceScatter(tideComm_t comm, tideLayout_t layout, const void* const* grads, void* out,
                                           tideDataType_t outType, tideRedOp_t op, float scale, void* staging,
                                           void* stream) {
  TIDE_API_BEGIN
  TIDE_CHECK(checkComm(comm, "tideReduceScatter"));
  if (layout == nullptr) return tide::fail(tideInvalidArgument, "API", "tideReduceScatter: layout is NULL");
  std::lock_guard<std::mutex> lock(comm->mu);
  ScopedDevice scoped(comm->device);
  return tide::cuda::reduceScatter(comm, layout, grads, out, outType, op, scale, staging,
                                   static_cast<cudaStream_t>(stream));
  TIDE_API_END
}

}  // extern "C"
