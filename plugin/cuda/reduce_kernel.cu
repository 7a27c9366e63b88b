// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Phase 2 of TIDE-RS: sum the node-local inputs of one staged chunk in fp32 and write the output shard, in the
// accumulation order of reduce_fold.cuh (include/tide.h, bit for bit). Padding needs no special case: phase 1
// fills it with zeros from a zero buffer.
//
// Shape (reduce_kernel.h, reduceShape): as many CTAs of 512 threads as keep pace with the inputs' arrival
// over the links (10 for 8 bf16 inputs at 370 GB/s, with the rule's headroom), each CTA a bounded contiguous slice, then exit; a large chunk is
// several launches in a row on the stream, so at most that many SMs are held at a time and every SM is free again
// after each launch (a waiting GEMM gets it). Each CTA keeps many bytes in flight:
// every thread issues up to 16 independent 16-byte loads (U vectors of 8 elements x 8 sources) before its first
// add, 128 KiB per CTA, which is what one SM needs to approach its own bandwidth (benchmarks/sm_bandwidth.py).
// The staged kernel (reduce_staged.cu) keeps its bytes in flight in shared memory instead; this file launches
// either on the 16-byte path (ReduceKernel), and the element path where neither applies.
#include <cuda_fp16.h>

#include "../core/errors.h"
#include "../core/params.h"
#include "cuda_check.h"
#include "reduce_fold.cuh"
#include "reduce_kernel.h"
#include "reduce_staged.h"
#include "reduce_types.h"

