// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Checked identity of the opaque handles of include/tide.h (tideLayout_t, tideComm_t).
//
// A handle is not the object's address but a registry key that is never reused within a process:
//   value = kHandleTag | (serial << 4) | kind      (kHandleTag sets bits 48..62: a non-canonical address on
//                                                    x86-64 and aarch64, so dereferencing a handle faults at once)
// Every entry point looks its handles up here (checkHandle) and holds a shared reference to the object for the
// duration of the call; Destroy unregisters the handle and drops the registry's reference, so the object is freed
// when the last call that uses it returns. Hence a destroyed, twice-destroyed, garbage or wrong-kind handle is
// refused with tideInvalidArgument naming the handle (never a use after free), and a Destroy racing a call on
// another thread never frees memory under it.
#ifndef TIDE_CORE_HANDLES_H_
#define TIDE_CORE_HANDLES_H_

#include <cstdint>
#include <memory>

#include "tide.h"

namespace tide {

enum class HandleKind : uint32_t { kLayout = 1, kComm = 2 };

namespace handles {

// Registers obj under a fresh handle value (never reused in this process).
const void* add(HandleKind kind, std::shared_ptr<void> obj);
// The object of a live handle of that kind, or nullptr.
std::shared_ptr<void> find(const void* handle, HandleKind kind);
// A second handle to the object of a live handle (nullptr if not live): for holders inside the library (the
// interposer's attachments) that must outlive the caller's handle. Release it like any handle.
const void* retain(const void* handle, HandleKind kind);
// Unregisters a live handle of that kind and returns its object (nullptr if the handle is not live).
std::shared_ptr<void> remove(const void* handle, HandleKind kind);
// Records and returns tideInvalidArgument: "<fn>: <what> <value> is not a live <type>: <why>" (destroyed, a handle of
// another type, or never created by this library).
tideResult_t failBad(const void* handle, HandleKind kind, const char* fn, const char* what);
// Number of live handles of a kind (tests).
size_t liveCount(HandleKind kind);

}  // namespace handles

// Looks up a handle: tideInvalidArgument naming it if NULL or not live; on success *out holds the object.
template <typename T>
tideResult_t checkHandle(const void* handle, HandleKind kind, const char* fn, const char* what,
                         std::shared_ptr<T>* out) {
  std::shared_ptr<void> obj = handle == nullptr ? nullptr : handles::find(handle, kind);
  if (!obj) return handles::failBad(handle, kind, fn, what);
  *out = std::static_pointer_cast<T>(obj);
  return tideSuccess;
}

}  // namespace tide

#endif  // TIDE_CORE_HANDLES_H_
