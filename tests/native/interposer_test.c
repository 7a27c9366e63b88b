/* Copyright The nccl-tide authors
 * SPDX-License-Identifier: Apache-2.0 */
/* Caller side of the interposer tests (tests/unit/test_interposer.py drives it; no GPU, no real NCCL).
 *
 * Built three ways from this one file, against the recording stub libnccl.so.2 (tests/native/stub_nccl/recording_stub_nccl.c):
 *   interposer_linked:  an executable linked with the stub (-lnccl), calling NCCL the way a C/C++ program does;
 *   libcaller.so:       -DTIDE_TEST_CALLER_LIB, a shared library linked with the stub (like libtorch_cuda.so);
 *   interposer_dlopen:  -DTIDE_TEST_DLOPEN, an executable NOT linked with NCCL that dlopen()s libcaller.so with
 *                       RTLD_LOCAL (so the stub is not in the global scope: RTLD_NEXT would not find it), or, with
 *                       the argument "nonccl", calls ncclAllGather with no NCCL loaded at all.
 * Each is run with libnccl-tide.so in LD_PRELOAD. run_calls() prints "EXPECT <line>" for every call that must reach
 * the stub, in the stub's own format, so the test compares the stub's log with these lines (arguments and order),
 * and "BOUND <symbol> <file>" with the library the caller's reference resolved to. Any unexpected return code
 * prints "FAIL ..." and makes the exit status nonzero. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*ag_config_fn)(const void*, void*, size_t, int, void*, void*, const void*);
typedef int (*rs_config_fn)(const void*, void*, size_t, int, int, void*, void*, const void*);
typedef int (*ag_fn)(const void*, void*, size_t, int, void*, void*);

#define P(x) ((void*)(uintptr_t)(x))

#ifndef TIDE_TEST_DLOPEN
int ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, int datatype, void* comm, void* stream);
int ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, int datatype, int op, void* comm,
                      void* stream);
int ncclGroupStart(void);
int ncclGroupEnd(void);
int ncclGroupSimulateEnd(void* simInfo);
int ncclRedOpCreatePreMulSum(int* op, void* scalar, int datatype, int residence, void* comm);
int ncclRedOpDestroy(int op, void* comm);
int ncclCommFinalize(void* comm);
int ncclCommDestroy(void* comm);
int ncclCommAbort(void* comm);
int ncclCommWindowRegister(void* comm, void* buff, size_t size, void** win, int winFlags);
int ncclCommWindowDeregister(void* comm, void* win);
int ncclCommRegister(void* comm, void* buff, size_t size, void** handle);
int ncclCommDeregister(void* comm, void* handle);

static int failures = 0;

static void check(int rc, int want, const char* what) {
  if (rc != want) {
    printf("FAIL %s returned %d, expected %d\n", what, rc, want);
    failures++;
  }
}

static void bound(const char* name, void* addr) {
  Dl_info info;
  memset(&info, 0, sizeof(info));
  printf("BOUND %s %s\n", name, dladdr(addr, &info) && info.dli_fname ? info.dli_fname : "?");
}

static void ag(const void* s, void* r, size_t n, int dt, void* comm, void* stream) {
  printf("EXPECT AG %p %p %zu %d %p %p\n", s, r, n, dt, comm, stream);
  check(ncclAllGather(s, r, n, dt, comm, stream), 0, "ncclAllGather");
}

static void rs(const void* s, void* r, size_t n, int dt, int op, void* comm, void* stream) {
  printf("EXPECT RS %p %p %zu %d %d %p %p\n", s, r, n, dt, op, comm, stream);
  check(ncclReduceScatter(s, r, n, dt, op, comm, stream), 0, "ncclReduceScatter");
}

/* A PREMUL_SUM op of an fp32 scalar (host: residence 1, device: 0), as torch creates one; the stub numbers ops
 * 5, 6, ... in creation order. */
static int premul(float scalar, int residence, void* comm) {
  static int next = 5;
  uint32_t bits;
  memcpy(&bits, &scalar, sizeof(bits));
  printf("EXPECT PMS %d 0x%x %d %d %p\n", next, residence == 1 ? bits : 0u, 7, residence, comm);
  int op = -1;
  check(ncclRedOpCreatePreMulSum(&op, &scalar, 7, residence, comm), 0, "ncclRedOpCreatePreMulSum");
  check(op == next, 1, "the stub's op number");
  next++;
  return op;
}

