// Peer memory of one rank: where its slots, flags and own RS staging live, and how it addresses another rank's.
//
// One object per rank of a comm, its rank bound at construction (tideComm::memory). The executors (ag_executor.cc,
// rs_executor.cc) and the interpreter (program_exec.cc) see only this interface, so the loopback provider (one view
// per virtual rank of a shared world), CUDA IPC and the NCCL-window provider of the NCCL-binding issue plug in
// without touching them. Addresses returned here are device addresses that this rank's device can read and write
// directly (peer-mapped); for loopback they are plain allocations on the one device.
#ifndef TIDE_CUDA_PEER_MEMORY_H_
#define TIDE_CUDA_PEER_MEMORY_H_

#include <cstddef>
#include <cstdint>

#include "../core/program.h"
#include "tide.h"

namespace tide {
namespace cuda {

// Flag words of one rank (uint32 each, zero at creation): defined once, with the programs that use them
// (plugin/core/program.h; their meaning in docs/architecture.md "Step programs").
namespace flag = ::tide::prog::word;

class PeerMemory {
 public:
  virtual ~PeerMemory() = default;

  // The provider's name ("loopback", "ipc"): tideCommGetProvider, the debug dump, error messages.
  virtual const char* name() const = 0;

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

  // Device address of `owner`'s flag array (flag::kWords words), as seen by this rank.
  virtual uint32_t* flags(int owner) = 0;

  // The provider's own RS staging buffer of `owner` (at least `bytes`) for the RS epoch `epoch`, as seen by this
  // rank. Every rank of one epoch gets the same buffers. Errors: tideOutOfMemory, tideMismatch (ranks disagree on
  // size).
  virtual tideResult_t ownStaging(int owner, uint64_t bytes, uint64_t epoch, void** out) = 0;

  // Device buffer of zeros (at least *bytes long) that a copy engine reads to fill padding.
  virtual const void* zeros(size_t* bytes) = 0;

  // NVLink multicast address of the slot region, or nullptr if the provider has none (loopback never has one; the
  // NCCL provider hands out only what ncclGetLsaMultimemDevicePointer returns; TIDE never creates multicast objects).
  // No provider returns one yet. Before one does: the multicast program copies each shard to its multicast position,
  // which covers the rank's own position too, so an in-place shard (the FSDP2 glue's cast in place) would be copied
  // onto itself; ag_executor.cc must then keep such calls on unicast copies (and test it on a provider that has one).
  virtual void* multicastPtr(const void* local, size_t bytes) {
    (void)local;
    (void)bytes;
    return nullptr;
  }

  // True if every rank of the comm can address every other rank's slots, staging and flags (loopback, CUDA IPC on
  // one host). Then a layout may split the ranks into any number of (virtual) nodes: the inter-node stage runs over
  // the peer-mapped transport (internode_transport.h). A provider spanning hosts returns false and needs an NCCL
  // transport (not built yet).
  virtual bool peerMapsAllRanks() const { return true; }

  // tideCommAbort of this rank: local, non-collective teardown (no exchange with peers, now or at destruction); the
  // device's queued work is waited for at most boundMs. What else it releases or breaks is the provider's (IPC: this
  // rank's mappings of the peers' memory; loopback: the whole world becomes unusable). Returns true if the device
  // went idle; false: the memory is left to process exit (a cudaFree would wait for the stuck work).
  virtual bool abort(uint64_t boundMs) = 0;
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_PEER_MEMORY_H_
