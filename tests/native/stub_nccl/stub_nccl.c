/* Copyright The nccl-tide authors
 * SPDX-License-Identifier: Apache-2.0 */
/* A stand-in libnccl.so.2 for the CI tests of TIDE's NCCL symbol resolution (no GPU, no real NCCL).
 *
 * Build: cc -shared -fPIC -Wl,-soname,libnccl.so.2 -DSTUB_VERSION=22809 stub_nccl.c -o <dir>/libnccl.so.2
 * It exports ncclGetVersion (returning STUB_VERSION) and exactly the entry points that NCCL release exports (per
 * the NCCL API reference): 2.28 base, + 2.29.2 windows pointers/RMA/properties, + 2.31.2 per-collective
 * config. Every function other than ncclGetVersion aborts loudly: resolving the library must call nothing else,
 * and an entry point missing from the stub can never be called by accident (the test checks the exit status).
 * -DSTUB_ASYNC_ERROR=N: ncclCommGetAsyncError reports NCCL error N for any communicator (a failed/aborting parent),
 * and ncclGetErrorString answers; everything else still aborts. */
#include <stdio.h>
#include <stdlib.h>

#ifndef STUB_VERSION
#error "define STUB_VERSION, e.g. -DSTUB_VERSION=22809"
#endif

#define UNEXPECTED(name)                                                                   \
  int name(void) {                                                                         \
    fprintf(stderr, "stub libnccl %d: unexpected call to %s\n", STUB_VERSION, #name);      \
    fflush(stderr);                                                                        \
    abort();                                                                               \
  }

int ncclGetVersion(int* version) {
  *version = STUB_VERSION;
  return 0;
}

/* 2.28 base (everything TIDE requires, and more of the 2.28 API). */
#ifdef STUB_ASYNC_ERROR
/* A communicator in error (what NCCL reports after a peer failure or while it is being aborted): the only calls
 * TIDE may make on it are ncclCommGetAsyncError and ncclGetErrorString; anything else aborts the test process. */
const char* ncclGetErrorString(int result) {
  return result == STUB_ASYNC_ERROR ? "stub: remote process exited or there was a network error" : "stub: other";
}
int ncclCommGetAsyncError(void* comm, int* asyncError) {
  (void)comm;
  *asyncError = STUB_ASYNC_ERROR;
  return 0;
}
/* The queries tideCommCreate makes on a healthy communicator (STUB_ASYNC_ERROR=0 or 7): rank 0 of 2 on device 0. */
int ncclCommCount(void* comm, int* count) {
  (void)comm;
  *count = 2;
  return 0;
}
int ncclCommUserRank(void* comm, int* rank) {
  (void)comm;
  *rank = 0;
  return 0;
}
int ncclCommCuDevice(void* comm, int* device) {
  (void)comm;
  *device = 0;
  return 0;
}
#else
UNEXPECTED(ncclGetErrorString)
UNEXPECTED(ncclCommGetAsyncError)
UNEXPECTED(ncclCommCount)
UNEXPECTED(ncclCommUserRank)
UNEXPECTED(ncclCommCuDevice)
#endif
UNEXPECTED(ncclAllGather)
UNEXPECTED(ncclReduceScatter)
UNEXPECTED(ncclSend)
UNEXPECTED(ncclRecv)
UNEXPECTED(ncclGroupStart)
UNEXPECTED(ncclGroupEnd)
UNEXPECTED(ncclCommInitRankConfig)
UNEXPECTED(ncclCommSplit)
UNEXPECTED(ncclCommDestroy)
UNEXPECTED(ncclCommAbort)
UNEXPECTED(ncclMemAlloc)
UNEXPECTED(ncclMemFree)
UNEXPECTED(ncclCommWindowRegister)
UNEXPECTED(ncclCommWindowDeregister)
UNEXPECTED(ncclDevCommCreate)
UNEXPECTED(ncclDevCommDestroy)

/* -DSTUB_NO_PEER_POINTERS: a 2.29+ build that lacks ncclGetPeerDevicePointer (what TIDE's window provider needs). */
#if STUB_VERSION >= 22902
UNEXPECTED(ncclWinGetUserPtr)
UNEXPECTED(ncclGetLsaDevicePointer)
#ifndef STUB_NO_PEER_POINTERS
UNEXPECTED(ncclGetPeerDevicePointer)
#endif
UNEXPECTED(ncclGetLsaMultimemDevicePointer)
UNEXPECTED(ncclGetMultimemDevicePointer)
UNEXPECTED(ncclPutSignal)
UNEXPECTED(ncclSignal)
UNEXPECTED(ncclWaitSignal)
UNEXPECTED(ncclCommQueryProperties)
#endif

#if STUB_VERSION >= 23102
UNEXPECTED(ncclAllGatherConfig)
UNEXPECTED(ncclReduceScatterConfig)
UNEXPECTED(ncclAllReduceConfig)
#endif
