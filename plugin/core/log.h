// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Logging in NCCL's shape, governed by NCCL's variables (docs/env.md, "Logging").
//
// One line per event:  <host>:<pid>:<tid> [<cudaDev>] NCCL TIDE <LEVEL> <Component>: <message>
// ([-] when no CUDA device is known: host-only builds, threads without a CUDA context).
//
// Level: NCCL_TIDE_DEBUG if set, else NCCL_DEBUG (VERSION, WARN, INFO, ABORT (= INFO), TRACE), else the default.
// The default prints only faults that no caller hears about (lines from TIDE_WARN): an error that a function
// returns to its caller, with its message in tideGetLastError (fail() in errors.h), is printed from WARN up, as
// NCCL prints its own WARN lines only when NCCL_DEBUG asks.
// Components: INFO and TRACE lines pass a mask (WARN lines always do). NCCL_TIDE_DEBUG_SUBSYS takes TIDE's
// component names (API, Cuda, ..., ALL, a leading ^ inverts); else NCCL_DEBUG_SUBSYS with NCCL's subsystem names,
// each TIDE component mapped to NCCL's subsystems (Params -> ENV, Cuda -> COLL, ...; log.cc has the table); else
// all components under NCCL_TIDE_DEBUG and NCCL's default (INIT,BOOTSTRAP,ENV) under NCCL_DEBUG.
// Destination: NCCL_TIDE_DEBUG_FILE, else NCCL_DEBUG_FILE with ".tide" appended (NCCL opens its file for writing,
// so sharing it would overwrite lines), %h and %p substituted as NCCL does; else stderr.
// NCCL exports no logger to a library that is not one of its plugins, so TIDE writes its own lines.
#ifndef TIDE_CORE_LOG_H_
#define TIDE_CORE_LOG_H_

#include <cstdarg>

namespace tide {
namespace log {

enum Level : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

// True if a line at `level` from `component` would be written (cheap after the first call: settings are read
// once). component may be nullptr (any component).
bool enabled(Level level, const char* component = nullptr);

// Writes one line. component is the bare name ("Layout", "Cuda", ...).
void write(Level level, const char* component, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void writeV(Level level, const char* component, const char* fmt, va_list ap);

// The WARN line of an error that is also returned to the caller (fail()): printed only when a level of WARN or
// more was asked for.
bool returnedErrorsEnabled();
void writeReturned(const char* component, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Writes `text` once per process at level VERSION or above (NCCL prints "NCCL version ..." the same way).
void versionOnce(const char* text);

// The CUDA device shown in brackets: the CUDA layer installs a query (returns -1 when it knows none).
using DeviceQuery = int (*)();
void setDeviceQuery(DeviceQuery query);

// Name of a level ("NONE", "WARN", "INFO", "TRACE").
const char* levelName(Level level);

}  // namespace log
}  // namespace tide

#define TIDE_LOG_AT_(level, component, ...)                                                      \
  do {                                                                                           \
    if (::tide::log::enabled(level, component)) ::tide::log::write(level, component, __VA_ARGS__); \
  } while (0)

#define TIDE_WARN(component, ...) TIDE_LOG_AT_(::tide::log::kWarn, component, __VA_ARGS__)
#define TIDE_INFO(component, ...) TIDE_LOG_AT_(::tide::log::kInfo, component, __VA_ARGS__)
#define TIDE_TRACE(component, ...) TIDE_LOG_AT_(::tide::log::kTrace, component, __VA_ARGS__)
// fail()'s line (see returnedErrorsEnabled).
#define TIDE_WARN_RETURNED(component, ...)                                              \
  do {                                                                                  \
    if (::tide::log::returnedErrorsEnabled()) ::tide::log::writeReturned(component, __VA_ARGS__); \
  } while (0)

#endif  // TIDE_CORE_LOG_H_
