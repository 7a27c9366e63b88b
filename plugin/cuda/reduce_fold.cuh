// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The reduce's element arithmetic, shared by its kernels (reduce_kernel.cu, reduce_staged.cu) so that every path
// folds bit for bit alike: conversions to fp32 (exact), the op's premultiply and AVG division, the narrowing stores
// with NaN canonicalisation, on 8-element vectors (16 bytes of bf16/fp16, 32 of fp32).
//
// Accumulation order (include/tide.h, bit for bit): x_s = (float) in_s[k] (exact), with PREMUL_SUM
// x_s = __fmul_rn(x_s, scale); acc = x_0; acc = __fadd_rn(acc, x_s) for s = 1 .. nSrc-1 (left fold, rank order);
// with a running sum acc = __fadd_rn(prev[k], acc); AVG: acc = __fdiv_rn(acc, W); then fp32 out, or RNE narrowing to
// bf16/fp16; a NaN result is stored as the canonical NaN of the output type, as on the host (plugin/core/dtype.cc).
#ifndef TIDE_CUDA_REDUCE_FOLD_CUH_
#define TIDE_CUDA_REDUCE_FOLD_CUH_

#include <cuda_fp16.h>

#include <cstdint>

#include "tide.h"

namespace tide {
namespace cuda {
namespace fold {

constexpr int kVec = 8;  // elements per 16-byte-path unit

// Per-element NaN canonicalisation at the store (include/tide.h "NaN results"): a NaN result is written as the one
// canonical quiet NaN of the output type, whichever NaN the fp32 adds produced, as the host executor does.
__device__ __forceinline__ bool isNanBits(uint32_t x) { return (x & 0x7fffffffu) > 0x7f800000u; }
__device__ __forceinline__ float canonicalNanF32(float f) {
  // f != f is true exactly for NaN (no fast-math here): one compare instead of three integer operations.
  return f != f ? __uint_as_float(TIDE_CANONICAL_NAN_F32) : f;
}

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static __device__ __forceinline__ float toFloat(float v) { return v; }
  static __device__ __forceinline__ float fromFloat(float v) { return canonicalNanF32(v); }
};
struct Bf16 {
  uint16_t bits;
};
struct Fp16 {
  uint16_t bits;
};
template <>
struct Elem<Bf16> {
  static __device__ __forceinline__ float toFloat(Bf16 v) { return __uint_as_float(static_cast<uint32_t>(v.bits) << 16); }
  static __device__ __forceinline__ Bf16 fromFloat(float f) {
    uint32_t x = __float_as_uint(f);
    if (isNanBits(x)) return Bf16{static_cast<uint16_t>(TIDE_CANONICAL_NAN_BF16)};
    uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
    return Bf16{static_cast<uint16_t>(rounded >> 16)};
  }
};
template <>
struct Elem<Fp16> {
  static __device__ __forceinline__ float toFloat(Fp16 v) { return __half2float(__ushort_as_half(v.bits)); }
  static __device__ __forceinline__ Fp16 fromFloat(float f) {
    uint32_t x = __float_as_uint(f);
    if (isNanBits(x)) return Fp16{static_cast<uint16_t>(TIDE_CANONICAL_NAN_FP16)};
    return Fp16{__half_as_ushort(__float2half_rn(f))};
  }
};

// 8 consecutive elements as raw 16-byte words (caller guarantees alignment), then converted to fp32.
template <typename T>
struct Raw8 {
  static constexpr int kWords = kVec * sizeof(T) / 16;
  uint4 w[kWords];
};

template <typename T>
__device__ __forceinline__ void convert8(const Raw8<T>& r, float (&v)[kVec]) {
  const T* e = reinterpret_cast<const T*>(r.w);
#pragma unroll
  for (int k = 0; k < kVec; ++k) v[k] = Elem<T>::toFloat(e[k]);
}

template <typename T>
__device__ __forceinline__ void store8(T* p, const float (&v)[kVec]) {
  constexpr int kPer16 = 16 / sizeof(T);
#pragma unroll
  for (int c = 0; c < kVec / kPer16; ++c) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < kPer16; ++k) e[k] = Elem<T>::fromFloat(v[c * kPer16 + k]);
    reinterpret_cast<uint4*>(p)[c] = raw;
  }
}

struct Op {
  bool premul;
  bool avg;
  float scale;
  float divisor;
};

__device__ __forceinline__ float pre(float x, const Op& op) { return op.premul ? __fmul_rn(x, op.scale) : x; }
__device__ __forceinline__ float post(float x, const Op& op) { return op.avg ? __fdiv_rn(x, op.divisor) : x; }

// The 16-byte paths are compiled per op (SUM, PREMUL_SUM, AVG): with the op tested at run time inside the unrolled
// fold, the register kernel used 108 registers (bf16 -> fp32) and one CTA moved 83.5 GB/s, while a bench copy of
// the same schedule for SUM alone (88 registers) moved 111.0 (benchmarks/sm_bandwidth.py "baseline512", H200). The
// element path keeps the runtime op (tails, unaligned bases).
enum OpKind { kOpSum = 0, kOpPremul = 1, kOpAvg = 2 };
template <int K>
__device__ __forceinline__ float preK(float x, const Op& op) { return K == kOpPremul ? __fmul_rn(x, op.scale) : x; }
template <int K>
__device__ __forceinline__ float postK(float x, const Op& op) { return K == kOpAvg ? __fdiv_rn(x, op.divisor) : x; }

}  // namespace fold
}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_REDUCE_FOLD_CUH_
