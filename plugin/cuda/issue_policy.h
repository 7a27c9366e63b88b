// Issue policy of one rank: when its step programs' work is enqueued, what is checked before, whether a new layout
// is agreed on with the peers, what may be captured into CUDA graphs, and which InterNodeTransport carries the
// operations that cross a node boundary.
//
// One object per rank of a comm, its rank bound at construction (tideComm::policy), next to the rank's PeerMemory
// (peer_memory.h): the memory says where bytes live, the policy how the work on them is issued. The defaults are
// those of a provider with one rank per process and its own copy-engine queues (IPC); the loopback provider (virtual
// ranks sharing one device's queues) overrides most of them.
#ifndef TIDE_CUDA_ISSUE_POLICY_H_
#define TIDE_CUDA_ISSUE_POLICY_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "tide.h"

namespace tide {
namespace cuda {

class InterNodeTransport;

// Kinds of collective, keys of the per-epoch bookkeeping (deferred issue, loopback stream and capture checks).
enum class CollKind { kAllGather = 0, kReduceScatter = 1 };

class IssuePolicy {
 public:
  virtual ~IssuePolicy() = default;

  // The provider's name, as PeerMemory::name (a provider implementing both has one override for both).
  virtual const char* name() const = 0;

  // True (loopback): step programs are compiled in prog::Mode::kDeferred, and their issue groups are handed to
  // scheduleSteps. False (default): every step is issued at call time in program order (kInOrder).
  virtual bool defersPushes() const { return false; }

  using IssueFn = std::function<tideResult_t(int group)>;
  // Deferred issue: issue(k) for k = 0 .. numSteps (inclusive) enqueues issue group k of this rank's program of
  // collective (kind, epoch). Called only if defersPushes(). A provider whose ranks share copy-engine queues
  // (loopback) issues the steps of all ranks step-major, rank-minor, once every rank has submitted: steps are
  // numbered so that a copy of step k only ever waits (through flags) for work of steps < k of any rank, or of step
  // k of a lower rank, so no copy is queued behind a copy it waits for. Default: all now, in order.
  virtual tideResult_t scheduleSteps(CollKind kind, uint64_t epoch, int numSteps, IssueFn issue) {
    (void)kind;
    (void)epoch;
    for (int k = 0; k <= numSteps; ++k) {
      tideResult_t r = issue(k);
      if (r != tideSuccess) return r;
    }
    return tideSuccess;
  }

  // Called before a deferred program's call-time steps are enqueued: fails (enqueueing nothing) if the groups could
  // not be issued later (loopback: the world is unusable, or an earlier rank of (kind, epoch) has another group
  // count, which then makes the world unusable). tokens: the program is a token program issued in rounds
  // (BoundProgram::issueTokens), whose later rounds must be issued before this rank's next collective enqueues
  // anything (loopback: checkStream refuses that next call while the rounds are held). Default: nothing to check.
  virtual tideResult_t precheckSteps(CollKind kind, uint64_t epoch, int numSteps, bool tokens) {
    (void)kind;
    (void)epoch;
    (void)numSteps;
    (void)tokens;
    return tideSuccess;
  }

  // An eager call of (kind, epoch) failed after the rank's epoch advanced (while its work was being enqueued, or in
  // the provider's deferred issue): part of it may be queued, and the peers' matching calls would wait for the rest.
  // Loopback: the whole world becomes unusable (every later call of any virtual rank fails with the reason). Default:
  // nothing (the comm itself refuses later calls: tideComm::broken).
  virtual void callFailed(CollKind kind, uint64_t epoch, const char* why) {
    (void)kind;
    (void)epoch;
    (void)why;
  }

  // The transport of cross-node operations (internode_transport.h). Default: the peer-mapped one, valid where
  // PeerMemory::peerMapsAllRanks(); a provider spanning hosts returns its NCCL transport (not built yet).
  virtual InterNodeTransport* transport();

  // Collective agreement on a layout the comm has not used before (called by every rank at the same call, because
  // every rank makes the same collective calls in the same order): tideMismatch on every rank if the ranks' layout
  // hashes differ. This holds when every rank's layout is new to it (the usual mismatch: ranks built their layouts
  // differently). A rank whose layout is new while a peer's is one they agreed on before waits alone in the
  // exchange, bounded only by NCCL_TIDE_TIMEOUT_MS (docs/reliability.md). Default: nothing to compare (loopback: one
  // process, one layout object per rank, ranks submit one after another, so there is no point at which they could
  // wait for each other).
  // eagerGraphs, tokenRsChunks: this rank's NCCL_TIDE_EAGER_GRAPHS and NCCL_TIDE_TOKEN_RS_CHUNKS (they pick the wire
  // protocol of eager calls, so they are agreed with the layout; a mismatch report names them).
  virtual tideResult_t agreeOnLayout(uint64_t layoutHash, bool eagerGraphs, int tokenRsChunks) {
    (void)layoutHash;
    (void)eagerGraphs;
    (void)tokenRsChunks;
    return tideSuccess;
  }

  // True if agreeOnLayout exchanges with the other ranks (IPC: over NCCL or the bootstrap). Such an exchange cannot
  // run inside a CUDA graph capture (it synchronizes), so a captured call with a layout this comm has not agreed on
  // yet is refused at capture time (layoutEntry); the first eager call with the layout agrees on it.
  virtual bool agreementExchanges() const { return false; }

  // True if this rank's collectives may be captured into CUDA graphs (the kCaptured programs; checked first), and
  // then also whether its eager calls of such programs take the token protocol (NCCL_TIDE_EAGER_GRAPHS; the same on
  // every rank of a comm, since all share the provider). Default false: refused at capture time, eager calls on the
  // epoch protocol. Loopback and IPC: true.
  virtual bool capturable() const { return false; }

  // Check of a collective enqueued into the stream capture `captureId` (cudaStreamGetCaptureInfo) by this rank,
  // after every other check, immediately before the captured enqueue. Loopback: each virtual rank captures into its
  // own graph, at most one TIDE collective per graph (tideUnsupported otherwise: its ranks share the device's
  // copy-engine queues and a graph launch enqueues a rank's whole graph at once). Default: nothing to check (one
  // rank per process, its own queues: a graph may hold several TIDE collectives).
  virtual tideResult_t checkCapture(CollKind kind, unsigned long long captureId) {
    (void)kind;
    (void)captureId;
    return tideSuccess;
  }

  // Per-call check of the stream this rank uses for an eager collective epoch, before anything is enqueued and
  // before the rank's epoch advances (loopback: each virtual rank needs a stream of its own, never the legacy default
  // stream, and no token call of this rank may still be held for a peer: checkCallOrder; IPC: the parent NCCL
  // communicator's health). Default: nothing to check.
  virtual tideResult_t checkStream(CollKind kind, uint64_t epoch, cudaStream_t stream) {
    (void)kind;
    (void)epoch;
    (void)stream;
    return tideSuccess;
  }
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_ISSUE_POLICY_H_
