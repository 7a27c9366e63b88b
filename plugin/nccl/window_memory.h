// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The memory one rank of a comm shares with the ranks of its TIDE node as NCCL windows (the window provider,
// plugin/cuda/window_provider.h): flags, slots and own RS staging, each its own ncclMemAlloc buffer registered with
// ncclCommWindowRegister, the node's peers' copies addressed through ncclGetPeerDevicePointer. Host-only (NCCL is
// reached through the resolved Lib, device memory is never touched here), so that the order of NCCL calls is
// testable on CPU against a recording stub libnccl (tests/native/nccl_windows_test.cc).
//
// Windows live on one NCCL communicator per TIDE node: the comm's own NCCL communicator when it is one node, else a
// child that open() splits off it (ncclCommSplit by node), owned here. NCCL maps a window only among ranks that
// reach each other by loads and stores (its LSA team); a communicator that spans NCCL hosts without a GIN network
// has no symmetric memory at all (ncclCommWindowRegister then returns no window), which is why a node gets its own.
//
// Every buffer is shared collectively (same order and sizes on every rank of the comm, through the comm's exchange
// of host bytes): allocate locally, agree on sizes and success, register (collective inside NCCL), resolve the
// peers' addresses, agree again. So no rank enters NCCL's registration when another failed to allocate, and every
// rank learns alike that NCCL has no windows for the node (Availability::kUnavailable) when, on any rank, NCCL said
// no in one of four ways: ncclCommWindowRegister failed (an error code) or returned ncclSuccess with no window (NCCL
// 2.29-2.30 without symmetric memory on the communicator), ncclGetPeerDevicePointer failed or returned ncclSuccess
// with a NULL address (a peer outside the rank's LSA team). The agreement carries which call it was and its result,
// so every rank's reason names them. A registration that failed holds no window (NCCL sets it NULL on every failure
// path); ranks whose registration succeeded deregister theirs, locally. Release is local
// (ncclCommWindowDeregister, ncclMemFree): the caller first makes sure no rank's work still uses the buffer
// (WindowMemory::Quiesce). The multicast pointer query (ncclGetLsaMultimemDevicePointer) is never called.
#ifndef TIDE_NCCL_WINDOW_MEMORY_H_
#define TIDE_NCCL_WINDOW_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nccl_lib.h"

namespace tide {
namespace nccl {

class WindowMemory {
 public:
  // All-gather of host bytes over the comm's ranks (worldSize blocks of `bytes`), blocking and collective.
  using Exchange = std::function<tideResult_t(const void* mine, void* all, size_t bytes)>;
  // Prepares a freshly allocated buffer before any peer can address it (the flags: zeroed), on this rank only.
  using Init = std::function<tideResult_t(void* base, size_t bytes)>;
  // Collective, before buffers are released: no work of any rank still reads or writes them (the CUDA provider
  // waits for its device and runs a barrier). `what` names the caller for errors.
  using Quiesce = std::function<tideResult_t(const char* what)>;
  // Whether device work may still be queued after a failed exchange (the NCCL exchange's all-gather, which only an
  // ncclCommAbort of the parent ends): then a buffer whose sharing failed is left allocated, never freed under it.
  using WorkLeft = std::function<bool()>;

  enum class Availability { kAvailable, kUnavailable };

  // One rank's part of each agreement of share() (public for the stand-in exchanges of tests): its size, whether its
  // step succeeded and, when NCCL gave it no window or peer address, which call said no and what it returned.
  struct Agreement {
    enum Refusal : int32_t { kNone = 0, kRegisterFailed, kNoWindow, kPeerPointerFailed, kNoPeerAddress };
    uint64_t bytes;
    int32_t ok;       // 0: the step failed on this rank (an error, not a refusal); see its log
    int32_t refusal;  // Refusal
    int32_t result;   // NCCL's ncclResult_t of a failed call (kRegisterFailed, kPeerPointerFailed)
    int32_t peer;     // the TIDE rank whose address was asked for (kPeerPointerFailed, kNoPeerAddress), else -1
  };

  // A buffer of this rank and the addresses of the node's peers' matching buffers, by comm rank (own: base; ranks of
  // other nodes: nullptr).
  struct Buffer {
    char* base = nullptr;
    size_t bytes = 0;
    ncclWindow_t win = nullptr;
    std::vector<char*> peers;
    // NCCL may still be registering or deregistering it (a bounded wait gave up): never freed, left to process exit.
    bool leftToNccl = false;
  };

