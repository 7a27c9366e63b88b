// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "ipc_provider.h"

#include <cstdio>

#include "../core/errors.h"
#include "../core/log.h"
#include "cuda_check.h"

namespace tide {
namespace cuda {
namespace {

constexpr const char* kComponent = "Ipc";

// cudaMalloc may sub-allocate small requests from a larger block, and CUDA IPC then shares (and maps in the
// importer) the whole underlying block, other sub-allocations included (CUDA C++ Programming Guide, Interprocess
// Communication: "only share allocations with a 2MiB aligned size"). Every buffer TIDE exports is allocated in
// whole 2 MiB units so that each handle covers exactly one allocation of its own.
constexpr size_t kIpcGranule = size_t(2) << 20;
// 0 when rounding up would wrap (bytes within 2 MiB of SIZE_MAX): no device has that much memory, and a wrapped
// size would allocate a tiny buffer for a huge request.
size_t ipcAllocBytes(size_t bytes) {
  if (bytes > SIZE_MAX - (kIpcGranule - 1)) return 0;
  return (bytes + kIpcGranule - 1) / kIpcGranule * kIpcGranule;
}

// One rank's part of a collective allocation.
struct ShareMsg {
  uint64_t bytes;
  int32_t ok;
  int32_t pad;
  cudaIpcMemHandle_t handle;
};

}  // namespace

tideResult_t IpcProvider::create(int rank, int worldSize, int device, uint64_t configHash, bool overNccl,
                                 ExchangeFn exchange, std::shared_ptr<IpcProvider>* out, WorkLeftFn workLeft) {
  std::shared_ptr<IpcProvider> p(new IpcProvider(rank, worldSize, device, std::move(exchange), std::move(workLeft)));
  Hello mine = localHello(configHash, device);
  // The flag array (exported) and the zero buffer (local).
  tideResult_t local = tideSuccess;
  {
    cudaError_t err = cudaSetDevice(device);
    size_t flagBytes = sizeof(uint32_t) * flag::kWords;
    if (err == cudaSuccess) err = cudaMalloc(reinterpret_cast<void**>(&p->flags_.base), ipcAllocBytes(flagBytes));
    if (err == cudaSuccess) err = cudaMemset(p->flags_.base, 0, ipcAllocBytes(flagBytes));
    if (err == cudaSuccess) err = p->zeros_.allocate();
    if (err == cudaSuccess) err = cudaDeviceSynchronize();  // memsets on the legacy stream: finish before use
    if (err == cudaSuccess) err = cudaIpcGetMemHandle(&mine.ipcFlags, p->flags_.base);
    if (err != cudaSuccess) {
      local = cudaFail(err, "IPC provider setup (flags, zeros)", __FILE__, __LINE__);
      mine.ok = 0;
    }
    p->flags_.bytes = flagBytes;
    p->flags_.live = p->flags_.base != nullptr;
  }
  std::vector<Hello> all(worldSize);
  tideResult_t ex = p->ex_.exchange(&mine, all.data(), sizeof(Hello));
  if (ex != tideSuccess) return ex;
  if (local != tideSuccess) return local;
  int nodeRanks = worldSize;
  TIDE_CHECK(checkHellos(all, worldSize, overNccl, kComponent, &nodeRanks));
  p->setNodes(nodeRanks, nodeRanks == worldSize);
  for (int r = 0; r < worldSize; ++r) {
    for (int q = 0; q < r; ++q) {
      if (all[q].pid == all[r].pid && all[q].host.machine == all[r].host.machine) {
        return fail(tideInvalidUsage, kComponent,
                    "ranks %d and %d are in the same process; the IPC provider needs one rank per process (use "
                    "tideLoopbackCreate for several ranks in one process)",
                    q, r);
      }
    }
  }
  p->flags_.peers.assign(worldSize, nullptr);
  for (int r = 0; r < worldSize; ++r) {
    if (r == rank) {
      p->flags_.peers[r] = p->flags_.base;
      continue;
    }
    if (!p->maps(r)) continue;
    void* q = nullptr;
    cudaError_t err = cudaIpcOpenMemHandle(&q, all[r].ipcFlags, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      p->unshare(&p->flags_);
      return cudaFail(err, "cudaIpcOpenMemHandle(peer flags)", __FILE__, __LINE__);
    }
    p->flags_.peers[r] = static_cast<char*>(q);
  }
  p->ready_ = true;
  TIDE_INFO(kComponent, "rank %d of %d on device %d: IPC provider ready (%d TIDE nodes of %d ranks; peers mapped: "
            "those of the own node)", rank, worldSize, device, worldSize / nodeRanks, nodeRanks);
  *out = std::move(p);
  return tideSuccess;
}

IpcProvider::~IpcProvider() {
  (void)cudaSetDevice(device_);
  const bool stuck = ex_.stuck();
  if (aborted_) {
    if (stuck) ex_.keepResources();
    // tideCommAbort: nothing collective. abort() closed the peer mappings if the device went idle; memory exported
    // to peers stays allocated (a peer's queued work may still write into it) until process exit.
    if (!stuck) zeros_.release();
    (void)cudaGetLastError();
    TIDE_WARN(kComponent,
              "rank %d: comm aborted; its exported device memory (%zu slots, %zu staging buffers, flags) stays "
              "allocated until the process exits%s",
              rank_, slots_.size(), staging_.size(),
              stuck ? " (device work was still pending: peer mappings were not closed either)" : "");
    return;
  }
  if (ready_ && !ex_.stuck()) {
    // Collective (tideCommDestroy on every rank): no rank frees memory that a peer's queued work may still write,
    // and no rank frees exported memory before every importer has closed its mapping (cudaFree of an exported
    // region before cudaIpcCloseMemHandle in the importing process is undefined behaviour).
    (void)ex_.syncDevice("tideCommDestroy");
  }
  if (ready_ && !ex_.stuck() && !ex_.broken()) {
    if (ex_.barrier() != tideSuccess) {
      TIDE_WARN(kComponent, "rank %d: barrier before releasing IPC memory failed", rank_);
    }
    for (auto& s : slots_) closePeers(&s);
    for (auto& s : staging_) closePeers(&s);
    closePeers(&flags_);
    if (ex_.barrier() != tideSuccess) {
      TIDE_WARN(kComponent, "rank %d: barrier after closing IPC mappings failed", rank_);
    }
  }
  if (ex_.stuck()) {
    ex_.keepResources();
    // Work that waits on a peer's flag is still queued: cudaFree would block behind it, and the peers may still
    // write into this memory. Leave it to process exit (the job is failing anyway; the NCCL_TIDE_TIMEOUT_MS error
    // said so).
    TIDE_WARN(kComponent,
              "rank %d: device work is still pending after NCCL_TIDE_TIMEOUT_MS; the comm's device memory (%zu slots, "
              "%zu staging buffers, flags) is not freed and stays allocated until the process exits",
              rank_, slots_.size(), staging_.size());
    return;
  }
  for (auto& s : slots_) unshare(&s);
  for (auto& s : staging_) unshare(&s);
  unshare(&flags_);
  zeros_.release();
  (void)cudaGetLastError();
}

bool IpcProvider::abort(uint64_t boundMs) {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  (void)cudaSetDevice(device_);
  if (!ex_.breakAndDrain(boundMs, "its memory is")) return false;
  // This device is idle: none of its work reads or writes the peers' memory any more.
  for (auto& s : slots_) closePeers(&s);
  for (auto& s : staging_) closePeers(&s);
  closePeers(&flags_);
  (void)cudaGetLastError();
  return true;
}

tideResult_t IpcProvider::checkStream(CollKind kind, uint64_t epoch, cudaStream_t stream) {
  (void)epoch;
  (void)stream;
  return ex_.checkHealth(kind == CollKind::kAllGather);
}

tideResult_t IpcProvider::agreeOnLayout(uint64_t layoutHash, bool eagerGraphs, int tokenRsChunks) {
  std::lock_guard<std::mutex> lock(mu_);
  return ex_.agreeOnLayout(layoutHash, eagerGraphs, tokenRsChunks);
}

tideResult_t IpcProvider::share(size_t bytes, const char* what, Shared* out) {
  ShareMsg mine{};
  mine.bytes = bytes;
  mine.ok = 1;
  void* p = nullptr;
  const size_t allocBytes = ipcAllocBytes(bytes);
  cudaError_t err = cudaSetDevice(device_);
  if (err == cudaSuccess) err = allocBytes == 0 ? cudaErrorMemoryAllocation : cudaMalloc(&p, allocBytes);
  if (err == cudaSuccess) err = cudaIpcGetMemHandle(&mine.handle, p);
  tideResult_t local = tideSuccess;
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    local = fail(err == cudaErrorMemoryAllocation ? tideOutOfMemory : tideCudaError, kComponent,
                 "%s: rank %d could not allocate %zu bytes on device %d: %s (%s)", what, rank_, bytes, device_,
                 cudaGetErrorName(err), cudaGetErrorString(err));
    mine.ok = 0;
  }
  std::vector<ShareMsg> all(world_);
  tideResult_t ex = ex_.exchange(&mine, all.data(), sizeof(ShareMsg));
  auto cleanup = [&] {
    if (p && !ex_.stuck()) (void)cudaFree(p);
    (void)cudaGetLastError();
  };
  if (ex != tideSuccess || local != tideSuccess) {
    cleanup();
    return ex != tideSuccess ? ex : local;
  }
  for (int r = 0; r < world_; ++r) {
    if (!all[r].ok) {
      cleanup();
      return fail(tideOutOfMemory, kComponent, "%s: rank %d could not allocate %llu bytes; see its log", what, r,
                  static_cast<unsigned long long>(all[r].bytes));
    }
    if (all[r].bytes != bytes) {
      cleanup();
      return fail(tideMismatch, kComponent,
                  "%s: rank %d allocates %llu bytes but rank %d allocates %llu; every rank must make the same "
                  "allocations in the same order",
                  what, r, static_cast<unsigned long long>(all[r].bytes), rank_, static_cast<unsigned long long>(bytes));
    }
  }
  Shared s;
  s.base = static_cast<char*>(p);
  s.bytes = bytes;
  s.live = true;
  s.peers.assign(world_, nullptr);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) {
      s.peers[r] = s.base;
      continue;
    }
    if (!maps(r)) continue;
    void* q = nullptr;
    err = cudaIpcOpenMemHandle(&q, all[r].handle, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      tideResult_t res = cudaFail(err, "cudaIpcOpenMemHandle", __FILE__, __LINE__);
      unshare(&s);
      return res;
    }
    s.peers[r] = static_cast<char*>(q);
  }
  // A new mapping of a peer's buffer must not overlap any live mapping of that peer (flags, slots, staging): if the
  // driver handed back an address inside an earlier mapping (handles sharing one underlying block), the pushes and
  // copies into this buffer would land on the flags or another buffer. Fail loudly instead of corrupting.
  for (int r = 0; r < world_; ++r) {
    if (r == rank_ || !maps(r)) continue;
    const char* lo = s.peers[r];
    const char* hi = lo + bytes;
    auto overlaps = [&](const Shared& o, size_t oBytes) {
      if (!o.live || static_cast<int>(o.peers.size()) <= r || o.peers[r] == nullptr) return false;
      return lo < o.peers[r] + oBytes && o.peers[r] < hi;
    };
    bool bad = overlaps(flags_, flags_.bytes);
    for (const Shared& o : slots_) bad = bad || overlaps(o, o.bytes);
    for (const Shared& o : staging_) bad = bad || overlaps(o, o.bytes);
    if (bad) {
      tideResult_t res = fail(tideInternalError, kComponent,
                              "%s: cudaIpcOpenMemHandle mapped rank %d's new buffer at %p, inside a live mapping of "
                              "another of its buffers (IPC handles sharing one allocation block)",
                              what, r, static_cast<void*>(s.peers[r]));
      unshare(&s);
      return res;
    }
  }
  TIDE_TRACE(kComponent, "%s: rank %d shares %zu bytes at %p; first peer mapping %p", what, rank_, bytes,
             static_cast<void*>(s.base), static_cast<void*>(s.peers[(rank_ + 1) % world_]));
  *out = std::move(s);
  return tideSuccess;
}

