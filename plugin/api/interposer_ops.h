// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Reduction ops of interposed reduce-scatters: the PREMUL_SUM ops the application creates with
// ncclRedOpCreatePreMulSum (a table per communicator and op) and what a call's op means for TIDE.
//
// NCCL's arithmetic, which TIDE mirrors (docs/usage.md "Reduction ops"): a host scalar is copied when the op is
// created, and each rank premultiplies its own input once; ncclAvg on floats is a premultiply by T(1/W), not a
// division at the end. Pure bookkeeping (no NCCL, no CUDA): the interposer forwards the NCCL calls and records
// their results here.
#ifndef TIDE_API_INTERPOSER_OPS_H_
#define TIDE_API_INTERPOSER_OPS_H_

namespace tide {
namespace interposer {
namespace ops {

// ncclRedOp_t and ncclDataType_t values of nccl.h (ABI-stable).
constexpr int kNcclSum = 0, kNcclAvg = 4;
constexpr int kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclBfloat16 = 9;
constexpr int kScalarHostImmediate = 1;  // ncclScalarResidence_t

// What a reduce-scatter's op is for TIDE.
struct Resolved {
  enum Kind { kSum, kPremul, kAvg, kNotTide } kind = kNotTide;
  float scale = 1.0f;        // kPremul: the host scalar, exactly (fp32, or a bf16/fp16 value widened)
  const char* why = nullptr;  // kNotTide: why the call stays with NCCL
};

// Records an op NCCL created (only after NCCL returned success). scalar: `dtype`'s bytes at the caller's pointer
// (read now, as NCCL reads a host scalar now; not read for a device scalar).
void created(void* comm, int op, const void* scalar, int dtype, int residence);

// A PREMUL_SUM op of comm that the application created and has not destroyed.
bool known(void* comm, int op);

// Forgets an op (NCCL's ncclRedOpDestroy succeeded) or every op of a communicator (finalize, destroy, abort).
void destroyed(void* comm, int op);
void forgetComm(void* comm);

// The op of a reduce-scatter of `dtype` on `comm`, as TIDE can run it. A host PREMUL_SUM scalar of exactly 1.0 is a
// sum (x * 1 = x); any other finite host scalar a premultiplied sum; ncclAvg kAvg (the caller knows W).
Resolved resolve(void* comm, int op, int dtype);

// ncclAvg's premultiplier, NCCL's T(1/W) widened to fp32: for bf16 and fp16 inputs 1/W rounded to that type first.
float avgScale(int worldSize, int dtype);

}  // namespace ops
}  // namespace interposer
}  // namespace tide

#endif  // TIDE_API_INTERPOSER_OPS_H_
