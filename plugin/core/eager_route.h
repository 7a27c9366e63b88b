// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Eager calls as graph replays (docs/architecture.md "CUDA graphs", "Eager calls as graph replays").
//
// Two decisions, kept apart because they have different scopes:
//   * eagerUsesTokens: which wire protocol an eager call uses (the epoch words of the eager programs, or the
//     replay-safe token words of prog::Mode::kCaptured). It must come out the same on every rank for a given call,
//     so it reads only what all ranks agree on: the switch (NCCL_TIDE_EAGER_GRAPHS, part of the layout agreement),
//     the provider kind and the layout (its node split and RS plan, all part of the layout hash).
//   * GraphAmortizer::next: how this rank issues a token program it has bound (directly on the stream, by capturing
//     it into a CUDA graph first, or by replaying that graph). Purely local: a replay and a direct issue put the same
//     operations on the stream in the same order, so ranks may choose differently for the same call.
#ifndef TIDE_CORE_EAGER_ROUTE_H_
#define TIDE_CORE_EAGER_ROUTE_H_

#include <cstdint>

#include "program.h"

namespace tide {
namespace prog {

struct RouteInputs {
  bool enabled = false;             // NCCL_TIDE_EAGER_GRAPHS
  bool providerCapturable = false;  // Provider::Traits::capturable: the provider can run kCaptured programs
  Coll coll = Coll::kAllGather;
  int nNodes = 1;                   // the layout's
  int rsNumChunks = 1;              // the layout's RS plan (tideLayoutInfo_t.rsNumChunks)
  int rsTokenMaxChunks = 2;         // NCCL_TIDE_TOKEN_RS_CHUNKS (part of the layout agreement)
};

// True if an eager call with these inputs runs the token (kCaptured) program. The covered programs are exactly those
// compileAllGather / compileReduceScatter accept in kCaptured mode: one node; RS with at most rsTokenMaxChunks chunks
// (up to 2 the RS plan has one staging buffer per chunk; beyond, 2 buffers behind consumed tokens), own staging or
// Slot-Reuse (both are bound at call time, outside any capture).
bool eagerUsesTokens(const RouteInputs& in);

// Per bound token program (same layout, pointers, staging): when to capture. The first call with a given set of
// call values (RS: output type, op, scale) issues directly; the second consecutive call with the same values
// captures and replays; later ones replay while the values stay those of the graph. A call with other values issues
// directly and counts as a first call of its values (the graph is recaptured only if they repeat). After a capture
// failure the program is never captured again (direct issue: the same protocol).
class GraphAmortizer {
 public:
  enum class Issue { kDirect, kCapture, kReplay };
  // valuesKey: a digest of the call values baked into a graph (0 for AG). Updates the state for this call.
  Issue next(uint64_t valuesKey);
  // The capture (or instantiation) failed: direct issue from now on.
  void captureFailed() { failed_ = true; haveGraph_ = false; }
  bool hasGraph() const { return haveGraph_; }

 private:
  bool failed_ = false;
  bool haveGraph_ = false;
  uint64_t graphKey_ = 0;   // the values the graph was captured with
  bool haveLast_ = false;
  uint64_t lastKey_ = 0;    // the previous call's values
};

}  // namespace prog
}  // namespace tide

#endif  // TIDE_CORE_EAGER_ROUTE_H_