namespace tide {
namespace cuda {
namespace {

using namespace fold;  // the fold's vocabulary, shared with reduce_staged.cu

constexpr int kThreads = 512;

// 8 consecutive elements from global memory (caller guarantees 16-byte alignment).
template <typename T>
__device__ __forceinline__ void loadRaw8(const T* p, Raw8<T>& r) {
#pragma unroll
  for (int c = 0; c < Raw8<T>::kWords; ++c) r.w[c] = __ldg(reinterpret_cast<const uint4*>(p) + c);
}

// Sources whose loads are all issued before the first add (memory-level parallelism); more are folded one by one.
constexpr int kPrefetch = 8;
// Vectors per thread per iteration: 16 sixteen-byte words in flight per thread with 8 sources (bf16/fp16: one word
// per vector and source, fp32: two), 64 registers of raw data under the 128-register cap of 512 threads.
template <typename T>
struct Unroll {
  static constexpr int value = 16 / (kPrefetch * Raw8<T>::kWords) > 0 ? 16 / (kPrefetch * Raw8<T>::kWords) : 1;
};

// The 16-byte path is compiled per op (reduce_fold.cuh, OpKind) and for at most / more than kPrefetch sources
// (kMany): with the loop over further sources always present it used more registers; this form uses 92 registers
// for SUM with 8 bf16 inputs.
// The 16-byte path over vectors [unitBase + blockIdx.x * perCta, + perCta) ∩ [0, nVec). kPrev: acc = prev + fold;
// out may alias prev (neither is __restrict__; prev is read with plain loads before the same thread writes the
// same element).
template <typename InT, typename OutT, bool kPrev, int kOp, bool kMany>
__global__ void __launch_bounds__(kThreads, 1)
    reduceVecKernel(const char* __restrict__ staging, size_t srcStride, int nSrc, uint64_t nVec, const float* prev,
                    OutT* out, Op op, uint64_t unitBase, uint64_t perCta) {
  constexpr int U = Unroll<InT>::value;
  const uint64_t begin = unitBase + static_cast<uint64_t>(blockIdx.x) * perCta;
  if (begin >= nVec) return;
  const uint64_t end = begin + perCta < nVec ? begin + perCta : nVec;
  for (uint64_t v0 = begin + threadIdx.x; v0 < end; v0 += static_cast<uint64_t>(kThreads) * U) {
    Raw8<InT> raw[U][kPrefetch];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint64_t v = v0 + static_cast<uint64_t>(u) * kThreads;
      if (v >= end) continue;
#pragma unroll
      for (int s = 0; s < kPrefetch; ++s) {
        if (s < nSrc) loadRaw8(reinterpret_cast<const InT*>(staging + s * srcStride) + v * kVec, raw[u][s]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint64_t v = v0 + static_cast<uint64_t>(u) * kThreads;
      if (v >= end) continue;
      float acc[kVec], x[kVec];
      convert8(raw[u][0], acc);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] = preK<kOp>(acc[k], op);
#pragma unroll
      for (int s = 1; s < kPrefetch; ++s) {
        if (s < nSrc) {
          convert8(raw[u][s], x);
#pragma unroll
          for (int k = 0; k < kVec; ++k) acc[k] = __fadd_rn(acc[k], preK<kOp>(x[k], op));
        }
      }
      for (int s = kPrefetch; kMany && s < nSrc; ++s) {
        Raw8<InT> r;
        loadRaw8(reinterpret_cast<const InT*>(staging + s * srcStride) + v * kVec, r);
        convert8(r, x);
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] = __fadd_rn(acc[k], preK<kOp>(x[k], op));
      }
      if (kPrev) {
        const float4* pp = reinterpret_cast<const float4*>(prev + v * kVec);
        const float4 p0 = pp[0], p1 = pp[1];
        const float pv[kVec] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] = __fadd_rn(pv[k], acc[k]);
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] = postK<kOp>(acc[k], op);
      store8(out + v * kVec, acc);
    }
  }
}

// Element by element over [unitBase + blockIdx.x * perCta, + perCta) ∩ [0, end): unaligned bases, and the n % 8
// tail of the 16-byte path.
template <typename InT, typename OutT, bool kPrev>
__global__ void __launch_bounds__(kThreads, 1)
    reduceScalarKernel(const char* __restrict__ staging, size_t srcStride, int nSrc, uint64_t end, const float* prev,
                       OutT* out, Op op, uint64_t unitBase, uint64_t perCta) {
  const uint64_t begin = unitBase + static_cast<uint64_t>(blockIdx.x) * perCta;
  if (begin >= end) return;
  const uint64_t stop = begin + perCta < end ? begin + perCta : end;
  for (uint64_t e = begin + threadIdx.x; e < stop; e += kThreads) {
    float acc = pre(Elem<InT>::toFloat(reinterpret_cast<const InT*>(staging)[e]), op);
    for (int s = 1; s < nSrc; ++s) {
      acc = __fadd_rn(acc, pre(Elem<InT>::toFloat(reinterpret_cast<const InT*>(staging + s * srcStride)[e]), op));
    }
    if (kPrev) acc = __fadd_rn(prev[e], acc);
    out[e] = Elem<OutT>::fromFloat(post(acc, op));
  }
}

size_t typeSize(tideDataType_t t) { return t == tideFloat32 ? 4 : 2; }

bool supported(tideDataType_t t) { return t == tideFloat32 || t == tideBfloat16 || t == tideFloat16; }

template <typename InT, typename OutT, bool kPrev, bool kMany>
decltype(&reduceVecKernel<InT, OutT, kPrev, kOpSum, kMany>) vecKernelOp(const Op& op) {
  if (op.premul) return reduceVecKernel<InT, OutT, kPrev, kOpPremul, kMany>;
  if (op.avg) return reduceVecKernel<InT, OutT, kPrev, kOpAvg, kMany>;
  return reduceVecKernel<InT, OutT, kPrev, kOpSum, kMany>;
}
template <typename InT, typename OutT, bool kPrev>
decltype(&reduceVecKernel<InT, OutT, kPrev, kOpSum, false>) vecKernelFor(const Op& op, int nSrc) {
  return nSrc > kPrefetch ? vecKernelOp<InT, OutT, kPrev, true>(op) : vecKernelOp<InT, OutT, kPrev, false>(op);
}

// The register kernel's launches over the chunk (none when the staged kernel takes its vectors: launchReduce), then
// the n % 8 tail of the 16-byte path.
template <typename InT, typename OutT, bool kPrev>
struct RegisterLaunch {
  static tideResult_t run(const ReduceArgs& a, const ReduceShape& sh, cudaStream_t stream) {
    Op op{a.op == tidePremulSum, a.op == tideAvg, a.scale, a.divisor};
    const char* s = static_cast<const char*>(a.staging);
    OutT* out = static_cast<OutT*>(a.out);
    const uint64_t units = sh.vector ? a.n / kVec : a.n;
    for (int l = 0; !sh.staged && l < sh.launches; ++l) {
      const uint64_t base = static_cast<uint64_t>(l) * static_cast<uint64_t>(sh.ctas) * sh.perCta;
      if (sh.vector) {
        vecKernelFor<InT, OutT, kPrev>(op, a.nSrc)<<<sh.ctas, kThreads, 0, stream>>>(
            s, a.srcStride, a.nSrc, units, a.prev, out, op, base, sh.perCta);
      } else {
        reduceScalarKernel<InT, OutT, kPrev><<<sh.ctas, kThreads, 0, stream>>>(s, a.srcStride, a.nSrc, units, a.prev,
                                                                               out, op, base, sh.perCta);
      }
      TIDE_CUDA_CHECK(cudaGetLastError());
    }
    if (sh.vector && units * kVec < a.n) {
      // The n % 8 tail (fewer than 8 elements): one CTA of the scalar kernel.
      reduceScalarKernel<InT, OutT, kPrev><<<1, kThreads, 0, stream>>>(s, a.srcStride, a.nSrc, a.n, a.prev, out, op,
                                                                       units * kVec, kVec);
      TIDE_CUDA_CHECK(cudaGetLastError());
    }
    return tideSuccess;
  }
};

template <typename InT, typename OutT>
struct PreloadRegister {
  static tideResult_t run() {
    cudaFuncAttributes attr;
    for (const Op& op : {Op{false, false, 1.0f, 1.0f}, Op{true, false, 1.0f, 1.0f}, Op{false, true, 1.0f, 1.0f}}) {
      for (int nSrc : {kPrefetch, kPrefetch + 1}) {
        TIDE_CUDA_CHECK(cudaFuncGetAttributes(&attr, vecKernelFor<InT, OutT, false>(op, nSrc)));
        TIDE_CUDA_CHECK(cudaFuncGetAttributes(&attr, vecKernelFor<InT, OutT, true>(op, nSrc)));
      }
    }
    TIDE_CUDA_CHECK(cudaFuncGetAttributes(&attr, reduceScalarKernel<InT, OutT, false>));
    TIDE_CUDA_CHECK(cudaFuncGetAttributes(&attr, reduceScalarKernel<InT, OutT, true>));
    return tideSuccess;
  }
};

}  // namespace