void IpcProvider::closePeers(Shared* s) {
  for (int r = 0; r < static_cast<int>(s->peers.size()); ++r) {
    if (r != rank_ && s->peers[r] != nullptr) (void)cudaIpcCloseMemHandle(s->peers[r]);
    if (r != rank_) s->peers[r] = nullptr;
  }
  (void)cudaGetLastError();
}

void IpcProvider::unshare(Shared* s) {
  if (!s->live) return;
  closePeers(s);
  if (s->base) (void)cudaFree(s->base);
  s->peers.clear();
  s->base = nullptr;
  s->live = false;
  (void)cudaGetLastError();
}

tideResult_t IpcProvider::slotAlloc(size_t bytes, void** ptr) {
  memGeneration_.fetch_add(1, std::memory_order_relaxed);
  if (bytes == 0) return fail(tideInvalidArgument, kComponent, "tideSlotAlloc: bytes must be > 0");
  std::lock_guard<std::mutex> lock(mu_);
  Shared s;
  TIDE_CHECK(share(bytes, "tideSlotAlloc", &s));
  *ptr = s.base;
  TIDE_TRACE(kComponent, "slot alloc rank %d #%zu: %zu bytes at %p", rank_, slots_.size(), bytes, *ptr);
  slots_.push_back(std::move(s));
  return tideSuccess;
}

