// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// libnccl-tide-bench.so's entry points (tide_bench.h). Each checks its arguments, then hands over to the
// library's own CUDA pieces, compiled into this library: the reduce launcher the executors use (reduce_kernel.h)
// and the copy-engine path (copy_batch.h); and to the benchmark's own: the link pacer (bench_pacer.h) and the
// persistent baseline (bench_kernels.h).
#include <cuda_runtime.h>

#include <new>

#include "api_guard.h"
#include "bench_kernels.h"
#include "bench_pacer.h"
#include "cuda/copy_batch.h"
#include "cuda/cuda_check.h"
#include "cuda/reduce_kernel.h"
#include "errors.h"
#include "tide.h"
#include "tide_bench.h"

struct tideBenchPacer {
  explicit tideBenchPacer(double rate, size_t piece) : pacer(rate, piece) {}
  tide::cuda::LinkPacer pacer;
};

namespace {

// The kernels load on first use under lazy module loading, and loading waits for the device's work in flight (a
// pacer's gated copies, say): load them once up front instead (reduce_kernel.h, preloadReduceKernels).
tideResult_t preloadOnce() {
  static tideResult_t status = [] {
    tideResult_t r = tide::cuda::preloadReduceKernels();
    return r == tideSuccess ? tide::cuda::preloadBenchKernels() : r;
  }();
  return status;
}

bool reducible(tideDataType_t t) { return t == tideFloat32 || t == tideBfloat16 || t == tideFloat16; }

// The launch options of args beside the reduce itself: the kernel and the rule's per-CTA rate.
struct LaunchChoice {
  tide::cuda::ReduceKernel kernel = tide::cuda::kReduceDefaultKernel;
  double ctaGBps = tide::cuda::kReduceCtaGBps;
};

tideResult_t toReduceArgs(const tideBenchReduceArgs_t* a, const char* fn, tide::cuda::ReduceArgs* r,
                          LaunchChoice* choice) {
  if (a == nullptr) return tide::fail(tideInvalidArgument, "Bench", "%s: args is NULL", fn);
  if (a->size < sizeof(tideBenchReduceArgs_t) || a->version != TIDE_BENCH_REDUCE_ARGS_VERSION) {
    return tide::fail(tideInvalidArgument, "Bench", "%s: args size %zu / version %d; expected %zu / %d", fn, a->size,
                      a->version, sizeof(tideBenchReduceArgs_t), TIDE_BENCH_REDUCE_ARGS_VERSION);
  }
  if (a->nSrc < 1) return tide::fail(tideInvalidArgument, "Bench", "%s: nSrc is %d (at least 1)", fn, a->nSrc);
  if (!reducible(a->inType) || !reducible(a->outType)) {
    return tide::fail(tideInvalidArgument, "Bench", "%s: inType %d / outType %d: use bf16, fp16 or fp32", fn,
                      static_cast<int>(a->inType), static_cast<int>(a->outType));
  }
  if (static_cast<int>(a->op) < 0 || static_cast<int>(a->op) >= static_cast<int>(tideNumRedOps)) {
    return tide::fail(tideInvalidArgument, "Bench", "%s: op %d", fn, static_cast<int>(a->op));
  }
  if (a->n > 0 && (a->staging == nullptr || a->out == nullptr)) {
    return tide::fail(tideInvalidArgument, "Bench", "%s: staging or out is NULL", fn);
  }
  if (a->maxCtas < 0 || a->maxCtas > 65535) {
    return tide::fail(tideInvalidArgument, "Bench", "%s: maxCtas %d (0: the rule's, else 1..65535)", fn, a->maxCtas);
  }
  if (a->followingBytes < -1) {
    return tide::fail(tideInvalidArgument, "Bench", "%s: followingBytes %lld (-1, 0 or a byte count)", fn,
                      static_cast<long long>(a->followingBytes));
  }
  if (a->prev != nullptr && a->outType != tideFloat32 && static_cast<const void*>(a->prev) == a->out) {
    return tide::fail(tideInvalidArgument, "Bench", "%s: prev may equal out only with an fp32 output", fn);
  }
  if (a->kernel < TIDE_BENCH_KERNEL_LIBRARY || a->kernel > TIDE_BENCH_KERNEL_STAGED) {
    return tide::fail(tideInvalidArgument, "Bench", "%s: kernel %d (0 the library's, 1 loads, 2 staged)", fn,
                      a->kernel);
  }
  if (!(a->ctaGBps >= 0) || a->ctaGBps > 1e6) {  // also NaN
    return tide::fail(tideInvalidArgument, "Bench", "%s: ctaGBps %g (0: the rule's, else a rate in GB/s)", fn,
                      a->ctaGBps);
  }
  if (a->kernel != TIDE_BENCH_KERNEL_LIBRARY) {
    choice->kernel = a->kernel == TIDE_BENCH_KERNEL_STAGED ? tide::cuda::ReduceKernel::kStaged
                                                           : tide::cuda::ReduceKernel::kLoads;
  }
  if (a->ctaGBps > 0) choice->ctaGBps = a->ctaGBps;
  r->staging = a->staging;
  r->srcStride = a->srcStride;
  r->nSrc = a->nSrc;
  r->n = a->n;
  r->out = a->out;
  r->inType = a->inType;
  r->outType = a->outType;
  r->op = a->op;
  r->scale = a->scale;
  r->divisor = a->divisor;
  r->prev = a->prev;
  r->followingBytes = a->followingBytes;
  return tideSuccess;
}

// The pace a comm on the current device would use (NCCL_TIDE_LINK_GBPS, the SM count): the benchmarks' reduces
// follow the library's own rule. Without a device (the shape query is pure arithmetic, CPU-tested) the SM count is
// ReducePace's default, an H200's 132.
tideResult_t currentPace(tide::cuda::ReducePace* pace) {
  int device = -1, count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
  } else {
    TIDE_CUDA_CHECK(cudaGetDevice(&device));
  }
  // A bench reduce has no world: one input and no prev is taken as a world of one rank (nothing arrives).
  return tide::cuda::devicePace(device, true, pace);
}

