// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Element sizes and exact fp32 <-> bf16/fp16 conversions (bit manipulation, no hardware half types, so the host
// result does not depend on the compiler or the CPU).
#include "dtype.h"

#include <cstring>

namespace tide {
namespace dtype {
namespace {

inline uint32_t floatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

inline float bitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

bool valid(tideDataType_t type) {
  return static_cast<int>(type) >= 0 && static_cast<int>(type) < static_cast<int>(tideNumDataTypes);
}

size_t size(tideDataType_t type) {
  switch (type) {
    case tideBfloat16:
    case tideFloat16:
      return 2;
    case tideFloat32:
    case tideInt32:
      return 4;
    case tideFloat8e4m3:
    case tideFloat8e5m2:
    case tideInt8:
      return 1;
    case tideNumDataTypes:
      break;
  }
  return 0;
}

const char* name(tideDataType_t type) {
  switch (type) {
    case tideBfloat16:
      return "bf16";
    case tideFloat16:
      return "fp16";
    case tideFloat32:
      return "fp32";
    case tideFloat8e4m3:
      return "fp8e4m3";
    case tideFloat8e5m2:
      return "fp8e5m2";
    case tideInt8:
      return "int8";
    case tideInt32:
      return "int32";
    case tideNumDataTypes:
      break;
  }
  return "unknown";
}

bool reducible(tideDataType_t type) { return type == tideBfloat16 || type == tideFloat16 || type == tideFloat32; }

float bf16ToFloat(uint16_t bits) { return bitsFloat(static_cast<uint32_t>(bits) << 16); }

uint16_t floatToBf16(float value) {
  uint32_t x = floatBits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return kCanonicalNanBf16;  // every NaN: the one canonical NaN (tide.h)
  // Round to nearest, ties to even; a carry into the exponent correctly produces the next binade or Inf.
  uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // Inf or NaN (payload kept, so NaN stays NaN)
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;  // signed zero
    } else {
      // Subnormal: normalize. Value = mant * 2^-24.
      uint32_t e = 113;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
      }
      bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  return bitsFloat(bits);
}

uint16_t floatToHalf(float value) {
  uint32_t x = floatBits(value);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return kCanonicalNanFp16;  // every NaN: the one canonical NaN (tide.h)
  // 65520 (0x477ff000) is the midpoint between the largest half 65504 and 2^16; it ties to the even side: Inf.
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (x < 0x38800000u) {
    // Result is subnormal (or zero): the half value is round(|value| * 2^24) units of 2^-24.
    if (x <= 0x33000000u) return sign;  // <= 2^-25: rounds to zero (2^-25 itself ties to even zero)
    uint32_t exp = x >> 23;
    uint32_t mant = (x & 0x7fffffu) | 0x800000u;  // |value| = mant * 2^(exp - 150)
    uint32_t shift = 126 - exp;                   // 14 .. 24
    uint32_t r = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // r == 0x400 is the smallest normal: still correct
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = (x - 0x38000000u) >> 13;  // rebias the exponent (127 -> 15) and drop 13 mantissa bits
  uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

void toFloat(const void* src, tideDataType_t type, uint64_t n, float* dst) {
  if (type == tideFloat32) {
    memcpy(dst, src, n * sizeof(float));
  } else if (type == tideBfloat16 || type == tideFloat16) {
    const unsigned char* s = static_cast<const unsigned char*>(src);
    const bool bf = type == tideBfloat16;
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t h;
      memcpy(&h, s + 2 * i, sizeof(h));
      dst[i] = bf ? bf16ToFloat(h) : halfToFloat(h);
    }
  }
}

void fromFloat(const float* src, uint64_t n, tideDataType_t type, void* dst) {
  if (type == tideFloat32) {
    // Which NaN an fp32 add returns depends on the instruction (SSE, AVX, x87) and on operand order, so the result
    // is canonicalized: every NaN becomes kCanonicalNanF32 (tide.h "NaN results"). Stores through memcpy.
    unsigned char* d = static_cast<unsigned char*>(dst);
    for (uint64_t i = 0; i < n; ++i) {
      uint32_t u = floatBits(src[i]);
      if ((u & 0x7fffffffu) > 0x7f800000u) u = kCanonicalNanF32;
      memcpy(d + i * sizeof(u), &u, sizeof(u));
    }
  } else if (type == tideBfloat16 || type == tideFloat16) {
    unsigned char* d = static_cast<unsigned char*>(dst);
    const bool bf = type == tideBfloat16;
    for (uint64_t i = 0; i < n; ++i) {
      const uint16_t h = bf ? floatToBf16(src[i]) : floatToHalf(src[i]);
      memcpy(d + 2 * i, &h, sizeof(h));
    }
  }
}

}  // namespace dtype
}  // namespace tide
