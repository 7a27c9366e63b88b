/* Copyright The nccl-tide authors
 * SPDX-License-Identifier: Apache-2.0 */
/* A recording stand-in libnccl.so.2 for the interposer tests (tests/unit/test_interposer.py; no GPU, no real NCCL).
 *
 * Build: cc -shared -fPIC -Wl,-soname,libnccl.so.2 -DSTUB_VERSION=23203 recording_stub_nccl.c -o <dir>/libnccl.so.2
 * Like real NCCL, each collective is defined as pncclXxx with a weak ncclXxx alias (NCCL_API in NCCL's core.h), and
 * ncclGetVersion reports STUB_VERSION. ncclAllGatherConfig / ncclReduceScatterConfig exist only for
 * STUB_VERSION >= 23102 (2.31.2). Every collective, point-to-point, group, PREMUL_SUM-op and communicator-teardown call appends one line with all
 * of its arguments to the file named by STUB_NCCL_LOG (opened per call, so the order is the order of the calls), then
 * returns 0, except that -DSTUB_FAIL_PEER=P makes ncclSend / ncclRecv with peer P return ncclInvalidArgument (4).
 * -DSTUB_BASE_QUERIES adds the rest of what TIDE requires of the 2.28 base (ncclGetErrorString, ncclCommCount,
 * ncclCommUserRank, ncclCommCuDevice, ncclCommGetAsyncError), so that libnccl-tide resolves the stub
 * (tests/native/nccl_p2p_binding_test.cc); the interposer tests build it without them.
 *
 * Windows (tests/native/nccl_windows_test.cc), recorded the same way: ncclMemAlloc (malloc), ncclMemFree,
 * ncclCommWindowRegister (window handles 0x7e00000000 + 0x1000 * k for the k-th registration of the process),
 * ncclCommWindowDeregister, ncclCommRegister (handle 0x4e00000000 + buff), ncclCommDeregister, ncclCommSplit
 * (child 0xc41d0000 + color) and, from 2.29.2, ncclGetPeerDevicePointer
 * (0x100000000000 + (k << 32) + ((peer + 1) << 24) + offset). At call time, each of NCCL's ways of saying no:
 *   STUB_WINDOWS=none          registration returns ncclSuccess and no window (a communicator without symmetric
 *                              memory: NCCL 2.30's answer on one spanning NCCL hosts without GIN);
 *   STUB_REGISTER_FAIL=CODE    registration returns CODE and no window;
 *   STUB_UNREACHABLE_PEER=P    ncclGetPeerDevicePointer gives peer P ncclSuccess and NULL;
 *   STUB_LSA_TEAM=FIRST:COUNT  ncclGetPeerDevicePointer gives peers outside FIRST..FIRST+COUNT-1 ncclSuccess and
 *                              NULL (the caller's LSA team: the ranks of its NCCL host);
 *   STUB_PEER_FAIL=CODE        ncclGetPeerDevicePointer returns CODE for every peer, leaving *ptr untouched;
 *   STUB_MEMALLOC_FAIL=1       ncclMemAlloc fails.
 * A call that returns an error logs " FAIL CODE" after its arguments. ncclGetLsaMultimemDevicePointer (the multicast
 * address) and ncclGetLsaDevicePointer abort the process: nothing may ask for them. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef STUB_VERSION
#error "define STUB_VERSION, e.g. -DSTUB_VERSION=23203"
#endif

#define EXPORT __attribute__((visibility("default")))
#define NCCL_API(ret, func, ...)                                                  \
  EXPORT ret func(__VA_ARGS__) __attribute__((weak, alias("p" #func)));           \
  EXPORT ret p##func(__VA_ARGS__)

static void record(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void record(const char* fmt, ...) {
  const char* path = getenv("STUB_NCCL_LOG");
  if (path == NULL) return;
  FILE* f = fopen(path, "a");
  if (f == NULL) abort();
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fclose(f);
}

NCCL_API(int, ncclGetVersion, int* version);
int pncclGetVersion(int* version) {
  *version = STUB_VERSION;
  return 0;
}

NCCL_API(int, ncclAllGather, const void* sendbuff, void* recvbuff, size_t sendcount, int datatype, void* comm,
         void* stream);
int pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, int datatype, void* comm, void* stream) {
  record("AG %p %p %zu %d %p %p", sendbuff, recvbuff, sendcount, datatype, comm, stream);
  return 0;
}

NCCL_API(int, ncclReduceScatter, const void* sendbuff, void* recvbuff, size_t recvcount, int datatype, int op,
         void* comm, void* stream);
int pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, int datatype, int op, void* comm,
                       void* stream) {
  record("RS %p %p %zu %d %d %p %p", sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  return 0;
}

NCCL_API(int, ncclGroupStart, void);
int pncclGroupStart(void) {
  record("GS");
  return 0;
}

NCCL_API(int, ncclGroupEnd, void);
int pncclGroupEnd(void) {
  record("GE");
  return 0;
}

NCCL_API(int, ncclGroupSimulateEnd, void* simInfo);
int pncclGroupSimulateEnd(void* simInfo) {
  record("GSE %p", simInfo);
  return 0;
}

#ifndef STUB_FAIL_PEER
#define STUB_FAIL_PEER (-1)
#endif

NCCL_API(int, ncclSend, const void* sendbuff, size_t count, int datatype, int peer, void* comm, void* stream);
int pncclSend(const void* sendbuff, size_t count, int datatype, int peer, void* comm, void* stream) {
  record("SEND %p %zu %d %d %p %p", sendbuff, count, datatype, peer, comm, stream);
  return peer == STUB_FAIL_PEER ? 4 : 0;
}

NCCL_API(int, ncclRecv, void* recvbuff, size_t count, int datatype, int peer, void* comm, void* stream);
int pncclRecv(void* recvbuff, size_t count, int datatype, int peer, void* comm, void* stream) {
  record("RECV %p %zu %d %d %p %p", recvbuff, count, datatype, peer, comm, stream);
  return peer == STUB_FAIL_PEER ? 4 : 0;
}

#ifdef STUB_BASE_QUERIES
NCCL_API(const char*, ncclGetErrorString, int result);
const char* pncclGetErrorString(int result) {
  switch (result) {
    case 1: return "stub: unhandled cuda error";
    case 4: return "stub: invalid argument";
    case 5: return "stub: invalid usage";
    default: return "stub: other";
  }
}

NCCL_API(int, ncclCommCount, void* comm, int* count);
int pncclCommCount(void* comm, int* count) {
  (void)comm;
  *count = 2;
  return 0;
}

NCCL_API(int, ncclCommUserRank, void* comm, int* rank);
int pncclCommUserRank(void* comm, int* rank) {
  (void)comm;
  *rank = 0;
  return 0;
}

NCCL_API(int, ncclCommCuDevice, void* comm, int* device);
int pncclCommCuDevice(void* comm, int* device) {
  (void)comm;
  *device = 0;
  return 0;
}

NCCL_API(int, ncclCommGetAsyncError, void* comm, int* asyncError);
int pncclCommGetAsyncError(void* comm, int* asyncError) {
  (void)comm;
  *asyncError = 0;
  return 0;
}
#endif

NCCL_API(int, ncclCommFinalize, void* comm);
int pncclCommFinalize(void* comm) {
  record("CF %p", comm);
  return 0;
}

NCCL_API(int, ncclCommDestroy, void* comm);
int pncclCommDestroy(void* comm) {
  record("CD %p", comm);
  return 0;
}

NCCL_API(int, ncclCommAbort, void* comm);
int pncclCommAbort(void* comm) {
  record("CA %p", comm);
  return 0;
}

/* PREMUL_SUM ops: the k-th op of the process is 5 + k (NCCL's own ops are 0..4); the scalar is logged as the
 * 32-bit word at the pointer (an fp32 value, or a bf16/fp16 value in its low half). */
