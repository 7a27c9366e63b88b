// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// FNV-1a, 64 bit: the one hash for what must agree across ranks (a layout, a comm's configuration, a host's
// identity). Values are fed as little-endian bytes, so the hash is the same on every host and build.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tide {

class Fnv1a {
 public:
  void bytes(const void* data, size_t n) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h_ ^= p[i];
      h_ *= 0x100000001b3ull;
    }
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      unsigned char b = static_cast<unsigned char>(v >> (8 * i));
      bytes(&b, 1);
    }
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

}  // namespace tide
