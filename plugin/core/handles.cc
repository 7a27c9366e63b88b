// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The handle registry (handles.h).
#include "handles.h"

#include <mutex>
#include <unordered_map>

#include "errors.h"
#include "fork_guard.h"

namespace tide {
namespace handles {
namespace {

constexpr uintptr_t kHandleTag = 0x71deull << 48;
constexpr uintptr_t kTagMask = 0xffffull << 48;
constexpr uintptr_t kKindMask = 0xf;

struct Entry {
  HandleKind kind;
  std::shared_ptr<void> obj;
};

struct Registry {
  std::mutex mu;
  uint64_t nextSerial = 1;
  std::unordered_map<uintptr_t, Entry> live;
};

// Never destroyed: handles may be destroyed from other static destructors at exit (the interposer's state).
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

// Created at the library's load, not at first use, and its lock held across fork().
[[maybe_unused]] const bool gForkGuarded = forkguard::guard(forkguard::kHandles, &registry().mu);

const char* typeName(HandleKind kind) { return kind == HandleKind::kLayout ? "tideLayout_t" : "tideComm_t"; }

}  // namespace

const void* add(HandleKind kind, std::shared_ptr<void> obj) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const uintptr_t value = kHandleTag | (static_cast<uintptr_t>(r.nextSerial++) << 4) | static_cast<uintptr_t>(kind);
  r.live.emplace(value, Entry{kind, std::move(obj)});
  return reinterpret_cast<const void*>(value);
}

std::shared_ptr<void> find(const void* handle, HandleKind kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.find(reinterpret_cast<uintptr_t>(handle));
  if (it == r.live.end() || it->second.kind != kind) return nullptr;
  return it->second.obj;
}

const void* retain(const void* handle, HandleKind kind) {
  std::shared_ptr<void> obj = find(handle, kind);
  return obj ? add(kind, std::move(obj)) : nullptr;
}

std::shared_ptr<void> remove(const void* handle, HandleKind kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.find(reinterpret_cast<uintptr_t>(handle));
  if (it == r.live.end() || it->second.kind != kind) return nullptr;
  std::shared_ptr<void> obj = std::move(it->second.obj);
  r.live.erase(it);
  return obj;
}

size_t liveCount(HandleKind kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  size_t n = 0;
  for (const auto& kv : r.live) n += kv.second.kind == kind ? 1 : 0;
  return n;
}

tideResult_t failBad(const void* handle, HandleKind kind, const char* fn, const char* what) {
  if (handle == nullptr) return fail(tideInvalidArgument, "API", "%s: %s is NULL", fn, what);
  const uintptr_t v = reinterpret_cast<uintptr_t>(handle);
  const char* why = "it was never created by this library (garbage, uninitialized or foreign)";
  if ((v & kTagMask) == kHandleTag) {
    const auto k = static_cast<uint32_t>(v & kKindMask);
    uint64_t next = 0;
    {
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mu);
      next = r.nextSerial;
    }
    const uint64_t serial = (v & ~kTagMask) >> 4;
    if (serial == 0 || serial >= next) {
      why = "it was never created by this library (garbage or corrupted)";
    } else if (k != static_cast<uint32_t>(kind)) {
      why = k == static_cast<uint32_t>(HandleKind::kLayout) ? "it is a tideLayout_t"
            : k == static_cast<uint32_t>(HandleKind::kComm) ? "it is a tideComm_t"
                                                            : "it is not a TIDE handle";
    } else {
      why = "it was destroyed (use after destroy, or a second destroy)";
    }
  }
  return fail(tideInvalidArgument, "API", "%s: %s %p is not a live %s: %s", fn, what, handle, typeName(kind), why);
}

}  // namespace handles
}  // namespace tide