static int gNextOp = 5;
NCCL_API(int, ncclRedOpCreatePreMulSum, int* op, void* scalar, int datatype, int residence, void* comm);
int pncclRedOpCreatePreMulSum(int* op, void* scalar, int datatype, int residence, void* comm) {
  uint32_t bits = 0;
  if (residence == 1) {
    unsigned char* b = (unsigned char*)scalar;
    bits = datatype == 7 ? (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24
                         : (uint32_t)b[0] | (uint32_t)b[1] << 8;
  }
  *op = gNextOp++;
  record("PMS %d 0x%x %d %d %p", *op, bits, datatype, residence, comm);
  return 0;
}

NCCL_API(int, ncclRedOpDestroy, int op, void* comm);
int pncclRedOpDestroy(int op, void* comm) {
  record("OPD %d %p", op, comm);
  return 0;
}

NCCL_API(int, ncclMemAlloc, void** ptr, size_t size);
int pncclMemAlloc(void** ptr, size_t size) {
  const char* f = getenv("STUB_MEMALLOC_FAIL");
  if (f != NULL && f[0] == '1') {
    record("MA %zu FAIL", size);
    return 1; /* ncclUnhandledCudaError */
  }
  *ptr = malloc(size);
  record("MA %zu %p", size, *ptr);
  return *ptr ? 0 : 1;
}

NCCL_API(int, ncclMemFree, void* ptr);
int pncclMemFree(void* ptr) {
  record("MF %p", ptr);
  free(ptr);
  return 0;
}

static unsigned long long gWindows = 0; /* registrations so far */
#define STUB_WINDOW_BASE 0x7e00000000ull

NCCL_API(int, ncclCommWindowRegister, void* comm, void* buff, size_t size, void** win, int winFlags);
int pncclCommWindowRegister(void* comm, void* buff, size_t size, void** win, int winFlags) {
  const char* none = getenv("STUB_WINDOWS");
  const char* f = getenv("STUB_REGISTER_FAIL");
  const int code = f != NULL ? atoi(f) : 0;
  ++gWindows;
  *win = (code != 0 || (none != NULL && none[0] == 'n')) ? NULL
                                                         : (void*)(uintptr_t)(STUB_WINDOW_BASE + 0x1000ull * gWindows);
  if (code != 0) {
    record("WR %p %p %zu %d %p FAIL %d", comm, buff, size, winFlags, *win, code);
  } else {
    record("WR %p %p %zu %d %p", comm, buff, size, winFlags, *win);
  }
  return code;
}

NCCL_API(int, ncclCommWindowDeregister, void* comm, void* win);
int pncclCommWindowDeregister(void* comm, void* win) {
  record("WD %p %p", comm, win);
  return 0;
}

NCCL_API(int, ncclCommRegister, void* comm, void* buff, size_t size, void** handle);
int pncclCommRegister(void* comm, void* buff, size_t size, void** handle) {
  *handle = (void*)(uintptr_t)(0x4e00000000ull + (uintptr_t)buff);
  record("REG %p %p %zu %p", comm, buff, size, *handle);
  return 0;
}

NCCL_API(int, ncclCommDeregister, void* comm, void* handle);
int pncclCommDeregister(void* comm, void* handle) {
  record("DEREG %p %p", comm, handle);
  return 0;
}

/* The leading fields of ncclConfig_t that TIDE passes (plugin/nccl/nccl_lib.h ConfigPrefix). */
struct StubConfigPrefix {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
};

NCCL_API(int, ncclCommSplit, void* comm, int color, int key, void** newcomm, struct StubConfigPrefix* config);
int pncclCommSplit(void* comm, int color, int key, void** newcomm, struct StubConfigPrefix* config) {
  *newcomm = (void*)(uintptr_t)(0xc41d0000u + (unsigned)color);
  record("SPLIT %p %d %d %d %x %u %zu %p", comm, color, key, config ? config->blocking : -1,
         config ? config->magic : 0, config ? config->version : 0, config ? config->size : 0, *newcomm);
  return 0;
}

#if STUB_VERSION >= 22902
NCCL_API(int, ncclGetPeerDevicePointer, void* win, size_t offset, int peer, void** ptr);
int pncclGetPeerDevicePointer(void* win, size_t offset, int peer, void** ptr) {
  const char* f = getenv("STUB_PEER_FAIL");
  if (f != NULL && atoi(f) != 0) {
    record("PP %p %zu %d %p FAIL %d", win, offset, peer, *ptr, atoi(f));
    return atoi(f);
  }
  const char* u = getenv("STUB_UNREACHABLE_PEER");
  const char* team = getenv("STUB_LSA_TEAM");
  int first = 0, count = 0;
  const int inTeam = team == NULL || sscanf(team, "%d:%d", &first, &count) != 2 ||
                     (peer >= first && peer < first + count);
  const unsigned long long k = ((uintptr_t)win - STUB_WINDOW_BASE) / 0x1000ull;
  *ptr = ((u != NULL && atoi(u) == peer) || !inTeam)
             ? NULL
             : (void*)(uintptr_t)(0x100000000000ull + (k << 32) + ((unsigned long long)(peer + 1) << 24) + offset);
  record("PP %p %zu %d %p", win, offset, peer, *ptr);
  return 0;
}

NCCL_API(int, ncclGetLsaDevicePointer, void* win, size_t offset, int lsaRank, void** ptr);
int pncclGetLsaDevicePointer(void* win, size_t offset, int lsaRank, void** ptr) {
  record("LSA %p %zu %d", win, offset, lsaRank);
  (void)ptr;
  abort();
}

NCCL_API(int, ncclGetLsaMultimemDevicePointer, void* win, size_t offset, void** ptr);
int pncclGetLsaMultimemDevicePointer(void* win, size_t offset, void** ptr) {
  record("MULTIMEM %p %zu", win, offset);
  (void)ptr;
  abort();
}
#endif

#if STUB_VERSION >= 23102
NCCL_API(int, ncclAllGatherConfig, const void* sendbuff, void* recvbuff, size_t sendcount, int datatype, void* comm,
         void* stream, const void* config);
int pncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount, int datatype, void* comm,
                         void* stream, const void* config) {
  record("AGC %p %p %zu %d %p %p %p", sendbuff, recvbuff, sendcount, datatype, comm, stream, config);
  return 0;
}

NCCL_API(int, ncclReduceScatterConfig, const void* sendbuff, void* recvbuff, size_t recvcount, int datatype, int op,
         void* comm, void* stream, const void* config);
int pncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount, int datatype, int op,
                             void* comm, void* stream, const void* config) {
  record("RSC %p %p %zu %d %d %p %p %p", sendbuff, recvbuff, recvcount, datatype, op, comm, stream, config);
  return 0;
}
#endif
