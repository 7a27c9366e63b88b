// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// CUDA IPC provider: one rank per process, peer memory through cudaIpcGetMemHandle/cudaIpcOpenMemHandle among the
// ranks of one TIDE node (node_map.h: NCCL's hosts, or NCCL_TIDE_RANKS_PER_NODE). Created on an NCCL communicator it
// may span several TIDE nodes, possibly on several machines: a rank then maps only its own node's ranks
// (peerMapsAllRanks false), and the comm carries the steps between nodes through NCCL (plugin/core/internode.h).
//
// Everything TIDE hands to peers (slots, the flag array, the own RS staging) is TIDE's own cudaMalloc memory; its
// IPC handles travel through a pluggable exchange step, an all-gather of host bytes over the ranks: over an NCCL
// communicator (tideCommCreate) or a caller's callback (tideCommCreateWithBootstrap, e.g. torch.distributed gloo,
// which also serves several processes sharing one GPU: opening a handle of another process's memory on the same
// device is allowed). Collective calls (creation, slotAlloc/slotFree, a growth of the own staging) exchange once;
// every rank sees the same gathered bytes, so a disagreement (sizes, config hash, hosts) fails on every rank alike.
// Flags are ordinary device words in IPC-mapped memory; the executors write and wait on them with stream memory
// operations (cuStreamWriteValue32 / cuStreamWaitValue32), which work on such mappings.
#ifndef TIDE_CUDA_IPC_PROVIDER_H_
#define TIDE_CUDA_IPC_PROVIDER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "provider.h"
#include "rank_exchange.h"
#include "zero_buffer.h"

namespace tide {
namespace cuda {

// One rank per process, with its own copy-engine queues: no SharedQueues hook, and a graph may hold several TIDE
// collectives.
class IpcProvider final : public Provider {
 public:
  // Collective. configHash must match on every rank (tideMismatch on every rank otherwise); the ranks of one TIDE
  // node must share a machine, several nodes need overNccl (the exchange is an NCCL communicator's, which then
  // carries the steps between nodes; tideUnsupported otherwise), and ranks of one machine must be in distinct
  // processes (tideInvalidUsage: use tideLoopbackCreate). workLeft: see the constructor (set before the creation
  // exchange, so that a failed one counts too).
  static tideResult_t create(int rank, int worldSize, int device, uint64_t configHash, bool overNccl,
                             ExchangeFn exchange, std::shared_ptr<IpcProvider>* out, WorkLeftFn workLeft = nullptr);
  ~IpcProvider() override;

  // PeerMemory (peer_memory.h).
  uint64_t memoryGeneration() const override { return memGeneration_.load(std::memory_order_relaxed); }
  tideResult_t slotAlloc(size_t bytes, void** ptr) override;
  tideResult_t slotFree(void* ptr) override;
  tideResult_t peerPtr(const void* local, size_t bytes, int peer, const char* what, void** out) override;
  tideResult_t ownStaging(int owner, uint64_t bytes, uint64_t epoch, void** out) override;
  const void* zeros(size_t* bytes) override;

  // RankOrdering (rank_ordering.h).
  uint32_t* flags(int owner) override;

  // Collective: every rank learns every rank's layout hash; tideMismatch on every rank (naming the ranks and hashes)
  // if they differ. A layout must have been agreed on by an eager call before it is captured (agreementExchanges).
  tideResult_t agreeOnLayout(uint64_t layoutHash, bool eagerGraphs, int tokenRsChunks) override;

  // Called before every eager AG/RS enqueues anything: runs the health check, if one is set. The NCCL constructor
  // sets ncclCommGetAsyncError of the parent communicator, so a parent that reports an error (a failed peer, an abort
  // in progress) makes TIDE calls fail with tideNcclError instead of enqueueing flag waits for peers that will never
  // come.
  tideResult_t checkStream(CollKind kind, uint64_t epoch, cudaStream_t stream) override;
  void setHealthCheck(HealthFn fn) { ex_.setHealthCheck(std::move(fn)); }

  // tideCommAbort: local, non-collective teardown. No exchange with peers (now or in the destructor); waits for this
  // device's queued work at most boundMs. If the device went idle, this rank's mappings of the peers' memory are
  // closed and its local (never exported) memory is freed by the destructor; memory exported to peers (flags, slots,
  // staging) stays allocated until process exit, because a peer's queued work may still write into it. If the device
  // did not go idle, nothing is closed or freed (the stuck work uses it). Returns true if the device went idle.
  bool abort(uint64_t boundMs) override;

 private:
  // Capturable; the layout agreement exchanges; every rank maps every other's memory until create() finds several
  // TIDE nodes.
  static constexpr Traits kTraits{true, true, true};
  // workLeft: whether the last failed exchange may have left device work queued (the NCCL exchange: its
  // ncclAllGather, which only an ncclCommAbort ends). If set and it answers true after a failure, the device counts
  // as stuck (as after a timeout): no cudaFree, no device synchronize afterwards. Unset (caller's callback): only
  // tideTimeout marks it.
  IpcProvider(int rank, int world, int device, ExchangeFn exchange, WorkLeftFn workLeft)
      : Provider("ipc", kTraits), rank_(rank), world_(world), device_(device),
        ex_("Ipc", rank, world, device, std::move(exchange), std::move(workLeft)) {}

  // Whether this rank maps rank r's memory (r is on its TIDE node), and the error for one it does not.
  bool maps(int r) const { return nodeRanks() == 0 || r / nodeRanks() == rank_ / nodeRanks(); }
  tideResult_t unmapped(int peer, const char* what) const;

  // A buffer of this rank and its mappings of every peer's matching buffer (peers[rank_] = own; nullptr for ranks on
  // other nodes).
  struct Shared {
    char* base = nullptr;
    size_t bytes = 0;
    bool live = false;
    std::vector<char*> peers;
  };
  // Collective: allocates `bytes` here, exchanges handles (and sizes: a mismatch fails on every rank), maps peers.
  tideResult_t share(size_t bytes, const char* what, Shared* out);
  void unshare(Shared* s);
  // Closes this rank's mappings of the peers' copies of s (its own memory stays allocated).
  void closePeers(Shared* s);

  const int rank_;
  const int world_;
  const int device_;
  std::atomic<uint64_t> memGeneration_{0};  // bumped on entry of slotAlloc / slotFree
  // The exchange and the comm's fault state: broken (no further exchange), stuck (device memory is never freed: a
  // cudaFree would block behind the stuck work, it is left to process exit).
  RankExchange ex_;
  bool ready_ = false;    // created on every rank: destruction is collective (a barrier before freeing)
  bool aborted_ = false;  // abort() ran: the destructor makes no exchange and frees only local memory
  std::mutex mu_;
  Shared flags_;
  ZeroBuffer zeros_;
  std::vector<Shared> slots_;
  std::vector<Shared> staging_;  // generations; the last is current (older ones kept: enqueued work may use them)
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_IPC_PROVIDER_H_
