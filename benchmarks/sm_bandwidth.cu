// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Micro-benchmark kernels: how many bytes per second ONE SM (one CTA) can move, and how that
// scales with CTAs, so that the reduce's grid can be sized from it. Built by benchmarks/sm_bandwidth.py with nvcc
// (-arch=sm_90) into a shared library; every entry point returns a cudaError_t and times `iters` launches with
// events on a stream of its own; the reduce variants (rv::, smbw_reduce) only enqueue, on the caller's stream.
//   read:  each thread issues `depth` independent 16-byte loads (LDG.128) per loop iteration and XOR-folds them
//          into a sink (ptxas folds each word as it arrives and refills its registers: 32 registers, so at most 4 to
//          5 loads are outstanding per thread for every depth >= 4, not `depth`);
//   copy:  the same loads, each stored to a second buffer (bytes read + written);
//   bulk:  one thread per CTA streams its slice into shared memory with cp.async.bulk (TMA bulk copies) through
//          `stages` buffers of `stageBytes`, each completing on an mbarrier (a 1 s spin limit turns a hang into an
//          error flag).
#include <cuda_runtime.h>

#include <cstdint>

#include "../include/tide.h"  // TIDE_CANONICAL_NAN_F32 (no other dependency: the probe builds without -I)

namespace {

template <int D>
__global__ void readKernel(const uint4* __restrict__ src, uint64_t perCta, uint64_t* sink) {
  const uint4* p = src + blockIdx.x * perCta;
  uint32_t acc = 0;
  const uint64_t step = static_cast<uint64_t>(blockDim.x) * D;
  for (uint64_t i = threadIdx.x; i + (D - 1) * blockDim.x < perCta; i += step) {
    uint4 v[D];
#pragma unroll
    for (int d = 0; d < D; ++d) v[d] = __ldg(p + i + static_cast<uint64_t>(d) * blockDim.x);
#pragma unroll
    for (int d = 0; d < D; ++d) acc ^= v[d].x ^ v[d].y ^ v[d].z ^ v[d].w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;  // practically never; keeps the loads alive
}

template <int D>
__global__ void copyKernel(uint4* __restrict__ dst, const uint4* __restrict__ src, uint64_t perCta) {
  const uint4* p = src + blockIdx.x * perCta;
  uint4* q = dst + blockIdx.x * perCta;
  const uint64_t step = static_cast<uint64_t>(blockDim.x) * D;
  for (uint64_t i = threadIdx.x; i + (D - 1) * blockDim.x < perCta; i += step) {
    uint4 v[D];
#pragma unroll
    for (int d = 0; d < D; ++d) v[d] = __ldg(p + i + static_cast<uint64_t>(d) * blockDim.x);
#pragma unroll
    for (int d = 0; d < D; ++d) q[i + static_cast<uint64_t>(d) * blockDim.x] = v[d];
  }
}

__device__ __forceinline__ uint64_t nowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t smemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bulkIssue(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" : : "r"(bar), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :
               : "r"(dst), "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

__device__ __forceinline__ bool bulkTryWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

constexpr int kMaxStages = 8;

__global__ void bulkKernel(const char* __restrict__ src, uint64_t perCta, int stages, uint32_t stageBytes,
                           uint64_t* sink, int* error) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[kMaxStages];
  if (threadIdx.x != 0) return;
  const char* base = src + blockIdx.x * perCta;
  const uint64_t chunks = perCta / stageBytes;
  for (int s = 0; s < stages; ++s) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" : : "r"(smemAddr(&bars[s])), "r"(1) : "memory");
  }
  asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
  asm volatile("fence.proxy.async.shared::cta;" : : : "memory");
  for (uint64_t c = 0; c < chunks && c < static_cast<uint64_t>(stages); ++c) {
    bulkIssue(smemAddr(smem + c * stageBytes), base + c * stageBytes, stageBytes, smemAddr(&bars[c]));
  }
  uint32_t parity = 0;  // bit s: phase of stage s
  uint32_t acc = 0;
  for (uint64_t c = 0; c < chunks; ++c) {
    const int s = static_cast<int>(c % stages);
    const uint32_t bar = smemAddr(&bars[s]);
    const uint64_t t0 = nowNs();
    while (!bulkTryWait(bar, (parity >> s) & 1u)) {
      if (nowNs() - t0 > 1000000000ull) {
        atomicExch(error, 1);
        return;
      }
    }
    parity ^= 1u << s;
    acc ^= reinterpret_cast<const uint32_t*>(smem + s * stageBytes)[c & 7];
    if (c + stages < chunks) {
      asm volatile("fence.proxy.async.shared::cta;" : : : "memory");  // our read before the engine's next write
      bulkIssue(smemAddr(smem + s * stageBytes), base + (c + stages) * stageBytes, stageBytes, bar);
    }
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

template <typename Launch>
cudaError_t timed(int iters, float* ms, Launch launch) {
  cudaStream_t s;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return e;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  launch(s);  // warm-up
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e == cudaSuccess) {
    cudaEventRecord(a, s);
    for (int i = 0; i < iters; ++i) launch(s);
    cudaEventRecord(b, s);
    e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaEventSynchronize(b);
    if (e == cudaSuccess) e = cudaEventElapsedTime(ms, a, b);
    if (e == cudaSuccess) *ms /= iters;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  return e;
}

template <int D>
void launchRead(int ctas, int threads, const void* src, uint64_t perCta, uint64_t* sink, cudaStream_t s) {
  readKernel<D><<<ctas, threads, 0, s>>>(static_cast<const uint4*>(src), perCta, sink);
}
template <int D>
void launchCopy(int ctas, int threads, void* dst, const void* src, uint64_t perCta, cudaStream_t s) {
  copyKernel<D><<<ctas, threads, 0, s>>>(static_cast<uint4*>(dst), static_cast<const uint4*>(src), perCta);
}

// ---- Reduce variants ("make the reduce quiet"): bench-only copies of the library's reduce math ----------
// Same fold as plugin/cuda/reduce_kernel.cu's reduceVecKernel for op SUM, bf16 inputs and an fp32 output (no
// premul, avg or prev): x_s = (float) in_s[k] (exact), acc = x_0, acc = __fadd_rn(acc, x_s) for s = 1 .. nSrc-1,
// a NaN sum stored as the canonical fp32 NaN; 16-byte path only (every base 16-byte aligned, n a multiple of 8);
// CTA b owns the contiguous vectors [b * perCta, (b + 1) * perCta) as one launch of the library's shape does. They
// differ only in how loads are kept in flight against the adds, so that sm_bandwidth.py can compare them per CTA
// with the library's kernel in one run. A vector is 8 bf16 = one 16-byte word per source.
namespace rv {

constexpr int kMaxSrc = 8;

struct Args {
  const char* staging;  // nSrc inputs, input s at staging + s * stride bytes
  size_t stride;
  int nSrc;             // 1 .. kMaxSrc
  uint64_t nVec;        // 8-element vectors
  float* out;
  uint64_t perCta;      // vectors per CTA
};

// The library's load: ld.global.nc (read-only path), allocating in L1 as any LDG does.
struct LoadNc {
  static __device__ __forceinline__ uint4 load(const uint4* p) { return __ldg(p); }
};
// Variant d's load. Every input byte is read exactly once, so an L1 line allocated for it is never hit again:
// L1::no_allocate lets the returning sectors bypass L1's allocation (no tag install, no eviction of other lines)
// and L2::256B asks L2 to fetch 256-byte DRAM bursts. Whether the SM's miss path is what bounds one CTA is the
// question this variant asks; it changes only the cache policy, not the bytes or the math.
struct LoadNoAlloc {
  static __device__ __forceinline__ uint4 load(const uint4* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
  }
};

__device__ __forceinline__ const uint4* srcVec(const Args& a, int s, uint64_t v) {
  return reinterpret_cast<const uint4*>(a.staging + static_cast<size_t>(s) * a.stride) + v;
}

// 8 bf16 (little-endian pairs in four 32-bit words) to fp32: element 2c is the low half of word c, 2c+1 the high
// half; both exact, bit for bit the library's (uint32_t) bits << 16.
__device__ __forceinline__ void widen(const uint4& w, float (&x)[8]) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    x[2 * c] = __uint_as_float(u[c] << 16);
    x[2 * c + 1] = __uint_as_float(u[c] & 0xffff0000u);
  }
}

__device__ __forceinline__ void addInto(const uint4& w, float (&acc)[8]) {
  float x[8];
  widen(w, x);
#pragma unroll
  for (int k = 0; k < 8; ++k) acc[k] = __fadd_rn(acc[k], x[k]);
}

__device__ __forceinline__ void storeOut(const Args& a, uint64_t v, float (&acc)[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) acc[k] = acc[k] != acc[k] ? __uint_as_float(TIDE_CANONICAL_NAN_F32) : acc[k];
  float4* p = reinterpret_cast<float4*>(a.out + v * 8);
  p[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  p[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
}

// One vector of every source into r (sources >= nSrc left untouched).
template <class Ld>
__device__ __forceinline__ void loadAll(const Args& a, uint64_t v, uint4 (&r)[kMaxSrc]) {
#pragma unroll
  for (int s = 0; s < kMaxSrc; ++s) {
    if (s < a.nSrc) r[s] = Ld::load(srcVec(a, s, v));
  }
}

// The left fold of one vector whose words are all in r, then its store.
__device__ __forceinline__ void foldStore(const Args& a, uint64_t v, const uint4 (&r)[kMaxSrc]) {
  float acc[8];
  widen(r[0], acc);
#pragma unroll
  for (int s = 1; s < kMaxSrc; ++s) {
    if (s < a.nSrc) addInto(r[s], acc);
  }
  storeOut(a, v, acc);
}

__device__ __forceinline__ bool slice(const Args& a, uint64_t* begin, uint64_t* end) {
  *begin = static_cast<uint64_t>(blockIdx.x) * a.perCta;
  if (*begin >= a.nVec) return false;
  *end = *begin + a.perCta < a.nVec ? *begin + a.perCta : a.nVec;
  return true;
}

// baseline512: the library's schedule for SUM (512 threads, U = 2 vectors x 8 sources = 16 loads issued, then the
// folds, then the next 16) without the library's runtime op (its premul / avg tests, compiled as branches around
// duplicated fold code): what dropping them is worth, so that the other variants' gains are not credited to their
// schedule by mistake.
template <class Ld>
__global__ void __launch_bounds__(512, 1) baseline512(Args a) {
  constexpr int T = 512, U = 2;
  uint64_t begin, end;
  if (!slice(a, &begin, &end)) return;
  for (uint64_t v0 = begin + threadIdx.x; v0 < end; v0 += static_cast<uint64_t>(T) * U) {
    uint4 r[U][kMaxSrc];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (v0 + static_cast<uint64_t>(u) * T < end) loadAll<Ld>(a, v0 + static_cast<uint64_t>(u) * T, r[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (v0 + static_cast<uint64_t>(u) * T < end) foldStore(a, v0 + static_cast<uint64_t>(u) * T, r[u]);
    }
  }
}

// pipelined (variant a, 512 threads; at 1024, variant c, it spills: see kVariants): double buffering by whole
// vectors. Two register sets of 8 sources x 1
// vector each; the next vector's 8 loads are issued into one set before the current vector, in the other, is
// folded, so a warp has 8 to 16 loads in flight while it adds instead of none (the library's warps stop loading
// from their first add until their 16 words are folded and stored). The loop body is unrolled by two so the sets
// swap roles without register copies (a copy would wait for its load, which is the stall this avoids).
template <int T, class Ld>
__global__ void __launch_bounds__(T, 1) pipelined(Args a) {
  uint64_t begin, end;
  if (!slice(a, &begin, &end)) return;
  uint64_t v = begin + threadIdx.x;
  if (v >= end) return;
  uint4 ra[kMaxSrc], rb[kMaxSrc];
  loadAll<Ld>(a, v, ra);
  for (;;) {
    const uint64_t vb = v + T;
    const bool hasB = vb < end;
    if (hasB) loadAll<Ld>(a, vb, rb);
    foldStore(a, v, ra);
    if (!hasB) break;
    const uint64_t vn = vb + T;
    const bool hasN = vn < end;
    if (hasN) loadAll<Ld>(a, vn, ra);
    foldStore(a, vb, rb);
    if (!hasN) break;
    v = vn;
  }
}

// threads1024 (b): the library's schedule with twice the warps and half the words per thread (1024 threads,
// U = 1: 8 loads issued, then the fold): the same 128 KiB in flight per CTA, but 32 warps instead of 16 to cover
// one another's adds and load latency. 64 registers per thread at most (the whole register file).
template <class Ld>
__global__ void __launch_bounds__(1024, 1) threads1024(Args a) {
  constexpr int T = 1024;
  uint64_t begin, end;
  if (!slice(a, &begin, &end)) return;
  for (uint64_t v = begin + threadIdx.x; v < end; v += T) {
    uint4 r[kMaxSrc];
    loadAll<Ld>(a, v, r);
    foldStore(a, v, r);
  }
}

// rolling (512 threads x 2 vectors, 1024 x 1): software pipelining by single words instead of whole vectors.
// Slot r[u][s] holds source s of the thread's vector u; as soon as the fold has consumed it, the same slot is
// refilled with source s of the vector U * T further on. So each thread keeps U x nSrc - 1 to U x nSrc loads in
// flight in the steady state (FIFO: the oldest word is always the next one added) with the registers of one buffer,
// which is what lets 1024 threads (64 registers each) pipeline at all. The raw-read probe above gets its 148 GB/s
// per CTA this way too: ptxas folds readKernel's words as they arrive and refills their registers (4 to 5 loads
// outstanding per thread at depth 16), not with depth-deep batches.
template <int T, int U, class Ld>
__global__ void __launch_bounds__(T, 1) rolling(Args a) {
  uint64_t begin, end;
  if (!slice(a, &begin, &end)) return;
  uint64_t v = begin + threadIdx.x;
  uint4 r[U][kMaxSrc];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (v + static_cast<uint64_t>(u) * T < end) loadAll<Ld>(a, v + static_cast<uint64_t>(u) * T, r[u]);
  }
  for (; v < end; v += static_cast<uint64_t>(T) * U) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint64_t cur = v + static_cast<uint64_t>(u) * T;
      if (cur >= end) break;  // the vectors after it are further still
      const uint64_t nxt = cur + static_cast<uint64_t>(T) * U;
      const bool more = nxt < end;
      float acc[8];
      widen(r[u][0], acc);
      if (more) r[u][0] = Ld::load(srcVec(a, 0, nxt));
#pragma unroll
      for (int s = 1; s < kMaxSrc; ++s) {
        if (s < a.nSrc) {
          addInto(r[u][s], acc);
          if (more) r[u][s] = Ld::load(srcVec(a, s, nxt));
        }
      }
      storeOut(a, cur, acc);
    }
  }
}

using Kernel = void (*)(Args);
struct Variant {
  const char* name;
  int threads;
  Kernel kernel;
};

// The order is the id sm_bandwidth.py passes (it reads names and threads from here, not a copy of this list).
// pipelined<1024> (variant c, two sets of 8 words at 1024 threads) is not listed: under the 64-register cap ptxas
// spills it (nvcc 13.0: 120-byte stack frame, 288 bytes of spill stores, 352 of spill loads), and rolling<1024, 1>
// is its spill-free form. Every schedule is listed twice: with the library's load and with variant d's.
const Variant kVariants[] = {
    {"baseline512", 512, baseline512<LoadNc>},
    {"pipelined512", 512, pipelined<512, LoadNc>},
    {"rolling512", 512, rolling<512, 2, LoadNc>},
    {"threads1024", 1024, threads1024<LoadNc>},
    {"rolling1024", 1024, rolling<1024, 1, LoadNc>},
    {"pipelined512_noalloc", 512, pipelined<512, LoadNoAlloc>},
    {"rolling512_noalloc", 512, rolling<512, 2, LoadNoAlloc>},
    {"threads1024_noalloc", 1024, threads1024<LoadNoAlloc>},
    {"rolling1024_noalloc", 1024, rolling<1024, 1, LoadNoAlloc>},
};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

}  // namespace rv

}  // namespace

