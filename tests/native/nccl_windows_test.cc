// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The window provider's NCCL side without a GPU (tests/unit/test_nccl_window_memory.py): loads a recording stub
// libnccl.so.2 (tests/native/stub_nccl/recording_stub_nccl.c) as a framework would, resolves it with
// nccl::resolve(), and drives nccl::WindowMemory through a rank's life with a stand-in exchange (every rank agrees,
// unless a mode makes one disagree). Prints "EXPECT <line>" for every line the stub log must hold, in order (the
// stub's calls, and "Q <what>" where the test's quiesce step runs), and "RESULT <tideResult_t> <message>".
//
// Usage: nccl_windows_test STUB life WORLD NODE RANK [SEED] open, slots (of sizes drawn from SEED), staging growth,
//                                                           a free, destroy
//        nccl_windows_test STUB abort WORLD NODE RANK       open, a slot, then tideCommAbort's local release
//        nccl_windows_test STUB unavailable WORLD NODE RANK open where NCCL gives no window or peer address (run
//                                                           with one of the stub's STUB_WINDOWS, STUB_REGISTER_FAIL,
//                                                           STUB_UNREACHABLE_PEER, STUB_LSA_TEAM, STUB_PEER_FAIL),
//                                                           then the fallback (auto) and refusal (forced) it makes
//        nccl_windows_test STUB refusedby WORLD NODE RANK R NCCL gives this rank everything, but the next rank
//                                                           reports refusal R (WindowMemory::Agreement::Refusal)
//        nccl_windows_test STUB memfail WORLD NODE RANK     open where ncclMemAlloc fails (STUB_MEMALLOC_FAIL=1)
//        nccl_windows_test STUB mismatch WORLD NODE RANK    open, then a slot whose size the next rank disagrees on
//        nccl_windows_test STUB choice                      the provider choice for each NCCL_TIDE_PROVIDER value,
//                                                           on this NCCL and on a bootstrap comm
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "errors.h"
#include "nccl/nccl_lib.h"
#include "nccl/provider_choice.h"
#include "nccl/window_memory.h"

using namespace tide;
using nccl::WindowMemory;

