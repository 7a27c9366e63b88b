// C API: result strings, last error, version, dtype sizes.
#include "api_guard.h"
#include "dtype.h"
#include "errors.h"
#include "tide.h"

extern "C" {

TIDE_EXPORT const char* tideGetErrorString(tideResult_t result) { return tide::resultString(result); }

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
  if (!tide::dtype::valid(dtype)) {
    return tide::fail(tideInvalidArgument, "API", "tideDataTypeSize: %d is not a tideDataType_t",
                      static_cast<int>(dtype));
  }
  *bytes = tide::dtype::size(dtype);
  return tideSuccess;
  TIDE_API_END
}

}  // extern "C"
