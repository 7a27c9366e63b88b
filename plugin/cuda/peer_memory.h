// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Memory for peers, one of a provider's two interfaces (provider.h): where a rank's slots and own RS staging live,
// how it addresses the other ranks' copies of them, and the zero buffer its copies read. Called by the public slot
// calls (tideSlotAlloc / tideSlotFree), slotRegion (comm.h) and the executors (ag_executor.cc, rs_executor.cc), which
// resolve every address a program needs before binding it (program_exec.h).
//
// Internal to the library (C++, not part of include/tide.h, loaded by nothing outside it): no ABI version; a new
// implementation is built into the library.
#ifndef TIDE_CUDA_PEER_MEMORY_H_
#define TIDE_CUDA_PEER_MEMORY_H_

#include <cstddef>
#include <cstdint>

#include "tide.h"

namespace tide {
namespace cuda {

class PeerMemory {
 public:
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

  // Optional. NVLink multicast address of the slot region, or nullptr (the default: no provider built so far has
  // one; the window provider does not ask NCCL for ncclGetLsaMultimemDevicePointer, and TIDE never creates multicast
  // objects). Before a provider returns one: the multicast program copies each shard to its multicast position,
  // which covers the rank's own position too, so an in-place shard (the FSDP2 glue's cast in place) would be copied
  // onto itself; ag_executor.cc must then keep such calls on unicast copies (and test it on a provider that has one).
  virtual void* multicastPtr(const void* local, size_t bytes) {
    (void)local;
    (void)bytes;
    return nullptr;
  }

 protected:
  ~PeerMemory() = default;
};

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_PEER_MEMORY_H_
