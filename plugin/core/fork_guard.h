// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Fork safety of the library's locks.
//
// A child forked while another thread holds a lock inherits the lock held by a thread that does not exist in the
// child, and blocks on it at its first call (fork-started DataLoader workers fork while the training thread is in
// the library). So every module registers its process-wide locks here; pthread_atfork handlers, installed with the
// first registration, take them all before fork() (outermost first: the order in which the library nests them, so
// taking them cannot deadlock against a thread that holds one and waits for the next), release them in the parent,
// and in the child run the modules' child hooks and then make every lock fresh. The child thus sees every structure
// in a consistent state, as left by the last thread that released its lock.
//
// Not registered: the CUDA paths' locks (one per comm, the IPC provider's); CUDA cannot be used
// in a child forked after CUDA was initialized, so nothing in the child can reach them.
#ifndef TIDE_CORE_FORK_GUARD_H_
#define TIDE_CORE_FORK_GUARD_H_

#include <mutex>

namespace tide {
namespace forkguard {

// Outermost first. A thread holding one of these locks may take only locks of later levels.
enum Level : int {
  kInterposerStates = 0,  // the interposer's communicator table (its per-communicator locks: see its child hook)
  kInterposerAttach,      // the interposer's attached layouts (taken under a per-communicator lock)
  kInterposerWindows,     // the interposer's registered buffers (taken under a per-communicator lock)
  kInterposerOps,         // the interposer's PREMUL_SUM op table
  kInterposerCounters,    // the interposer's call counters
  kNcclBinding,           // the resolved NCCL library (taken under a per-communicator lock; logs)
  kHandles,               // the handle registry
  kLogSettings,           // the logging settings' one-time load (reads the parameters)
  kParams,                // the parameters' one-time read of the environment
  kNumLevels
};

// Holds `mu` across fork() at `level`; `inChild`, if set, runs in the child while every lock is still held, before
// the locks are made fresh. Call it during static initialization (the library's load). Returns true (for use as a
// static initializer).
bool guard(Level level, std::mutex* mu, void (*inChild)() = nullptr);

}  // namespace forkguard
}  // namespace tide

#endif  // TIDE_CORE_FORK_GUARD_H_
