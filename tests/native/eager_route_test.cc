// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Host-only checks of the eager graph route's two decisions (plugin/core/eager_route.h), run by
// tests/unit/test_eager_route.py. Exit 0 and "all checks passed" when every check holds; each failure prints
// "FAIL: ...".
#include <cstdio>
#include <vector>

#include "eager_route.h"

using namespace tide::prog;

namespace {

int g_failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAIL: %s\n", what);
    ++g_failures;
  }
}

RouteInputs base(Coll c) {
  RouteInputs in;
  in.enabled = true;
  in.providerCapturable = true;
  in.coll = c;
  in.nNodes = 1;
  in.rsNumChunks = 1;
  return in;
}

void decisionTable() {
  check(eagerUsesTokens(base(Coll::kAllGather)), "single-node AG takes tokens");
  check(eagerUsesTokens(base(Coll::kReduceScatter)), "single-node RS of 1 chunk takes tokens");
  RouteInputs in = base(Coll::kReduceScatter);
  in.rsNumChunks = 2;
  check(eagerUsesTokens(in), "RS of 2 chunks takes tokens");
  in.rsNumChunks = 3;
  check(!eagerUsesTokens(in), "RS of 3 chunks keeps the epoch protocol");
  in.rsNumChunks = 4;
  check(!eagerUsesTokens(in), "RS of 4 chunks keeps the epoch protocol");
  // NCCL_TIDE_TOKEN_RS_CHUNKS raised: RSs up to the limit take tokens (2 buffers behind consumed tokens).
  in = base(Coll::kReduceScatter);
  in.rsTokenMaxChunks = 4;
  in.rsNumChunks = 3;
  check(eagerUsesTokens(in), "limit 4: RS of 3 chunks takes tokens");
  in.rsNumChunks = 4;
  check(eagerUsesTokens(in), "limit 4: RS of 4 chunks takes tokens");
  in.rsNumChunks = 5;
  check(!eagerUsesTokens(in), "limit 4: RS of 5 chunks keeps the epoch protocol");
  in.rsTokenMaxChunks = 1;  // below 2 means 2: RSs of 1-2 chunks always could take tokens
  in.rsNumChunks = 2;
  check(eagerUsesTokens(in), "limit below 2: RS of 2 chunks takes tokens");
  in.rsNumChunks = 0;
  check(!eagerUsesTokens(in), "RS of 0 chunks (no plan) keeps the epoch protocol");
  in = base(Coll::kAllGather);
  in.rsNumChunks = 9;  // an AG does not care about the RS plan
  check(eagerUsesTokens(in), "AG takes tokens whatever the RS chunks");
  for (Coll c : {Coll::kAllGather, Coll::kReduceScatter}) {
    in = base(c);
    in.enabled = false;
    check(!eagerUsesTokens(in), "switch off: epoch protocol");
    in = base(c);
    in.providerCapturable = false;
    check(!eagerUsesTokens(in), "a provider that cannot capture: epoch protocol");
    in = base(c);
    in.nNodes = 2;
    check(!eagerUsesTokens(in), "several nodes: epoch protocol");
  }
}

using Issue = GraphAmortizer::Issue;

void amortizer() {
  {
    GraphAmortizer a;
    check(a.next(0) == Issue::kDirect, "1st call direct");
    check(!a.hasGraph(), "no graph after the 1st call");
    check(a.next(0) == Issue::kCapture, "2nd call with the same values captures");
    check(a.hasGraph(), "graph after the capture");
    for (int i = 0; i < 5; ++i) check(a.next(0) == Issue::kReplay, "later calls replay");
  }
  {
    GraphAmortizer a;  // values change: direct, and recapture only when the new values repeat
    check(a.next(1) == Issue::kDirect, "values 1: direct");
    check(a.next(1) == Issue::kCapture, "values 1 again: capture");
    check(a.next(2) == Issue::kDirect, "values 2: direct (the graph has values 1)");
    check(a.next(1) == Issue::kReplay, "values 1: replay the graph");
    check(a.next(2) == Issue::kDirect, "values 2 after 1: direct");
    check(a.next(2) == Issue::kCapture, "values 2 twice: recapture");
    check(a.next(2) == Issue::kReplay, "values 2: replay");
    check(a.next(1) == Issue::kDirect, "values 1: the old graph is gone");
  }
  {
    GraphAmortizer a;  // alternating values never capture (no repeat), never replay
    for (int i = 0; i < 6; ++i) check(a.next(i % 2) == Issue::kDirect, "alternating values: direct");
  }
  {
    GraphAmortizer a;  // a capture failure: direct forever
    (void)a.next(0);
    check(a.next(0) == Issue::kCapture, "capture");
    a.captureFailed();
    check(!a.hasGraph(), "no graph after a failed capture");
    for (int i = 0; i < 4; ++i) check(a.next(0) == Issue::kDirect, "after a failure: direct");
  }
}

}  // namespace

int main() {
  decisionTable();
  amortizer();
  if (g_failures == 0) printf("all checks passed\n");
  return g_failures == 0 ? 0 : 1;
}
