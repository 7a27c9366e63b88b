// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// What the providers of one rank per process (IPC, window) share about talking to their peers: the all-gather of
// host bytes (over an NCCL communicator or a caller's bootstrap) with the comm's fault state, a barrier over it, the
// bounded wait for the rank's device, the collective layout agreement, the parent NCCL communicator's health check,
// and the creation handshake (every rank's host, config hash and device: the TIDE node split).
#ifndef TIDE_CUDA_RANK_EXCHANGE_H_
#define TIDE_CUDA_RANK_EXCHANGE_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "../core/node_map.h"
#include "tide.h"

namespace tide {
namespace cuda {

// All-gather of host bytes: `all` receives worldSize blocks of `bytes`, block r from rank r. Blocking, collective.
using ExchangeFn = std::function<tideResult_t(const void* mine, void* all, size_t bytes)>;
// The parent NCCL communicator's health before a collective call (`what` names it): tideNcclError when it reports an
// asynchronous error.
using HealthFn = std::function<tideResult_t(const char* what)>;
// Whether the last failed exchange may have left device work queued (the NCCL exchange's ncclAllGather, which only
// an ncclCommAbort ends).
using WorkLeftFn = std::function<bool()>;

// What every rank announces at creation. The IPC flag handle travels in the same message so that the first exchange
// of a comm has one shape whichever provider the ranks chose (a window rank leaves it zero): ranks that chose
// differently then fail on the config hash (which includes the choice), never on an exchange of unequal sizes.
struct Hello {
  nodes::RankHost host;
  uint64_t configHash;
  int64_t pid;
  int32_t device;
  int32_t ok;  // 0: this rank failed before the exchange (it still takes part, so nobody hangs)
  cudaIpcMemHandle_t ipcFlags;
};

// This process's Hello (ok = 1, no handle).
Hello localHello(uint64_t configHash, int device);

// The checks every rank makes on the gathered Hellos, alike: a rank that failed before the exchange
// (tideCudaError, naming it), config hashes (tideMismatch), the TIDE node split (node_map.h; several nodes need an
// NCCL communicator: tideUnsupported otherwise). component names the provider in errors.
tideResult_t checkHellos(const std::vector<Hello>& all, int worldSize, bool overNccl, const char* component,
                         int* nodeRanks);

class RankExchange {
 public:
  RankExchange(const char* component, int rank, int world, int device, ExchangeFn fn, WorkLeftFn workLeft)
      : component_(component), rank_(rank), world_(world), device_(device), fn_(std::move(fn)),
        workLeft_(std::move(workLeft)) {}

  // The exchange, with the comm's fault state: after an exchange failed (timeout, callback or NCCL error) the ranks'
  // exchange sequences may no longer line up, so every later exchange fails at once (tideInvalidUsage) instead of
  // pairing with a different collective step of a peer. A failure that may leave device work queued (a timeout, or
  // workLeft) marks the device stuck.
  tideResult_t exchange(const void* mine, void* all, size_t bytes);
  // An all-gather of one word.
  tideResult_t barrier();
  // Waits for this device's queued work, bounded by NCCL_TIDE_TIMEOUT_MS (unbounded when 0): tideTimeout (the device
  // counts as stuck) if it is still running then (a peer never signalled); `what` names the caller.
  tideResult_t syncDevice(const char* what);
  // RankOrdering::agreeOnLayout: every rank learns every rank's layout hash and settings; tideMismatch on every rank
  // (naming the ranks and hashes) if they differ.
  tideResult_t agreeOnLayout(uint64_t layoutHash, bool eagerGraphs, int tokenRsChunks);
  // The health check before an eager AG/RS, if one is set.
  tideResult_t checkHealth(bool allGather) const;
  void setHealthCheck(HealthFn fn) { health_ = std::move(fn); }
  // Whether device work may still be queued after the last failed exchange (the provider's memory then stays).
  bool workLeft() const { return workLeft_ && workLeft_(); }

  // tideCommAbort's first step: nothing collective from here on, then this device's queued work waited for, at most
  // boundMs (1 ms when 0). Returns whether the device is idle; if not, it is marked stuck, and one WARN says that
  // `leftBehind` (the provider's memory) stays until process exit. The device of the comm must be current.
  bool breakAndDrain(uint64_t boundMs, const char* leftBehind);
  bool broken() const { return broken_; }
  bool stuck() const { return stuck_; }
  // With device work stuck, the exchange's own resources (the NCCL exchange's buffer and stream) would be freed with
  // a cudaFree that waits for that work: this keeps them until process exit (deliberately never deleted).
  void keepResources();

 private:
  const char* const component_;
  const int rank_, world_, device_;
  ExchangeFn fn_;
  WorkLeftFn workLeft_;
  HealthFn health_;
  bool broken_ = false;
  bool stuck_ = false;
};

// cudaDeviceSynchronize of `device` on a helper thread, waited for at most `ms` milliseconds (0: unbounded, on this
// thread); *timedOut tells a timeout (tideTimeout) apart from a CUDA error. Also used by the loopback provider.
tideResult_t boundedDeviceSync(int device, uint64_t ms, bool* timedOut);

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_RANK_EXCHANGE_H_
