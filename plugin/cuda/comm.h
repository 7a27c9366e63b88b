// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The communicator handle of include/tide.h for the CUDA data path, and the per-layout facts the executors derive
// (read through the public layout queries, cached per layout handle).
#ifndef TIDE_CUDA_COMM_H_
#define TIDE_CUDA_COMM_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../core/internode.h"
#include "../nccl/nccl_lib.h"
#include "internode_transport.h"
#include "peer_regions.h"
#include "provider.h"
#include "reduce_kernel.h"
#include "tide.h"

namespace tide {
namespace cuda {

class BoundProgram;
struct ExecCache;

// What the executors need of a layout, fetched once per layout handle.
struct LayoutView {
  tideLayoutInfo_t info{};
  std::vector<tideParamInfo_t> params;
  size_t maxElemSize = 0;
  bool uniformDtype = true;  // every parameter has params[0].dtype
};

}  // namespace cuda
}  // namespace tide

// What a tideComm_t refers to: the handle is a registry key (core/handles.h), never this object's address. Entry
// points hold a shared reference for the duration of a call, lock `mu`, and refuse the call if `closed` (destroyed
// or aborted by another thread meanwhile); the object itself is freed when the last reference goes.
struct tideComm {
  ~tideComm();
  int rank = 0;
  int worldSize = 0;
  int device = 0;
  // Ranks per node as this comm sees its world, set by commInit: the provider's node size (Provider::nodeRanks: IPC
  // follows NCCL's hosts or NCCL_TIDE_RANKS_PER_NODE), else NCCL_TIDE_RANKS_PER_NODE if set (virtual nodes; it must
  // divide the world size), else the world size. A layout carries its own ranksPerNode: on a provider whose ranks all
  // map each other's memory (Provider::Traits::peerMapsAllRanks) any split of the world runs; otherwise a layout's
  // node must lie within one of the comm's nodes (checkLayoutAndStream).
  int ranksPerNode = 0;
  // The NCCL communicator the comm was created on (tideCommCreate) and the process's NCCL, through which the
  // sendrecv transport issues its p2p groups (plugin/nccl/p2p_group.h). Null for loopback and bootstrap comms.
  const tide::nccl::Lib* ncclLib = nullptr;
  tide::nccl::ncclComm_t ncclComm = nullptr;
  // What carries the steps between TIDE nodes, chosen once by commInit (plugin/core/internode.h): the programs of
  // layouts of several nodes are compiled one-sided (peer-mapped) or two-sided (sendrecv) accordingly, and their
  // cross-node operations go through `transport` (internode_transport.h), made for that choice.
  tide::internode::Transport interNode = tide::internode::Transport::kPeerMapped;
  std::unique_ptr<tide::cuda::InterNodeTransport> transport;
  // This rank's provider (provider.h), bound to `rank`: where its memory lives, its flags, and the checks around each
  // call (IPC: the rank's own; loopback: one view of the shared world).
  std::shared_ptr<tide::cuda::Provider> provider;
  // Application buffers the node's ranks already map to each other (peer_regions.h): slotRegion resolves them too.
  tide::cuda::PeerRegions peerRegions;

  // Per-comm sequence numbers; every rank makes the same calls in the same order, so they agree across ranks.
  uint64_t agEpoch = 0;
  uint64_t rsEpoch = 0;
  uint64_t rsChunkSeq = 0;  // global RS chunk counter (flag values)

  // The last AG and RS this comm issued (the bound program and its call values), for tideCommDebugDump and
  // tideCommGetPendingWaits: the report walks the program's waits against the flags (nothing re-derives them).
  struct LastCall {
    std::shared_ptr<tide::cuda::BoundProgram> bound;
    uint64_t epoch = 0;
    uint64_t task = 0;
  };
  LastCall lastAg, lastRs;
  // Where the host thread is inside a TIDE call on this comm ("idle" between calls): a static string, readable
  // from another thread while a call is stuck (tideCommDebugDump).
  std::atomic<const char*> phase{"idle"};

