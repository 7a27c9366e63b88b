// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// C API: result strings, last error, version, dtype sizes.
#include "api_guard.h"
#include "c_enum.h"
#include "dtype.h"
#include "errors.h"
#include "tide.h"

extern "C" {

TIDE_EXPORT const char* tideGetErrorString(tideResult_t result) {
  const int raw = tide::rawEnum(result);  // any int may come in (plugin/core/c_enum.h)
  if (!tide::enumInRange(raw, tideNumResults)) return tide::resultString(tideNumResults);  // "unknown result code"
  return tide::resultString(static_cast<tideResult_t>(raw));
}

TIDE_EXPORT const char* tideGetLastError(void) { return tide::lastError(); }

TIDE_EXPORT tideResult_t tideGetVersion(int* version) {
  TIDE_API_BEGIN
  if (version == nullptr) return tide::fail(tideInvalidArgument, "API", "tideGetVersion: version is NULL");
  *version = TIDE_VERSION_CODE;
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideDataTypeSize(tideDataType_t dtype, size_t* bytes) {
  TIDE_API_BEGIN
  if (bytes == nullptr) return tide::fail(tideInvalidArgument, "API", "tideDataTypeSize: bytes is NULL");
  const int raw = tide::rawEnum(dtype);
  if (!tide::enumInRange(raw, tideNumDataTypes)) {
    return tide::fail(tideInvalidArgument, "API", "tideDataTypeSize: %d is not a tideDataType_t", raw);
  }
  *bytes = tide::dtype::size(static_cast<tideDataType_t>(raw));
  return tideSuccess;
  TIDE_API_END
}

}  // extern "C"
