// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Phase 2 of TIDE-RS: the short-lived reduce kernel over one staged chunk.
#ifndef TIDE_CUDA_REDUCE_KERNEL_H_
#define TIDE_CUDA_REDUCE_KERNEL_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tide.h"

namespace tide {
namespace cuda {

struct ReduceArgs {
  const void* staging;    // nSrc inputs of n elements of inType, input s at staging + s * srcStride bytes
  size_t srcStride;       // bytes
  int nSrc;               // node-local ranks, folded left to right in this order
  uint64_t n;             // elements
  void* out;              // n elements of outType
  tideDataType_t inType;  // bf16, fp16, fp32
  tideDataType_t outType; // bf16, fp16, fp32
  tideRedOp_t op;
  float scale;            // PREMUL_SUM
  float divisor;          // AVG: world size
  // Multi-node: the running fp32 sum of the earlier nodes (n elements), or nullptr. With it, out[k] =
  // post(prev[k] + fold) (the node order of include/tide.h: total = total + partial(node)). out may be prev itself
  // (in place, outType fp32): each element is read and written by the same thread.
  const float* prev = nullptr;
  // The reduce's deadline, as the bytes that reach this GPU over links while it runs (the next chunk's inputs: the
  // pipeline stalls if this reduce is still running when they have all arrived). -1: not known, this reduce's own
  // incoming bytes stand in (chunks of equal size); 0: nothing arrives after it (the collective's last reduce: a
  // drain on the critical path, given kReduceMaxPacedCtas).
  int64_t followingBytes = -1;
};

// Bytes of a reduce of n elements of nSrc inputs of inType (and prev) that arrive over links: every input but the
// rank's own, and prev; a reduce with neither (one input, no prev: a final narrowing, a one-rank node's fold)
// counts its input as arriving (in a world of one rank nothing arrives, which reduceMaxCtas checks first).
uint64_t reduceArrivingBytes(int nSrc, uint64_t n, tideDataType_t inType, bool prev);

// How one reduce is launched: `launches` kernels in a row on the stream, each of `ctas` CTAs of `threads` threads;
// CTA b of launch l handles the contiguous units [(l * ctas + b) * perCta, ... + perCta) (units: 8-element vectors
// on the 16-byte path, elements otherwise), so every CTA does a bounded amount of work and exits.
struct ReduceShape {
  int ctas = 1;
  int launches = 1;
  int threads = 0;
  uint64_t perCta = 0;   // units per CTA
  bool vector = false;   // 16-byte path (every base 16-byte aligned)
  bool staged = false;   // the 16-byte path runs the staged kernel (ReduceKernel::kStaged)
  uint32_t tileVectors = 0;  // staged: 8-element vectors of every source per shared-memory stage
  uint64_t bytes = 0;    // HBM traffic of the whole reduce: inputs read + prev read + output written
};

// The kernels of the 16-byte path, bit for bit alike (one fold: reduce_fold.cuh).
//   kLoads:  each thread holds its sources' 16-byte loads in registers, then folds (reduceVecKernel in
//            reduce_kernel.cu): the reference path.
//   kStaged: a producer warp brings tiles of every source into a ring of shared-memory stages by TMA bulk copies
//            while 16 consumer warps fold the tile that has landed (reduce_staged.cu). Where a stage cannot hold 32
//            vectors of every source (and prev), kLoads runs instead.
// Not a user setting: the executors launch kReduceDefaultKernel; the benchmark library (benchmarks/native) picks
// either, so that both are measured side by side (benchmarks/reduce_sweep.py).
enum class ReduceKernel { kLoads, kStaged };

// The grid rule (docs/architecture.md, "Reduce kernel shape"). Traffic T = n * (nSrc * inSize + outSize (+ 4 with
// prev)); incoming I = n * ((nSrc - 1) * inSize (+ 4 with prev)).
//   unpaced (I = 0 and a single-rank world): maxCtas = smCount
//   drain (followingBytes == 0: nothing arrives after it): maxCtas = min(kReduceMaxPacedCtas, smCount)
//   paced (otherwise; F = followingBytes if > 0, else I, where I = 0 counts every input as incoming):
//                   rate = kReducePaceHeadroom * linkGBps * T / F;
//                   maxCtas = min(clamp(ceil(rate / ctaGBps), 1, kReduceMaxPacedCtas), smCount)
//                   (ctaGBps: ReducePace, kReduceCtaGBps unless a benchmark sets it)
// then ctas = min(maxCtas, ceil(T / min(ctaBytes, kReduceCtaMinBytes))); launches = min(ceil(T / (ctas * ctaBytes)),
// kReduceMaxLaunches);
// units are split evenly over ctas * launches CTAs. So at most maxCtas SMs are held at a time, and a CTA moves from
// about kReduceCtaMinBytes to about ctaBytes (more only for chunks above maxCtas * kReduceMaxLaunches * ctaBytes of
// traffic) and exits. An explicit
// maxCtas > 0 replaces the paced/unpaced choice (benchmarks, tests). Example: W = 8 bf16 inputs -> fp32 at 370
// GB/s: T/I = 20/14, 529 GB/s to keep pace, 634 GB/s with the headroom, 10 CTAs. Bit-exactness does not depend on
// the shape: each element is folded by one thread in the fixed order.
// The rate one CTA of the kernel that runs (kReduceDefaultKernel) sustains beside the arrivals it keeps pace with.
// The register kernel's (512 threads), in one rank's share
// (benchmarks/share, whose timeline times every chunk's reduce) on an H100, bf16 x 8 -> fp32,
// full 32 MiB-output chunks in 3 launches: 66.7-68.5 GB/s per CTA at 8 CTAs, 64.5-67.0 at 10 (each run's median
// over its full chunks; single chunks 63.2-69.3), while the paced incoming copies ran. Alone (sm_bandwidth) one CTA moves far more, 94.2 GB/s at 8 CTAs on the H200 and
// 85.6 at 3 launches on the H100; sized by that figure (an earlier value of this constant) the rule
// gave 8 CTAs, whose reduce of a chunk took as long as the next chunk's arrival (305-320 us against 310), so the
// pipeline ran at the reduce's pace: the 70B share took 1.056-1.068x the link floor, 1.023-1.025 with 10 CTAs,
// the GEMM beside it unchanged (1.035-1.039 against 1.038-1.040; 8B 1.097-1.101 against 1.077-1.083).
constexpr double kReduceCtaGBps = 66.0;
// The executors' kernel; kReduceCtaGBps is its rate, so the two change together. benchmarks/reduce_sweep.py
// measures both kernels' rate per CTA alone and beside the arrivals (8 bf16 inputs at 370 GB/s: each grid's median
// over its full chunks), and one rank's share with the staged kernel on the grid that its measured rate gives: the
// staged kernel becomes the default with kReduceCtaGBps set to that rate beside the arrivals.
constexpr ReduceKernel kReduceDefaultKernel = ReduceKernel::kLoads;
// The reduce of chunk k must end before chunk k+1 has arrived, or it becomes the pipeline's bottleneck; and the
// last chunk's reduce is a drain after the last byte arrived. Exactly the arrival rate left one rank's share at
// 1.49x the link floor. A fifth more (1.25 was right while kReduceCtaGBps was the rate of a CTA alone): 10 CTAs for 8 inputs, which measured 653 GB/s beside the arrivals, 1.23x the 529 they bring.
constexpr double kReducePaceHeadroom = 1.2;
constexpr int kReduceMaxPacedCtas = 32;
// Bytes of traffic per CTA: 8 MiB. Each launch boundary costs the grid's tail and a launch
// gap: on an H100 the rule's 8-CTA grid of a 32 MiB-output chunk moved 71.6 GB/s per CTA in 11 launches of 2 MiB
// CTAs, 85.6 in 3 launches of 8 MiB, 95.5 in one (sm_bandwidth). At 8 MiB that chunk's CTAs live about
// 90 us each: still short beside a GEMM's waves, and every SM is free again between launches. In one rank's share
// (same machine) 8 MiB CTAs slowed the single-wave GEMM less than 2 MiB ones (8B 1.042 vs 1.057, 70B 1.030
// vs 1.041) and took the 70B RS from 1.17x to 1.08x the link floor (8B unchanged, 1.19x).
constexpr uint64_t kReduceCtaBytes = 8ull << 20;
// The least a CTA is given before the grid shrinks below maxCtas. Sizing the grid as ceil(T / ctaBytes) alone,
// at 8 MiB a chunk of under maxCtas x 8 MiB of traffic ran on fewer CTAs than its pace asks for (a 32 MiB
// paced chunk on 4 of 8; the drain below 32) and a world of one rank's casts on a fraction of the SMs: the FSDP2
// step at world size 1 went from stock's 145 ms to 158 (H100). One MiB is about 11 us of one CTA's
// work: still long beside a launch gap.
constexpr uint64_t kReduceCtaMinBytes = 1ull << 20;
constexpr int kReduceMaxLaunches = 16;  // bounds the launches queued per chunk (the stream may be blocked on flags)
// How fast the reduce must go (the grid rule's input). The node-local inputs other than this rank's own, and prev,
// arrive over links at linkGBps; the reduce only has to keep pace with them, so it is sized to that rate and no
// faster (fewer SMs taken from concurrent compute). Only in a world of one rank does nothing arrive: every input is
// already present and nothing paces the reduce, which then runs on the whole GPU (smCount CTAs). In a larger world
// a reduce of one input and no prev (the final narrowing of a sum that came over the link, the first node's fold
// with one rank per node) counts its input as arriving.
struct ReducePace {
  double linkGBps = 370.0;  // NCCL_TIDE_LINK_GBPS
  int smCount = 132;        // the device's SMs
  bool singleRank = false;  // a world of one rank (tideBench's reduces: true)
  // What one CTA of the kernel that runs sustains beside the arrivals (the executors: kReduceCtaGBps; the benchmark
  // library sets other rates to measure the grids they give).
  double ctaGBps = kReduceCtaGBps;
};

// The rule's CTA cap for args.
int reduceMaxCtas(const ReduceArgs& args, const ReducePace& pace);
ReduceShape reduceShape(const ReduceArgs& args, int maxCtas, uint64_t ctaBytes, const ReducePace& pace,
                        ReduceKernel kernel = kReduceDefaultKernel);

// Enqueues the kernels on stream. out[k] = fold over s of x_s[k] in the order of include/tide.h (plus prev[k]).
// maxCtas / ctaBytes: 0 keeps the rule's; maxCtas, ctaBytes and kernel are set by benchmarks and tests only.
tideResult_t launchReduce(const ReduceArgs& args, cudaStream_t stream, const ReducePace& pace, int maxCtas = 0,
                          uint64_t ctaBytes = 0, ReduceKernel kernel = kReduceDefaultKernel);

// The pace of a rank on `device`: NCCL_TIDE_LINK_GBPS (an invalid value is an error, as for every parameter that
// changes behaviour), the device's SM count (device < 0: no device, ReducePace's default) and whether its world
// has one rank. Queried once per comm (commInit), not per call.
tideResult_t devicePace(int device, bool singleRank, ReducePace* out);

// Loads every reduce kernel into the current device's context now. Required before the first RS: under lazy
// module loading (CUDA_MODULE_LOADING=LAZY, which PyTorch sets) the first launch of a kernel loads it, and loading
// waits for the device's work in flight, which includes this rank's flag waits for work that other (virtual)
// ranks have not issued yet: the host thread would wait forever.
tideResult_t preloadReduceKernels();

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_REDUCE_KERNEL_H_