namespace {

void* const kParent = reinterpret_cast<void*>(0x9a7e0000);
constexpr size_t kFlagBytes = 4096;

[[noreturn]] void die(const char* what) {
  printf("FAIL: %s\n", what);
  fflush(stdout);
  exit(1);
}

void check(bool ok, const char* what) {
  if (!ok) die(what);
}

// The stub's numbering: the k-th registration's window, and the address it gives for a peer of that window.
uint64_t gRegistrations = 0;
void* windowK(uint64_t k) { return reinterpret_cast<void*>(static_cast<uintptr_t>(0x7e00000000ull + 0x1000ull * k)); }
char* peerAddress(uint64_t k, int commPeer) {
  return reinterpret_cast<char*>(
      static_cast<uintptr_t>(0x100000000000ull + (k << 32) + (static_cast<uint64_t>(commPeer + 1) << 24)));
}

// A line in the stub's log written by the test itself (where the quiesce step runs relative to NCCL's calls).
void mark(const char* line) {
  const char* path = getenv("STUB_NCCL_LOG");
  if (path == nullptr) die("STUB_NCCL_LOG is not set");
  FILE* f = fopen(path, "a");
  if (f == nullptr) die("cannot append to the stub log");
  fprintf(f, "%s\n", line);
  fclose(f);
  printf("EXPECT %s\n", line);
}

std::string lastLogLine() {
  std::ifstream in(getenv("STUB_NCCL_LOG"));
  std::string line, last;
  while (std::getline(in, line)) last = line;
  return last;
}

struct World {
  int world, node, rank;
  bool lieAboutSize = false;  // the next rank reports 8 more bytes for every buffer (a disagreeing allocation)
  int32_t nextRefuses = WindowMemory::Agreement::kNone;  // the next rank reports this refusal for every buffer
  void* comm() const { return node < world ? reinterpret_cast<void*>(0xc41d0000u + rank / node) : kParent; }
  int commRank(int r) const { return node < world ? r - rank / node * node : r; }
  bool onNode(int r) const { return r / node == rank / node; }
};

WindowMemory::Exchange exchangeOf(World* w) {
  return [w](const void* mine, void* all, size_t bytes) {
    for (int r = 0; r < w->world; ++r) memcpy(static_cast<char*>(all) + r * bytes, mine, bytes);
    if (bytes != sizeof(WindowMemory::Agreement)) return tideSuccess;
    WindowMemory::Agreement next;
    char* other = static_cast<char*>(all) + ((w->rank + 1) % w->world) * bytes;
    memcpy(&next, other, sizeof(next));
    if (w->lieAboutSize) next.bytes += 8;
    if (w->nextRefuses != WindowMemory::Agreement::kNone) {
      next.refusal = w->nextRefuses;
      const bool failed = w->nextRefuses == WindowMemory::Agreement::kRegisterFailed ||
                          w->nextRefuses == WindowMemory::Agreement::kPeerPointerFailed;
      next.result = failed ? 5 : 0;  // ncclInvalidUsage
      const bool asked = w->nextRefuses == WindowMemory::Agreement::kPeerPointerFailed ||
                         w->nextRefuses == WindowMemory::Agreement::kNoPeerAddress;
      next.peer = asked ? w->rank : -1;
    }
    memcpy(other, &next, sizeof(next));
    return tideSuccess;
  };
}

// The lines of one buffer's sharing: its ncclMemAlloc, registration and the node peers' addresses, in rank order.
void expectShare(const World& w, char* base, size_t bytes) {
  printf("EXPECT MA %zu %p\n", bytes, static_cast<void*>(base));
  const uint64_t k = ++gRegistrations;
  printf("EXPECT WR %p %p %zu %d %p\n", w.comm(), static_cast<void*>(base), bytes, nccl::kNcclWinDefault,
         windowK(k));
  for (int q = 0; q < w.world; ++q) {
    if (q == w.rank || !w.onNode(q)) continue;
    const int c = w.commRank(q);
    printf("EXPECT PP %p 0 %d %p\n", windowK(k), c, static_cast<void*>(peerAddress(k, c)));
  }
}

void expectRelease(const World& w, char* base, uint64_t k) {
  printf("EXPECT WD %p %p\n", w.comm(), windowK(k));
  printf("EXPECT MF %p\n", static_cast<void*>(base));
}

void expectSplit(const World& w) {
  if (w.node == w.world) return;
  printf("EXPECT SPLIT %p %d %d 1 cafebeef 21400 %zu %p\n", kParent, w.rank / w.node, w.rank,
         sizeof(nccl::ConfigPrefix), w.comm());
}

struct Opened {
  std::unique_ptr<WindowMemory> mem;
  char* flags = nullptr;
  uint64_t flagsK = 0;
};

// open() with flags whose init checks that nothing registered them yet; the expected lines of a successful open.
tideResult_t openWindows(const nccl::Lib& lib, World* w, Opened* o, WindowMemory::Availability* avail,
                         std::string* why) {
  expectSplit(*w);
  char* initBase = nullptr;
  auto init = [&](void* base, size_t bytes) {
    check(bytes == kFlagBytes, "flags init: size");
    check(lastLogLine().rfind("MA ", 0) == 0, "flags init ran after something other than their ncclMemAlloc");
    memset(base, 0, bytes);
    initBase = static_cast<char*>(base);
    return tideSuccess;
  };
  tideResult_t r = WindowMemory::open(lib, kParent, w->rank, w->world, w->node, exchangeOf(w), nullptr, kFlagBytes,
                                      init, &o->mem, avail, why);
  if (r != tideSuccess || *avail != WindowMemory::Availability::kAvailable) return r;
  o->flags = o->mem->flags(w->rank);
  check(o->flags == initBase, "flags(own rank) is not the buffer init prepared");
  expectShare(*w, o->flags, kFlagBytes);
  o->flagsK = gRegistrations;
  for (int q = 0; q < w->world; ++q) {
    char* f = o->mem->flags(q);
    if (q == w->rank) continue;
    check(w->onNode(q) ? f == peerAddress(o->flagsK, w->commRank(q)) : f == nullptr, "flags(peer)");
  }
  return tideSuccess;
}

// Every rank's address of [base + off, + len) of one slot, checked against the stub's numbering.
void checkPeers(const World& w, const WindowMemory& mem, char* base, size_t bytes, uint64_t k) {
  const size_t off = bytes / 3, len = bytes - off;
  for (int q = 0; q < w.world; ++q) {
    void* p = nullptr;
    const tideResult_t r = mem.peerPtr(base + off, len, q, "test", &p);
    if (q == w.rank) {
      check(r == tideSuccess && p == base + off, "peerPtr(own rank)");
    } else if (w.onNode(q)) {
      check(r == tideSuccess && p == peerAddress(k, w.commRank(q)) + off, "peerPtr(node peer)");
    } else {
      check(r == tideInternalError, "peerPtr(rank of another node) must fail");
    }
  }
  void* p = nullptr;
  check(mem.peerPtr(base + off, len + 1, w.rank, "test", &p) == tideInvalidArgument, "peerPtr past the slot's end");
  int outside = 0;
  check(mem.peerPtr(&outside, 1, w.rank, "test", &p) == tideInvalidArgument, "peerPtr outside every slot");
}

tideResult_t life(const nccl::Lib& lib, World* w, bool abortAtEnd, uint64_t seed) {
  Opened o;
  WindowMemory::Availability avail;
  std::string why;
  TIDE_CHECK(openWindows(lib, w, &o, &avail, &why));
  check(avail == WindowMemory::Availability::kAvailable, "windows unavailable");
  size_t sizes[3];
  for (size_t& s : sizes) {  // 1 byte to 4 MiB, every rank alike (the same seed)
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    s = 1 + (seed >> 33) % (4u << 20);
  }
  std::vector<char*> slots;
  std::vector<uint64_t> ks;
  for (size_t bytes : sizes) {
    void* p = nullptr;
    TIDE_CHECK(o.mem->slotAlloc(bytes, &p));
    slots.push_back(static_cast<char*>(p));
    expectShare(*w, slots.back(), bytes);
    ks.push_back(gRegistrations);
    checkPeers(*w, *o.mem, slots.back(), bytes, ks.back());
    if (abortAtEnd) break;
  }
  if (abortAtEnd) {
    o.mem->abortRelease();
    if (w->node < w->world) {  // a split child: released locally and aborted
      expectRelease(*w, slots[0], ks[0]);
      expectRelease(*w, o.flags, o.flagsK);
      printf("EXPECT CA %p\n", w->comm());
    }  // else the caller's communicator: no NCCL call on it at abort, everything left to process exit
    o.mem.reset();  // nothing left to release
    return tideSuccess;
  }
  // Own staging: grown for a larger request only; the owner's address is the node peer's copy.
  uint64_t stagingK[2] = {0, 0};
  char* staging[2] = {nullptr, nullptr};
  const uint64_t stagingBytes[] = {5000, 4000, 9000};
  int g = -1;  // the current generation
  for (int i = 0; i < 3; ++i) {
    void* out = nullptr;
    bool grown = false;
    TIDE_CHECK(o.mem->ownStaging(w->rank, stagingBytes[i], &out, &grown));
    check(grown == (i != 1), "own staging grows exactly when a request is larger");
    if (grown) {
      staging[++g] = static_cast<char*>(out);
      expectShare(*w, staging[g], stagingBytes[i]);
      stagingK[g] = gRegistrations;
    }
    const int peer = w->rank / w->node * w->node + (w->rank + 1) % w->node;  // a node peer (self on 1-rank nodes)
    TIDE_CHECK(o.mem->ownStaging(peer, stagingBytes[i], &out, &grown));
    check(!grown, "a second owner's staging does not grow it again");
    check(out == (peer == w->rank ? staging[g] : peerAddress(stagingK[g], w->commRank(peer))),
          "own staging address of a node peer");
  }
  // Free the middle slot: quiesce, then its window goes; the others keep their addresses.
  TIDE_CHECK(o.mem->slotFree(slots[1], [](const char* what) {
    char line[64];
    snprintf(line, sizeof(line), "Q %s", what);
    mark(line);
    return tideSuccess;
  }));
  expectRelease(*w, slots[1], ks[1]);
  check(o.mem->slotFree(slots[1], [](const char*) { return tideSuccess; }) == tideInvalidArgument,
        "a second free of a slot must fail");
  void* p = nullptr;
  check(o.mem->peerPtr(slots[1], 1, w->rank, "test", &p) == tideInvalidArgument, "a freed slot is no slot");
  checkPeers(*w, *o.mem, slots[2], sizes[2], ks[2]);
  check(o.mem->slotCount() == 2 && o.mem->stagingCount() == 2, "slot and staging counts");
  // Destroy: slots in allocation order, staging generations, flags, then the split communicator.
  o.mem.reset();
  expectRelease(*w, slots[0], ks[0]);
  expectRelease(*w, slots[2], ks[2]);
  expectRelease(*w, staging[0], stagingK[0]);
  expectRelease(*w, staging[1], stagingK[1]);
  expectRelease(*w, o.flags, o.flagsK);
  if (w->node < w->world) printf("EXPECT CD %p\n", w->comm());
  return tideSuccess;
}

// The fallback and the refusal tideCommCreate makes of `why` (plugin/nccl/provider_choice.h), for auto and forced.
void printFallbacks(const std::string& why) {
  for (bool forced : {false, true}) {
    nccl::ProviderChoice choice;
    choice.kind = nccl::ProviderKind::kWindow;
    choice.forced = forced;
    std::string info;
    const tideResult_t r = nccl::windowFallback(choice, why, &info);
    if (r == tideSuccess) {
      printf("FALLBACK %s ipc %s\n", forced ? "forced" : "auto", info.c_str());
    } else {
      printf("FALLBACK %s ERROR %d %s\n", forced ? "forced" : "auto", r, lastError());
    }
  }
}

// NCCL gives no window or no peer address (the stub's STUB_WINDOWS, STUB_REGISTER_FAIL, STUB_UNREACHABLE_PEER,
// STUB_LSA_TEAM, STUB_PEER_FAIL): unavailable, the reason printed ("WHY"), nothing left registered or allocated.
tideResult_t unavailable(const nccl::Lib& lib, World* w) {
  Opened o;
  WindowMemory::Availability avail;
  std::string why;
  TIDE_CHECK(openWindows(lib, w, &o, &avail, &why));
  check(avail == WindowMemory::Availability::kUnavailable && o.mem == nullptr, "expected no windows");
  printf("WHY %s\n", why.c_str());
  printFallbacks(why);
  // The log tells the flag buffer's address; the expected lines follow from it.
  std::ifstream in(getenv("STUB_NCCL_LOG"));
  std::string line;
  void* base = nullptr;
  while (std::getline(in, line)) {
    if (line.rfind("MA ", 0) == 0) sscanf(line.c_str(), "MA %*u %p", &base);
  }
  const char* regFail = getenv("STUB_REGISTER_FAIL");
  const char* peerFail = getenv("STUB_PEER_FAIL");
  const char* unreachable = getenv("STUB_UNREACHABLE_PEER");
  const char* team = getenv("STUB_LSA_TEAM");
  int first = 0, count = 0;
  if (team != nullptr) check(sscanf(team, "%d:%d", &first, &count) == 2, "STUB_LSA_TEAM=FIRST:COUNT");
  printf("EXPECT MA %zu %p\n", kFlagBytes, base);
  const uint64_t k = ++gRegistrations;
  if (regFail != nullptr || getenv("STUB_WINDOWS") != nullptr) {
    printf("EXPECT WR %p %p %zu %d %p%s%s\n", w->comm(), base, kFlagBytes, nccl::kNcclWinDefault, nullptr,
           regFail ? " FAIL " : "", regFail ? regFail : "");
    printf("EXPECT MF %p\n", base);
  } else {
    printf("EXPECT WR %p %p %zu %d %p\n", w->comm(), base, kFlagBytes, nccl::kNcclWinDefault, windowK(k));
    // The node's peers in rank order, up to the first that NCCL refuses.
    for (int q = 0; q < w->world; ++q) {
      if (q == w->rank || !w->onNode(q)) continue;
      const int c = w->commRank(q);
      if (peerFail != nullptr) {
        printf("EXPECT PP %p 0 %d %p FAIL %s\n", windowK(k), c, nullptr, peerFail);
        break;
      }
      const bool none = (unreachable != nullptr && atoi(unreachable) == c) ||
                        (team != nullptr && (c < first || c >= first + count));
      printf("EXPECT PP %p 0 %d %p\n", windowK(k), c, none ? nullptr : static_cast<void*>(peerAddress(k, c)));
      if (none) break;
    }
    expectRelease(*w, static_cast<char*>(base), k);
  }
  if (w->node < w->world) printf("EXPECT CD %p\n", w->comm());
  return tideSuccess;
}

// NCCL gives this rank its window and every peer address, but the next rank reports a refusal: every rank falls
// back alike, naming the next rank's NCCL call; this rank's window is deregistered and freed (locally).
tideResult_t refusedBy(const nccl::Lib& lib, World* w, int32_t refusal) {
  check(w->world > 1, "refusedby needs a next rank");
  w->nextRefuses = refusal;
  Opened o;
  WindowMemory::Availability avail;
  std::string why;
  expectSplit(*w);
  const tideResult_t r = WindowMemory::open(lib, kParent, w->rank, w->world, w->node, exchangeOf(w), nullptr,
                                            kFlagBytes, nullptr, &o.mem, &avail, &why);
  TIDE_CHECK(r);
  check(avail == WindowMemory::Availability::kUnavailable && o.mem == nullptr, "expected no windows");
  printf("WHY %s\n", why.c_str());
  printFallbacks(why);
  std::ifstream in(getenv("STUB_NCCL_LOG"));
  std::string line;
  void* base = nullptr;
  while (std::getline(in, line)) {
    if (line.rfind("MA ", 0) == 0) sscanf(line.c_str(), "MA %*u %p", &base);
  }
  expectShare(*w, static_cast<char*>(base), kFlagBytes);
  expectRelease(*w, static_cast<char*>(base), gRegistrations);
  if (w->node < w->world) printf("EXPECT CD %p\n", w->comm());
  return tideSuccess;
}

tideResult_t memfail(const nccl::Lib& lib, World* w) {
  Opened o;
  WindowMemory::Availability avail;
  std::string why;
  const tideResult_t r = openWindows(lib, w, &o, &avail, &why);
  printf("EXPECT MA %zu FAIL\n", kFlagBytes);
  if (w->node < w->world) printf("EXPECT CA %p\n", w->comm());
  return r;
}

tideResult_t mismatch(const nccl::Lib& lib, World* w) {
  Opened o;
  WindowMemory::Availability avail;
  std::string why;
  TIDE_CHECK(openWindows(lib, w, &o, &avail, &why));
  w->lieAboutSize = true;
  void* p = nullptr;
  const tideResult_t r = o.mem->slotAlloc(4096, &p);
  check(p == nullptr && o.mem->slotCount() == 0, "a refused slot is not kept");
  // Its buffer was allocated and freed, never registered.
  std::ifstream in(getenv("STUB_NCCL_LOG"));
  std::string line;
  void* base = nullptr;
  while (std::getline(in, line)) {
    if (line.rfind("MA 4096 ", 0) == 0) sscanf(line.c_str(), "MA %*u %p", &base);
  }
  printf("EXPECT MA 4096 %p\nEXPECT MF %p\n", base, base);
  o.mem.reset();  // releases without errors: the slot's error stays the last one
  expectRelease(*w, o.flags, o.flagsK);
  if (w->node < w->world) printf("EXPECT CD %p\n", w->comm());
  return r;
}

void choice(const nccl::Lib& lib) {
  const struct {
    const char* name;
    params::ProviderSetting setting;
  } settings[] = {{"auto", params::kProviderAuto}, {"ipc", params::kProviderIpc}, {"window", params::kProviderWindow}};
  for (const auto& s : settings) {
    for (const nccl::Lib* l : {&lib, static_cast<const nccl::Lib*>(nullptr)}) {
      nccl::ProviderChoice c;
      const tideResult_t r = nccl::chooseProvider(s.setting, l, &c);
      if (r == tideSuccess) {
        printf("CHOICE %s %s %s forced=%d why=%s\n", s.name, l ? "nccl" : "bootstrap", nccl::providerName(c.kind),
               c.forced ? 1 : 0, c.why);
      } else {
        printf("CHOICE %s %s ERROR %d %s\n", s.name, l ? "nccl" : "bootstrap", r, lastError());
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) die("usage: nccl_windows_test STUB MODE [WORLD NODE RANK]");
  if (dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr) die(dlerror());
  const nccl::Lib* lib = nullptr;
  if (nccl::resolve(&lib) != tideSuccess) die(lastError());
  printf("resolved NCCL %d.%d.%d, provider %s, window capable %d\n", lib->major, lib->minor, lib->patch,
         lib->provider, lib->windowCapable ? 1 : 0);
  const std::string mode = argv[2];
  if (mode == "choice") {
    choice(*lib);
    printf("RESULT 0\n");
    return 0;
  }
  if (argc != 6 && argc != 7) die("usage: nccl_windows_test STUB MODE WORLD NODE RANK [SEED | REFUSAL]");
  World w{atoi(argv[3]), atoi(argv[4]), atoi(argv[5])};
  check(w.world > 0 && w.node > 0 && w.world % w.node == 0 && w.rank >= 0 && w.rank < w.world, "bad world");
  tideResult_t r = tideSuccess;
  const uint64_t seed = argc > 6 ? strtoull(argv[6], nullptr, 10) : 1;
  if (mode == "life") {
    r = life(*lib, &w, false, seed);
  } else if (mode == "abort") {
    r = life(*lib, &w, true, seed);
  } else if (mode == "unavailable") {
    r = unavailable(*lib, &w);
  } else if (mode == "refusedby") {
    r = refusedBy(*lib, &w, static_cast<int32_t>(seed));
  } else if (mode == "memfail") {
    r = memfail(*lib, &w);
  } else if (mode == "mismatch") {
    r = mismatch(*lib, &w);
  } else {
    die("unknown mode");
  }
  printf("RESULT %d %s\n", r, r == tideSuccess ? "" : lastError());
  return 0;
}
