// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The staged reduce kernel: the fold of reduce_fold.cuh over 8-element vectors, bit for bit that of the register
// kernel (reduceVecKernel), with the inputs brought into shared memory by TMA bulk copies instead of held in
// registers.
//
// Why: a CTA moves at most its bytes in flight per memory latency. The register kernel has its 128 KiB in flight
// only while its threads wait for their batch of 16 loads; while they add, nothing is in flight. Alone one of its
// CTAs moves about 104 GB/s on an H100, beside the paced arrivals (whose copies load HBM and lengthen every load)
// 64-68, while one CTA of TMA bulk reads alone moves about 207 (benchmarks/sm_bandwidth.py). Here a producer warp
// keeps up to kStages tiles of every source in flight (up to 192 KiB) while 16 consumer warps fold the tile that
// has landed: loads and adds overlap, and no register holds a byte in flight.
//
// Two earlier staged forms measured slower than the register kernel on an H200 (docs/architecture.md): one thread
// issuing with a block-wide barrier per tile and the op tested at run time (69 GB/s per CTA against 81), and a
// producer warp with one source per stage and 8 consumer warps holding 12 vectors of sums each (57.6). This form
// differs in what those measurements point at: the op is compiled in (which alone took a register-kernel CTA from
// 83.5 to 111 GB/s), 16 consumer warps fold (as many as the register kernel has, to keep the SM's issue slots
// busy), each vector's every source comes from one stage, and no block-wide barrier follows the role split.
//
// The ring, per CTA: tile t (tileVec vectors of every source, then prev's) goes to stage s = t % kStages, its
// u = t / kStages-th use of that stage.
//   full[s]  (1 arrival): the producer's arrive.expect_tx of the tile's bytes, completed by the bulk copies'
//            complete_tx; its phase u completes when tile t has landed. Consumers wait for parity u & 1.
//   empty[s] (kConsumerWarps arrivals): lane 0 of each consumer warp, after __syncwarp, once the warp has read tile
//            t; its phase u completes when every consumer warp has. Before refilling stage s with tile t + kStages
//            the producer waits for parity u & 1, then fences the async proxy behind those generic-proxy reads.
// No barrier gets two phases ahead of a thread that waits on it: tile t + kStages is issued only after every
// consumer warp arrived for tile t, after its wait for tile t, so a parity cannot stand for two phases. Every tile
// issued is waited for by every consumer, so no copy is in flight when the CTA exits.
#include "../core/errors.h"
#include "cuda_check.h"
#include "reduce_fold.cuh"
#include "reduce_staged.h"
#include "reduce_types.h"

namespace tide {
namespace cuda {
namespace {

using namespace fold;  // the fold's vocabulary, shared with reduce_kernel.cu

constexpr int kConsumerWarps = 16;
constexpr int kConsumers = kConsumerWarps * 32;
static_assert(kStagedThreads == kConsumers + 32, "16 consumer warps and one producer warp");
// Three stages of up to 64 KiB: 192 KiB of the 227 KiB of shared memory a CTA may have on sm_90. A tile of 8 bf16
// sources is then one vector per consumer thread (512 x 8 x 16 bytes); one CTA of bulk reads alone moved 207 GB/s
// with 4 x 48 KiB in flight and less with less (benchmarks/RESULTS.md).
constexpr int kStages = 3;
constexpr uint32_t kStageBytes = 64u << 10;
constexpr uint32_t kRingBytes = kStages * kStageBytes;
constexpr uint32_t kMinTileVectors = 32;  // one warp's worth
// Sources read from the stage before the first add, 8 sixteen-byte words per thread (8 bf16/fp16 sources, 4 fp32):
// more are folded one by one. 16 words spilled with fp32 inputs and prev under the 96 registers ptxas allots a
// thread of 544.
template <typename T>
struct Prefetch {
  static constexpr int value = 8 / Raw8<T>::kWords;
};

// Bytes of one stage: every source's slice of the tile (tileVec vectors of vecBytes), then prev's (fp32). The host
// sizes the launch's shared memory with it, the kernel lays the stage out by it.
__host__ __device__ constexpr uint32_t stageBytesFor(int nSrc, uint32_t vecBytes, uint32_t tileVec, bool prev) {
  return static_cast<uint32_t>(nSrc) * tileVec * vecBytes + (prev ? tileVec * kVec * 4u : 0u);
}

__device__ __forceinline__ uint32_t smemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The mbarrier and bulk-copy operations, on 32-bit shared-window addresses (smemAddr).
__device__ __forceinline__ void mbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" : : "r"(bar), "r"(count) : "memory");
}

// One arrival that also expects `bytes` more of transactions (the bulk copies' complete_tx) in the current phase.
__device__ __forceinline__ void mbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" : : "r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" : : "r"(bar) : "memory");
}

// Returns once the phase of bar with parity `parity` has completed (acquire: what the arrivals of that phase
// ordered before them, and the bytes of its transactions, are visible after it).
__device__ __forceinline__ void mbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

// Orders this thread's earlier generic-proxy accesses to shared memory (and those made visible to it) before its
// later async-proxy ones (the bulk copies), and the mbarrier inits before the copies' complete_tx.
__device__ __forceinline__ void fenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;" : : : "memory"); }

// bytes (a multiple of 16; src and dst 16-byte aligned) from global memory into this CTA's shared memory, counted
// on bar's transactions when they have landed.
__device__ __forceinline__ void bulkLoad(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :
               : "r"(dst), "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// 16 bytes of shared memory at a 32-bit shared-window address. An asm of its own so that the address is computed
// once per vector, not rebuilt from the generic pointer for every source; volatile keeps it between the waits and
// the arrivals (volatile asm, in program order) that bracket a tile's reads.
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 r;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(addr));
  return r;
}