tideResult_t preloadReduceKernels() {
  TIDE_CHECK(forEveryTypePair<PreloadRegister>());
  return preloadStagedKernels();
}

uint64_t reduceArrivingBytes(int nSrc, uint64_t n, tideDataType_t inType, bool prev) {
  const uint64_t inSize = typeSize(inType);
  if (nSrc <= 1 && !prev) return n * inSize;
  const uint64_t others = nSrc > 1 ? static_cast<uint64_t>(nSrc - 1) : 0;
  return n * (others * inSize + (prev ? 4 : 0));
}

int reduceMaxCtas(const ReduceArgs& a, const ReducePace& pace) {
  const uint64_t inSize = typeSize(a.inType);
  const uint64_t nSrc = static_cast<uint64_t>(a.nSrc > 0 ? a.nSrc : 0);
  const uint64_t traffic = a.n * (nSrc * inSize + typeSize(a.outType) + (a.prev != nullptr ? 4 : 0));
  const int sms = pace.smCount > 0 ? pace.smCount : 1;
  // A single-rank world: one input, no prev, nothing to keep pace with.
  if (pace.singleRank && a.nSrc <= 1 && a.prev == nullptr) return sms;
  const uint64_t incoming = reduceArrivingBytes(a.nSrc, a.n, a.inType, a.prev != nullptr);
  if (incoming == 0 || !(pace.linkGBps > 0)) return sms;
  if (a.followingBytes == 0) return kReduceMaxPacedCtas < sms ? kReduceMaxPacedCtas : sms;  // the drain
  const uint64_t deadline = a.followingBytes > 0 ? static_cast<uint64_t>(a.followingBytes) : incoming;
  const double rate =
      kReducePaceHeadroom * pace.linkGBps * static_cast<double>(traffic) / static_cast<double>(deadline);
  double c = rate / pace.ctaGBps;
  if (!(c < kReduceMaxPacedCtas)) c = kReduceMaxPacedCtas;  // also NaN; before the cast, which would overflow
  int ctas = static_cast<int>(c);
  if (static_cast<double>(ctas) < c) ++ctas;
  if (ctas < 1) ctas = 1;
  return ctas < sms ? ctas : sms;
}

tideResult_t devicePace(int device, bool singleRank, ReducePace* out) {
  TIDE_CHECK(params::status(params::kLinkGBps));
  out->linkGBps = static_cast<double>(params::linkGBps());
  out->singleRank = singleRank;
  if (device >= 0) {
    int sms = 0;
    TIDE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    out->smCount = sms > 0 ? sms : 1;
  }
  return tideSuccess;
}