  // The internal lane of step programs (RS pushes; deferred multi-node work), ordered against the caller's stream
  // by flags only (docs/architecture.md "Step programs").
  cudaStream_t sideStream = nullptr;
  // Eager calls as graph replays (docs/architecture.md "Eager calls as graph replays"): NCCL_TIDE_EAGER_GRAPHS, read
  // once by commInit (part of the layout agreement: it picks the wire protocol), and the private stream the library
  // captures its own graphs on (created at the first capture, so that it takes no hardware queue from the streams
  // created with the comm; it never runs work). The graphs live with their bound programs (ExecCache).
  bool eagerGraphs = false;
  // NCCL_TIDE_TOKEN_RS_CHUNKS, read once by commInit (agreed with the layout, as eagerGraphs): the most RS chunks a
  // token program (eager route or capture) may have.
  int tokenRsChunks = 2;
  // Token programs pair their barrier tokens (prog::Options::pairTokens): params::pairTokens() and the device's
  // 64-bit stream memory operations, read once by commInit. Local: no other rank needs to agree.
  bool pairTokens = false;
  cudaStream_t captureStream = nullptr;
  // A captured token program on two lanes (RS of more chunks than staging buffers: docs/architecture.md "More
  // chunks than buffers") forks its internal lane onto a private side stream inside the capture and joins it back
  // with these two events (captureForkOf: created at the first such capture). A side stream never runs work; once
  // joined to a capture it belongs to that capture until the capture ends (a user's may stay open across calls), so
  // a capture takes a side stream that is in no capture or already in its own, and a new one is made otherwise.
  std::vector<cudaStream_t> captureSides;
  cudaEvent_t forkEvent = nullptr, joinEvent = nullptr;
  // The NVLink multicast gate (docs/env.md, "The multicast gate"), read once by commInit.
  bool multicastGate = false;
  // What the RS reduce kernel keeps pace with (NCCL_TIDE_LINK_GBPS, the device's SMs), read once by commInit.
  tide::cuda::ReducePace reducePace;
  // tideCommDebugDump's flag readback stream, created once by commInit (a stream created per dump can land on a
  // hardware queue that a stuck wait blocks). After a readback that did not finish in time it is abandoned (its
  // helper thread may still use it: never destroyed) and the dumps fall back to a fresh stream each.
  cudaStream_t dumpStream = nullptr;
  std::atomic<bool> dumpStreamStuck{false};

  std::mutex mu;  // one call at a time per comm
  bool closed = false;  // under mu: tideCommDestroy/tideCommAbort released it (calls that still hold it fail)
  // Under mu. Non-empty: why this comm is unusable (an eager call failed after its epoch advanced, with part of it
  // possibly enqueued: markCallFailed). Every later AG/RS fails with it (checkUsable) instead of pairing with the
  // peers' calls out of step, or waiting for writes that will never come.
  std::string broken;
  std::vector<uintptr_t> keyScratch;  // the binding key of the current call (reused: no allocation per call)
  std::vector<char*> stagingScratch;  // RS own staging of every rank, as this rank addresses it
  struct CacheEntry {
    uint64_t hash;
    std::shared_ptr<const tide::cuda::LayoutView> view;
    std::shared_ptr<tide::cuda::ExecCache> exec;  // compiled programs and bound pointer sets of this layout
  };
  std::unordered_map<const void*, CacheEntry> layoutCache;
  // Layout hashes every rank has agreed on (RankOrdering::agreeOnLayout), keyed by hash rather than by handle, so
  // a rank that recreates an identical layout object does not start an exchange its peers do not make.
  std::unordered_set<uint64_t> agreedLayouts;
};