tideResult_t IpcProvider::slotFree(void* ptr) {
  memGeneration_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = slots_.begin(); it != slots_.end(); ++it) {
    Shared& s = *it;
    if (s.live && s.base == ptr) {
      // Collective: no rank frees its memory while a peer's work may still write into it.
      TIDE_CUDA_CHECK(cudaSetDevice(device_));
      TIDE_CHECK(ex_.syncDevice("tideSlotFree"));
      TIDE_CHECK(ex_.barrier());
      // Every rank closes its mappings of the peers' copies before any rank frees its own (freeing exported memory
      // that an importer still maps is undefined behaviour).
      closePeers(&s);
      TIDE_CHECK(ex_.barrier());
      unshare(&s);
      // Drop the dead entry: a trimming slot pool (nccl_tide.fsdp) frees and allocates slots every step, and dead
      // entries would pile up and lengthen every peerPtr lookup. Nothing keeps a pointer into slots_ (mu_ is held).
      slots_.erase(it);
      return tideSuccess;
    }
  }
  return fail(tideInvalidArgument, kComponent, "tideSlotFree: %p is not a live slot of rank %d", ptr, rank_);
}

tideResult_t IpcProvider::peerPtr(const void* local, size_t bytes, int peer, const char* what, void** out) {
  if (!maps(peer)) return unmapped(peer, what);
  std::lock_guard<std::mutex> lock(mu_);
  const char* p = static_cast<const char*>(local);
  for (const Shared& s : slots_) {
    if (!s.live || p < s.base || p >= s.base + s.bytes) continue;
    size_t off = static_cast<size_t>(p - s.base);
    if (bytes > s.bytes - off) {
      return fail(tideInvalidArgument, kComponent,
                  "%s: region of %zu bytes at offset %zu runs past the end of rank %d's slot (%zu bytes)", what, bytes,
                  off, rank_, s.bytes);
    }
    if (s.peers[peer] == nullptr) {  // a free that failed half-way (its mappings closed, the entry still live)
      return fail(tideInternalError, kComponent, "%s: rank %d's slot at %p has no mapping of peer %d (a failed "
                  "tideSlotFree?)", what, rank_, static_cast<const void*>(s.base), peer);
    }
    *out = s.peers[peer] + off;
    return tideSuccess;
  }
  return fail(tideInvalidArgument, kComponent, "%s: %p is not inside a live slot of rank %d (use tideSlotAlloc)", what,
              local, rank_);
}

