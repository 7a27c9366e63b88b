// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The provider of one rank of a comm: where the rank's memory for peers lives (slots, own RS staging, flags), how it
// addresses the other ranks' copies, and the checks a provider makes around each call. tideComm holds one per rank (comm.h); the executors (ag_executor.cc,
// rs_executor.cc) and the program interpreter (program_exec.cc) see only this interface.
//
// Built: IpcProvider (one rank per process, CUDA IPC; ipc_provider.h), WindowProvider (one rank per process, NCCL
// windows; window_provider.h) and LoopbackRank (a virtual rank of a single-process world on one device;
// loopback.h). The interface is internal to the library (C++, not part of include/tide.h): it carries no ABI
// version, and a new provider is built into the library.
//
// Required core: memory for peers (slotAlloc .. zeros), flags, the layout agreement, the per-call check and abort.
// Optional: multicastPtr (NVLink multicast addresses), and sharedQueues, the one hook of a provider whose ranks share
// one device's hardware queues (the loopback stand-in) and so must interleave their issue.
#ifndef TIDE_CUDA_PROVIDER_H_
#define TIDE_CUDA_PROVIDER_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

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

class Provider {
 public:
  // What a provider can do, fixed at its creation.
  struct Traits {
    // Its collectives may be captured into CUDA graphs (the kCaptured programs), and then its eager calls of such
    // programs take the token protocol when NCCL_TIDE_EAGER_GRAPHS is on. False: refused at capture time, eager calls
    // on the epoch protocol.
    bool capturable = false;
    // agreeOnLayout exchanges with the other ranks. Such an exchange cannot run inside a CUDA graph capture (it
    // synchronizes), so a captured call with a layout this comm has not agreed on yet is refused at capture time
    // (layoutEntry); the first eager call with the layout agrees on it.
    bool agreementExchanges = false;
    // Every rank can address every other rank's slots, staging and flags. Then a layout may split the ranks into any
    // number of (virtual) nodes, the inter-node stage running over the peer-mapped transport. False: a rank maps only
    // the ranks of its own node (nodeRanks), and steps between nodes go through NCCL (the comm's sendrecv transport,
    // plugin/core/internode.h).
    bool peerMapsAllRanks = true;
  };

  virtual ~Provider() = default;

  // "loopback", "ipc", "window": tideCommGetProvider, the debug dump, error messages.
  const char* name() const { return name_; }
  const Traits& traits() const { return traits_; }
  // The provider's node size: ranks r and q are on one node exactly when r / nodeRanks() == q / nodeRanks() (IPC:
  // NCCL's hosts or NCCL_TIDE_RANKS_PER_NODE, plugin/core/node_map.h); 0: no node split of its own (loopback: one
  // device). Without peerMapsAllRanks, peers on other nodes have no address here: peerPtr fails and flags returns
  // nullptr for them (two-sided programs never address them).
  int nodeRanks() const { return nodeRanks_; }

  // --- Memory for peers ---

  // Bound programs keep peer addresses resolved through peerPtr, and this is part of their cache key. It changes
  // whenever a slot of any rank that shares it is allocated or freed (slotAlloc / slotFree change it on entry, also
  // when they fail): loopback ranks share one counter, since one virtual rank's free changes what the others'
  // peerPtr resolves.
  virtual uint64_t memoryGeneration() const = 0;

  // Collective slot allocation (same order and sizes on every rank).
  virtual tideResult_t slotAlloc(size_t bytes, void** ptr) = 0;
  virtual tideResult_t slotFree(void* ptr) = 0;

  // Address, as seen by this rank, of peer `peer`'s copy of the slot region [local, local + bytes) of this rank.
  // tideInvalidArgument if the region is not inside one of this rank's slots (what names the argument);
  // tideInvalidUsage if the peer has not (yet) allocated the matching slot.
  virtual tideResult_t peerPtr(const void* local, size_t bytes, int peer, const char* what, void** out) = 0;

  // The provider's own RS staging buffer of `owner` (at least `bytes`) for the RS epoch `epoch`, as seen by this
  // rank. Every rank of one epoch gets the same buffers. Errors: tideOutOfMemory, tideMismatch (ranks disagree on
  // size).
  virtual tideResult_t ownStaging(int owner, uint64_t bytes, uint64_t epoch, void** out) = 0;

