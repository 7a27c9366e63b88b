// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "rank_exchange.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>

#include "../core/errors.h"
#include "../core/log.h"
#include "../core/params.h"
#include "cuda_check.h"

namespace tide {
namespace cuda {
namespace {

// cudaDeviceSynchronize on a helper thread, waited for at most `ms` milliseconds (0: unbounded, on this thread). A
// helper that outlives the wait keeps its state alive (shared) and finishes, or not, on its own.
struct SyncState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  cudaError_t err = cudaSuccess;
};

}  // namespace

tideResult_t boundedDeviceSync(int device, uint64_t ms, bool* timedOut) {
  *timedOut = false;
  if (ms == 0) {
    cudaError_t err = cudaDeviceSynchronize();
    return err == cudaSuccess ? tideSuccess : cudaFail(err, "cudaDeviceSynchronize", __FILE__, __LINE__);
  }
  auto st = std::make_shared<SyncState>();
  try {
    std::thread([st, device] {
      cudaError_t err = cudaSetDevice(device);
      if (err == cudaSuccess) err = cudaDeviceSynchronize();
      (void)cudaGetLastError();
      std::lock_guard<std::mutex> lock(st->mu);
      st->err = err;
      st->done = true;
      st->cv.notify_all();
    }).detach();
  } catch (const std::exception& e) {
    return fail(tideSystemError, "Cuda", "could not start the device-synchronize thread: %s", e.what());
  }
  std::unique_lock<std::mutex> lock(st->mu);
  if (!st->cv.wait_for(lock, std::chrono::milliseconds(ms), [&] { return st->done; })) {
    *timedOut = true;
    return tideTimeout;
  }
  if (st->err != cudaSuccess) return cudaFail(st->err, "cudaDeviceSynchronize", __FILE__, __LINE__);
  return tideSuccess;
}

Hello localHello(uint64_t configHash, int device) {
  Hello h{};
  h.host = nodes::localHost();
  h.configHash = configHash;
  h.pid = static_cast<int64_t>(getpid());
  h.device = device;
  h.ok = 1;
  return h;
}

tideResult_t checkHellos(const std::vector<Hello>& all, int worldSize, bool overNccl, const char* component,
                         int* nodeRanks) {
  for (int r = 0; r < worldSize; ++r) {
    if (!all[r].ok) return fail(tideCudaError, component, "rank %d failed to set up its provider; see its log", r);
  }
  for (int r = 0; r < worldSize; ++r) {
    if (all[r].configHash != all[0].configHash) {
      return fail(tideMismatch, component,
                  "config mismatch: rank %d's config hash is %016llx but rank 0's is %016llx; every rank must pass "
                  "the same tideConfig_t and the same NCCL_TIDE_* plan parameters (and load the same NCCL)",
                  r, static_cast<unsigned long long>(all[r].configHash),
                  static_cast<unsigned long long>(all[0].configHash));
    }
  }
  // TIDE's nodes follow NCCL's hosts unless NCCL_TIDE_RANKS_PER_NODE declares them (node_map.h, which also checks
  // that the ranks of one node share a machine). A provider maps the ranks of its own node only: ranks on other
  // nodes may run on other machines, and steps between nodes go through the NCCL communicator (the comm's sendrecv
  // transport). A comm without one (a caller's bootstrap) must therefore be one node.
  std::vector<nodes::RankHost> hosts(worldSize);
  for (int r = 0; r < worldSize; ++r) hosts[r] = all[r].host;
  const int declared = params::ranksPerNodeOverride();
  TIDE_CHECK(nodes::decide(hosts.data(), worldSize, declared, nodeRanks));
  if (*nodeRanks < worldSize && !overNccl) {
    return fail(tideUnsupported, component,
                "the %d ranks are %d TIDE nodes (%s), and steps between TIDE nodes run through NCCL (grouped "
                "ncclSend / ncclRecv), which needs the comm created on an NCCL communicator (tideCommCreate), not on "
                "a bootstrap; ranks that share one machine can instead be declared one TIDE node with "
                "NCCL_TIDE_RANKS_PER_NODE=%d",
                worldSize, worldSize / *nodeRanks,
                declared > 0 ? "NCCL_TIDE_RANKS_PER_NODE" : "NCCL hosts: NCCL_HOSTID, or hostname and boot id",
                worldSize);
  }
  return tideSuccess;
}

tideResult_t RankExchange::exchange(const void* mine, void* all, size_t bytes) {
  if (broken_) {
    return fail(tideInvalidUsage, component_,
                "rank %d: an earlier exchange of this comm failed or timed out, so the ranks' collective steps no "
                "longer line up; destroy this comm (and, over NCCL, abort the NCCL communicator)",
                rank_);
  }
  tideResult_t r = fn_(mine, all, bytes);
  if (r != tideSuccess) broken_ = true;
  // A failed NCCL exchange (timeout, parent async error or a CUDA error while its all-gather was queued) leaves that
  // all-gather kernel queued until the NCCL communicator is aborted; a cudaFree (which synchronizes the device) would
  // then block. Device memory is left to process exit from here on.
  if (r == tideTimeout || (r != tideSuccess && workLeft())) stuck_ = true;
  return r;
}

tideResult_t RankExchange::barrier() {
  uint64_t mine = 0;
  std::vector<uint64_t> all(world_);
  return exchange(&mine, all.data(), sizeof(mine));
}

tideResult_t RankExchange::syncDevice(const char* what) {
  const uint64_t ms = params::timeoutMs();
  bool timedOut = false;
  tideResult_t r = boundedDeviceSync(device_, ms, &timedOut);
  if (timedOut) {
    stuck_ = true;
    return fail(tideTimeout, component_,
                "%s: rank %d's queued TIDE work on device %d did not finish within %llu ms (NCCL_TIDE_TIMEOUT_MS): a "
                "peer has not signalled (it did not make the matching AG/RS call, or it died); nothing was freed. "
                "tideCommDebugDump names the pending wait",
                what, rank_, device_, static_cast<unsigned long long>(ms));
  }
  return r;
}

bool RankExchange::breakAndDrain(uint64_t boundMs, const char* leftBehind) {
  broken_ = true;
  if (stuck_) return false;
  bool timedOut = false;
  const tideResult_t r = boundedDeviceSync(device_, boundMs == 0 ? 1 : boundMs, &timedOut);
  if (timedOut) {
    stuck_ = true;
    TIDE_WARN(component_,
              "tideCommAbort: rank %d's queued device work did not finish within %llu ms (a peer never signalled, "
              "or the parent NCCL communicator's kernels are stuck); %s left to process exit",
              rank_, static_cast<unsigned long long>(boundMs), leftBehind);
  } else if (r != tideSuccess) {
    // A CUDA error (sticky context error): releasing may fail too but does not wait.
    TIDE_WARN(component_, "tideCommAbort: rank %d: device synchronize failed; releasing what can be released", rank_);
  }
  return !stuck_;
}

tideResult_t RankExchange::checkHealth(bool allGather) const {
  if (!health_) return tideSuccess;
  return health_(allGather ? "tideAllGather" : "tideReduceScatter");
}

void RankExchange::keepResources() {
  if (fn_) new ExchangeFn(std::move(fn_));
  workLeft_ = nullptr;
}

tideResult_t RankExchange::agreeOnLayout(uint64_t layoutHash, bool eagerGraphs, int tokenRsChunks) {
  struct Agreed {
    uint64_t hash;
    uint64_t eagerGraphs;
    uint64_t tokenRsChunks;
  };
  const Agreed mine{layoutHash, eagerGraphs ? 1ull : 0ull, static_cast<uint64_t>(tokenRsChunks)};
  std::vector<Agreed> all(world_);
  TIDE_CHECK(exchange(&mine, all.data(), sizeof(mine)));
  auto same = [&](int r) {
    return all[r].hash == all[0].hash && all[r].eagerGraphs == all[0].eagerGraphs &&
           all[r].tokenRsChunks == all[0].tokenRsChunks;
  };
  int differ = 0;
  for (int r = 0; r < world_; ++r) differ += !same(r);
  if (differ == 0) return tideSuccess;
  // One message that every rank builds from the same gathered bytes: rank 0's hash, then up to 8 ranks that differ
  // from it, as many as fit in 480 bytes (the error buffer holds 1 KiB, and the fixed text about 450 of it).
  char list[480] = {0};
  size_t used = 0;
  int shown = 0;
  for (int r = 1; r < world_ && shown < 8; ++r) {
    if (same(r)) continue;
    char chunks[48] = "";
    if (all[r].tokenRsChunks != all[0].tokenRsChunks) {
      snprintf(chunks, sizeof(chunks), " with NCCL_TIDE_TOKEN_RS_CHUNKS=%llu",
               static_cast<unsigned long long>(all[r].tokenRsChunks));
    }
    int n = snprintf(list + used, sizeof(list) - used, "%srank %d has %016llx%s%s", shown ? ", " : "", r,
                     static_cast<unsigned long long>(all[r].hash),
                     all[r].eagerGraphs != all[0].eagerGraphs
                         ? (all[r].eagerGraphs ? " with NCCL_TIDE_EAGER_GRAPHS=1" : " with NCCL_TIDE_EAGER_GRAPHS=0")
                         : "",
                     chunks);
    if (n < 0 || static_cast<size_t>(n) >= sizeof(list) - used) break;
    used += static_cast<size_t>(n);
    ++shown;
  }
  if (differ > shown) snprintf(list + used, sizeof(list) - used, " and %d more", differ - shown);
  // Rank 0's limit whenever it differs from another rank's (or is not the default), so the report shows both sides.
  bool chunksDiffer = false;
  for (int r = 1; r < world_; ++r) chunksDiffer = chunksDiffer || all[r].tokenRsChunks != all[0].tokenRsChunks;
  char chunks0[48] = "";
  if (chunksDiffer || all[0].tokenRsChunks != static_cast<uint64_t>(params::kTokenRsChunksDefault)) {
    snprintf(chunks0, sizeof(chunks0), " with NCCL_TIDE_TOKEN_RS_CHUNKS=%llu",
             static_cast<unsigned long long>(all[0].tokenRsChunks));
  }
  return fail(tideMismatch, component_,
              "layout mismatch across ranks: rank 0 has layout hash %016llx%s%s (%d of %d ranks agree with it), but "
              "%s (this is rank %d). Every rank must build the layout from the same parameter numels, dtypes, row "
              "numels, world size, ranks per node and NCCL_TIDE_* plan parameters, and set NCCL_TIDE_EAGER_GRAPHS "
              "and NCCL_TIDE_TOKEN_RS_CHUNKS alike",
              static_cast<unsigned long long>(all[0].hash),
              all[0].eagerGraphs ? " with NCCL_TIDE_EAGER_GRAPHS=1" : "", chunks0, world_ - differ, world_, list,
              rank_);
}

}  // namespace cuda
}  // namespace tide