static void destroy_op(int op, void* comm) {
  printf("EXPECT OPD %d %p\n", op, comm);
  check(ncclRedOpDestroy(op, comm), 0, "ncclRedOpDestroy");
}

/* Buffer registrations as an application makes them (the stub numbers windows 0x7e00000000 + 0x1000 * k for the
 * k-th registration of the process, and local handles 0x4e00000000 + buff): a symmetric window outside and inside a
 * group, a local registration, an all-gather into each, then the deregistrations. */
static void registrations(void* comm, void* stream) {
  static unsigned long long k = 0;
  void* win = NULL;
  printf("EXPECT WR %p %p %zu %d %p\n", comm, P(0x20000000), (size_t)1 << 24, 1, P(0x7e00000000ull + 0x1000 * ++k));
  check(ncclCommWindowRegister(comm, P(0x20000000), (size_t)1 << 24, &win, 1), 0, "ncclCommWindowRegister");
  check(win == P(0x7e00000000ull + 0x1000 * k), 1, "the window NCCL gave");
  check(ncclGroupStart(), 0, "ncclGroupStart");
  printf("EXPECT GS\n");
  void* grouped = NULL;
  printf("EXPECT WR %p %p %zu %d %p\n", comm, P(0x30000000), (size_t)1 << 24, 0, P(0x7e00000000ull + 0x1000 * ++k));
  check(ncclCommWindowRegister(comm, P(0x30000000), (size_t)1 << 24, &grouped, 0), 0, "ncclCommWindowRegister");
  check(ncclGroupEnd(), 0, "ncclGroupEnd");
  printf("EXPECT GE\n");
  void* local = NULL;
  printf("EXPECT REG %p %p %zu %p\n", comm, P(0x40000000), (size_t)1 << 24, P(0x4e00000000ull + 0x40000000));
  check(ncclCommRegister(comm, P(0x40000000), (size_t)1 << 24, &local), 0, "ncclCommRegister");
  ag(P(0x20000000), P(0x20000000), (size_t)1 << 20, 7, comm, stream); /* in place, in the symmetric window */
  ag(P(0x3000f000), P(0x30000000), (size_t)1 << 20, 7, comm, stream); /* in the plain window */
  ag(P(0x50000000), P(0x40000000), (size_t)1 << 20, 7, comm, stream); /* in the local registration */
  printf("EXPECT WD %p %p\n", comm, win);
  check(ncclCommWindowDeregister(comm, win), 0, "ncclCommWindowDeregister");
  printf("EXPECT WD %p %p\n", comm, grouped);
  check(ncclCommWindowDeregister(comm, grouped), 0, "ncclCommWindowDeregister");
  printf("EXPECT DEREG %p %p\n", comm, local);
  check(ncclCommDeregister(comm, local), 0, "ncclCommDeregister");
}

