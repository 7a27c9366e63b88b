// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Which waits of a comm's last all-gather and reduce-scatter have not been satisfied: read from their step programs
// and the flag words (nothing here re-derives the protocol). For tideCommDebugDump and tideCommGetPendingWaits.
#ifndef TIDE_CUDA_PENDING_H_
#define TIDE_CUDA_PENDING_H_

#include <cstdint>
#include <vector>

#include "comm.h"

namespace tide {
namespace cuda {

struct PendingWait {
  int collective = 0;  // 0 all-gather, 1 reduce-scatter
  int lane = 0;        // 0 the caller's stream, 1 the comm's internal stream
  int step = 0;        // program step index
  int owner = 0;       // whose flag word
  int word = 0;
  int writer = 0;      // the rank that writes the value waited for
  uint32_t expected = 0, seen = 0;
  char name[24] = {0};  // agReady, agDone[s], rsEnter, rsConsumed, rsPushDone, rsFull[s], rsPrev, rsFinal, ...
};

// The first unreached wait on each lane of the last AG and RS (a stream runs in order: it is stuck at its first
// unreached wait). words: every rank's flag array, rank-major (flag::kWords per rank). Caller holds comm->mu.
void pendingWaits(const tideComm* comm, const std::vector<uint32_t>& words, std::vector<PendingWait>* out);

// The short name of a flag word (PendingWait::name).
void shortWordName(int word, int ranksPerNode, char* buf, size_t len);

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_PENDING_H_
