// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Thread-local last-error message and the static result strings.
#include "errors.h"

#include <cstdio>

#include "log.h"

namespace tide {
namespace {

// A fixed buffer (not std::string) so that recording an error can never allocate or throw, even when the error
// being recorded is an allocation failure.
constexpr size_t kMessageBytes = 1024;
thread_local char tlsMessage[kMessageBytes] = {0};

}  // namespace

tideResult_t failV(tideResult_t code, const char* component, const char* fmt, va_list ap) {
  va_list copy;
  va_copy(copy, ap);
  vsnprintf(tlsMessage, kMessageBytes, fmt, copy);
  va_end(copy);
  TIDE_WARN_RETURNED(component, "%s (%s)", tlsMessage, resultString(code));
  return code;
}

tideResult_t fail(tideResult_t code, const char* component, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tideResult_t result = failV(code, component, fmt, ap);
  va_end(ap);
  return result;
}

void clearLastError() { tlsMessage[0] = '\0'; }

const char* lastError() { return tlsMessage; }

const char* resultString(tideResult_t result) {
  switch (result) {
    case tideSuccess:
      return "tideSuccess: no error";
    case tideInvalidArgument:
      return "tideInvalidArgument: invalid argument";
    case tideInvalidUsage:
      return "tideInvalidUsage: call not allowed in the current state";
    case tideUnsupported:
      return "tideUnsupported: not supported by this build or runtime";
    case tideOutOfMemory:
      return "tideOutOfMemory: out of memory";
    case tideCudaError:
      return "tideCudaError: CUDA call failed";
    case tideNcclError:
      return "tideNcclError: NCCL call failed";
    case tideSystemError:
      return "tideSystemError: system call failed";
    case tideMismatch:
      return "tideMismatch: ranks disagree on layout or configuration";
    case tideTimeout:
      return "tideTimeout: wait timed out";
    case tideInternalError:
      return "tideInternalError: internal error (please report)";
    case tideNumResults:
      break;
  }
  return "tideUnknownResult: unknown result code";
}

}  // namespace tide
