// Phase 2 of TIDE-RS: sum the node-local inputs of one staged chunk in fp32 and write the output shard.
//
// Accumulation order (include/tide.h, bit for bit): x_s = (float) in_s[k] (exact), with PREMUL_SUM
// x_s = __fmul_rn(x_s, scale); acc = x_0; acc = __fadd_rn(acc, x_s) for s = 1 .. nSrc-1 (left fold, rank order);
// AVG: acc = __fdiv_rn(acc, W); then fp32 out, or RNE narrowing to bf16/fp16; a NaN result is stored as the
// canonical NaN of the output type, as on the host (plugin/core/dtype.cc). Padding needs no special case: phase 1 fills it with zeros from a zero buffer.
//
// The kernel is short-lived by design (DESIGN.md section 9): a few CTAs sized to the chunk, each thread handling
// 8 elements per step with 16-byte loads when every base is aligned, grid-stride beyond that; it exits when done.
#include <cuda_fp16.h>

#include "../core/errors.h"
#include "cuda_check.h"
#include "reduce_kernel.h"

namespace tide {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;         // elements per thread per step
constexpr int kStepsPerThread = 4;  // steps each thread takes before the grid caps (fewer, longer-lived CTAs)

// Per-element NaN canonicalisation at the store (include/tide.h "NaN results"): a NaN result is written as the one
// canonical quiet NaN of the output type, whichever NaN the fp32 adds produced, as the host executor does.
__device__ __forceinline__ bool isNanBits(uint32_t x) { return (x & 0x7fffffffu) > 0x7f800000u; }
__device__ __forceinline__ float canonicalNanF32(float f) {
  return isNanBits(__float_as_uint(f)) ? __uint_as_float(TIDE_CANONICAL_NAN_F32) : f;
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
__device__ __forceinline__ void loadRaw8(const T* p, Raw8<T>& r) {
#pragma unroll
  for (int c = 0; c < Raw8<T>::kWords; ++c) r.w[c] = __ldg(reinterpret_cast<const uint4*>(p) + c);
}

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

// Sources whose loads are all issued before the first add (memory-level parallelism); more are folded one by one.
constexpr int kPrefetch = 8;

struct Op {
  bool premul;
  bool avg;
  float scale;
  float divisor;
};

__device__ __forceinline__ float pre(float x, const Op& op) { return op.premul ? __fmul_rn(x, op.scale) : x; }
__device__ __forceinline__ float post(float x, const Op& op) { return op.avg ? __fdiv_rn(x, op.divisor) : x; }

template <typename InT, typename OutT, bool kVector>
__global__ void __launch_bounds__(kThreads) reduceKernel(const char* __restrict__ staging, size_t srcStride, int nSrc,
                                                         uint64_t n, OutT* __restrict__ out, Op op) {
  const uint64_t tid = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t nThreads = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  if (kVector) {
    const uint64_t nVec = n / kVec;
    for (uint64_t v = tid; v < nVec; v += nThreads) {
      Raw8<InT> raw[kPrefetch];
#pragma unroll
      for (int s = 0; s < kPrefetch; ++s) {
        if (s < nSrc) loadRaw8(reinterpret_cast<const InT*>(staging + s * srcStride) + v * kVec, raw[s]);
      }
      float acc[kVec], x[kVec];
      convert8(raw[0], acc);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] = pre(acc[k], op);
#pragma unroll
      for (int s = 1; s < kPrefetch; ++s) {
        if (s < nSrc) {
          convert8(raw[s], x);
#pragma unroll
          for (int k = 0; k < kVec; ++k) acc[k] = __fadd_rn(acc[k], pre(x[k], op));
        }
      }
      for (int s = kPrefetch; s < nSrc; ++s) {
        Raw8<InT> r;
        loadRaw8(reinterpret_cast<const InT*>(staging + s * srcStride) + v * kVec, r);
        convert8(r, x);
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] = __fadd_rn(acc[k], pre(x[k], op));
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] = post(acc[k], op);
      store8(out + v * kVec, acc);
    }
    // Tail (n % 8 elements) by the first threads.
    for (uint64_t e = nVec * kVec + tid; e < n; e += nThreads) {
      float acc = pre(Elem<InT>::toFloat(reinterpret_cast<const InT*>(staging)[e]), op);
      for (int s = 1; s < nSrc; ++s) {
        acc = __fadd_rn(acc, pre(Elem<InT>::toFloat(reinterpret_cast<const InT*>(staging + s * srcStride)[e]), op));
      }
      out[e] = Elem<OutT>::fromFloat(post(acc, op));
    }
  } else {
    for (uint64_t e = tid; e < n; e += nThreads) {
      float acc = pre(Elem<InT>::toFloat(reinterpret_cast<const InT*>(staging)[e]), op);
      for (int s = 1; s < nSrc; ++s) {
        acc = __fadd_rn(acc, pre(Elem<InT>::toFloat(reinterpret_cast<const InT*>(staging + s * srcStride)[e]), op));
      }
      out[e] = Elem<OutT>::fromFloat(post(acc, op));
    }
  }
}

