// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
/*
 * libnccl-tide-bench.so: the benchmark library of nccl-tide (benchmarks/native; built with the CUDA data path
 * unless TIDE_BUILD_BENCHMARKS=OFF, never installed or shipped in the wheel).
 *
 * Not an API of nccl-tide: no stability promise. These entry points let a single-GPU benchmark put on one GPU
 * exactly what one GPU of a W-rank node does, with the library's own pieces, compiled into this library: its
 * reduce kernel on given buffers (same shape rule as the executors), its copy-engine copy path (the hinted
 * cudaMemcpyBatchAsync of plugin/cuda/copy_batch.h), copies paced to a link rate without SMs, and an NCCL-like
 * persistent reduce for the baseline. libnccl-tide.so exports none of them. Python: benchmarks/bench_lib.py.
 */
#ifndef TIDE_BENCH_H_
#define TIDE_BENCH_H_

#include <stddef.h>
#include <stdint.h>

#include "tide.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TIDE_BENCH_REDUCE_ARGS_VERSION 3

/* The kernels of the reduce's 16-byte path (plugin/cuda/reduce_kernel.h, ReduceKernel), bit for bit alike. */
#define TIDE_BENCH_KERNEL_LIBRARY 0 /* the one the executors launch */
#define TIDE_BENCH_KERNEL_LOADS 1   /* each thread's 16-byte loads held in registers (the reference path) */
#define TIDE_BENCH_KERNEL_STAGED 2  /* TMA bulk copies into a ring of shared-memory stages */

/* One reduce on device buffers: out[k] = post(prev[k] + fold over s < nSrc of pre(in_s[k])), in_s at
 * staging + s * srcStride bytes, in the accumulation order of include/tide.h. The shape follows the library's rule
 * (plugin/cuda/reduce_kernel.h) with NCCL_TIDE_LINK_GBPS and the current device's SM count, nSrc - 1 inputs (and
 * prev) taken as arriving over links (one input and no prev: a world of one rank, unpaced). maxCtas / ctaBytes
 * override the rule's CTA cap and bytes per CTA (0: the rule's own); ctaGBps the per-CTA rate the rule sizes the
 * grid by (0: the library's kReduceCtaGBps); kernel picks the 16-byte path's kernel (TIDE_BENCH_KERNEL_*; the
 * staged kernel falls back to the loads kernel where its stage cannot hold 32 vectors of every source). */
typedef struct {
  size_t size;       /* sizeof(tideBenchReduceArgs_t) */
  int version;       /* TIDE_BENCH_REDUCE_ARGS_VERSION */
  const void* staging;
  size_t srcStride;  /* bytes */
  int nSrc;          /* >= 1 */
  uint64_t n;        /* elements */
  void* out;
  tideDataType_t inType;  /* bf16, fp16, fp32 */
  tideDataType_t outType; /* bf16, fp16, fp32 */
  tideRedOp_t op;
  float scale;       /* PREMUL_SUM */
  float divisor;     /* AVG */
  const float* prev; /* NULL, or the running fp32 sum (n elements; may equal out when outType is fp32) */
  int maxCtas;       /* 0: the rule's */
  uint64_t ctaBytes; /* 0: the rule's */
  int64_t followingBytes; /* bytes arriving while it runs (its deadline); -1: its own incoming; 0: a drain */
  int kernel;        /* TIDE_BENCH_KERNEL_* */
  double ctaGBps;    /* 0: the rule's; else > 0 */
} tideBenchReduceArgs_t;

/* The message of this library's last failed call on the calling thread ("" if none): its errors are recorded
 * here, not in libnccl-tide.so's tideGetLastError. */
const char* tideBenchGetLastError(void);

/* Enqueues the library's reduce kernel(s) on stream (of the current device; NULL: the legacy default stream). */
tideResult_t tideBenchReduce(const tideBenchReduceArgs_t* args, void* stream);

/* The shape the launcher would use for args: CTAs per launch, launches, threads per CTA, whether the 16-byte path
 * applies, the reduce's HBM traffic in bytes, and the kernel of the 16-byte path (TIDE_BENCH_KERNEL_LOADS or
 * _STAGED; 0 on the element path). Launches nothing; it reads the current device's SM count when a device is
 * present (else 132, an H200's). */
tideResult_t tideBenchReduceShape(const tideBenchReduceArgs_t* args, int* ctas, int* launches, int* threads,
                                  int* vector, uint64_t* bytes, int* kernel);

/* count device-to-device copies through the library's copy-engine path (one hinted cudaMemcpyBatchAsync). The
 * stream must not be NULL (the batch API rejects the legacy stream; the fallback could use SMs); nor for the pacer. */
tideResult_t tideBenchCopy(int count, void* const* dst, const void* const* src, const size_t* bytes, void* stream);

/* A link model: copies paced to bytesPerSecond (the pacing uses no SM; same-device copies may themselves run on
 * SMs). Each tideBenchPacedCopy call is one transfer: its copies are cut into pieces of pieceBytes; before piece j
 * the stream waits (cuStreamWaitValue32 on a word in mapped host memory) until a host thread of the pacer releases
 * it, at t0 + (bytes of pieces 0..j) / rate, where t0 = max(when the stream reached the transfer's first piece (a
 * stream write the thread observes), when the previous transfer's last piece was released). So a piece lands only
 * after its bytes could have crossed the link, the link is never faster than the rate, and it idles while the
 * receiver's stream is elsewhere. Sources may be device memory or pinned host memory (then host-to-device copies).
 * Pieces reach the pacer's thread one by one as they are enqueued, so a transfer of more pieces than the driver
 * queues on one stream does not deadlock. Transfers may be on different streams (at most 63 per pacer; each stream
 * reports its arrivals in a word of its own): the link still carries them one after the other in the order of the
 * tideBenchPacedCopy calls, and a transfer whose stream gets there early waits for the link, not for the earlier
 * transfer's stream. So a transfer's stream must not wait (before the transfer) for work that comes after a
 * later-called transfer on another stream: the thread releases transfers in call order and would wait forever. */
typedef struct tideBenchPacer* tideBenchPacer_t;
tideResult_t tideBenchPacerCreate(double bytesPerSecond, size_t pieceBytes, tideBenchPacer_t* pacer);
tideResult_t tideBenchPacedCopy(tideBenchPacer_t pacer, int count, void* const* dst, const void* const* src,
                                const size_t* bytes, void* stream);
/* stats[0] pieces released, [1] transfers, [2] largest lag of a release past its due time (us), [3] link idle time
 * between transfers (us), [4] pieces enqueued. */
tideResult_t tideBenchPacerStats(tideBenchPacer_t pacer, double* stats, int count);
/* Releases every enqueued piece (so no stream stays blocked), stops the thread, frees the words. */
tideResult_t tideBenchPacerDestroy(tideBenchPacer_t pacer);

/* The NCCL-like baseline: one persistent kernel of `ctas` CTAs doing the reduce of args (bf16 inputs, fp32 output,
 * 16-byte aligned, op SUM) spread evenly over `seconds`: each CTA spins on %globaltimer until the step's share of
 * the link time has passed, as NCCL's CTAs spin on their peers' flags. */
tideResult_t tideBenchPersistentReduce(const tideBenchReduceArgs_t* args, int ctas, double seconds, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TIDE_BENCH_H_ */