template <typename T>
__device__ __forceinline__ void loadStage(uint32_t addr, Raw8<T>& r) {
#pragma unroll
  for (int c = 0; c < Raw8<T>::kWords; ++c) r.w[c] = lds128(addr + 16u * c);
}

// The 8 elements of r as fp32, the values of reduce_fold.cuh's convert8 in one instruction per element: a bf16 is
// the high half of its fp32 (element 2c is the low half of word c: w << 16; element 2c + 1 the high half:
// w & 0xffff0000), an fp16 pair converts as a half2. convert8 reads element by element (an extract and a shift per
// element); the register kernel keeps it as it was measured.
__device__ __forceinline__ void widen8(const Raw8<Bf16>& r, float (&v)[kVec]) {
  const uint32_t u[4] = {r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    v[2 * c] = __uint_as_float(u[c] << 16);
    v[2 * c + 1] = __uint_as_float(u[c] & 0xffff0000u);
  }
}
__device__ __forceinline__ void widen8(const Raw8<Fp16>& r, float (&v)[kVec]) {
  const uint32_t u[4] = {r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u[c]));
    v[2 * c] = f.x;
    v[2 * c + 1] = f.y;
  }
}
__device__ __forceinline__ void widen8(const Raw8<float>& r, float (&v)[kVec]) {
  v[0] = __uint_as_float(r.w[0].x), v[1] = __uint_as_float(r.w[0].y), v[2] = __uint_as_float(r.w[0].z);
  v[3] = __uint_as_float(r.w[0].w), v[4] = __uint_as_float(r.w[1].x), v[5] = __uint_as_float(r.w[1].y);
  v[6] = __uint_as_float(r.w[1].z), v[7] = __uint_as_float(r.w[1].w);
}

// A vector of a landed stage folded in the order of reduce_fold.cuh: source s at addr + s * slice (shared window).
template <typename InT, int kOp>
__device__ __forceinline__ void foldStage(uint32_t addr, uint32_t slice, int nSrc, const Op& op, float (&acc)[kVec]) {
  constexpr int kPrefetch = Prefetch<InT>::value;
  Raw8<InT> raw[kPrefetch];
  uint32_t at = addr;  // source s's vector, stepped by slice (not recomputed from s per source)
#pragma unroll
  for (int s = 0; s < kPrefetch; ++s, at += slice) {
    if (s < nSrc) loadStage(at, raw[s]);
  }
  widen8(raw[0], acc);
#pragma unroll
  for (int k = 0; k < kVec; ++k) acc[k] = preK<kOp>(acc[k], op);
  float x[kVec];
#pragma unroll
  for (int s = 1; s < kPrefetch; ++s) {
    if (s < nSrc) {
      widen8(raw[s], x);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] = __fadd_rn(acc[k], preK<kOp>(x[k], op));
    }
  }
  for (int s = kPrefetch; s < nSrc; ++s, at += slice) {
    Raw8<InT> r;
    loadStage(at, r);
    widen8(r, x);
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[k] = __fadd_rn(acc[k], preK<kOp>(x[k], op));
  }
}

// Where a CTA is in the ring: the stage of its tile t (t % kStages) and the parity of that stage's use
// ((t / kStages) & 1), stepped tile by tile alike by the producer and the consumers.
struct RingSlot {
  uint32_t stage = 0;
  uint32_t parity = 0;
  __device__ __forceinline__ void next() {
    if (++stage == kStages) {
      stage = 0;
      parity ^= 1u;
    }
  }
};

