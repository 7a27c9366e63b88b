// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Host reduce-scatter in the contract's accumulation order (include/tide.h, top):
//   x_s = (float) grad(rank s)[j] (0 beyond numel), times scale for PREMUL_SUM;
//   partial(node m) = left fold over the node's ranks; total = left fold over nodes; AVG divides by W last.
// Every fp32 operation is individually rounded: this file is compiled with -ffp-contract=off (no FMA), and the folds
// start from the first operand (not from 0.0f, which would turn -0.0f into +0.0f).
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "dtype.h"
#include "errors.h"
#include "host_executor.h"
#include "memory_ranges.h"

namespace tide {
namespace {

constexpr const char* kComponent = "HostRS";
constexpr uint64_t kOutputBit = 1ull << 63;

// The contract is IEEE fp32: subnormals kept, round to nearest even. The calling thread's mode may say otherwise
// (torch.set_flush_denormal(True), code built with -ffast-math), and the vector unit's control register applies it
// to every operation here; so the call runs in the default mode and gives the caller's back, exception flags
// included. On other architectures the default mode is assumed.
class IeeeFloatMode {
 public:
#if defined(__x86_64__) || defined(__i386__)
  // MXCSR: flush-to-zero (bit 15), denormals-are-zero (bit 6), rounding control (bits 13-14), exception masks
  // (bits 7-12; all masked, so a NaN input never traps).
  IeeeFloatMode() : saved_(_mm_getcsr()) { _mm_setcsr(kDefault); }
  ~IeeeFloatMode() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kDefault = 0x1f80;
  unsigned saved_;
#elif defined(__aarch64__)
  // FPCR: flush-to-zero (bit 24), half-precision flush-to-zero (bit 19), rounding mode (bits 22-23), trap enables
  // (bits 8-15): all cleared.
  IeeeFloatMode() : saved_(get()) { set(saved_ & ~kModeBits); }
  ~IeeeFloatMode() { set(saved_); }

 private:
  static constexpr uint64_t kModeBits = (1ull << 24) | (1ull << 19) | (3ull << 22) | (0xffull << 8);
  static uint64_t get() {
    uint64_t v;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(v));
    return v;
  }
  static void set(uint64_t v) { __asm__ __volatile__("msr fpcr, %0" : : "r"(v)); }
  uint64_t saved_;
#endif
};

tideResult_t validate(const Layout& l, const void* const* grads, void* const* outs, tideDataType_t outType,
                      tideRedOp_t op, float scale) {
  if (grads == nullptr) return fail(tideInvalidArgument, kComponent, "grads table is NULL");
  if (outs == nullptr) return fail(tideInvalidArgument, kComponent, "outs table is NULL");
  if (static_cast<int>(op) < 0 || static_cast<int>(op) >= static_cast<int>(tideNumRedOps)) {
    return fail(tideInvalidArgument, kComponent, "op is %d; use tideSum, tideAvg or tidePremulSum",
                static_cast<int>(op));
  }
  if (!dtype::valid(outType) || !dtype::reducible(outType)) {
    return fail(tideInvalidArgument, kComponent, "outType is %d (%s); use tideFloat32, tideBfloat16 or tideFloat16",
                static_cast<int>(outType), dtype::name(outType));
  }
  if (!std::isfinite(scale)) return fail(tideInvalidArgument, kComponent, "scale is not finite");
  for (int i = 0; i < l.nParams; ++i) {
    if (!dtype::reducible(l.params[i].dtype)) {
      return fail(tideInvalidArgument, kComponent, "parameter %d has dtype %s; reduce-scatter takes bf16, fp16 or fp32",
                  i, dtype::name(l.params[i].dtype));
    }
  }
  const size_t n = static_cast<size_t>(l.worldSize) * l.nParams;
  std::vector<MemoryRange> ranges;
  ranges.reserve(n + static_cast<size_t>(l.worldSize));
  for (size_t idx = 0; idx < n; ++idx) {
    if (grads[idx] == nullptr) {
      return fail(tideInvalidArgument, kComponent, "grads[%zu] (rank %zu, parameter %zu) is NULL", idx,
                  idx / l.nParams, idx % l.nParams);
    }
    const ParamLayout& p = l.params[idx % l.nParams];
    uintptr_t a = reinterpret_cast<uintptr_t>(grads[idx]), e = 0;
    if (a % p.elemSize != 0) {
      return fail(tideInvalidArgument, kComponent,
                  "grads[%zu] (rank %zu, parameter %zu) = %p is not aligned to its element size (%zu bytes, %s)", idx,
                  idx / l.nParams, idx % l.nParams, grads[idx], p.elemSize, dtype::name(p.dtype));
    }
    if (__builtin_add_overflow(a, p.numel * p.elemSize, &e)) {
      return fail(tideInvalidArgument, kComponent, "grads[%zu] wraps around the address space", idx);
    }
    const int r = static_cast<int>(idx / l.nParams);
    if (isInPlaceReduceScatter(l.nParams, p.numel, p.rowNumel, p.shardNumel, p.elemSize, outType == p.dtype,
                               l.worldSize, r, grads[idx], outs[r])) {
      // In place: rank r's own block is its output, so only the rest of its gradient counts as input here. Block r of
      // any gradient feeds output r alone, and output r is written after all of its inputs are read (below), so the
      // writes never reach a byte still to be read; every other overlap with the block is still refused.
      const uintptr_t o = reinterpret_cast<uintptr_t>(outs[r]), oe = o + p.shardNumel * p.elemSize;
      ranges.push_back({a, o, false, idx});
      ranges.push_back({oe, e, false, idx});
      continue;
    }
    ranges.push_back({a, e, false, idx});
  }
  const uint64_t outBytes = l.rsOutNumel * dtype::size(outType);
  for (int r = 0; r < l.worldSize; ++r) {
    if (outs[r] == nullptr) return fail(tideInvalidArgument, kComponent, "outs[%d] is NULL", r);
    uintptr_t a = reinterpret_cast<uintptr_t>(outs[r]), e = 0;
    if (a % dtype::size(outType) != 0) {
      return fail(tideInvalidArgument, kComponent, "outs[%d] = %p is not aligned to its element size (%zu bytes, %s)",
                  r, outs[r], dtype::size(outType), dtype::name(outType));
    }
    if (__builtin_add_overflow(a, outBytes, &e)) {
      return fail(tideInvalidArgument, kComponent, "outs[%d] wraps around the address space", r);
    }
    ranges.push_back({a, e, true, kOutputBit | static_cast<uint64_t>(r)});
  }
  uint64_t x = 0, y = 0;
  if (findOverlap(&ranges, &x, &y)) {
    return fail(tideInvalidArgument, kComponent,
                "overlapping buffers: %s[%" PRIu64 "] and %s[%" PRIu64 "] (outputs may not overlap each other or "
                "any gradient)", (x & kOutputBit) ? "outs" : "grads", x & ~kOutputBit,
                (y & kOutputBit) ? "outs" : "grads", y & ~kOutputBit);
  }
  return tideSuccess;
}

// x[0 .. count) = contribution of rank s to output elements [j0, j0 + count) of parameter p (zeros past numel).
void loadContribution(const ParamLayout& p, const void* grad, uint64_t j0, uint64_t count, tideRedOp_t op,
                      float scale, float* x) {
  uint64_t valid = j0 >= p.numel ? 0 : (p.numel - j0 < count ? p.numel - j0 : count);
  if (valid > 0) dtype::toFloat(static_cast<const unsigned char*>(grad) + j0 * p.elemSize, p.dtype, valid, x);
  for (uint64_t k = valid; k < count; ++k) x[k] = 0.0f;
  if (op == tidePremulSum) {
    for (uint64_t k = 0; k < count; ++k) x[k] = x[k] * scale;
  }
}

}  // namespace

