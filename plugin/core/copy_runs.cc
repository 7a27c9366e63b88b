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

}  // namespace tide
