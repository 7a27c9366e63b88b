// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Eager calls as graph replays: the two decisions of eager_route.h.
#include "eager_route.h"

namespace tide {
namespace prog {

bool eagerUsesTokens(const RouteInputs& in) {
  if (!in.enabled || !in.providerCapturable || in.nNodes != 1) return false;
  if (in.coll == Coll::kAllGather) return true;
  // Up to 2 chunks one staging buffer per chunk (rs_plan.cc): no push waits for a reduction. More (when
  // NCCL_TIDE_TOKEN_RS_CHUNKS allows): 2 buffers behind consumed tokens (docs/architecture.md "CUDA graphs").
  const int most = in.rsTokenMaxChunks > 2 ? in.rsTokenMaxChunks : 2;
  return in.rsNumChunks >= 1 && in.rsNumChunks <= most;
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