// Multi-node variant: acc = prev[e] + fold(inputs), then post. out may alias prev (no __restrict__ on either; prev is
// read with plain loads, never through the read-only cache, and before the same thread writes the same element).
template <typename InT, typename OutT, bool kVector>
__global__ void __launch_bounds__(kThreads) reducePrevKernel(const char* __restrict__ staging, size_t srcStride,
                                                             int nSrc, uint64_t n, const float* prev, OutT* out,
                                                             Op op) {
  const uint64_t tid = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t nThreads = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uint64_t scalarFrom = 0;
  if (kVector) {
    const uint64_t nVec = n / kVec;
    for (uint64_t v = tid; v < nVec; v += nThreads) {
      float acc[kVec], x[kVec];
      {
        Raw8<InT> r;
        loadRaw8(reinterpret_cast<const InT*>(staging) + v * kVec, r);
        convert8(r, acc);
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] = pre(acc[k], op);
      for (int s = 1; s < nSrc; ++s) {
        Raw8<InT> r;
        loadRaw8(reinterpret_cast<const InT*>(staging + s * srcStride) + v * kVec, r);
        convert8(r, x);
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] = __fadd_rn(acc[k], pre(x[k], op));
      }
      const float4* pp = reinterpret_cast<const float4*>(prev + v * kVec);
      const float4 p0 = pp[0], p1 = pp[1];
      const float pv[kVec] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] = post(__fadd_rn(pv[k], acc[k]), op);
      store8(out + v * kVec, acc);
    }
    scalarFrom = nVec * kVec;
  }
  for (uint64_t e = scalarFrom + tid; e < n; e += nThreads) {
    float acc = pre(Elem<InT>::toFloat(reinterpret_cast<const InT*>(staging)[e]), op);
    for (int s = 1; s < nSrc; ++s) {
      acc = __fadd_rn(acc, pre(Elem<InT>::toFloat(reinterpret_cast<const InT*>(staging + s * srcStride)[e]), op));
    }
    out[e] = Elem<OutT>::fromFloat(post(__fadd_rn(prev[e], acc), op));
  }
}

int smCount(int device) {
  static int cached[64] = {0};
  if (device >= 0 && device < 64 && cached[device] > 0) return cached[device];
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) {
    (void)cudaGetLastError();
    sms = 132;
  }
  if (device >= 0 && device < 64) cached[device] = sms;
  return sms;
}