  // Device buffer of zeros (at least *bytes long) that a copy engine reads to fill padding.
  virtual const void* zeros(size_t* bytes) = 0;

  // --- Flags ---

  // Device address of `owner`'s flag array (flag::kWords words), as seen by this rank; nullptr for an owner this rank
  // does not map (another node, without peerMapsAllRanks).
  virtual uint32_t* flags(int owner) = 0;

  // --- Around each call ---

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

  // --- Optional ---

  // NVLink multicast address of the slot region, or nullptr (the default: no provider built so far has one; the
  // window provider does not ask NCCL for ncclGetLsaMultimemDevicePointer, and TIDE never creates multicast
  // objects). Before a provider returns one: the multicast program copies each shard to its multicast position,
  // which covers the rank's own position too, so an in-place shard (the FSDP2 glue's cast in place) would be copied
  // onto itself; ag_executor.cc must then keep such calls on unicast copies (and test it on a provider that has one).
  virtual void* multicastPtr(const void* local, size_t bytes) {
    (void)local;
    (void)bytes;
    return nullptr;
  }

  // The ranks of this provider share one device's copy-engine queues (the loopback stand-in): their issue is
  // interleaved through this hook (below). nullptr (the default): every step is issued at call time in program
  // order, and a CUDA graph may hold several TIDE collectives.
  virtual SharedQueues* sharedQueues() { return nullptr; }

 protected:
  Provider(const char* name, Traits traits) : name_(name), traits_(traits) {}
  // While the provider is being created (its node split is known only after the ranks' exchange): the node size, and
  // whether ranks on other nodes are mapped too.
  void setNodes(int nodeRanks, bool peerMapsAllRanks) {
    nodeRanks_ = nodeRanks;
    traits_.peerMapsAllRanks = peerMapsAllRanks;
  }

 private:
  const char* const name_;
  Traits traits_;
  int nodeRanks_ = 0;
};

// What only a provider whose ranks share one device's hardware queues needs (Provider::sharedQueues): a copy
// queued behind a copy it waits for (through flags) would never run, so the ranks' steps are issued step-major,
// rank-minor once every rank has submitted, and what could break that order is refused or makes the world unusable.
class SharedQueues {
 public:
  using IssueFn = std::function<tideResult_t(int group)>;

  // Step programs are compiled in prog::Mode::kDeferred and their issue groups handed to scheduleSteps:
  // issue(k) for k = 0 .. numSteps (inclusive) enqueues issue group k of this rank's program of collective
  // (kind, epoch). Steps are numbered so that a copy of step k only ever waits (through flags) for work of steps < k
  // of any rank, or of step k of a lower rank, so no copy is queued behind a copy it waits for.
  virtual tideResult_t scheduleSteps(CollKind kind, uint64_t epoch, int numSteps, IssueFn issue) = 0;

  // Called before a deferred program's call-time steps are enqueued: fails (enqueueing nothing) if the groups could
  // not be issued later (the world is unusable, or an earlier rank of (kind, epoch) has another group count, which
  // then makes the world unusable). tokens: the program is a token program issued in rounds
  // (BoundProgram::issueTokens), whose later rounds must be issued before this rank's next collective enqueues
  // anything (checkStream refuses that next call while the rounds are held).
  virtual tideResult_t precheckSteps(CollKind kind, uint64_t epoch, int numSteps, bool tokens) = 0;

  // An eager call of (kind, epoch) failed after the rank's epoch advanced (while its work was being enqueued, or in
  // the deferred issue): part of it may be queued, and the peers' matching calls would wait for the rest. The whole
  // world becomes unusable (every later call of any rank fails with the reason).
  virtual void callFailed(CollKind kind, uint64_t epoch, const char* why) = 0;

  // Check of a collective enqueued into the stream capture `captureId` (cudaStreamGetCaptureInfo) by this rank,
  // after every other check, immediately before the captured enqueue: each rank captures into its own graph, with
  // at most one TIDE collective per graph (tideUnsupported otherwise: a graph launch enqueues a rank's whole graph at
  // once).
  virtual tideResult_t checkCapture(CollKind kind, unsigned long long captureId) = 0;

 protected:
  ~SharedQueues() = default;
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_PROVIDER_H_
