// The staged reduce kernel (issue 16): the same fold as reduceVecKernel, but the inputs reach the CTA through shared
// memory by TMA bulk copies, issued by one producer warp, consumed by the other warps, with a full and an empty
// mbarrier per stage so no block-wide barrier sits between consuming a stage and refilling it.
//
// Why: a CTA's bandwidth is bounded by its bytes in flight. Registers hold at most about 128 KiB of loads in flight
// per SM (512 threads x 16 sixteen-byte loads: 81 GB/s per CTA on an H200), while shared memory can hold about
// 192 KiB of bulk copies in flight, without a register per byte (205 GB/s per CTA for bulk reads alone;
// benchmarks/sm_bandwidth.py). Fewer CTAs then keep pace with the same link, which is the SM time TIDE-RS takes
// from concurrent compute. Session 15 tried one-thread issue with a __syncthreads per tile (69 GB/s per CTA): every
// refill waited for the slowest warp of the block. Here each consumer warp releases a stage on its own.
//
// Included by reduce_kernel.cu only (it uses that file's Elem / Raw8 / Op helpers).
#ifndef TIDE_CUDA_REDUCE_STAGED_CUH_
#define TIDE_CUDA_REDUCE_STAGED_CUH_

constexpr int kStagedConsumerWarps = 8;
constexpr int kStagedConsumers = kStagedConsumerWarps * 32;
constexpr int kStagedThreads = kStagedConsumers + 32;  // + the producer warp
// A stage is one source's slice of a tile: one bulk copy of up to 48 KiB (bulk reads alone reach 205 GB/s per CTA
// with 4 x 48 KiB in flight, 150 with 32 KiB stages, and small copies are slower still: 8 sources x 4 KiB stages
// gave 47 GB/s in this kernel). Consumers keep the tile's fp32 sums in registers across the sources, so the fold
// order stays that of the other paths.
constexpr int kStagedPasses = 12;  // vectors per consumer per tile: 12 x 256 x 16 bytes = 48 KiB per stage
constexpr int kStagedStages = 4;
constexpr uint32_t kStagedStageBytes = kStagedPasses * kStagedConsumers * 16u;
constexpr uint32_t kStagedSmemBytes = kStagedStages * kStagedStageBytes;  // 192 KiB of the 227 a CTA may have

__device__ __forceinline__ uint32_t smemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" : : "r"(smemAddr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbarExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" : : "r"(smemAddr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" : : "r"(smemAddr(bar)) : "memory");
}

// Waits until the phase of parity `parity` of bar has completed.
__device__ __forceinline__ void mbarWait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(smemAddr(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
}

__device__ __forceinline__ void bulkLoad(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :
               : "r"(smemAddr(dst)), "l"(src), "r"(bytes), "r"(smemAddr(bar))
               : "memory");
}

// Consumer threadIdx.x's vectors of one tile: stage j of the tile holds source j's nv vectors; acc holds the fp32 sums
// of this thread's vectors i = p * 256 + threadIdx.x.
template <typename InT, bool kPremul>
__device__ __forceinline__ void foldStage(const unsigned char* stage, uint64_t nv, bool first, const Op& op,
                                          float (&acc)[kStagedPasses][kVec]) {
#pragma unroll
  for (int p = 0; p < kStagedPasses; ++p) {
    const uint64_t i = static_cast<uint64_t>(p) * kStagedConsumers + threadIdx.x;
    if (i < nv) {
      Raw8<InT> r;
      r.w[0] = *reinterpret_cast<const uint4*>(stage + i * 16);
      float x[kVec];
      convert8(r, x);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float v = kPremul ? __fmul_rn(x[k], op.scale) : x[k];
        acc[p][k] = first ? v : __fadd_rn(acc[p][k], v);
      }
    }
  }
}

