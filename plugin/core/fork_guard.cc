// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Locks held across fork() (fork_guard.h).
#include "fork_guard.h"

#include <pthread.h>

#include <atomic>
#include <new>

namespace tide {
namespace forkguard {
namespace {

// Constant-initialized: usable from any module's static initializer, whatever the initialization order.
std::atomic<std::mutex*> gLocks[kNumLevels];
std::atomic<void (*)()> gChildHooks[kNumLevels];

void prepare() {
  for (auto& l : gLocks) {
    if (std::mutex* mu = l.load(std::memory_order_acquire)) mu->lock();
  }
}

void parent() {
  for (int i = kNumLevels - 1; i >= 0; --i) {
    if (std::mutex* mu = gLocks[i].load(std::memory_order_acquire)) mu->unlock();
  }
}

void child() {
  for (auto& h : gChildHooks) {
    if (void (*hook)() = h.load(std::memory_order_acquire)) hook();
  }
  // The child's only thread holds them all (taken in prepare); a fresh mutex is the unlocked state whoever the
  // owner was recorded to be.
  for (auto& l : gLocks) {
    if (std::mutex* mu = l.load(std::memory_order_acquire)) new (mu) std::mutex();
  }
}

}  // namespace

bool guard(Level level, std::mutex* mu, void (*inChild)()) {
  static const bool installed = pthread_atfork(prepare, parent, child) == 0;
  (void)installed;
  gChildHooks[level].store(inChild, std::memory_order_release);
  gLocks[level].store(mu, std::memory_order_release);
  return true;
}

}  // namespace forkguard
}  // namespace tide