/* config_rc: what the ...Config calls must return (0 when the stub has them, 5 = ncclInvalidUsage when not). */
#ifdef TIDE_TEST_CALLER_LIB
__attribute__((visibility("default")))
#endif
int run_calls(int config_rc) {
  bound("ncclAllGather", (void*)&ncclAllGather);
  bound("ncclReduceScatter", (void*)&ncclReduceScatter);
  bound("ncclGroupStart", (void*)&ncclGroupStart);
  bound("ncclGroupEnd", (void*)&ncclGroupEnd);
  bound("ncclGroupSimulateEnd", (void*)&ncclGroupSimulateEnd);
  bound("ncclRedOpCreatePreMulSum", (void*)&ncclRedOpCreatePreMulSum);
  bound("ncclRedOpDestroy", (void*)&ncclRedOpDestroy);
  bound("ncclCommFinalize", (void*)&ncclCommFinalize);
  bound("ncclCommDestroy", (void*)&ncclCommDestroy);
  bound("ncclCommAbort", (void*)&ncclCommAbort);
  bound("ncclCommWindowRegister", (void*)&ncclCommWindowRegister);
  bound("ncclCommWindowDeregister", (void*)&ncclCommWindowDeregister);
  bound("ncclCommRegister", (void*)&ncclCommRegister);
  bound("ncclCommDeregister", (void*)&ncclCommDeregister);
  void* comm = P(0xc0ffee00);
  void* stream = P(0x5713a4);
  ag(P(0x1000), P(0x2000), 1, 7, comm, stream);                         /* small fp32 */
  rs(P(0x3000), P(0x4000), (size_t)1 << 20, 9, 0, comm, stream);        /* 2 MiB bf16 sum: eligible by size */
  ag(P(0x5000), P(0x6000), (size_t)1 << 22, 6, comm, P(0));             /* 8 MiB fp16, default stream */
  /* A group over two communicators goes to NCCL whole, in call order (TIDE may reorder only one communicator's
   * group, which no build can show here: tests/native/interposer_group_test.cc covers it). */
  check(ncclGroupStart(), 0, "ncclGroupStart");
  printf("EXPECT GS\n");
  rs(P(0xb000), P(0xc000), 17, 2, 0, P(0xc0ffee01), stream);           /* int32 sum, second comm */
  ag(P(0x7000), P(0x8000), (size_t)3 << 20, 7, comm, stream);
  rs(P(0x9000), P(0xa000), (size_t)1 << 21, 7, 2, comm, stream);        /* max: ineligible op */
  check(ncclGroupEnd(), 0, "ncclGroupEnd");
  printf("EXPECT GE\n");
  /* A simulated group: NCCL sees its calls, then the simulated end (nothing launches). */
  check(ncclGroupStart(), 0, "ncclGroupStart");
  printf("EXPECT GS\n");
  ag(P(0x15000), P(0x16000), (size_t)1 << 20, 7, comm, stream);
  printf("EXPECT GSE %p\n", P(0x51a));
  check(ncclGroupSimulateEnd(P(0x51a)), 0, "ncclGroupSimulateEnd");
  /* PREMUL_SUM ops as torch sends them: created right before the call, destroyed right after; a host scalar of 1.0
   * (a sum), another host scalar (a premultiplied sum), a device scalar (NCCL's). */
  int op = premul(1.0f, 1, comm);
  rs(P(0x12000), P(0x13000), (size_t)1 << 20, 7, op, comm, stream);
  destroy_op(op, comm);
  op = premul(0.25f, 1, comm);
  rs(P(0x12000), P(0x13000), (size_t)1 << 20, 7, op, comm, stream);
  destroy_op(op, comm);
  op = premul(0.5f, 0, comm);
  rs(P(0x12000), P(0x13000), (size_t)1 << 20, 7, op, comm, stream);
  destroy_op(op, comm);
  ag(NULL, NULL, 0, 42, comm, stream);                                   /* unknown dtype, null buffers */
  rs(P(0xd000), P(0xd000), (size_t)1 << 30, 6, 4, comm, stream);        /* in place, avg */
  rs(P(0x14000000), P(0x14400000), (size_t)1 << 20, 7, 4, comm, stream); /* avg; NCCL's in-place form on rank 1 */
  registrations(comm, stream);

  /* The Config variants (NCCL >= 2.31.2), looked up at run time as a caller built against a newer nccl.h would
   * bind them: with the interposer preloaded they resolve to it; without pnccl*Config in NCCL it must refuse. */
  ag_config_fn agc = (ag_config_fn)dlsym(RTLD_DEFAULT, "ncclAllGatherConfig");
  rs_config_fn rsc = (rs_config_fn)dlsym(RTLD_DEFAULT, "ncclReduceScatterConfig");
  if (agc == NULL || rsc == NULL) {
    printf("FAIL ncclAllGatherConfig/ncclReduceScatterConfig not found in the global scope\n");
    return 1;
  }
  bound("ncclAllGatherConfig", (void*)agc);
  bound("ncclReduceScatterConfig", (void*)rsc);
  for (int i = 0; i < 2; ++i) {
    const void* cfg = i == 0 ? P(0xcf9000) : NULL;
    if (config_rc == 0) printf("EXPECT AGC %p %p %zu %d %p %p %p\n", P(0xe000), P(0xf000), (size_t)1 << 20, 9, comm, stream, cfg);
    check(agc(P(0xe000), P(0xf000), (size_t)1 << 20, 9, comm, stream, cfg), config_rc, "ncclAllGatherConfig");
    if (config_rc == 0) printf("EXPECT RSC %p %p %zu %d %d %p %p %p\n", P(0x10000), P(0x11000), (size_t)5, 7, 0, comm, stream, cfg);
    check(rsc(P(0x10000), P(0x11000), 5, 7, 0, comm, stream, cfg), config_rc, "ncclReduceScatterConfig");
  }
  /* The interposer's counters for the process, as tideInterposerGetCounters reports them (libnccl-tide.so is
   * preloaded: its symbols are in the global scope). */
  typedef int (*counters_fn)(void*, void*);
  counters_fn counters = (counters_fn)dlsym(RTLD_DEFAULT, "tideInterposerGetCounters");
  if (counters != NULL) {
    /* tideInterposerCounters_t: size, version, takenCalls[2], takenBytes[2], forwardedCalls[2][32],
     * forwardedBytes[2][32], allGatherCopyOutCalls, allGatherCopyOutBytes */
    struct {
      size_t size;
      unsigned version;
      uint64_t takenCalls[2], takenBytes[2], fwdCalls[2][32], fwdBytes[2][32], copyOutCalls, copyOutBytes;
    } c;
    memset(&c, 0, sizeof(c));
    c.size = sizeof(c);
    c.version = 1;
    check(counters(NULL, &c), 0, "tideInterposerGetCounters");
    for (int coll = 0; coll < 2; ++coll) {
      printf("COUNT %d 0 %llu %llu\n", coll, (unsigned long long)c.takenCalls[coll],
             (unsigned long long)c.takenBytes[coll]);
      for (int r = 1; r < 32; ++r) {
        if (c.fwdCalls[coll][r] != 0) {
          printf("COUNT %d %d %llu %llu\n", coll, r, (unsigned long long)c.fwdCalls[coll][r],
                 (unsigned long long)c.fwdBytes[coll][r]);
        }
      }
    }
  }
  /* Communicator teardown: forwarded in order (the TIDE path releases its state of the comm first). */
  printf("EXPECT CF %p\n", comm);
  check(ncclCommFinalize(comm), 0, "ncclCommFinalize");
  printf("EXPECT CD %p\n", comm);
  check(ncclCommDestroy(comm), 0, "ncclCommDestroy");
  printf("EXPECT CA %p\n", P(0xc0ffee01));
  check(ncclCommAbort(P(0xc0ffee01)), 0, "ncclCommAbort");
  fflush(stdout);
  return failures ? 1 : 0;
}
#endif /* !TIDE_TEST_DLOPEN */

