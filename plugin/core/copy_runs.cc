// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "copy_runs.h"

#include <unordered_map>

namespace tide {

std::vector<CopyRun> stridedRuns(const uint64_t* dst, const uint64_t* src, const uint64_t* bytes, const uint32_t* group,
                                 size_t n, uint64_t maxPitch) {
  std::vector<CopyRun> out;
  out.reserve(n);
  std::unordered_map<uint32_t, size_t> open;  // group -> its run that the group's next copy may extend
  for (size_t i = 0; i < n; ++i) {
    auto it = open.find(group[i]);
    if (it != open.end()) {
      CopyRun& r = out[it->second];
      const uint64_t w = r.width;
      if (w == bytes[i] && r.rows == 1 && dst[i] > r.dst && src[i] > r.src) {
        // The second row sets the pitches.
        const uint64_t dp = dst[i] - r.dst, sp = src[i] - r.src;
        if (dp >= w && sp >= w && dp <= maxPitch && sp <= maxPitch) {
          r.dpitch = dp;
          r.spitch = sp;
          r.rows = 2;
          continue;
        }
      } else if (w == bytes[i] && r.rows > 1 && dst[i] == r.dst + r.rows * r.dpitch &&
                 src[i] == r.src + r.rows * r.spitch) {
        ++r.rows;
        continue;
      }
    }
    CopyRun r;
    r.dst = dst[i];
    r.src = src[i];
    r.width = bytes[i];
    r.rows = 1;
    out.push_back(r);
    open[group[i]] = out.size() - 1;
  }
  return out;
}

std::vector<CopyRun> splitAtAllocations(const std::vector<CopyRun>& runs, const AddressRangeFn& rangeOf) {
  std::vector<CopyRun> out;
  out.reserve(runs.size());
  auto plain = [](CopyRun r) {
    if (r.rows == 1) r.dpitch = r.spitch = 0;
    return r;
  };
  for (const CopyRun& r : runs) {
    if (r.rows <= 1) {
      out.push_back(r);
      continue;
    }
    uint64_t k = 0;
    while (k < r.rows) {
      CopyRun piece = r;
      piece.dst = r.dst + k * r.dpitch;
      piece.src = r.src + k * r.spitch;
      uint64_t sb = 0, ss = 0, db = 0, ds = 0;
      if (!rangeOf(piece.src, &sb, &ss) || !rangeOf(piece.dst, &db, &ds)) {
        piece.rows = 1;
        out.push_back(plain(piece));
        ++k;
        continue;
      }
      // Rows k .. e - 1 lie inside [sb, sb + ss) and [db, db + ds).
      uint64_t e = k;
      while (e < r.rows) {
        const uint64_t s0 = r.src + e * r.spitch, d0 = r.dst + e * r.dpitch;
        if (s0 < sb || s0 + r.width > sb + ss || d0 < db || d0 + r.width > db + ds) break;
        ++e;
      }
      if (e == k) e = k + 1;  // the row itself straddles its allocation: a plain copy of that row
      piece.rows = e - k;
      out.push_back(plain(piece));
      k = e;
    }
  }
  return out;
}

}  // namespace tide
