// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Error reporting shared by every layer: one thread-local "last error" message per thread, set by the root cause.
//
// The rule: the function that detects a problem calls fail(), which records the message, logs exactly one WARN line
// for <component> (printed from NCCL_DEBUG=WARN up: the caller gets the message through the return code and
// tideGetLastError; log.h), and returns the code. Callers higher up propagate the code with TIDE_CHECK and add
// nothing, so each failure produces one log line with the useful context.
#ifndef TIDE_CORE_ERRORS_H_
#define TIDE_CORE_ERRORS_H_

#include <cstdarg>

#include "tide.h"

namespace tide {

// Records the formatted message as this thread's last error, logs it at WARN (TIDE_WARN_RETURNED), returns code.
// Never allocates and never throws (the message lives in a fixed thread-local buffer; long messages are cut).
tideResult_t fail(tideResult_t code, const char* component, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
tideResult_t failV(tideResult_t code, const char* component, const char* fmt, va_list ap);

// Forgets this thread's last error (tideGetLastError() then returns "").
void clearLastError();

// This thread's last error message ("" if none). Valid until the next fail() on this thread.
const char* lastError();

// Static, never-NULL description of a result code ("tideInvalidArgument: invalid argument", ...).
const char* resultString(tideResult_t result);

}  // namespace tide

// Propagates a non-success tideResult_t to the caller (the root cause has already logged and recorded it).
#define TIDE_CHECK(call)                          \
  do {                                            \
    tideResult_t tide_check_res_ = (call);        \
    if (tide_check_res_ != tideSuccess) return tide_check_res_; \
  } while (0)

#endif  // TIDE_CORE_ERRORS_H_
