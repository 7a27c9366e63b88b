// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "window_provider.h"

#include <vector>

#include "../core/errors.h"
#include "../core/log.h"
#include "cuda_check.h"

namespace tide {
namespace cuda {
namespace {

constexpr const char* kComponent = "Window";

}  // namespace

tideResult_t WindowProvider::create(const nccl::Lib& lib, nccl::ncclComm_t parent, int rank, int worldSize,
                                    int device, uint64_t configHash, ExchangeFn exchange, WorkLeftFn workLeft,
                                    std::shared_ptr<WindowProvider>* out, std::string* unavailable) {
  out->reset();
  unavailable->clear();
  std::shared_ptr<WindowProvider> p(
      new WindowProvider(rank, worldSize, device, std::move(exchange), std::move(workLeft)));
  Hello mine = localHello(configHash, device);
  // The zero buffer (local, never shared).
  tideResult_t local = tideSuccess;
  {
    cudaError_t err = cudaSetDevice(device);
    if (err == cudaSuccess) err = p->zeros_.allocate();
    if (err == cudaSuccess) err = cudaDeviceSynchronize();  // a memset on the legacy stream: finish before use
    if (err != cudaSuccess) {
      local = cudaFail(err, "window provider setup (zeros)", __FILE__, __LINE__);
      mine.ok = 0;
    }
  }
  std::vector<Hello> all(worldSize);
  TIDE_CHECK(p->ex_.exchange(&mine, all.data(), sizeof(Hello)));
  TIDE_CHECK(local);
  int nodeRanks = worldSize;
  TIDE_CHECK(checkHellos(all, worldSize, /*overNccl=*/true, kComponent, &nodeRanks));
  p->setNodes(nodeRanks, nodeRanks == worldSize);

  // Flags are zeroed before the registration's agreement, so before any peer can address them.
  auto zeroFlags = [](void* base, size_t bytes) -> tideResult_t {
    cudaError_t err = cudaMemset(base, 0, bytes);
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    return err == cudaSuccess ? tideSuccess : cudaFail(err, "zeroing the flag window", __FILE__, __LINE__);
  };
  WindowProvider* raw = p.get();  // the window memory lives inside the provider
  nccl::WindowMemory::Exchange ex = [raw](const void* m, void* a, size_t b) { return raw->ex_.exchange(m, a, b); };
  nccl::WindowMemory::WorkLeft stuck = [raw] { return raw->ex_.stuck(); };
  nccl::WindowMemory::Availability avail = nccl::WindowMemory::Availability::kAvailable;
  TIDE_CHECK(nccl::WindowMemory::open(lib, parent, rank, worldSize, nodeRanks, std::move(ex), std::move(stuck),
                                      sizeof(uint32_t) * flag::kWords, zeroFlags, &p->mem_, &avail, unavailable));
  if (avail == nccl::WindowMemory::Availability::kUnavailable) return tideSuccess;
  TIDE_INFO(kComponent,
            "rank %d of %d on device %d: window provider ready (%d TIDE nodes of %d ranks; windows on %s; peers "
            "mapped: those of the own node)",
            rank, worldSize, device, worldSize / nodeRanks, nodeRanks, p->mem_->where());
  *out = std::move(p);
  return tideSuccess;
}

WindowProvider::~WindowProvider() {
  (void)cudaSetDevice(device_);
  // Creation did not finish (nothing was shared), or abort() released the windows if the device went idle (else it
  // left everything to process exit). After a failed exchange whose all-gather may still be queued, or with device
  // work stuck, a cudaFree would wait for it: left to exit.
  if (mem_ == nullptr || aborted_) {
    if (ex_.stuck()) {
      ex_.keepResources();
    } else {
      zeros_.release();
    }
    (void)cudaGetLastError();
    return;
  }
  // Collective (tideCommDestroy on every rank): no rank releases a window that a peer's queued work may still use.
  if (!ex_.stuck()) (void)ex_.syncDevice("tideCommDestroy");
  if (!ex_.stuck() && !ex_.broken() && ex_.barrier() != tideSuccess) {
    TIDE_WARN(kComponent, "rank %d: barrier before releasing the windows failed", rank_);
  }
  if (ex_.stuck()) {
    ex_.keepResources();
    mem_->abandon();
    TIDE_WARN(kComponent,
              "rank %d: device work is still pending after NCCL_TIDE_TIMEOUT_MS; the comm's windows (%zu slots, %zu "
              "staging buffers, flags) are not released and stay until the process exits",
              rank_, mem_->slotCount(), mem_->stagingCount());
    mem_.reset();
    return;
  }
  // Over a broken exchange the peers may be gone: a split node communicator is aborted (local), not destroyed.
  if (ex_.broken()) mem_->abortRelease();
  mem_.reset();
  zeros_.release();
  (void)cudaGetLastError();
}

bool WindowProvider::abort(uint64_t boundMs) {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  (void)cudaSetDevice(device_);
  if (!ex_.breakAndDrain(boundMs, "its windows are")) {
    mem_->abandon();
    return false;
  }
  // This device is idle. A peer's queued work may still write into this rank's memory: deregistering and freeing
  // drop only this rank's references, and the peers' imported cuMem handles keep it allocated until they let go.
  mem_->abortRelease();
  (void)cudaGetLastError();
  return true;
}

tideResult_t WindowProvider::slotAlloc(size_t bytes, void** ptr) {
  memGeneration_.fetch_add(1, std::memory_order_relaxed);
  if (bytes == 0) return fail(tideInvalidArgument, kComponent, "tideSlotAlloc: bytes must be > 0");
  std::lock_guard<std::mutex> lock(mu_);
  TIDE_CUDA_CHECK(cudaSetDevice(device_));  // ncclMemAlloc allocates on the current device
  TIDE_CHECK(mem_->slotAlloc(bytes, ptr));
  TIDE_TRACE(kComponent, "slot alloc rank %d #%zu: %zu bytes at %p", rank_, mem_->slotCount() - 1, bytes, *ptr);
  return tideSuccess;
}

tideResult_t WindowProvider::slotFree(void* ptr) {
  memGeneration_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  TIDE_CUDA_CHECK(cudaSetDevice(device_));
  // Collective: no rank releases its window while a peer's work may still write into it.
  return mem_->slotFree(ptr, [this](const char* what) {
    TIDE_CHECK(ex_.syncDevice(what));
    return ex_.barrier();
  });
}

tideResult_t WindowProvider::peerPtr(const void* local, size_t bytes, int peer, const char* what, void** out) {
  std::lock_guard<std::mutex> lock(mu_);
  return mem_->peerPtr(local, bytes, peer, what, out);
}

tideResult_t WindowProvider::ownStaging(int owner, uint64_t bytes, uint64_t epoch, void** out) {
  std::lock_guard<std::mutex> lock(mu_);
  TIDE_CUDA_CHECK(cudaSetDevice(device_));
  // Collective growth: every rank reaches this point in the same RS call (same layouts in the same order).
  bool grown = false;
  TIDE_CHECK(mem_->ownStaging(owner, bytes, out, &grown));
  if (grown) {
    TIDE_INFO(kComponent, "rank %d: own RS staging grown to %llu bytes from epoch %llu", rank_,
              static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(epoch));
  }
  return tideSuccess;
}

const void* WindowProvider::zeros(size_t* bytes) { return zeros_.get(bytes); }

uint32_t* WindowProvider::flags(int owner) { return reinterpret_cast<uint32_t*>(mem_->flags(owner)); }

tideResult_t WindowProvider::agreeOnLayout(uint64_t layoutHash, bool eagerGraphs, int tokenRsChunks) {
  std::lock_guard<std::mutex> lock(mu_);
  return ex_.agreeOnLayout(layoutHash, eagerGraphs, tokenRsChunks);
}

tideResult_t WindowProvider::checkStream(CollKind kind, uint64_t epoch, cudaStream_t stream) {
  (void)epoch;
  (void)stream;
  return ex_.checkHealth(kind == CollKind::kAllGather);
}

}  // namespace cuda
}  // namespace tide
