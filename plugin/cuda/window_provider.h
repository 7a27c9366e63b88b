// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// NCCL window provider: one rank per process, the memory the ranks of one TIDE node share (flags, slots, own RS
// staging) allocated with ncclMemAlloc and registered as NCCL windows, the peers' copies addressed through
// ncclGetPeerDevicePointer (NCCL >= 2.29.2; plugin/nccl/window_memory.h does the NCCL side). NCCL maps the windows
// with cuMem (same-device aliases, or peer mappings between GPUs of a host), so the executors' copy-engine copies,
// stream memory operations and signal kernels address them as they address IPC mappings; nothing else in the data
// path changes. Chosen by tideCommCreate over CUDA IPC where NCCL has it (NCCL_TIDE_PROVIDER,
// plugin/nccl/provider_choice.h); created only on an NCCL communicator.
//
// Like the IPC provider it maps the ranks of its own TIDE node (node_map.h); a comm of several nodes carries the
// steps between them through NCCL (the sendrecv transport), and its windows live on a communicator split off per
// node. The comm's exchange of host bytes (an all-gather over the NCCL communicator) orders every collective step:
// creation, slotAlloc/slotFree, staging growth, layout agreement, destroy.
//
// NCCL's multicast pointer (ncclGetLsaMultimemDevicePointer) is never asked for: multicastPtr stays the default.
#ifndef TIDE_CUDA_WINDOW_PROVIDER_H_
#define TIDE_CUDA_WINDOW_PROVIDER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "../nccl/window_memory.h"
#include "provider.h"
#include "rank_exchange.h"
#include "zero_buffer.h"

namespace tide {
namespace cuda {

class WindowProvider final : public Provider {
 public:
  // Collective over the NCCL communicator `parent` (of `lib`): the creation handshake (configHash must match:
  // tideMismatch on every rank; the TIDE node split), the node's communicator and the flag window. When NCCL gives
  // no window or no peer address for the node, on any rank, every rank returns tideSuccess with *out null and
  // *unavailable naming the NCCL call that said no and its result (tideCommCreate then falls back to IPC, or fails
  // when the window provider was forced: nccl::windowFallback).
  static tideResult_t create(const nccl::Lib& lib, nccl::ncclComm_t parent, int rank, int worldSize, int device,
                             uint64_t configHash, ExchangeFn exchange, WorkLeftFn workLeft,
                             std::shared_ptr<WindowProvider>* out, std::string* unavailable);
  ~WindowProvider() override;

  // PeerMemory (peer_memory.h).
  uint64_t memoryGeneration() const override { return memGeneration_.load(std::memory_order_relaxed); }
  tideResult_t slotAlloc(size_t bytes, void** ptr) override;
  tideResult_t slotFree(void* ptr) override;
  tideResult_t peerPtr(const void* local, size_t bytes, int peer, const char* what, void** out) override;
  tideResult_t ownStaging(int owner, uint64_t bytes, uint64_t epoch, void** out) override;
  const void* zeros(size_t* bytes) override;

  // RankOrdering (rank_ordering.h).
  uint32_t* flags(int owner) override;
  tideResult_t agreeOnLayout(uint64_t layoutHash, bool eagerGraphs, int tokenRsChunks) override;
  // The parent NCCL communicator's health (setHealthCheck), as for IPC.
  tideResult_t checkStream(CollKind kind, uint64_t epoch, cudaStream_t stream) override;
  void setHealthCheck(HealthFn fn) { ex_.setHealthCheck(std::move(fn)); }
  // tideCommAbort: local. If the device goes idle within boundMs, this rank's windows are deregistered and freed
  // (NCCL's cuMem handles keep the memory alive for peers that still map it) and a split node communicator is
  // aborted; otherwise nothing is released (process exit).
  bool abort(uint64_t boundMs) override;

  // Where the windows are registered, for the INFO line.
  const char* windowsWhere() const { return mem_->where(); }

 private:
  // Capturable; the layout agreement exchanges; maps every rank until create() finds several TIDE nodes.
  static constexpr Traits kTraits{true, true, true};
  WindowProvider(int rank, int world, int device, ExchangeFn exchange, WorkLeftFn workLeft)
      : Provider("window", kTraits), rank_(rank), world_(world), device_(device),
        ex_("Window", rank, world, device, std::move(exchange), std::move(workLeft)) {}

  const int rank_;
  const int world_;
  const int device_;
  std::atomic<uint64_t> memGeneration_{0};  // bumped on entry of slotAlloc / slotFree
  RankExchange ex_;
  bool aborted_ = false;
  std::mutex mu_;
  std::unique_ptr<nccl::WindowMemory> mem_;
  ZeroBuffer zeros_;
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_WINDOW_PROVIDER_H_