extern "C" {

// bytes: of the buffer (each CTA reads bytes / ctas); depth in {1, 2, 4, 8, 16}. sink: ctas uint64 of scratch.
int smbw_read(const void* src, size_t bytes, int ctas, int threads, int depth, int iters, void* sink, float* ms) {
  if (ctas < 1 || threads < 32 || threads > 1024 || reinterpret_cast<uintptr_t>(src) % 16) return cudaErrorInvalidValue;
  // Whole steps only (threads x depth vectors), so that every counted byte is read.
  const uint64_t step = static_cast<uint64_t>(threads) * depth;
  const uint64_t perCta = bytes / 16 / ctas / step * step;
  uint64_t* k = static_cast<uint64_t*>(sink);
  switch (depth) {
    case 1: return timed(iters, ms, [&](cudaStream_t s) { launchRead<1>(ctas, threads, src, perCta, k, s); });
    case 2: return timed(iters, ms, [&](cudaStream_t s) { launchRead<2>(ctas, threads, src, perCta, k, s); });
    case 4: return timed(iters, ms, [&](cudaStream_t s) { launchRead<4>(ctas, threads, src, perCta, k, s); });
    case 8: return timed(iters, ms, [&](cudaStream_t s) { launchRead<8>(ctas, threads, src, perCta, k, s); });
    case 16: return timed(iters, ms, [&](cudaStream_t s) { launchRead<16>(ctas, threads, src, perCta, k, s); });
    default: return cudaErrorInvalidValue;
  }
}

int smbw_copy(void* dst, const void* src, size_t bytes, int ctas, int threads, int depth, int iters, float* ms) {
  if (ctas < 1 || threads < 32 || threads > 1024 || (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) % 16) {
    return cudaErrorInvalidValue;
  }
  const uint64_t step = static_cast<uint64_t>(threads) * depth;
  const uint64_t perCta = bytes / 16 / ctas / step * step;
  switch (depth) {
    case 1: return timed(iters, ms, [&](cudaStream_t s) { launchCopy<1>(ctas, threads, dst, src, perCta, s); });
    case 4: return timed(iters, ms, [&](cudaStream_t s) { launchCopy<4>(ctas, threads, dst, src, perCta, s); });
    case 8: return timed(iters, ms, [&](cudaStream_t s) { launchCopy<8>(ctas, threads, dst, src, perCta, s); });
    default: return cudaErrorInvalidValue;
  }
}

// error: one int of device scratch, 0 on entry; set to 1 if a stage did not complete within 1 s.
int smbw_bulk(const void* src, size_t bytes, int ctas, int stages, unsigned stageBytes, int iters, void* sink,
              void* error, float* ms) {
  if (ctas < 1 || stages < 1 || stages > kMaxStages || stageBytes < 16 || stageBytes % 16 ||
      reinterpret_cast<uintptr_t>(src) % 16) {
    return cudaErrorInvalidValue;
  }
  const size_t smem = static_cast<size_t>(stages) * stageBytes;
  cudaError_t e = cudaFuncSetAttribute(bulkKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  const uint64_t perCta = bytes / ctas / stageBytes * stageBytes;
  return timed(iters, ms, [&](cudaStream_t s) {
    bulkKernel<<<ctas, 32, smem, s>>>(static_cast<const char*>(src), perCta, stages, stageBytes,
                                      static_cast<uint64_t*>(sink), static_cast<int*>(error));
  });
}

// Reduce variants (rv above). smbw_reduce_count / _name / _threads describe them without a device; smbw_reduce_attrs
// reads the compiled kernel's registers and local (spill) bytes (cudaFuncGetAttributes: needs a device).
int smbw_reduce_count() { return rv::kNumVariants; }
const char* smbw_reduce_name(int id) { return id >= 0 && id < rv::kNumVariants ? rv::kVariants[id].name : nullptr; }
int smbw_reduce_threads(int id) { return id >= 0 && id < rv::kNumVariants ? rv::kVariants[id].threads : 0; }

int smbw_reduce_attrs(int id, int* regs, int* localBytes) {
  if (id < 0 || id >= rv::kNumVariants) return cudaErrorInvalidValue;
  cudaFuncAttributes attr;
  const cudaError_t e = cudaFuncGetAttributes(&attr, rv::kVariants[id].kernel);
  if (e != cudaSuccess) return e;
  *regs = attr.numRegs;
  *localBytes = static_cast<int>(attr.localSizeBytes);
  return cudaSuccess;
}

// Enqueues variant `id` on `stream` (a cudaStream_t; 0: the legacy default stream) over n elements of nSrc bf16
// inputs (input s at staging + s * srcStride bytes) into n fp32 of out, on `ctas` CTAs of one launch, CTA b owning
// the vectors [b * perCta, (b + 1) * perCta), perCta = ceil(n / 8 / ctas). Returns the launch's cudaError_t.
int smbw_reduce(int id, const void* staging, size_t srcStride, int nSrc, uint64_t n, void* out, int ctas,
                void* stream) {
  if (id < 0 || id >= rv::kNumVariants || nSrc < 1 || nSrc > rv::kMaxSrc || ctas < 1 || n % 8 != 0 ||
      (reinterpret_cast<uintptr_t>(staging) | reinterpret_cast<uintptr_t>(out) | srcStride) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  rv::Args a{static_cast<const char*>(staging), srcStride, nSrc, n / 8, static_cast<float*>(out), 0};
  a.perCta = (a.nVec + static_cast<uint64_t>(ctas) - 1) / static_cast<uint64_t>(ctas);
  const rv::Variant& v = rv::kVariants[id];
  v.kernel<<<ctas, v.threads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return cudaGetLastError();
}

}  // extern "C"