ReduceShape reduceShape(const ReduceArgs& a, int maxCtas, uint64_t ctaBytes, const ReducePace& pace,
                        ReduceKernel kernel) {
  ReduceShape sh;
  sh.threads = kThreads;
  const uintptr_t in = reinterpret_cast<uintptr_t>(a.staging), o = reinterpret_cast<uintptr_t>(a.out);
  sh.vector = in % 16 == 0 && a.srcStride % 16 == 0 && o % 16 == 0 &&
              (a.prev == nullptr || reinterpret_cast<uintptr_t>(a.prev) % 16 == 0);
  const uint64_t perElem = static_cast<uint64_t>(a.nSrc > 0 ? a.nSrc : 0) * typeSize(a.inType) +
                           typeSize(a.outType) + (a.prev != nullptr ? 4 : 0);
  sh.bytes = a.n * perElem;
  const uint64_t units = sh.vector ? a.n / kVec : a.n;
  if (units == 0) {
    sh.ctas = 1;
    sh.launches = 0;
    sh.perCta = 0;
    return sh;
  }
  sh.tileVectors = kernel == ReduceKernel::kStaged && sh.vector ? stagedTileVectors(a) : 0;
  sh.staged = sh.tileVectors > 0;
  if (sh.staged) sh.threads = kStagedThreads;
  const uint64_t perUnit = perElem * (sh.vector ? kVec : 1);
  const uint64_t cta = ctaBytes > 0 ? ctaBytes : kReduceCtaBytes;
  if (maxCtas <= 0) maxCtas = reduceMaxCtas(a, pace);
  const uint64_t mc = static_cast<uint64_t>(maxCtas);
  uint64_t unitsPerCta = cta / perUnit;
  if (unitsPerCta < 1) unitsPerCta = 1;
  // The grid is the rule's maxCtas unless the chunk is too small to give each of them kReduceCtaMinBytes: fewer
  // CTAs than the pace asks for would fall behind the arrivals (or, unpaced, leave SMs idle on the critical path).
  const uint64_t floorBytes = cta < kReduceCtaMinBytes ? cta : kReduceCtaMinBytes;
  uint64_t minUnits = floorBytes / perUnit;
  if (minUnits < 1) minUnits = 1;
  const uint64_t worth = (units + minUnits - 1) / minUnits;  // CTAs of at least floorBytes each
  const uint64_t ctas = worth < mc ? worth : mc;
  const uint64_t needed = (units + unitsPerCta - 1) / unitsPerCta;  // CTAs of at most about ctaBytes each
  uint64_t launches = (needed + ctas - 1) / ctas;
  if (launches > static_cast<uint64_t>(kReduceMaxLaunches)) launches = kReduceMaxLaunches;
  const uint64_t slots = ctas * launches;
  sh.ctas = static_cast<int>(ctas);
  sh.perCta = (units + slots - 1) / slots;
  sh.launches = static_cast<int>((units + ctas * sh.perCta - 1) / (ctas * sh.perCta));
  return sh;
}

tideResult_t launchReduce(const ReduceArgs& a, cudaStream_t stream, const ReducePace& pace, int maxCtas,
                          uint64_t ctaBytes, ReduceKernel kernel) {
  if (a.n == 0) return tideSuccess;
  if (a.nSrc < 1) return fail(tideInvalidArgument, "Cuda", "reduce: nSrc is %d (at least 1)", a.nSrc);
  if (!supported(a.inType) || !supported(a.outType)) {
    return fail(tideInvalidArgument, "Cuda", "reduce: unsupported types (in %d, out %d)", static_cast<int>(a.inType),
                static_cast<int>(a.outType));
  }
  // Every element access is a naturally aligned load or store of its type: a pointer or stride that is not a
  // multiple of the element size would fault on the device (a sticky "misaligned address" for the whole context).
  const uintptr_t in = reinterpret_cast<uintptr_t>(a.staging), o = reinterpret_cast<uintptr_t>(a.out);
  const uintptr_t pv = reinterpret_cast<uintptr_t>(a.prev);
  if (in % typeSize(a.inType) != 0 || a.srcStride % typeSize(a.inType) != 0 || o % typeSize(a.outType) != 0 ||
      pv % 4 != 0) {
    return fail(tideInvalidArgument, "Cuda",
                "reduce: staging %p, stride %zu, out %p, prev %p not aligned to their element sizes (in %zu, out %zu, "
                "prev 4 bytes)",
                a.staging, a.srcStride, a.out, static_cast<const void*>(a.prev), typeSize(a.inType),
                typeSize(a.outType));
  }
  const ReduceShape sh = reduceShape(a, maxCtas, ctaBytes, pace, kernel);
  if (sh.staged) TIDE_CHECK(launchStaged(a, sh, stream));
  return launchForTypes<RegisterLaunch>(a, sh, stream);
}

}  // namespace cuda
}  // namespace tide
