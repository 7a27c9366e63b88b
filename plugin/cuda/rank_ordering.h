// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Ordering between ranks, one of a provider's two interfaces (provider.h): the flag arrays the ranks' steps write and
// wait on, the agreement on a new layout, the check before each eager call, the local abort, and the hook of ranks
// that share one device's hardware queues (shared_queues.h). Called by the program interpreter (program_exec.cc:
// flag addresses, shared issue), layoutEntry and markCallFailed (comm.h), the executors (ag_executor.cc,
// rs_executor.cc: the per-call check) and the public calls tideCommAbort and tideCommDebugDump.
//
// Internal to the library (C++, not part of include/tide.h, loaded by nothing outside it): no ABI version; a new
// implementation is built into the library.
#ifndef TIDE_CUDA_RANK_ORDERING_H_
#define TIDE_CUDA_RANK_ORDERING_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "../core/program.h"
#include "tide.h"

namespace tide {
namespace cuda {

// Flag words of one rank (uint32 each, zero at creation): defined once, with the programs that use them
// (plugin/core/program.h; their meaning in docs/architecture.md "Step programs").
namespace flag = ::tide::prog::word;

// Kinds of collective, keys of the per-epoch bookkeeping (deferred issue, loopback stream and capture checks).
enum class CollKind { kAllGather = 0, kReduceScatter = 1 };

class SharedQueues;

class RankOrdering {
 public:
  // Device address of `owner`'s flag array (flag::kWords words), as seen by this rank; nullptr for an owner this rank
  // does not map (another node, without Provider::Traits::peerMapsAllRanks).
  virtual uint32_t* flags(int owner) = 0;

  // Collective agreement on a layout the comm has not used before (called by every rank at the same call, because
  // every rank makes the same collective calls in the same order): tideMismatch on every rank if the ranks' layout
  // hashes differ. This holds when every rank's layout is new to it (the usual mismatch: ranks built their layouts
  // differently). A rank whose layout is new while a peer's is one they agreed on before waits alone in the
  // exchange, bounded only by NCCL_TIDE_TIMEOUT_MS (docs/reliability.md). A provider that cannot disagree with
  // itself (loopback: one process, one layout object per rank) returns tideSuccess.
  // eagerGraphs, tokenRsChunks: this rank's NCCL_TIDE_EAGER_GRAPHS and NCCL_TIDE_TOKEN_RS_CHUNKS (they pick the wire
  // protocol of eager calls, so they are agreed with the layout; a mismatch report names them).
  virtual tideResult_t agreeOnLayout(uint64_t layoutHash, bool eagerGraphs, int tokenRsChunks) = 0;

  // Per-call check of an eager collective epoch on `stream`, before anything is enqueued and before the rank's epoch
  // advances (IPC: the parent NCCL communicator's health; loopback: a stream of the rank's own and the call order of
  // its token calls). Captured calls skip it.
  virtual tideResult_t checkStream(CollKind kind, uint64_t epoch, cudaStream_t stream) = 0;

  // tideCommAbort of this rank: local, non-collective teardown (no exchange with peers, now or at destruction); the
  // device's queued work is waited for at most boundMs. What else it releases or breaks is the provider's (IPC: this
  // rank's mappings of the peers' memory; loopback: the whole world becomes unusable). Returns true if the device
  // went idle; false: the memory is left to process exit (a cudaFree would wait for the stuck work).
  virtual bool abort(uint64_t boundMs) = 0;

  // Optional. The ranks of this provider share one device's copy-engine queues (the loopback stand-in): their issue
  // is interleaved through this hook (shared_queues.h). nullptr (the default): every step is issued at call time in
  // program order, and a CUDA graph may hold several TIDE collectives.
  virtual SharedQueues* sharedQueues() { return nullptr; }

 protected:
  ~RankOrdering() = default;
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_RANK_ORDERING_H_
