// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Definitions of the few glibc symbols newer than the wheel's glibc target (manylinux_2_28 = glibc 2.28) that the
// statically linked libstdc++ refers to. Compiled only with TIDE_GLIBC_COMPAT (cmake/glibc_stubs.py explains the
// portable link); hidden, so they bind only the references inside libnccl-tide.so and are never exported.
//
// * __libc_single_threaded (glibc 2.32): libstdc++ skips atomic reference counting when it reads 1. Always 0 here:
//   the library is multi-threaded anyway (its callers, NCCL's and torch's threads), so nothing is lost.
// * arc4random (glibc 2.36): libstdc++'s std::random_device "default" token. Served from getrandom (2.25).
// * pthread_cond_clockwait (glibc 2.30): std::condition_variable waits on steady_clock deadlines. A monotonic
//   deadline becomes the equivalent realtime one for pthread_cond_timedwait; libstdc++'s callers re-check their
//   clock after every wake-up, so a realtime clock step can only cost one extra wait round, never a missed wake.
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define TIDE_SHIM extern "C" __attribute__((visibility("hidden")))

TIDE_SHIM char __libc_single_threaded = 0;

TIDE_SHIM uint32_t arc4random(void) {
  uint32_t v = 0;
  char* p = reinterpret_cast<char*>(&v);
  size_t got = 0;
  while (got < sizeof(v)) {
    ssize_t n = getrandom(p + got, sizeof(v) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      break;
    }
  }
  if (got < sizeof(v)) {  // getrandom unavailable (very old kernel): the urandom device
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      while (got < sizeof(v)) {
        ssize_t n = read(fd, p + got, sizeof(v) - got);
        if (n > 0) {
          got += static_cast<size_t>(n);
        } else if (n < 0 && errno == EINTR) {
          continue;
        } else {
          break;
        }
      }
      close(fd);
    }
  }
  return v;
}

TIDE_SHIM int pthread_cond_clockwait(pthread_cond_t* cond, pthread_mutex_t* mutex, clockid_t clock,
                                     const struct timespec* abstime) {
  if (clock == CLOCK_REALTIME) return pthread_cond_timedwait(cond, mutex, abstime);
  if (clock != CLOCK_MONOTONIC) return EINVAL;
  struct timespec now_mono, now_real;
  clock_gettime(CLOCK_MONOTONIC, &now_mono);
  clock_gettime(CLOCK_REALTIME, &now_real);
  int64_t left_ns = (static_cast<int64_t>(abstime->tv_sec) - now_mono.tv_sec) * 1000000000LL +
                    (abstime->tv_nsec - now_mono.tv_nsec);
  if (left_ns < 0) left_ns = 0;
  int64_t when_ns = static_cast<int64_t>(now_real.tv_sec) * 1000000000LL + now_real.tv_nsec + left_ns;
  struct timespec deadline;
  deadline.tv_sec = static_cast<time_t>(when_ns / 1000000000LL);
  deadline.tv_nsec = static_cast<long>(when_ns % 1000000000LL);
  return pthread_cond_timedwait(cond, mutex, &deadline);
}
