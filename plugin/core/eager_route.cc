// Eager calls as graph replays: the two decisions of eager_route.h.
#include "eager_route.h"

namespace tide {
namespace prog {

bool eagerUsesTokens(const RouteInputs& in) {
  if (!in.enabled || !in.providerCapturable || in.nNodes != 1) return false;
  if (in.coll == Coll::kAllGather) return true;
  // At most 2 chunks: one staging buffer per chunk (rs_plan.cc), so no push waits for a reduction
  // (docs/architecture.md "CUDA graphs").
  return in.rsNumChunks >= 1 && in.rsNumChunks <= 2;
}

GraphAmortizer::Issue GraphAmortizer::next(uint64_t valuesKey) {
  const bool repeat = haveLast_ && lastKey_ == valuesKey;
  haveLast_ = true;
  lastKey_ = valuesKey;
  if (failed_) return Issue::kDirect;
  if (haveGraph_ && graphKey_ == valuesKey) return Issue::kReplay;
  if (!repeat) return Issue::kDirect;
  // The caller captures now; on failure it calls captureFailed().
  haveGraph_ = true;
  graphKey_ = valuesKey;
  return Issue::kCapture;
}

}  // namespace prog
}  // namespace tide
