// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The interposer's record of registered buffers (plugin/api/interposer_windows.h) and the comm's peer regions
// (plugin/cuda/peer_regions.h): which buffer an all-gather's receive range lies in, and which peer address a slot
// region resolves to. tests/unit/test_interposer_windows.py runs it.
//
// Usage: interposer_windows_test SEED   exit 0: every check passed
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "api/interposer_windows.h"
#include "cuda/peer_regions.h"
#include "expect.h"

namespace w = tide::interposer::windows;

namespace {

char* at(uintptr_t a) { return reinterpret_cast<char*>(a); }
void* handle(uintptr_t h) { return reinterpret_cast<void*>(h); }
void* const kCommA = handle(0xA000);
void* const kCommB = handle(0xB000);

w::Kind kindOf(void* comm, uintptr_t p, size_t bytes, w::Hit* hit = nullptr) {
  w::Hit h;
  return w::lookup(comm, at(p), bytes, hit != nullptr ? hit : &h);
}

void kindsAndBounds() {
  w::registered(kCommA, at(0x100000), 0x10000, handle(0x7e01), w::kNcclWinCollSymmetric);
  w::registered(kCommA, at(0x200000), 0x10000, handle(0x7e02), 0);
  w::registeredLocal(kCommA, at(0x300000), 0x10000, handle(0x4e01));
  w::registered(kCommA, at(0x400000), 0x10000, nullptr, w::kNcclWinCollSymmetric);  // NCCL gave no window
  w::Hit hit;
  EXPECT(kindOf(kCommA, 0x100000, 0x10000, &hit) == w::Kind::kSymmetricWindow, "whole symmetric window");
  EXPECT(hit.win == handle(0x7e01) && hit.base == at(0x100000) && hit.size == 0x10000, "its window, base, size");
  EXPECT(kindOf(kCommA, 0x10ff00, 0x100) == w::Kind::kSymmetricWindow, "a range ending at the window's end");
  EXPECT(kindOf(kCommA, 0x10ff00, 0x101) == w::Kind::kNone, "a range one byte past the window's end");
  EXPECT(kindOf(kCommA, 0x0fffff, 2) == w::Kind::kNone, "a range starting before the window");
  EXPECT(kindOf(kCommA, 0x200100, 64) == w::Kind::kWindow, "inside a window without the symmetric flag");
  EXPECT(kindOf(kCommA, 0x300100, 64) == w::Kind::kLocalRegistration, "inside a local registration");
  EXPECT(kindOf(kCommA, 0x400100, 64) == w::Kind::kNone, "a registration NCCL gave no window is not recorded");
  EXPECT(kindOf(kCommB, 0x100100, 64) == w::Kind::kNone, "another communicator's window");
  // A window over a locally registered buffer wins over the local registration.
  w::registered(kCommA, at(0x300000), 0x10000, handle(0x7e03), w::kNcclWinCollSymmetric);
  EXPECT(kindOf(kCommA, 0x300100, 64, &hit) == w::Kind::kSymmetricWindow && hit.win == handle(0x7e03),
         "a symmetric window over a local registration");
  EXPECT(w::deregistered(kCommA, handle(0x7e03)) == at(0x300000), "deregistering returns the window's buffer");
  EXPECT(kindOf(kCommA, 0x300100, 64) == w::Kind::kLocalRegistration, "the local registration is left");
  w::deregisteredLocal(kCommA, handle(0x4e01));
  EXPECT(kindOf(kCommA, 0x300100, 64) == w::Kind::kNone, "deregistered locally");
  EXPECT(w::deregistered(kCommA, handle(0x7eff)) == nullptr, "an unknown window");
  EXPECT(w::deregistered(kCommA, nullptr) == nullptr, "a NULL window");
  w::forgetComm(kCommA);
  EXPECT(kindOf(kCommA, 0x100100, 64) == w::Kind::kNone, "a released communicator's windows are gone");
}

void groups() {
  void* winOk = nullptr;
  void* winLate = nullptr;
  w::registeredInGroup(kCommB, at(0x500000), 0x1000, &winOk, w::kNcclWinCollSymmetric);
  w::registeredInGroup(kCommB, at(0x600000), 0x1000, &winLate, w::kNcclWinCollSymmetric);
  EXPECT(kindOf(kCommB, 0x500000, 16) == w::Kind::kNone, "not recorded before the group ends");
  winOk = handle(0x7e10);  // NCCL fills the handle at the group's end; winLate stays NULL (nonblocking)
  w::groupEnded(true);
  EXPECT(kindOf(kCommB, 0x500000, 16) == w::Kind::kSymmetricWindow, "recorded when the group ended");
  EXPECT(kindOf(kCommB, 0x600000, 16) == w::Kind::kNone, "a handle NCCL had not filled is not recorded");
  void* winFailed = handle(0x7e11);
  w::registeredInGroup(kCommB, at(0x700000), 0x1000, &winFailed, w::kNcclWinCollSymmetric);
  w::groupEnded(false);
  EXPECT(kindOf(kCommB, 0x700000, 16) == w::Kind::kNone, "a failed group registers nothing");
  w::groupEnded(true);
  EXPECT(kindOf(kCommB, 0x700000, 16) == w::Kind::kNone, "the failed group's registration is not kept for later");
  w::forgetComm(kCommB);
}

// Random windows (disjoint) and ranges: the kind is the symmetric window's exactly when the range lies inside it.
void randomRanges(std::mt19937_64& rng) {
  struct Win { uintptr_t base; size_t size; bool sym; };
  std::vector<Win> wins;
  for (int i = 0; i < 20; ++i) {
    Win x{0x1000000ull * (i + 1), 4096 * (1 + rng() % 64), rng() % 2 == 0};
    wins.push_back(x);
    w::registered(kCommA, at(x.base), x.size, handle(0x7f00 + i), x.sym ? w::kNcclWinCollSymmetric : 0);
  }
  for (int k = 0; k < 20000; ++k) {
    const Win& x = wins[rng() % wins.size()];
    const uintptr_t p = x.base - 64 + rng() % (x.size + 128);
    const size_t bytes = 1 + rng() % 8192;
    const bool inside = p >= x.base && p + bytes <= x.base + x.size;
    const w::Kind want = !inside ? w::Kind::kNone : x.sym ? w::Kind::kSymmetricWindow : w::Kind::kWindow;
    w::Hit hit;
    const w::Kind got = kindOf(kCommA, p, bytes, &hit);
    EXPECT(got == want, "range %#lx + %zu against window %#lx + %zu: kind %d, want %d", static_cast<unsigned long>(p),
           bytes, static_cast<unsigned long>(x.base), x.size, static_cast<int>(got), static_cast<int>(want));
    if (inside) EXPECT(hit.base == at(x.base), "the hit names its window");
  }
  w::forgetComm(kCommA);
}

void peerRegions(std::mt19937_64& rng) {
  tide::cuda::PeerRegions regions;
  const uint64_t g0 = regions.generation();
  const int world = 4;
  std::vector<char*> peers = {at(0x100000), at(0x9100000), nullptr, at(0xb100000)};
  regions.add(at(0x100000), 0x10000, peers);
  EXPECT(regions.generation() != g0 && regions.has(at(0x100000)), "added");
  for (int k = 0; k < 10000; ++k) {
    const uintptr_t p = 0x100000 - 32 + rng() % (0x10000 + 64);
    const size_t bytes = 1 + rng() % 1024;
    const int peer = static_cast<int>(rng() % (world + 1)) - (rng() % 8 == 0 ? 1 : 0);
    const bool inside = p >= 0x100000 && p + bytes <= 0x110000;
    const bool mapped = peer >= 0 && peer < world && peers[peer] != nullptr;
    void* out = nullptr;
    const bool found = regions.find(at(p), bytes, peer, &out);
    EXPECT(found == (inside && mapped), "find %#lx + %zu peer %d", static_cast<unsigned long>(p), bytes, peer);
    if (found) EXPECT(out == peers[peer] + (p - 0x100000), "the peer's address at the same offset");
  }
  const uint64_t g1 = regions.generation();
  regions.remove(at(0x200000));
  EXPECT(regions.generation() == g1, "removing nothing keeps the generation");
  regions.remove(at(0x100000));
  void* out = nullptr;
  EXPECT(regions.generation() != g1 && !regions.find(at(0x100010), 16, 1, &out), "removed");
}

}  // namespace

int main(int argc, char** argv) {
  std::mt19937_64 rng(argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1);
  kindsAndBounds();
  groups();
  randomRanges(rng);
  peerRegions(rng);
  if (failures == 0) printf("all checks passed\n");
  return failures == 0 ? 0 : 1;
}