  // Collective over `parent`: the communicator of this rank's node (nodeRanks consecutive ranks; the parent when
  // nodeRanks == world, else a child split off it, blocking, owned by the returned object), then the flag buffer
  // (flagBytes, prepared by initFlags). *avail kUnavailable, on every rank alike, when NCCL gives no window or no
  // peer address for the node on any rank: *why then names the NCCL call and its result (this rank's, else the
  // lowest rank's that NCCL refused), *out is null and nothing is left registered or allocated.
  // The device of the comm must be current.
  static tideResult_t open(const Lib& lib, ncclComm_t parent, int rank, int world, int nodeRanks, Exchange exchange,
                           WorkLeft workLeft, size_t flagBytes, const Init& initFlags,
                           std::unique_ptr<WindowMemory>* out, Availability* avail, std::string* why);
  // Releases what is left (deregister, free, destroy an owned child communicator): call only after quiescing, or
  // use abandon().
  ~WindowMemory();

  // Collective (same order and sizes on every rank).
  tideResult_t slotAlloc(size_t bytes, void** ptr);
  // Collective: quiesce, then release the slot.
  tideResult_t slotFree(void* ptr, const Quiesce& quiesce);
  // Peer `peer`'s address of [local, local + bytes) of one of this rank's slots (PeerMemory::peerPtr's contract).
  tideResult_t peerPtr(const void* local, size_t bytes, int peer, const char* what, void** out) const;
  // Own RS staging of `owner` of at least `bytes`: grows collectively (a new buffer; older ones stay for work
  // already enqueued). *grown tells whether it did.
  tideResult_t ownStaging(int owner, uint64_t bytes, void** out, bool* grown);
  // owner's flag buffer as this rank addresses it; nullptr for a rank of another node.
  char* flags(int owner) const { return flags_.peers[owner]; }

  // tideCommAbort with the device idle, or a failure with the peers possibly gone: on an owned child communicator a
  // local release of everything (no exchange) and ncclCommAbort; on the caller's communicator, which its owner may
  // have aborted and freed already, no NCCL call at all (abandon()).
  void abortRelease();
  // Device work still pending (it may use any of it): nothing is released or destroyed, ever (process exit).
  void abandon();

  // "the comm's NCCL communicator" or "a communicator split off per TIDE node", for messages.
  const char* where() const {
    return owned_ ? "a communicator split off per TIDE node" : "the comm's NCCL communicator";
  }
  size_t slotCount() const { return slots_.size(); }
  size_t stagingCount() const { return staging_.size(); }

 private:
  WindowMemory(const Lib& lib, ncclComm_t comm, bool owned, int rank, int world, int nodeRanks, Exchange exchange,
               WorkLeft workLeft)
      : lib_(lib), comm_(comm), owned_(owned), rank_(rank), world_(world), nodeRanks_(nodeRanks),
        exchange_(std::move(exchange)), workLeft_(std::move(workLeft)) {}

  // Collective: allocate, init (if set), agree, register, resolve the node's peers, agree (see the file comment).
  tideResult_t share(size_t bytes, const char* what, const Init& init, Buffer* out, Availability* avail,
                     std::string* why);
  // Registers b (allocated, agreed on) and resolves the node's peers' addresses: tideSuccess with *mine's refusal set
  // where NCCL said no; an error only where this rank could not learn NCCL's answer (a nonblocking registration that
  // did not settle).
  tideResult_t registerAndResolve(Buffer* b, Agreement* mine);
  // Rank q's refusal in words: the NCCL call, its result, and what it means.
  std::string refusalText(int q, const Agreement& a) const;
  // Local: deregister (if registered) and free. The first NCCL error, after trying both.
  tideResult_t release(Buffer* b);
  // Releases every buffer and destroys (or aborts) an owned child.
  void releaseAll(bool abortChild);
  bool onNode(int r) const { return r / nodeRanks_ == rank_ / nodeRanks_; }
  // The rank of the windows' communicator that TIDE rank r is.
  int commRank(int r) const { return owned_ ? r - rank_ / nodeRanks_ * nodeRanks_ : r; }

  const Lib& lib_;
  ncclComm_t comm_;
  const bool owned_;
  const int rank_, world_, nodeRanks_;
  Exchange exchange_;
  WorkLeft workLeft_;
  bool abandoned_ = false;
  Buffer flags_;
  std::vector<Buffer> slots_;
  std::vector<Buffer> staging_;  // generations; the last is current
};

}  // namespace nccl
}  // namespace tide

#endif  // TIDE_NCCL_WINDOW_MEMORY_H_