// The ring's shared memory, as 32-bit shared-window addresses: the stages, and one full and one empty barrier per
// stage (8 bytes each).
struct Ring {
  uint32_t stages;
  uint32_t stageBytes;
  uint32_t full;
  uint32_t empty;
};

// The producer lane: vectors [begin, end) tile by tile into the ring, each stage refilled once every consumer warp
// has released it.
template <typename InT, bool kPrev>
__device__ __forceinline__ void produce(const char* staging, size_t srcStride, int nSrc, const float* prev,
                                        uint64_t begin, uint64_t end, uint32_t tileVec, const Ring& ring) {
  constexpr uint32_t kVecBytes = sizeof(Raw8<InT>);
  const uint32_t slice = tileVec * kVecBytes;
  RingSlot r;
  for (uint64_t v0 = begin, t = 0; v0 < end; v0 += tileVec, ++t, r.next()) {
    if (t >= kStages) {
      mbarWait(ring.empty + 8 * r.stage, r.parity ^ 1u);  // every consumer warp has read tile t - kStages from it
      fenceProxyAsync();                                  // those reads before the copies' writes into the same bytes
    }
    const uint32_t nv = static_cast<uint32_t>(end - v0 < tileVec ? end - v0 : tileVec);
    const uint32_t bytes = nv * kVecBytes;
    const uint32_t stage = ring.stages + r.stage * ring.stageBytes;
    const uint32_t bar = ring.full + 8 * r.stage;
    mbarArriveExpectTx(bar, static_cast<uint32_t>(nSrc) * bytes + (kPrev ? nv * kVec * 4u : 0u));
    for (int j = 0; j < nSrc; ++j) bulkLoad(stage + j * slice, staging + j * srcStride + v0 * kVecBytes, bytes, bar);
    if (kPrev) bulkLoad(stage + nSrc * slice, prev + v0 * kVec, nv * kVec * 4u, bar);
  }
}

// A consumer thread (of warps 0 .. kConsumerWarps - 1): vector v0 + i of each tile for i = threadIdx.x, + 512, ...,
// folded, then stored with 16-byte stores; each warp releases a stage once all its lanes have read it.
template <typename InT, typename OutT, bool kPrev, int kOp>
__device__ __forceinline__ void consume(int nSrc, OutT* out, const Op& op, uint64_t begin, uint64_t end,
                                        uint32_t tileVec, const Ring& ring) {
  constexpr uint32_t kVecBytes = sizeof(Raw8<InT>);
  const uint32_t slice = tileVec * kVecBytes;
  RingSlot r;
  for (uint64_t v0 = begin; v0 < end; v0 += tileVec, r.next()) {
    mbarWait(ring.full + 8 * r.stage, r.parity);  // the tile has landed
    const uint32_t nv = static_cast<uint32_t>(end - v0 < tileVec ? end - v0 : tileVec);
    const uint32_t stage = ring.stages + r.stage * ring.stageBytes;
    for (uint32_t i = threadIdx.x; i < nv; i += kConsumers) {
      float acc[kVec];
      foldStage<InT, kOp>(stage + i * kVecBytes, slice, nSrc, op, acc);
      if (kPrev) {
        Raw8<float> p;
        loadStage(stage + nSrc * slice + i * kVec * 4u, p);
        float pv[kVec];
        widen8(p, pv);
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] = __fadd_rn(pv[k], acc[k]);
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] = postK<kOp>(acc[k], op);
      store8(out + (v0 + i) * kVec, acc);
    }
    __syncwarp();  // every lane's reads of the stage before lane 0 releases it
    if (threadIdx.x % 32 == 0) mbarArrive(ring.empty + 8 * r.stage);
  }
}

