// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "window_memory.h"

#include <cstdio>
#include <memory>

#include "../core/errors.h"
#include "../core/log.h"

namespace tide {
namespace nccl {
namespace {

constexpr const char* kComponent = "Window";

// NCCL's name for a result, for messages.
const char* resultName(const Lib& lib, ncclResult_t r) {
  const char* s = lib.getErrorString ? lib.getErrorString(r) : nullptr;
  return s ? s : "unknown error";
}

}  // namespace

tideResult_t WindowMemory::open(const Lib& lib, ncclComm_t parent, int rank, int world, int nodeRanks,
                                Exchange exchange, WorkLeft workLeft, size_t flagBytes, const Init& initFlags,
                                std::unique_ptr<WindowMemory>* out, Availability* avail, std::string* why) {
  out->reset();
  *avail = Availability::kAvailable;
  why->clear();
  ncclComm_t comm = parent;
  tideResult_t local = tideSuccess;
  if (nodeRanks < world) {
    // Blocking whatever the parent is: every later call on it (registration, destroy) then completes in the call.
    ConfigPrefix config;
    ncclComm_t child = nullptr;
    const ncclResult_t r = lib.commSplit(parent, rank / nodeRanks, rank, &child, &config);
    local = settle(lib, child != nullptr ? child : parent, r, "ncclCommSplit (one communicator per TIDE node)");
    if (local == tideSuccess && child == nullptr) {
      local = fail(tideInternalError, kComponent, "ncclCommSplit by TIDE node returned no communicator");
    }
    comm = child;
  }
  std::unique_ptr<WindowMemory> m(
      new WindowMemory(lib, comm, nodeRanks < world, rank, world, nodeRanks, std::move(exchange), std::move(workLeft)));
  // Every rank learns that every node has its communicator before any rank registers (which waits for its node).
  const int32_t mine = local == tideSuccess ? 1 : 0;
  std::vector<int32_t> all(world);
  const tideResult_t ex = m->exchange_(&mine, all.data(), sizeof(mine));
  // On failure the split communicator is aborted (local), not destroyed: the other ranks may not reach a destroy.
  if (ex != tideSuccess) {
    if (m->workLeft_ && m->workLeft_()) {
      m->abandon();
    } else {
      m->abortRelease();
    }
    return ex;
  }
  tideResult_t res = local;
  for (int r = 0; r < world && res == tideSuccess; ++r) {
    if (!all[r]) res = fail(tideNcclError, kComponent, "rank %d could not split its TIDE node's communicator", r);
  }
  if (res == tideSuccess) res = m->share(flagBytes, "flags", initFlags, &m->flags_, avail, why);
  if (res != tideSuccess) {
    m->abortRelease();
    return res;
  }
  // Unavailable on every rank: m destroys the communicator it split (on every rank of the node alike).
  if (*avail == Availability::kUnavailable) return tideSuccess;
  *out = std::move(m);
  return tideSuccess;
}

WindowMemory::~WindowMemory() {
  if (!abandoned_) releaseAll(false);
}

tideResult_t WindowMemory::share(size_t bytes, const char* what, const Init& init, Buffer* out, Availability* avail,
                                 std::string* why) {
  *avail = Availability::kAvailable;
  Buffer b;
  b.bytes = bytes;
  Agreement mine{bytes, 1, Agreement::kNone, kNcclSuccess, -1};
  tideResult_t local = tideSuccess;
  void* p = nullptr;
  const ncclResult_t r = lib_.memAlloc(&p, bytes);
  if (r != kNcclSuccess || p == nullptr) {
    local = fail(tideOutOfMemory, kComponent, "%s: rank %d could not allocate %zu bytes with ncclMemAlloc: %s", what,
                 rank_, bytes, r != kNcclSuccess ? resultName(lib_, r) : "no memory");
    p = nullptr;
  }
  b.base = static_cast<char*>(p);
  if (local == tideSuccess && init) local = init(p, bytes);
  mine.ok = local == tideSuccess ? 1 : 0;
  auto drop = [&] {
    if (workLeft_ && workLeft_()) return;  // device work may still write into it: left to process exit
    (void)release(&b);
  };
  std::vector<Agreement> all(world_);
  tideResult_t ex = exchange_(&mine, all.data(), sizeof(Agreement));
  if (ex != tideSuccess || local != tideSuccess) {
    drop();
    return ex != tideSuccess ? ex : local;
  }
  for (int q = 0; q < world_; ++q) {
    if (!all[q].ok) {
      drop();
      return fail(tideOutOfMemory, kComponent, "%s: rank %d could not allocate %llu bytes; see its log", what, q,
                  static_cast<unsigned long long>(all[q].bytes));
    }
    if (all[q].bytes != bytes) {
      drop();
      return fail(tideMismatch, kComponent,
                  "%s: rank %d allocates %llu bytes but rank %d allocates %zu; every rank must make the same "
                  "allocations in the same order",
                  what, q, static_cast<unsigned long long>(all[q].bytes), rank_, bytes);
    }
  }
  local = registerAndResolve(&b, &mine);
  mine.ok = local == tideSuccess ? 1 : 0;
  ex = exchange_(&mine, all.data(), sizeof(Agreement));
  if (ex != tideSuccess || local != tideSuccess) {
    drop();
    return ex != tideSuccess ? ex : local;
  }
  for (int q = 0; q < world_; ++q) {
    if (!all[q].ok) {
      drop();
      return fail(tideNcclError, kComponent, "%s: rank %d could not register its window; see its log", what, q);
    }
  }
  // This rank's own refusal, else the lowest rank's: the reason names the NCCL call that said no on every rank.
  int refused = mine.refusal != Agreement::kNone ? rank_ : -1;
  for (int q = 0; q < world_ && refused < 0; ++q) {
    if (all[q].refusal != Agreement::kNone) refused = q;
  }
  if (refused >= 0) {
    drop();
    *avail = Availability::kUnavailable;
    *why = refusalText(refused, refused == rank_ ? mine : all[refused]);
    TIDE_INFO(kComponent, "rank %d: %s: %s", rank_, what, why->c_str());
    return tideSuccess;
  }
  TIDE_TRACE(kComponent, "%s: rank %d registered %zu bytes at %p as window %p", what, rank_, bytes,
             static_cast<void*>(b.base), b.win);
  *out = std::move(b);
  return tideSuccess;
}

tideResult_t WindowMemory::registerAndResolve(Buffer* b, Agreement* mine) {
  // Collective inside NCCL over the windows' communicator. On a nonblocking communicator NCCL writes the handle when
  // the registration completes, possibly after the bounded wait gave up: the handle lives on the heap, and then it
  // and the buffer are left to NCCL.
  auto handle = std::make_unique<ncclWindow_t>(nullptr);
  ncclResult_t r = kNcclSuccess;
  const tideResult_t settled = settledResult(
      lib_, comm_, lib_.commWindowRegister(comm_, b->base, b->bytes, handle.get(), kNcclWinDefault),
      "ncclCommWindowRegister", &r);
  if (settled != tideSuccess) {
    (void)handle.release();
    b->leftToNccl = true;
    return settled;
  }
  b->win = *handle;
  if (r != kNcclSuccess) {
    b->win = nullptr;  // NCCL holds no window after a failed registration
    mine->refusal = Agreement::kRegisterFailed;
    mine->result = r;
    return tideSuccess;
  }
  if (b->win == nullptr) {
    mine->refusal = Agreement::kNoWindow;
    return tideSuccess;
  }
  b->peers.assign(world_, nullptr);
  for (int q = 0; q < world_; ++q) {
    if (q == rank_) {
      b->peers[q] = b->base;
      continue;
    }
    if (!onNode(q)) continue;
    void* ptr = nullptr;
    const ncclResult_t pr = lib_.getPeerDevicePointer(b->win, 0, commRank(q), &ptr);
    if (pr != kNcclSuccess || ptr == nullptr) {
      mine->refusal = pr != kNcclSuccess ? Agreement::kPeerPointerFailed : Agreement::kNoPeerAddress;
      mine->result = pr;
      mine->peer = q;
      return tideSuccess;
    }
    b->peers[q] = static_cast<char*>(ptr);
  }
  return tideSuccess;
}

std::string WindowMemory::refusalText(int q, const Agreement& a) const {
  char text[512];
  switch (a.refusal) {
    case Agreement::kRegisterFailed:
      snprintf(text, sizeof(text), "ncclCommWindowRegister on %s failed on rank %d: %s (NCCL error %d)", where(), q,
               resultName(lib_, a.result), a.result);
      break;
    case Agreement::kNoWindow:
      snprintf(text, sizeof(text),
               "ncclCommWindowRegister on %s returned no window on rank %d (ncclSuccess, window NULL): NCCL has no "
               "symmetric memory there (it needs CUDA P2P and cuMem between the ranks, one NCCL host or a GIN "
               "network, NCCL_WIN_ENABLE and NCCL_CUMEM_ENABLE not 0)",
               where(), q);
      break;
    case Agreement::kPeerPointerFailed:
      snprintf(text, sizeof(text),
               "ncclGetPeerDevicePointer on %s failed on rank %d for rank %d's window: %s (NCCL error %d)", where(), q,
               a.peer, resultName(lib_, a.result), a.result);
      break;
    default:
      snprintf(text, sizeof(text),
               "ncclGetPeerDevicePointer on %s returned no address on rank %d for rank %d's window (ncclSuccess, "
               "pointer NULL): NCCL does not count them as reaching each other by loads and stores (its LSA team)",
               where(), q, a.peer);
      break;
  }
  return text;
}

tideResult_t WindowMemory::release(Buffer* b) {
  tideResult_t first = tideSuccess;
  if (b->win != nullptr) {
    first = settle(lib_, comm_, lib_.commWindowDeregister(comm_, b->win), "ncclCommWindowDeregister");
    b->win = nullptr;
    // NCCL may still hold the window (a failed or unfinished deregistration): its memory is not freed under it.
    if (first != tideSuccess) b->leftToNccl = true;
  }
  if (b->base != nullptr && !b->leftToNccl) {
    const ncclResult_t r = lib_.memFree(b->base);
    if (r != kNcclSuccess && first == tideSuccess) first = ncclFail(lib_, r, "ncclMemFree");
    b->base = nullptr;
  }
  b->peers.clear();
  return first;
}

void WindowMemory::releaseAll(bool abortChild) {
  auto drop = [&](Buffer* b, const char* what) {
    if (release(b) != tideSuccess) {
      TIDE_WARN(kComponent, "rank %d: releasing %s failed: %s", rank_, what, lastError());
    }
  };
  for (Buffer& s : slots_) drop(&s, "a slot");
  for (Buffer& s : staging_) drop(&s, "own RS staging");
  drop(&flags_, "flags");
  slots_.clear();
  staging_.clear();
  if (owned_ && comm_ != nullptr) {
    const ncclResult_t r = abortChild ? lib_.commAbort(comm_) : lib_.commDestroy(comm_);
    if (r != kNcclSuccess) {
      (void)ncclFail(lib_, r, abortChild ? "ncclCommAbort (TIDE node communicator)"
                                         : "ncclCommDestroy (TIDE node communicator)");
    }
  }
  comm_ = nullptr;
}

tideResult_t WindowMemory::slotAlloc(size_t bytes, void** ptr) {
  Buffer b;
  Availability avail = Availability::kAvailable;
  std::string why;
  TIDE_CHECK(share(bytes, "tideSlotAlloc", nullptr, &b, &avail, &why));
  if (avail == Availability::kUnavailable) {
    return fail(tideNcclError, kComponent, "tideSlotAlloc: NCCL gave no window for a slot of %zu bytes: %s", bytes,
                why.c_str());
  }
  *ptr = b.base;
  slots_.push_back(std::move(b));
  return tideSuccess;
}

tideResult_t WindowMemory::slotFree(void* ptr, const Quiesce& quiesce) {
  for (auto it = slots_.begin(); it != slots_.end(); ++it) {
    if (it->base != ptr) continue;
    TIDE_CHECK(quiesce("tideSlotFree"));
    const tideResult_t r = release(&*it);
    // Dropped also when a release step failed: the trimming slot pool of nccl_tide.fsdp frees and allocates slots
    // every step, and dead entries would lengthen every peerPtr lookup.
    slots_.erase(it);
    return r;
  }
  return fail(tideInvalidArgument, kComponent, "tideSlotFree: %p is not a live slot of rank %d", ptr, rank_);
}

tideResult_t WindowMemory::peerPtr(const void* local, size_t bytes, int peer, const char* what, void** out) const {
  const char* p = static_cast<const char*>(local);
  for (const Buffer& s : slots_) {
    if (p < s.base || p >= s.base + s.bytes) continue;
    const size_t off = static_cast<size_t>(p - s.base);
    if (bytes > s.bytes - off) {
      return fail(tideInvalidArgument, kComponent,
                  "%s: region of %zu bytes at offset %zu runs past the end of rank %d's slot (%zu bytes)", what, bytes,
                  off, rank_, s.bytes);
    }
    if (s.peers[peer] == nullptr) {
      return fail(tideInternalError, kComponent,
                  "%s: rank %d addressed rank %d's copy of a slot, which is on another TIDE node (%d ranks per node) "
                  "and not mapped here; steps between nodes go through NCCL",
                  what, rank_, peer, nodeRanks_);
    }
    *out = s.peers[peer] + off;
    return tideSuccess;
  }
  return fail(tideInvalidArgument, kComponent, "%s: %p is not inside a live slot of rank %d (use tideSlotAlloc)", what,
              local, rank_);
}

tideResult_t WindowMemory::ownStaging(int owner, uint64_t bytes, void** out, bool* grown) {
  *grown = false;
  if (staging_.empty() || staging_.back().bytes < bytes) {
    Buffer b;
    Availability avail = Availability::kAvailable;
    std::string why;
    TIDE_CHECK(share(bytes, "own RS staging", nullptr, &b, &avail, &why));
    if (avail == Availability::kUnavailable) {
      return fail(tideNcclError, kComponent, "own RS staging: NCCL gave no window of %llu bytes: %s",
                  static_cast<unsigned long long>(bytes), why.c_str());
    }
    staging_.push_back(std::move(b));
    *grown = true;
  }
  if (staging_.back().peers[owner] == nullptr) {
    return fail(tideInternalError, kComponent,
                "own RS staging: rank %d addressed rank %d's, which is on another TIDE node and not mapped here",
                rank_, owner);
  }
  *out = staging_.back().peers[owner];
  return tideSuccess;
}

void WindowMemory::abortRelease() {
  // The caller's own communicator may already be aborted and freed by its owner (a watchdog): no NCCL call on it
  // then; the windows and their memory are left to process exit. A communicator TIDE split off is aborted with them.
  if (!owned_) abandon();
  if (!abandoned_) releaseAll(true);
}

void WindowMemory::abandon() { abandoned_ = true; }

}  // namespace nccl
}  // namespace tide
