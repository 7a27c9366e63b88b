// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Element types: sizes, names, and exact conversions between bf16/fp16 and fp32.
//
// The conversions define the arithmetic every executor must reproduce bit for bit: widening is exact; narrowing
// rounds to nearest, ties to even; every NaN becomes the canonical quiet NaN of the target type (sign and payload
// dropped: include/tide.h "NaN results"); overflow goes to infinity.
#ifndef TIDE_CORE_DTYPE_H_
#define TIDE_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "tide.h"

namespace tide {
namespace dtype {

// The NaN every executor writes for a NaN result (include/tide.h TIDE_CANONICAL_NAN_*).
constexpr uint32_t kCanonicalNanF32 = TIDE_CANONICAL_NAN_F32;
constexpr uint16_t kCanonicalNanBf16 = TIDE_CANONICAL_NAN_BF16;
constexpr uint16_t kCanonicalNanFp16 = TIDE_CANONICAL_NAN_FP16;

bool valid(tideDataType_t type);        // a known tideDataType_t value
size_t size(tideDataType_t type);       // bytes per element; 0 for an unknown type
const char* name(tideDataType_t type);  // "bf16", "fp16", "fp32", "fp8e4m3", "fp8e5m2", "int8", "int32", "unknown"
bool reducible(tideDataType_t type);    // bf16, fp16 or fp32: the types RS accepts as input or output

float bf16ToFloat(uint16_t bits);
uint16_t floatToBf16(float value);
float halfToFloat(uint16_t bits);
uint16_t floatToHalf(float value);

// Widens n elements of a reducible type to fp32 (exact).
void toFloat(const void* src, tideDataType_t type, uint64_t n, float* dst);
// Narrows (or copies) n fp32 values into a reducible type (round to nearest even, NaN canonicalized). Loads and
// stores go through memcpy, so no element access is misaligned even if a caller's buffer were.
void fromFloat(const float* src, uint64_t n, tideDataType_t type, void* dst);

}  // namespace dtype
}  // namespace tide

#endif  // TIDE_CORE_DTYPE_H_
