/* A recording stand-in libnccl.so.2 for the interposer tests (tests/test_interposer.py; no GPU, no real NCCL).
 *
 * Build: cc -shared -fPIC -Wl,-soname,libnccl.so.2 -DSTUB_VERSION=23203 recording_stub_nccl.c -o <dir>/libnccl.so.2
 * Like real NCCL, each collective is defined as pncclXxx with a weak ncclXxx alias (NCCL_API in NCCL's core.h), and
 * ncclGetVersion reports STUB_VERSION. ncclAllGatherConfig / ncclReduceScatterConfig exist only for
 * STUB_VERSION >= 23102 (2.31.2). Every collective, group and communicator-teardown call appends one line with all of its arguments to
 * the file named by STUB_NCCL_LOG (opened per call, so the order is the order of the calls), then returns 0. */
#include <stddef.h>
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