// Vectors [unitBase + blockIdx.x * perCta, + perCta) ∩ [0, nVec), tileVec at a time through the ring (the header
// comment). Warps 0-15 consume, warp 16's lane 0 produces. kPrev: acc = prev + fold; prev comes through the ring
// too, so out may alias prev (each element's prev has landed in the stage before the same thread writes it).
template <typename InT, typename OutT, bool kPrev, int kOp>
__global__ void __launch_bounds__(kStagedThreads, 1)
    reduceStagedKernel(const char* __restrict__ staging, size_t srcStride, int nSrc, uint64_t nVec, const float* prev,
                       OutT* out, Op op, uint64_t unitBase, uint64_t perCta, uint32_t tileVec) {
  extern __shared__ __align__(128) unsigned char stages[];
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ __align__(8) uint64_t empty[kStages];
  const uint64_t begin = unitBase + static_cast<uint64_t>(blockIdx.x) * perCta;
  if (begin >= nVec) return;  // the whole CTA, before any barrier
  const uint64_t end = begin + perCta < nVec ? begin + perCta : nVec;
  const Ring ring{smemAddr(stages), stageBytesFor(nSrc, sizeof(Raw8<InT>), tileVec, kPrev), smemAddr(full),
                  smemAddr(empty)};
  const bool producer = threadIdx.x == kConsumers;
  if (producer) {
    for (int s = 0; s < kStages; ++s) {
      mbarInit(ring.full + 8 * s, 1);
      mbarInit(ring.empty + 8 * s, kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
    fenceProxyAsync();  // the initialised barriers, before the bulk copies complete on them
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them; no block-wide barrier after this
  if (producer) {
    produce<InT, kPrev>(staging, srcStride, nSrc, prev, begin, end, tileVec, ring);
  } else if (threadIdx.x < kConsumers) {
    consume<InT, OutT, kPrev, kOp>(nSrc, out, op, begin, end, tileVec, ring);
  }
}

template <typename InT, typename OutT, bool kPrev>
decltype(&reduceStagedKernel<InT, OutT, kPrev, kOpSum>) stagedKernelFor(const Op& op) {
  if (op.premul) return reduceStagedKernel<InT, OutT, kPrev, kOpPremul>;
  if (op.avg) return reduceStagedKernel<InT, OutT, kPrev, kOpAvg>;
  return reduceStagedKernel<InT, OutT, kPrev, kOpSum>;
}

template <typename InT, typename OutT, bool kPrev>
struct StagedLaunch {
  static tideResult_t run(const ReduceArgs& a, const ReduceShape& sh, cudaStream_t stream) {
    const Op op{a.op == tidePremulSum, a.op == tideAvg, a.scale, a.divisor};
    const auto kernel = stagedKernelFor<InT, OutT, kPrev>(op);
    const uint32_t smem = kStages * stageBytesFor(a.nSrc, sizeof(Raw8<InT>), sh.tileVectors, kPrev);
    const char* s = static_cast<const char*>(a.staging);
    OutT* out = static_cast<OutT*>(a.out);
    const uint64_t nVec = a.n / kVec;
    for (int l = 0; l < sh.launches; ++l) {
      const uint64_t base = static_cast<uint64_t>(l) * static_cast<uint64_t>(sh.ctas) * sh.perCta;
      kernel<<<sh.ctas, kStagedThreads, smem, stream>>>(s, a.srcStride, a.nSrc, nVec, a.prev, out, op, base,
                                                        sh.perCta, sh.tileVectors);
      TIDE_CUDA_CHECK(cudaGetLastError());
    }
    return tideSuccess;
  }
};

template <typename InT, typename OutT>
struct PreloadStaged {
  static tideResult_t run() {
    cudaFuncAttributes attr;
    for (const Op& op : {Op{false, false, 1.0f, 1.0f}, Op{true, false, 1.0f, 1.0f}, Op{false, true, 1.0f, 1.0f}}) {
      for (const auto kernel : {stagedKernelFor<InT, OutT, false>(op), stagedKernelFor<InT, OutT, true>(op)}) {
        TIDE_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
        TIDE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(kRingBytes)));
      }
    }
    return tideSuccess;
  }
};

}  // namespace

uint32_t stagedTileVectors(const ReduceArgs& a) {
  if (a.nSrc < 1) return 0;
  const uint64_t vecBytes = kVec * (a.inType == tideFloat32 ? 4u : 2u);
  const uint64_t perVector = static_cast<uint64_t>(a.nSrc) * vecBytes + (a.prev != nullptr ? kVec * 4u : 0u);
  const uint64_t fit = kStageBytes / perVector;
  if (fit >= static_cast<uint64_t>(kConsumers)) return static_cast<uint32_t>(fit / kConsumers * kConsumers);
  return fit >= kMinTileVectors ? static_cast<uint32_t>(fit / kMinTileVectors * kMinTileVectors) : 0;
}

tideResult_t launchStaged(const ReduceArgs& a, const ReduceShape& sh, cudaStream_t stream) {
  return launchForTypes<StagedLaunch>(a, sh, stream);
}

tideResult_t preloadStagedKernels() { return forEveryTypePair<PreloadStaged>(); }

}  // namespace cuda
}  // namespace tide