tideResult_t hostReduceScatter(const Layout& l, const void* const* grads, void* const* outs, tideDataType_t outType,
                               tideRedOp_t op, float scale) {
  TIDE_CHECK(validate(l, grads, outs, outType, op, scale));
  const IeeeFloatMode ieee;
  const int R = l.ranksPerNode, N = l.nNodes, W = l.worldSize;
  const size_t outElem = dtype::size(outType);
  uint64_t maxShard = 0;
  for (const ParamLayout& p : l.params) maxShard = p.shardNumel > maxShard ? p.shardNumel : maxShard;
  std::vector<float> x(maxShard), partial(maxShard), total(maxShard);
  const float divisor = static_cast<float>(W);
  for (int r = 0; r < W; ++r) {
    for (int i = 0; i < l.nParams; ++i) {
      const ParamLayout& p = l.params[i];
      const uint64_t count = p.shardNumel, j0 = static_cast<uint64_t>(r) * p.shardNumel;
      for (int m = 0; m < N; ++m) {
        for (int q = 0; q < R; ++q) {
          const int s = m * R + q;
          const void* grad = grads[static_cast<size_t>(s) * l.nParams + i];
          float* dst = q == 0 ? partial.data() : x.data();
          loadContribution(p, grad, j0, count, op, scale, dst);
          if (q > 0) {
            for (uint64_t k = 0; k < count; ++k) partial[k] = partial[k] + x[k];
          }
        }
        if (m == 0) {
          memcpy(total.data(), partial.data(), count * sizeof(float));
        } else {
          for (uint64_t k = 0; k < count; ++k) total[k] = total[k] + partial[k];
        }
      }
      if (op == tideAvg) {
        for (uint64_t k = 0; k < count; ++k) total[k] = total[k] / divisor;
      }
      dtype::fromFloat(total.data(), count, outType, static_cast<unsigned char*>(outs[r]) + p.rsOutOffset * outElem);
    }
  }
  return tideSuccess;
}

}  // namespace tide
