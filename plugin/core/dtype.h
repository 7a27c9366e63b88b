// Element types: sizes, names, and exact conversions between bf16/fp16 and fp32.
//
// The conversions define the arithmetic every executor must reproduce bit for bit: widening is exact; narrowing
// rounds to nearest, ties to even; NaN stays NaN (quiet, sign kept); overflow goes to infinity.
#ifndef TIDE_CORE_DTYPE_H_
#define TIDE_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "tide.h"

namespace tide {
namespace dtype {

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
// Narrows (or copies) n fp32 values into a reducible type (round to nearest even).
void fromFloat(const float* src, uint64_t n, tideDataType_t type, void* dst);

}  // namespace dtype
}  // namespace tide

#endif  // TIDE_CORE_DTYPE_H_
