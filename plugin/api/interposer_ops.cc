// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "interposer_ops.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "../core/dtype.h"
#include "../core/fork_guard.h"

namespace tide {
namespace interposer {
namespace ops {
namespace {

struct Premul {
  int dtype = 0;
  bool host = false;
  float scale = 0.0f;  // host scalars only
};

std::mutex gMu;
// Never freed: an op may be resolved by a thread still running while the process exits.
auto* gOps = new std::map<std::pair<void*, int>, Premul>();
[[maybe_unused]] const bool gOpsForkGuarded = forkguard::guard(forkguard::kInterposerOps, &gMu);

bool reducible(int dtype) { return dtype == kNcclFloat16 || dtype == kNcclFloat32 || dtype == kNcclBfloat16; }

float widen(const void* scalar, int dtype) {
  if (dtype == kNcclFloat32) {
    float v;
    std::memcpy(&v, scalar, sizeof(v));
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, scalar, sizeof(bits));
  return dtype == kNcclBfloat16 ? dtype::bf16ToFloat(bits) : dtype::halfToFloat(bits);
}

}  // namespace

void created(void* comm, int op, const void* scalar, int dtype, int residence) {
  Premul p;
  p.dtype = dtype;
  p.host = residence == kScalarHostImmediate;
  if (p.host && scalar != nullptr && reducible(dtype)) p.scale = widen(scalar, dtype);
  std::lock_guard<std::mutex> lock(gMu);
  (*gOps)[{comm, op}] = p;
}

bool known(void* comm, int op) {
  std::lock_guard<std::mutex> lock(gMu);
  return gOps->count({comm, op}) != 0;
}

void destroyed(void* comm, int op) {
  std::lock_guard<std::mutex> lock(gMu);
  gOps->erase({comm, op});
}

void forgetComm(void* comm) {
  std::lock_guard<std::mutex> lock(gMu);
  for (auto it = gOps->lower_bound({comm, INT32_MIN}); it != gOps->end() && it->first.first == comm;) {
    it = gOps->erase(it);
  }
}

Resolved resolve(void* comm, int op, int dtype) {
  Resolved r;
  if (op == kNcclSum) {
    r.kind = Resolved::kSum;
    return r;
  }
  if (op == kNcclAvg) {
    r.kind = Resolved::kAvg;
    return r;
  }
  Premul p;
  {
    std::lock_guard<std::mutex> lock(gMu);
    auto it = gOps->find({comm, op});
    if (it == gOps->end()) {
      r.why = "an op other than sum, avg or a PREMUL_SUM created through ncclRedOpCreatePreMulSum";
      return r;
    }
    p = it->second;
  }
  if (!p.host) {
    r.why = "a PREMUL_SUM op with a device scalar (read by NCCL's kernel at run time)";
  } else if (p.dtype != dtype || !reducible(dtype)) {
    r.why = "a PREMUL_SUM op created for another datatype than the call's";
  } else if (!std::isfinite(p.scale)) {
    r.why = "a PREMUL_SUM op whose scalar is not finite";
  } else if (p.scale == 1.0f) {
    r.kind = Resolved::kSum;
  } else {
    r.kind = Resolved::kPremul;
    r.scale = p.scale;
  }
  return r;
}

float avgScale(int worldSize, int dtype) {
  const float inv = static_cast<float>(1.0 / worldSize);
  if (dtype == kNcclBfloat16) return dtype::bf16ToFloat(dtype::floatToBf16(inv));
  if (dtype == kNcclFloat16) return dtype::halfToFloat(dtype::floatToHalf(inv));
  return inv;
}

}  // namespace ops
}  // namespace interposer
}  // namespace tide