namespace tide {
namespace cuda {

using CommRef = std::shared_ptr<tideComm>;

// Registers a new comm (fully initialized) and returns its public handle.
tideComm_t registerComm(std::unique_ptr<tideComm> comm);
// Looks up a handle: tideInvalidArgument naming it when NULL, destroyed, garbage or of another type; tideInvalidUsage
// when it has no provider. Does not lock the comm.
tideResult_t checkComm(tideComm_t handle, const char* fn, CommRef* out);
// With comm->mu held: tideInvalidArgument if another thread destroyed or aborted the comm meanwhile.
tideResult_t checkOpen(const tideComm* comm, tideComm_t handle, const char* fn);

// Creates the comm's internal stream and events (on the provider's device), reads the comm's parameters and chooses
// and makes its inter-node transport (one INFO line saying which and why; tideUnsupported if NCCL_TIDE_INTERNODE asks
// for one this comm cannot have). The provider, and for a comm on an NCCL communicator ncclLib / ncclComm, are set
// before.
tideResult_t commInit(tideComm* comm);

// Whether this rank addresses rank `peer`'s memory and flags (the provider maps every rank, or peer is on its node).
bool mapsPeer(const tideComm* comm, int peer);

// The programs' transport option for this comm (prog::Options::transport).
prog::Transport programTransport(const tideComm* comm);
// Releases the internal stream/events (the caller synchronized first). The debug-dump stream goes with the object
// (~tideComm), since a tideCommDebugDump on another thread may still hold the comm.
void commRelease(tideComm* comm);

// Cached view of `layout` for this comm (validates nothing about the comm). The first use of a layout's hash agrees
// on it across ranks (RankOrdering::agreeOnLayout); while capturing (`capturing`), a layout that still needs an
// exchanging agreement is refused with tideUnsupported (the capture stays valid).
// The cache entry is owned by the comm (valid until the next call on this comm).
tideResult_t layoutEntry(tideComm* comm, tideLayout_t layout, bool capturing, tideComm::CacheEntry** out);

// Checks that layout matches the comm (world size, rank; without peerMapsAllRanks, layout nodes within the comm's
// nodes) and that `stream` belongs to the comm's device. what names the calling function.
tideResult_t checkLayoutAndStream(tideComm* comm, const LayoutView& view, cudaStream_t stream, const char* what);

// Whether `stream` is being captured into a CUDA graph (checked before anything else). Captured collectives take
// the replay-safe path (docs/architecture.md "CUDA graphs"); what that path cannot do fails with tideUnsupported at
// capture time, before anything is enqueued (the capture stays valid). An invalidated capture is refused here.
struct CaptureState {
  bool active = false;
  unsigned long long id = 0;  // cudaStreamGetCaptureInfo's unique id of the capture sequence
};
tideResult_t queryCapture(cudaStream_t stream, const char* what, CaptureState* out);
// tideInvalidUsage naming the reason if an earlier call of this comm failed part-way (tideComm::broken).
tideResult_t checkUsable(const tideComm* comm, const char* what);
// An eager call of (kind, epoch) failed with `res` after the comm's epoch advanced: records the comm as unusable
// (the last error's text is the reason) and tells a provider with shared queues (SharedQueues::callFailed: loopback
// marks the whole world unusable). Returns res.
tideResult_t markCallFailed(tideComm* comm, CollKind kind, uint64_t epoch, tideResult_t res);

// tideUnsupported if cap is active and the comm's provider cannot capture (Provider::Traits::capturable); called by
// the executors first, before anything else.
tideResult_t checkCapturable(const tideComm* comm, const CaptureState& cap, const char* what);

// Whether an eager call of this layout runs the token program (prog::eagerUsesTokens over what every rank agrees
// on: the comm's switch, the provider, the layout's node split and RS chunks). Never true while capturing (cap.active
// takes the captured path itself).
bool eagerTokens(const tideComm* comm, const LayoutView& view, bool reduceScatter);

// The comm's private capture stream, created on first use (false with the reason on failure; error state cleared).
bool captureStreamOf(tideComm* comm, cudaStream_t* out, std::string* why);

// A fork for the capture `capturing` is in: a side stream of the comm that is in no capture or already in this one,
// and the fork/join events, created as needed (with the thread's capture mode relaxed, so that creating them inside a
// user's global-mode capture is not an unsafe call). False with the reason in *why if `capturing` is not capturing or
// something could not be created.
struct CaptureFork {
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};
bool captureForkOf(tideComm* comm, cudaStream_t capturing, CaptureFork* out, std::string* why);

// tideInvalidArgument unless p is device memory (device or managed) that the comm's device can address, aligned to
// `align` bytes.
tideResult_t checkDevicePointer(const tideComm* comm, const void* p, size_t align, const char* what);

// Address, as seen by this rank, of rank `peer`'s copy of the slot region [local, local + bytes) (AG destination, RS
// staging): the provider's peerPtr, except on a comm of world size 1, where nothing is peer-mapped and any device
// memory of the comm's device is a slot region (checkDevicePointer only; tideSlotAlloc is not required, so a caller
// may hand memory of its own allocator, e.g. torch's caching allocator: nccl_tide.fsdp's trimming pool at shard
// world size 1). Such memory is the caller's: it orders its reuse after the TIDE work on its streams. A region the
// interposer registered (comm->peerRegions: an application's symmetric NCCL window) resolves to the peers' addresses
// NCCL gave for it.
tideResult_t slotRegion(tideComm* comm, const void* local, size_t bytes, int peer, const char* what, void** out);

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_COMM_H_
