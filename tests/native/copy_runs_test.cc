// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Checks tide::stridedRuns and tide::splitAtAllocations (plugin/core/copy_runs.h) on the host: for random copy
// lists (random groups, widths, strides, gaps, repeated sources) and for the all-gather's own pattern, applying the
// runs row by row writes exactly the bytes the copies write (same values, each byte once), every run respects its
// limits, the AG pattern of P parameters of one size pushed to W ranks collapses to W runs, and after the split at
// allocations (a fake allocation map) every run of several rows reads one allocation and writes one.
// Usage: copy_runs_test [seeds]; prints "all checks passed", exit 0.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "copy_runs.h"

namespace {

[[noreturn]] void die(const std::string& m) {
  fprintf(stderr, "FAIL: %s\n", m.c_str());
  exit(1);
}

struct List {
  std::vector<uint64_t> dst, src, bytes;
  std::vector<uint32_t> group;
  void add(uint64_t d, uint64_t s, uint64_t b, uint32_t g) {
    dst.push_back(d);
    src.push_back(s);
    bytes.push_back(b);
    group.push_back(g);
  }
};

constexpr uint64_t kDstBase = 1 << 20;  // destinations live in [kDstBase, ...), sources in [0, kSrcBytes)
constexpr uint64_t kSrcBytes = 1 << 20;

// Applies the copies and the runs to two copies of destination memory; they must agree byte for byte, and every
// byte must be written exactly as often (once: the copies of a list do not overlap).
void check(const List& l, const std::vector<tide::CopyRun>& runs, uint64_t maxPitch, uint64_t dstBytes,
           const std::string& what) {
  std::vector<unsigned char> mem(kSrcBytes);
  std::mt19937_64 fill(7);
  for (auto& c : mem) c = static_cast<unsigned char>(fill());
  std::vector<unsigned char> a(dstBytes, 0xA5), b(dstBytes, 0xA5);
  std::vector<int> na(dstBytes, 0), nb(dstBytes, 0);
  for (size_t i = 0; i < l.dst.size(); ++i) {
    for (uint64_t k = 0; k < l.bytes[i]; ++k) {
      a[l.dst[i] - kDstBase + k] = mem[l.src[i] + k];
      ++na[l.dst[i] - kDstBase + k];
    }
  }
  uint64_t rows = 0;
  for (const tide::CopyRun& r : runs) {
    if (r.rows == 0 || r.width == 0) die(what + ": an empty run");
    if (r.rows > 1 && (r.dpitch < r.width || r.spitch < r.width || r.dpitch > maxPitch || r.spitch > maxPitch)) {
      die(what + ": a run's pitch breaks its limits");
    }
    rows += r.rows;
    for (uint64_t k = 0; k < r.rows; ++k) {
      for (uint64_t x = 0; x < r.width; ++x) {
        const uint64_t d = r.dst + k * r.dpitch + x - kDstBase;
        if (d >= dstBytes || r.src + k * r.spitch + x >= kSrcBytes) die(what + ": a run leaves the buffers");
        b[d] = mem[r.src + k * r.spitch + x];
        ++nb[d];
      }
    }
  }
  if (rows != l.dst.size()) die(what + ": runs cover " + std::to_string(rows) + " copies of " +
                                std::to_string(l.dst.size()));
  if (a != b || na != nb) die(what + ": the runs write other bytes than the copies");
}

std::vector<tide::CopyRun> plan(const List& l, uint64_t maxPitch) {
  return tide::stridedRuns(l.dst.data(), l.src.data(), l.bytes.data(), l.group.data(), l.dst.size(), maxPitch);
}

// A fake allocation map: sorted [base, base + size) intervals; addresses in no interval cannot be told.
struct Allocations {
  std::vector<std::pair<uint64_t, uint64_t>> iv;
  bool rangeOf(uint64_t a, uint64_t* base, uint64_t* size) const {
    for (const auto& [b, n] : iv) {
      if (a >= b && a < b + n) {
        *base = b;
        *size = n;
        return true;
      }
    }
    return false;
  }
  const tide::AddressRangeFn fn() const {
    return [this](uint64_t a, uint64_t* b, uint64_t* n) { return rangeOf(a, b, n); };
  }
};

// Every run of several rows stays inside one allocation on each side.
void checkInside(const std::vector<tide::CopyRun>& runs, const Allocations& al, const std::string& what) {
  for (const tide::CopyRun& r : runs) {
    if (r.rows < 2) continue;
    uint64_t sb = 0, ss = 0, db = 0, ds = 0;
    if (!al.rangeOf(r.src, &sb, &ss) || !al.rangeOf(r.dst, &db, &ds)) die(what + ": a run starts outside the map");
    const uint64_t sl = r.src + (r.rows - 1) * r.spitch + r.width, dl = r.dst + (r.rows - 1) * r.dpitch + r.width;
    if (sl > sb + ss || dl > db + ds) die(what + ": a run of several rows crosses an allocation");
  }
}

// The single-node AG push of one rank: for each parameter i, its shard to every rank r's slot at
// slot_r + slotOffset_i + me * shard_i, from src_i. Packed shards and equal sizes: W runs of P rows.
uint64_t agPattern(int P, int W, bool uniform, bool packed, std::mt19937_64& rng, List* l) {
  const int me = static_cast<int>(rng() % W);
  std::vector<uint64_t> shard(P), slotOff(P), src(P);
  uint64_t slotBytes = 0, s = 0;
  for (int i = 0; i < P; ++i) {
    shard[i] = uniform ? 96 : 32 + 16 * (rng() % 8);
    slotOff[i] = slotBytes;
    slotBytes += W * shard[i];
    src[i] = s;
    s += shard[i] + (packed ? 0 : 16 * (i + 1));  // unpacked: a gap that grows, so no pitch repeats
  }
  for (int i = 0; i < P; ++i) {
    for (int k = 0; k < W; ++k) {
      const int r = (me + k) % W;
      l->add(kDstBase + r * slotBytes + slotOff[i] + me * shard[i], src[i], shard[i], static_cast<uint32_t>(r));
    }
  }
  return W * slotBytes;
}

}  // namespace

