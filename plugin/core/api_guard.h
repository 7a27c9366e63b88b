// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Exception firewall for exported C functions: no C++ exception may cross include/tide.h.
//
//   tideResult_t tideSomething(...) {
//     TIDE_API_BEGIN
//     ...
//     return tideSuccess;
//     TIDE_API_END
//   }
//
// std::bad_alloc becomes tideOutOfMemory, anything else tideInternalError; both record the last error.
#ifndef TIDE_CORE_API_GUARD_H_
#define TIDE_CORE_API_GUARD_H_

#include <exception>
#include <new>

#include "errors.h"
#include "export.h"

#define TIDE_API_BEGIN try {
#define TIDE_API_END                                                                                      \
  }                                                                                                       \
  catch (const std::bad_alloc&) {                                                                         \
    return ::tide::fail(tideOutOfMemory, "API", "%s: out of host memory", __func__);                     \
  }                                                                                                       \
  catch (const std::exception& tide_api_e_) {                                                             \
    return ::tide::fail(tideInternalError, "API", "%s: internal error (please report): %s", __func__,    \
                        tide_api_e_.what());                                                              \
  }                                                                                                       \
  catch (...) {                                                                                           \
    return ::tide::fail(tideInternalError, "API", "%s: internal error (please report): unknown exception", \
                        __func__);                                                                        \
  }

#endif  // TIDE_CORE_API_GUARD_H_
