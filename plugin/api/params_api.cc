// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// C API: the NCCL_TIDE_* registry and the multicast gate.
#include "api_guard.h"
#include "errors.h"
#include "multicast.h"
#include "params.h"
#include "tide.h"

extern "C" {

TIDE_EXPORT tideResult_t tideParamCount(int* count) {
  TIDE_API_BEGIN
  if (count == nullptr) return tide::fail(tideInvalidArgument, "API", "tideParamCount: count is NULL");
  *count = tide::params::count();
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideParamDescribe(int index, const char** name, const char** type, const char** defaultValue,
                                           const char** doc, const char** value) {
  TIDE_API_BEGIN
  return tide::params::describe(index, name, type, defaultValue, doc, value);
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideMulticastAllowed(int* allowed) {
  TIDE_API_BEGIN
  return tide::multicastAllowed(allowed);
  TIDE_API_END
}

}  // extern "C"