template <typename OutT, bool kPrev>
__device__ __forceinline__ void storeTile(const float* prev, OutT* out, uint64_t v0, uint64_t nv, const Op& op,
                                          float (&acc)[kStagedPasses][kVec]) {
#pragma unroll
  for (int p = 0; p < kStagedPasses; ++p) {
    const uint64_t i = static_cast<uint64_t>(p) * kStagedConsumers + threadIdx.x;
    if (i < nv) {
      if (kPrev) {
        // Read before this thread writes the same element (out may alias prev).
        const float4* pp = reinterpret_cast<const float4*>(prev + (v0 + i) * kVec);
        const float4 p0 = pp[0], p1 = pp[1];
        const float pv[kVec] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[p][k] = __fadd_rn(pv[k], acc[p][k]);
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[p][k] = post(acc[p][k], op);
      store8(out + (v0 + i) * kVec, acc[p]);
    }
  }
}

// Vectors [unitBase + blockIdx.x * perCta, + perCta) ∩ [0, nVec), tile by tile (kStagedPasses * 256 vectors), and
// within a tile source by source: stage q = (tile, source) pairs in that order, ring slot q % kStagedStages. The
// producer lane refills a slot once every consumer warp has released it (empty barrier, one arrival per warp); the
// consumers wait for its bytes (full barrier, transaction count). Bit-exact with the other paths: each element is
// folded by one thread, sources in order, then prev, then post.
template <typename InT, typename OutT, bool kPrev>
__global__ void __launch_bounds__(kStagedThreads, 1)
    reduceStagedKernel(const char* __restrict__ staging, size_t srcStride, int nSrc, uint64_t nVec, const float* prev,
                       OutT* out, Op op, uint64_t unitBase, uint64_t perCta) {
  static_assert(sizeof(InT) == 2, "the staged path folds 2-byte inputs");
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[kStagedStages];
  __shared__ __align__(8) uint64_t empty[kStagedStages];
  const uint64_t begin = unitBase + static_cast<uint64_t>(blockIdx.x) * perCta;
  if (begin >= nVec) return;
  const uint64_t end = begin + perCta < nVec ? begin + perCta : nVec;
  constexpr uint64_t kTileVecs = static_cast<uint64_t>(kStagedPasses) * kStagedConsumers;
  const uint64_t tiles = (end - begin + kTileVecs - 1) / kTileVecs;
  const uint64_t steps = tiles * static_cast<uint64_t>(nSrc);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStagedStages; ++s) {
      mbarInit(&full[s], 1);
      mbarInit(&empty[s], kStagedConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
  }
  __syncthreads();  // the barriers are initialised before anyone uses them

  if (warp == kStagedConsumerWarps) {  // the producer warp: one lane issues every copy
    if (lane != 0) return;
    for (uint64_t q = 0; q < steps; ++q) {
      const int s = static_cast<int>(q % kStagedStages);
      const uint64_t round = q / kStagedStages;
      if (round > 0) {
        mbarWait(&empty[s], static_cast<uint32_t>((round - 1) & 1u));  // every consumer warp has read step q - stages
        asm volatile("fence.proxy.async.shared::cta;" : : : "memory");  // their reads before the engine's writes
      }
      const uint64_t t = q / static_cast<uint64_t>(nSrc);
      const int j = static_cast<int>(q % static_cast<uint64_t>(nSrc));
      const uint64_t v0 = begin + t * kTileVecs;
      const uint64_t nv = end - v0 < kTileVecs ? end - v0 : kTileVecs;
      const uint32_t bytes = static_cast<uint32_t>(nv * 16);
      mbarExpectTx(&full[s], bytes);
      bulkLoad(smem + static_cast<size_t>(s) * kStagedStageBytes, staging + j * srcStride + v0 * 16, bytes, &full[s]);
    }
    return;
  }

  // Consumers.
  float acc[kStagedPasses][kVec];
  uint64_t q = 0;
  for (uint64_t t = 0; t < tiles; ++t) {
    const uint64_t v0 = begin + t * kTileVecs;
    const uint64_t nv = end - v0 < kTileVecs ? end - v0 : kTileVecs;
    for (int j = 0; j < nSrc; ++j, ++q) {
      const int s = static_cast<int>(q % kStagedStages);
      mbarWait(&full[s], static_cast<uint32_t>((q / kStagedStages) & 1u));
      const unsigned char* stage = smem + static_cast<size_t>(s) * kStagedStageBytes;
      // The op is uniform: one branch per stage instead of a select per element.
      if (op.premul) {
        foldStage<InT, true>(stage, nv, j == 0, op, acc);
      } else {
        foldStage<InT, false>(stage, nv, j == 0, op, acc);
      }
      __syncwarp();
      if (lane == 0) mbarArrive(&empty[s]);  // this warp is done with the slot
    }
    storeTile<OutT, kPrev>(prev, out, v0, nv, op, acc);
  }
}

#endif  // TIDE_CUDA_REDUCE_STAGED_CUH_