// Copies refuse the legacy default stream: the batch API rejects it and the fallback (cudaMemcpyAsync) may run
// same-device copies on the SMs, which would falsify the measurement.
tideResult_t checkStream(void* stream, const char* fn) {
  if (stream == nullptr) {
    return tide::fail(tideInvalidArgument, "Bench", "%s: stream is NULL; pass a created stream", fn);
  }
  return tideSuccess;
}

}  // namespace

extern "C" {

TIDE_EXPORT const char* tideBenchGetLastError(void) { return tide::lastError(); }

TIDE_EXPORT tideResult_t tideBenchReduce(const tideBenchReduceArgs_t* args, void* stream) {
  TIDE_API_BEGIN
  tide::cuda::ReduceArgs r{};
  LaunchChoice choice;
  TIDE_CHECK(toReduceArgs(args, __func__, &r, &choice));
  TIDE_CHECK(preloadOnce());
  tide::cuda::ReducePace pace;
  if (args->maxCtas <= 0) TIDE_CHECK(currentPace(&pace));  // an explicit CTA cap needs no pace
  pace.ctaGBps = choice.ctaGBps;
  return tide::cuda::launchReduce(r, static_cast<cudaStream_t>(stream), pace, args->maxCtas, args->ctaBytes,
                                  choice.kernel);
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideBenchReduceShape(const tideBenchReduceArgs_t* args, int* ctas, int* launches,
                                              int* threads, int* vector, uint64_t* bytes, int* kernel) {
  TIDE_API_BEGIN
  tide::cuda::ReduceArgs r{};
  LaunchChoice choice;
  TIDE_CHECK(toReduceArgs(args, __func__, &r, &choice));
  tide::cuda::ReducePace pace;
  if (args->maxCtas <= 0) TIDE_CHECK(currentPace(&pace));
  pace.ctaGBps = choice.ctaGBps;
  const tide::cuda::ReduceShape sh = tide::cuda::reduceShape(r, args->maxCtas, args->ctaBytes, pace, choice.kernel);
  if (ctas) *ctas = sh.ctas;
  if (launches) *launches = sh.launches;
  if (threads) *threads = sh.threads;
  if (vector) *vector = sh.vector ? 1 : 0;
  if (bytes) *bytes = sh.bytes;
  if (kernel) *kernel = !sh.vector ? 0 : sh.staged ? TIDE_BENCH_KERNEL_STAGED : TIDE_BENCH_KERNEL_LOADS;
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideBenchCopy(int count, void* const* dst, const void* const* src, const size_t* bytes,
                                       void* stream) {
  TIDE_API_BEGIN
  if (count < 0 || (count > 0 && (dst == nullptr || src == nullptr || bytes == nullptr))) {
    return tide::fail(tideInvalidArgument, "Bench", "%s: bad copy list (count %d)", __func__, count);
  }
  TIDE_CHECK(checkStream(stream, __func__));
  int device = 0;
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  tide::cuda::CopyList list;
  for (int i = 0; i < count; ++i) list.add(dst[i], src[i], bytes[i]);
  return list.enqueue(static_cast<cudaStream_t>(stream), device);
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideBenchPacerCreate(double bytesPerSecond, size_t pieceBytes, tideBenchPacer_t* pacer) {
  TIDE_API_BEGIN
  if (pacer == nullptr) return tide::fail(tideInvalidArgument, "Bench", "%s: pacer is NULL", __func__);
  *pacer = nullptr;
  TIDE_CHECK(preloadOnce());
  auto* p = new tideBenchPacer(bytesPerSecond, pieceBytes);
  tideResult_t r = p->pacer.init();
  if (r != tideSuccess) {
    delete p;
    return r;
  }
  *pacer = p;
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideBenchPacedCopy(tideBenchPacer_t pacer, int count, void* const* dst,
                                            const void* const* src, const size_t* bytes, void* stream) {
  TIDE_API_BEGIN
  if (pacer == nullptr) return tide::fail(tideInvalidArgument, "Bench", "%s: pacer is NULL", __func__);
  TIDE_CHECK(checkStream(stream, __func__));
  return pacer->pacer.pacedCopy(count, dst, src, bytes, static_cast<cudaStream_t>(stream));
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideBenchPacerStats(tideBenchPacer_t pacer, double* stats, int count) {
  TIDE_API_BEGIN
  if (pacer == nullptr || stats == nullptr || count < 0) {
    return tide::fail(tideInvalidArgument, "Bench", "%s: NULL pacer or stats, or count < 0", __func__);
  }
  pacer->pacer.stats(stats, count);
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideBenchPacerDestroy(tideBenchPacer_t pacer) {
  TIDE_API_BEGIN
  delete pacer;  // the destructor releases every enqueued piece before it frees the words
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideBenchPersistentReduce(const tideBenchReduceArgs_t* args, int ctas, double seconds,
                                                   void* stream) {
  TIDE_API_BEGIN
  tide::cuda::ReduceArgs r{};
  LaunchChoice choice;  // the baseline is a kernel of its own: the choice does not apply
  TIDE_CHECK(toReduceArgs(args, __func__, &r, &choice));
  TIDE_CHECK(preloadOnce());
  if (r.inType != tideBfloat16 || r.outType != tideFloat32 || r.op != tideSum || r.prev != nullptr) {
    return tide::fail(tideUnsupported, "Bench", "%s: the baseline folds bf16 into fp32 with SUM and no prev only",
                      __func__);
  }
  return tide::cuda::launchPersistentReduce(r.staging, r.srcStride, r.nSrc, r.n, static_cast<float*>(r.out), ctas,
                                            seconds, static_cast<cudaStream_t>(stream));
  TIDE_API_END
}

}  // extern "C"
