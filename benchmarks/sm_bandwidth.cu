// Micro-benchmark kernels (issue 16, part 2): how many bytes per second ONE SM (one CTA) can move, and how that
// scales with CTAs, so that the reduce's grid can be sized from it. Built by benchmarks/sm_bandwidth.py with nvcc
// (-arch=sm_90) into a shared library; every entry point returns a cudaError_t and times `iters` launches with
// events on a stream of its own.
//   read:  each thread keeps `depth` independent 16-byte loads (LDG.128) in flight, XOR-folds them into a sink;
//   copy:  the same loads, each stored to a second buffer (bytes read + written);
//   bulk:  one thread per CTA streams its slice into shared memory with cp.async.bulk (TMA bulk copies) through
//          `stages` buffers of `stageBytes`, each completing on an mbarrier (a 1 s spin limit turns a hang into an
//          error flag).
#include <cuda_runtime.h>

#include <cstdint>

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

}  // extern "C"