int main(int argc, char** argv) {
  const int seeds = argc > 1 ? atoi(argv[1]) : 200;
  const uint64_t big = uint64_t(1) << 31;
  // The AG pattern: W runs when shards are packed and of one size; no merging otherwise.
  for (int W : {1, 2, 3, 8}) {
    for (int P : {1, 2, 9, 64}) {
      std::mt19937_64 rng(1000 * W + P);
      List l;
      uint64_t bytes = agPattern(P, W, true, true, rng, &l);
      auto runs = plan(l, big);
      check(l, runs, big, bytes, "ag packed W=" + std::to_string(W) + " P=" + std::to_string(P));
      if (runs.size() != static_cast<size_t>(W)) {
        die("ag packed W=" + std::to_string(W) + " P=" + std::to_string(P) + ": " + std::to_string(runs.size()) +
            " runs, want " + std::to_string(W));
      }
      List g;
      bytes = agPattern(P, W, true, false, rng, &g);  // growing gaps between the shards: 2 rows per run at most
      runs = plan(g, big);
      check(g, runs, big, bytes, "ag gaps");
      if (runs.size() != static_cast<size_t>(W * ((P + 1) / 2))) {
        die("ag gaps W=" + std::to_string(W) + " P=" + std::to_string(P) + ": " + std::to_string(runs.size()) +
            " runs, want " + std::to_string(W * ((P + 1) / 2)));
      }
      List m;
      bytes = agPattern(P, W, false, true, rng, &m);  // sizes differ: runs only where neighbours share a size
      check(m, plan(m, big), big, bytes, "ag mixed sizes");
    }
  }
  // A pitch limit below the AG's pitch: nothing merges.
  {
    std::mt19937_64 rng(5);
    List l;
    const uint64_t bytes = agPattern(16, 4, true, true, rng, &l);
    auto runs = plan(l, 95);
    check(l, runs, 95, bytes, "pitch limit");
    if (runs.size() != l.dst.size()) die("pitch limit: a run with a pitch above the limit");
  }
  // Random lists: non-overlapping destinations in random order and groups, random sources (overlapping reads and a
  // repeated "zero buffer" source allowed), stretches of regular strides mixed with irregular copies.
  for (int s = 0; s < seeds; ++s) {
    std::mt19937_64 rng(77 + s);
    List l;
    uint64_t at = kDstBase;
    const int stretches = 1 + static_cast<int>(rng() % 12);
    for (int t = 0; t < stretches; ++t) {
      const uint64_t w = 1 + rng() % 64;
      const int rows = 1 + static_cast<int>(rng() % 9);
      // Source pitch: 0 (a repeated source such as the zero buffer), below the width (overlapping reads: legal
      // copies, but no 2D copy), or at least the width.
      const uint64_t dp = w + rng() % 3 * (rng() % 40), pick = rng() % 5;
      const uint64_t sp = pick == 0 ? 0 : (pick == 1 ? 1 + rng() % w : w + rng() % 50);
      const uint64_t s0 = rng() % (kSrcBytes / 2);
      const uint32_t g = static_cast<uint32_t>(rng() % 3);
      for (int k = 0; k < rows; ++k) {
        const bool jitter = rng() % 7 == 0;  // breaks the stride now and then
        l.add(at + k * dp + (jitter ? 1 : 0), s0 + k * sp, w, g);
      }
      at += rows * dp + 64;
    }
    // Shuffle stretches of the list a little (adjacent swaps), so that groups interleave.
    for (size_t i = 1; i < l.dst.size(); ++i) {
      if (rng() % 4 == 0) {
        std::swap(l.dst[i], l.dst[i - 1]);
        std::swap(l.src[i], l.src[i - 1]);
        std::swap(l.bytes[i], l.bytes[i - 1]);
        std::swap(l.group[i], l.group[i - 1]);
      }
    }
    // Jitter can make neighbouring rows overlap by a byte: drop such lists (a batch never overlaps).
    std::vector<int> used(at - kDstBase + 64, 0);
    bool overlap = false;
    for (size_t i = 0; i < l.dst.size() && !overlap; ++i) {
      for (uint64_t k = 0; k < l.bytes[i]; ++k) overlap = overlap || used[l.dst[i] - kDstBase + k]++ > 0;
    }
    if (overlap) continue;
    check(l, plan(l, 1 << 12), 1 << 12, at - kDstBase + 64, "random seed " + std::to_string(s));
  }
  // Split at allocations. The AG pattern with every shard its own allocation: nothing of several rows survives;
  // with the shards in two allocations (halves): 2 runs per destination; with one: W.
  for (int W : {2, 8}) {
    const int P = 16;
    for (int pieces : {16, 2, 1}) {
      std::mt19937_64 rng(31 * W + pieces);
      List l;
      const uint64_t bytes = agPattern(P, W, true, true, rng, &l);
      Allocations al;
      al.iv.push_back({kDstBase, bytes});  // the slots: one allocation
      const uint64_t per = 96 * (P / pieces);  // shards are 96 bytes, packed from address 0
      for (int k = 0; k < pieces; ++k) al.iv.push_back({k * per, per});
      auto runs = tide::splitAtAllocations(plan(l, big), al.fn());
      const std::string what = "split W=" + std::to_string(W) + " pieces=" + std::to_string(pieces);
      check(l, runs, big, bytes, what);
      checkInside(runs, al, what);
      const size_t want = pieces == 16 ? static_cast<size_t>(P * W) : static_cast<size_t>(pieces * W);
      if (runs.size() != want) die(what + ": " + std::to_string(runs.size()) + " runs, want " + std::to_string(want));
    }
  }
  // Random lists under random allocation maps (holes included: those rows are copied alone).
  for (int s = 0; s < seeds; ++s) {
    std::mt19937_64 rng(5000 + s);
    List l;
    uint64_t at = kDstBase;
    for (int t = 0; t < 6; ++t) {
      const uint64_t w = 8 + rng() % 32, dp = w + rng() % 16, sp = w + rng() % 16, s0 = rng() % (kSrcBytes / 2);
      const int rows = 2 + static_cast<int>(rng() % 12);
      for (int k = 0; k < rows; ++k) l.add(at + k * dp, s0 + k * sp, w, static_cast<uint32_t>(t));
      at += rows * dp + 64;
    }
    Allocations al;
    for (uint64_t a = 0; a < at + 64;) {  // random pieces over sources and destinations, some left as holes
      const uint64_t n = 16 + rng() % 400;
      if (rng() % 6 != 0) al.iv.push_back({a, n});
      a += n;
    }
    auto runs = tide::splitAtAllocations(plan(l, big), al.fn());
    const std::string what = "split random seed " + std::to_string(s);
    check(l, runs, big, at - kDstBase + 64, what);
    checkInside(runs, al, what);
  }
  printf("all checks passed\n");
  return 0;
}
