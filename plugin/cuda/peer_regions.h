// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Application memory that the ranks of a comm's node already map to each other: a buffer the application registered
// with NCCL as a symmetric window (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC). The interposer learns the
// peers' addresses of such a window from NCCL and hands them to the comm (plugin/api/interposer_windows.h);
// slotRegion (comm.h) then resolves an address inside it as it resolves a slot, so an all-gather's peers write
// straight into the application's buffer, with no bounce slot and no copy-out.
//
// The regions are the application's: it registers and deregisters them, and orders their reuse after the TIDE
// work on its streams, as NCCL requires of a registered buffer.
#ifndef TIDE_CUDA_PEER_REGIONS_H_
#define TIDE_CUDA_PEER_REGIONS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace tide {
namespace cuda {

class PeerRegions {
 public:
  // [base, base + bytes) and, by comm rank, each rank's copy of it as this rank addresses it (own: base; nullptr:
  // a rank that does not map it). Replaces a region at the same base.
  void add(const void* base, size_t bytes, std::vector<char*> peers) {
    std::lock_guard<std::mutex> lock(mu_);
    regions_[reinterpret_cast<uintptr_t>(base)] = Region{bytes, std::move(peers)};
    generation_.fetch_add(1, std::memory_order_relaxed);
  }

  bool has(const void* base) const {
    std::lock_guard<std::mutex> lock(mu_);
    return regions_.count(reinterpret_cast<uintptr_t>(base)) != 0;
  }

  // Drops the region at `base` (nothing if there is none).
  void remove(const void* base) {
    std::lock_guard<std::mutex> lock(mu_);
    if (regions_.erase(reinterpret_cast<uintptr_t>(base)) != 0) generation_.fetch_add(1, std::memory_order_relaxed);
  }

  // Rank `peer`'s address of [local, local + bytes) if that range lies inside one region that `peer` maps.
  bool find(const void* local, size_t bytes, int peer, void** out) const {
    const auto lo = reinterpret_cast<uintptr_t>(local);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.upper_bound(lo);
    if (it == regions_.begin()) return false;
    --it;
    const Region& r = it->second;
    const uintptr_t off = lo - it->first;
    if (off > r.bytes || bytes > r.bytes - off) return false;
    if (peer < 0 || static_cast<size_t>(peer) >= r.peers.size() || r.peers[peer] == nullptr) return false;
    *out = r.peers[peer] + off;
    return true;
  }

  // Changes with every add and remove: part of the key of bound programs, which keep resolved peer addresses.
  uint64_t generation() const { return generation_.load(std::memory_order_relaxed); }

 private:
  struct Region {
    size_t bytes = 0;
    std::vector<char*> peers;
  };
  mutable std::mutex mu_;
  std::map<uintptr_t, Region> regions_;  // by base
  std::atomic<uint64_t> generation_{0};
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_PEER_REGIONS_H_
