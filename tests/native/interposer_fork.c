/* Copyright The nccl-tide authors
 * SPDX-License-Identifier: Apache-2.0 */
/* fork() while other threads are inside interposed NCCL calls (tests/unit/test_fork_safety.py).
 *
 * Run with libnccl-tide.so preloaded, NCCL_TIDE_ENABLE=1 and linked with the stub libnccl.so.2
 * (tests/native/stub_nccl/recording_stub_nccl.c). Threads make eligible ncclAllGather / ncclReduceScatter calls on fresh
 * communicators and destroy them, so the interposer's state lock, its per-communicator locks and the NCCL binding's
 * lock (a CUDA build tries a TIDE comm for each communicator; it fails over the stub and the call goes to NCCL) are
 * taken and released all the time. The main thread forks children meanwhile; each child makes the same calls once
 * and exits 0. Prints "forks N hung H failed F" and exits 0; a child that has not exited 10 s after the last fork is
 * counted as hung and killed. argv[1]: number of forks. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int ncclAllGather(const void*, void*, size_t, int, void*, void*);
int ncclReduceScatter(const void*, void*, size_t, int, int, void*, void*);
int ncclCommDestroy(void*);

enum { kFloat32 = 7, kCount = 1 << 20 };
static atomic_int gStop;
static float gSend[2], gRecv[2];

static int calls(uintptr_t comm) {
  void* c = (void*)comm;
  int r = ncclAllGather(gSend, gRecv, kCount, kFloat32, c, NULL);
  r |= ncclReduceScatter(gSend, gRecv, kCount, kFloat32, 0, c, NULL);
  r |= ncclCommDestroy(c);
  return r;
}

static void* churn(void* arg) {
  uintptr_t comm = 0x10000000u * ((uintptr_t)arg + 1);
  while (!atomic_load(&gStop)) comm += 16, calls(comm);
  return NULL;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char** argv) {
  const int forks = argc > 1 ? atoi(argv[1]) : 100;
  pthread_t threads[3];
  for (intptr_t i = 0; i < 3; ++i) pthread_create(&threads[i], NULL, churn, (void*)i);
  pid_t* pids = calloc((size_t)forks, sizeof(pid_t));
  for (int i = 0; i < forks; ++i) {
    pid_t pid = fork();
    if (pid == 0) _exit(calls(0xf0000000u + 16u * (unsigned)i) == 0 ? 0 : 3);
    pids[i] = pid;
    usleep(2000);
  }
  atomic_store(&gStop, 1);
  for (int i = 0; i < 3; ++i) pthread_join(threads[i], NULL);
  int hung = 0, failed = 0;
  const double deadline = now() + 10.0;
  for (int i = 0; i < forks; ++i) {
    int status = 0;
    pid_t got = 0;
    while ((got = waitpid(pids[i], &status, WNOHANG)) == 0 && now() < deadline) usleep(10000);
    if (got == 0) {
      kill(pids[i], SIGKILL);
      waitpid(pids[i], &status, 0);
      ++hung;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
    }
  }
  printf("forks %d hung %d failed %d\n", forks, hung, failed);
  free(pids);
  return 0;
}
