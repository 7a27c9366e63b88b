// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "interposer_windows.h"

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "../core/fork_guard.h"

namespace tide {
namespace interposer {
namespace windows {
namespace {

struct Registered {
  Kind kind;
  char* base;
  size_t size;
  void* handle;  // the window, or ncclCommRegister's handle
};

std::mutex gMu;
// Never freed: registrations may be looked up by threads still running while the process exits.
auto* gByComm = new std::unordered_map<void*, std::vector<Registered>>();
[[maybe_unused]] const bool gWindowsForkGuarded = forkguard::guard(forkguard::kInterposerWindows, &gMu);

struct Pending {
  void* comm;
  void* buff;
  size_t size;
  void** winOut;
  int flags;
};
thread_local std::vector<Pending> tPending;  // registrations of the thread's open group

void add(void* comm, Kind kind, void* buff, size_t size, void* handle) {
  std::lock_guard<std::mutex> lock(gMu);
  (*gByComm)[comm].push_back(Registered{kind, static_cast<char*>(buff), size, handle});
}

// Removes the record of `handle` and returns its buffer (nullptr if none).
void* drop(void* comm, void* handle) {
  std::lock_guard<std::mutex> lock(gMu);
  auto it = gByComm->find(comm);
  if (it == gByComm->end()) return nullptr;
  std::vector<Registered>& v = it->second;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i].handle == handle) {
      char* base = v[i].base;
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      return base;
    }
  }
  return nullptr;
}

}  // namespace

void registered(void* comm, void* buff, size_t size, void* win, int flags) {
  if (win == nullptr) return;
  add(comm, (flags & kNcclWinCollSymmetric) ? Kind::kSymmetricWindow : Kind::kWindow, buff, size, win);
}

void registeredInGroup(void* comm, void* buff, size_t size, void** winOut, int flags) {
  tPending.push_back(Pending{comm, buff, size, winOut, flags});
}

void groupEnded(bool ok) {
  std::vector<Pending> done;
  done.swap(tPending);
  if (!ok) return;
  // A nonblocking communicator may fill the handle later: such a window is not recorded (its all-gathers keep the
  // copy-out), never guessed at.
  for (const Pending& p : done) registered(p.comm, p.buff, p.size, *p.winOut, p.flags);
}

void* deregistered(void* comm, void* win) { return win == nullptr ? nullptr : drop(comm, win); }

void registeredLocal(void* comm, void* buff, size_t size, void* handle) {
  add(comm, Kind::kLocalRegistration, buff, size, handle);
}

void deregisteredLocal(void* comm, void* handle) { (void)drop(comm, handle); }

Kind lookup(void* comm, const void* p, size_t bytes, Hit* hit) {
  const auto lo = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(gMu);
  auto it = gByComm->find(comm);
  if (it == gByComm->end()) return Kind::kNone;
  // Windows first: a buffer may be both registered locally and inside a window.
  Kind found = Kind::kNone;
  for (const Registered& r : it->second) {
    const auto base = reinterpret_cast<uintptr_t>(r.base);
    if (lo < base || lo - base > r.size || bytes > r.size - (lo - base)) continue;
    if (found == Kind::kNone || (found == Kind::kLocalRegistration && r.kind != Kind::kLocalRegistration) ||
        (found == Kind::kWindow && r.kind == Kind::kSymmetricWindow)) {
      found = r.kind;
      hit->win = r.kind == Kind::kLocalRegistration ? nullptr : r.handle;
      hit->base = r.base;
      hit->size = r.size;
    }
  }
  return found;
}

void forgetComm(void* comm) {
  std::lock_guard<std::mutex> lock(gMu);
  gByComm->erase(comm);
}

}  // namespace windows
}  // namespace interposer
}  // namespace tide