template <typename InT, typename OutT>
tideResult_t launchTyped(const ReduceArgs& a, cudaStream_t stream, int grid) {
  const uintptr_t in = reinterpret_cast<uintptr_t>(a.staging), o = reinterpret_cast<uintptr_t>(a.out);
  const bool vector = in % 16 == 0 && a.srcStride % 16 == 0 && o % 16 == 0;
  Op op{a.op == tidePremulSum, a.op == tideAvg, a.scale, a.divisor};
  const char* s = static_cast<const char*>(a.staging);
  OutT* out = static_cast<OutT*>(a.out);
  if (a.prev != nullptr) {
    const bool vp = vector && reinterpret_cast<uintptr_t>(a.prev) % 16 == 0;
    if (vp) {
      reducePrevKernel<InT, OutT, true><<<grid, kThreads, 0, stream>>>(s, a.srcStride, a.nSrc, a.n, a.prev, out, op);
    } else {
      reducePrevKernel<InT, OutT, false><<<grid, kThreads, 0, stream>>>(s, a.srcStride, a.nSrc, a.n, a.prev, out, op);
    }
    TIDE_CUDA_CHECK(cudaGetLastError());
    return tideSuccess;
  }
  if (vector) {
    reduceKernel<InT, OutT, true><<<grid, kThreads, 0, stream>>>(s, a.srcStride, a.nSrc, a.n, out, op);
  } else {
    reduceKernel<InT, OutT, false><<<grid, kThreads, 0, stream>>>(s, a.srcStride, a.nSrc, a.n, out, op);
  }
  TIDE_CUDA_CHECK(cudaGetLastError());
  return tideSuccess;
}

template <typename InT>
tideResult_t launchIn(const ReduceArgs& a, cudaStream_t stream, int grid) {
  switch (a.outType) {
    case tideFloat32:
      return launchTyped<InT, float>(a, stream, grid);
    case tideBfloat16:
      return launchTyped<InT, Bf16>(a, stream, grid);
    case tideFloat16:
      return launchTyped<InT, Fp16>(a, stream, grid);
    default:
      return fail(tideInvalidArgument, "Cuda", "reduce: unsupported output type %d", static_cast<int>(a.outType));
  }
}

template <typename InT, typename OutT>
tideResult_t preloadPair() {
  cudaFuncAttributes attr;
  TIDE_CUDA_CHECK(cudaFuncGetAttributes(&attr, reduceKernel<InT, OutT, true>));
  TIDE_CUDA_CHECK(cudaFuncGetAttributes(&attr, reduceKernel<InT, OutT, false>));
  TIDE_CUDA_CHECK(cudaFuncGetAttributes(&attr, reducePrevKernel<InT, OutT, true>));
  TIDE_CUDA_CHECK(cudaFuncGetAttributes(&attr, reducePrevKernel<InT, OutT, false>));
  return tideSuccess;
}

template <typename InT>
tideResult_t preloadIn() {
  TIDE_CHECK((preloadPair<InT, float>()));
  TIDE_CHECK((preloadPair<InT, Bf16>()));
  return preloadPair<InT, Fp16>();
}

}  // namespace

tideResult_t preloadReduceKernels() {
  TIDE_CHECK(preloadIn<float>());
  TIDE_CHECK(preloadIn<Bf16>());
  return preloadIn<Fp16>();
}

int reduceGridSize(uint64_t n, int device) {
  const uint64_t perBlock = static_cast<uint64_t>(kThreads) * kVec * kStepsPerThread;
  uint64_t blocks = (n + perBlock - 1) / perBlock;
  // Never more than one full wave of resident CTAs (2 per SM at 256 threads keeps the kernel short and few).
  const uint64_t cap = static_cast<uint64_t>(smCount(device)) * 2;
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  return static_cast<int>(blocks);
}

tideResult_t launchReduce(const ReduceArgs& a, cudaStream_t stream) {
  if (a.n == 0) return tideSuccess;
  int device = 0;
  TIDE_CUDA_CHECK(cudaGetDevice(&device));
  const int grid = reduceGridSize(a.n, device);
  switch (a.inType) {
    case tideFloat32:
      return launchIn<float>(a, stream, grid);
    case tideBfloat16:
      return launchIn<Bf16>(a, stream, grid);
    case tideFloat16:
      return launchIn<Fp16>(a, stream, grid);
    default:
      return fail(tideInvalidArgument, "Cuda", "reduce: unsupported input type %d", static_cast<int>(a.inType));
  }
}

}  // namespace cuda
}  // namespace tide
