// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Enum values that arrive through the C API.
//
// A C caller (or ctypes) may pass any int where include/tide.h says tideDataType_t, tideRedOp_t or tideResult_t. In
// C++ an enum without a fixed underlying type only has the values of its enumerators' bit range (0..7 for
// tideDataType_t, 0..3 for tideRedOp_t), and loading an object of enum type that holds anything else is undefined
// behaviour (UBSan: "load of value 4294967295, which is not a valid value for type 'tideDataType_t'"); a compiler
// may fold a range check on such a value away. So every exported function reads enum inputs with rawEnum() (a memcpy,
// never an enum load), range-checks the int, and only then uses the value as the enum.
#ifndef TIDE_CORE_C_ENUM_H_
#define TIDE_CORE_C_ENUM_H_

#include <cstring>
#include <type_traits>

namespace tide {

template <typename E>
inline int rawEnum(const E& value) {
  static_assert(std::is_enum<E>::value && sizeof(E) == sizeof(int), "C API enums are int-sized");
  int raw;
  memcpy(&raw, &value, sizeof(raw));
  return raw;
}

// True if raw is in [0, count): a known value of an enum whose enumerators are 0 .. count-1.
inline bool enumInRange(int raw, int count) { return raw >= 0 && raw < count; }

}  // namespace tide

#endif  // TIDE_CORE_C_ENUM_H_