#ifndef TIDE_TEST_CALLER_LIB
int main(int argc, char** argv) {
  int config_rc = argc > 1 ? atoi(argv[1]) : 0;
#ifdef TIDE_TEST_DLOPEN
  const char* caller = argc > 2 ? argv[2] : "";
  if (strcmp(caller, "nonccl") == 0) {
    /* No NCCL in the process: the interposer must return an error (ncclSystemError = 2), never crash. */
    ag_fn f = (ag_fn)dlsym(RTLD_DEFAULT, "ncclAllGather");
    if (f == NULL) {
      printf("FAIL ncclAllGather not found (is libnccl-tide.so preloaded?)\n");
      return 1;
    }
    int rc1 = f(P(0x1000), P(0x2000), 1, 7, P(0xc0), NULL);
    int rc2 = f(P(0x1000), P(0x2000), 1, 7, P(0xc0), NULL);
    printf("NONCCL %d %d\n", rc1, rc2);
    return 0;
  }
  void* h = dlopen(caller, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    printf("FAIL dlopen %s: %s\n", caller, dlerror());
    return 1;
  }
  /* The stub came in as libcaller.so's dependency, RTLD_LOCAL: it is not in the global scope. */
  printf("GLOBAL pncclAllGather %s\n", dlsym(RTLD_DEFAULT, "pncclAllGather") ? "visible" : "hidden");
  int (*run)(int) = (int (*)(int))dlsym(h, "run_calls");
  if (run == NULL) {
    printf("FAIL run_calls not found in %s\n", caller);
    return 1;
  }
  return run(config_rc);
#else
  (void)argv;
  return run_calls(config_rc);
#endif
}
#endif /* !TIDE_TEST_CALLER_LIB */