uint32_t* IpcProvider::flags(int owner) {
  return reinterpret_cast<uint32_t*>(flags_.peers[owner]);  // nullptr for an owner on another node
}

tideResult_t IpcProvider::unmapped(int peer, const char* what) const {
  return fail(tideInternalError, kComponent,
              "%s: rank %d addressed the memory of rank %d, which is on another TIDE node (%d ranks per node) and not "
              "mapped here; steps between nodes go through NCCL",
              what, rank_, peer, nodeRanks());
}

tideResult_t IpcProvider::ownStaging(int owner, uint64_t bytes, uint64_t epoch, void** out) {
  if (!maps(owner)) return unmapped(owner, "own RS staging");
  std::lock_guard<std::mutex> lock(mu_);
  if (staging_.empty() || staging_.back().bytes < bytes) {
    // Collective growth: every rank reaches this point in the same RS call (same layouts in the same order).
    Shared s;
    TIDE_CHECK(share(bytes, "own RS staging", &s));
    TIDE_INFO(kComponent, "rank %d: own RS staging grown to %llu bytes from epoch %llu", rank_,
              static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(epoch));
    staging_.push_back(std::move(s));
  }
  *out = staging_.back().peers[owner];
  return tideSuccess;
}

const void* IpcProvider::zeros(size_t* bytes) { return zeros_.get(bytes); }

}  // namespace cuda
}  // namespace tide
