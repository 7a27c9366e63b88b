// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The buffers the application registered with NCCL, as the interposer saw them: windows (ncclCommWindowRegister)
// and local registrations (ncclCommRegister), per NCCL communicator.
//
// An all-gather whose receive buffer lies in a window registered with NCCL_WIN_COLL_SYMMETRIC can be gathered
// straight into it: NCCL maps such a window on every rank of its node and promises nothing less than TIDE needs,
// since its contract makes the application put the buffer at the same offset of its window on every rank
// ("users need to guarantee the offset to the buffer head address from all ranks must be equal"), so each rank
// knows its peers' buffers from its own offset (ncclGetPeerDevicePointer) and decides alike. A window without that
// flag may hold the buffer at another offset on each rank, and a local registration maps nothing for the peers:
// both keep TIDE's bounce slot and copy-out (interposer_tide.cc), which is why they are recorded at all.
#ifndef TIDE_API_INTERPOSER_WINDOWS_H_
#define TIDE_API_INTERPOSER_WINDOWS_H_

#include <cstddef>

namespace tide {
namespace interposer {
namespace windows {

constexpr int kNcclWinCollSymmetric = 0x01;  // NCCL_WIN_COLL_SYMMETRIC

// After NCCL registered a window (win NULL: NCCL has no symmetric memory there; nothing is recorded).
void registered(void* comm, void* buff, size_t size, void* win, int flags);
// A registration inside an open group: NCCL fills *winOut when the group ends (groupEnded reads it then).
void registeredInGroup(void* comm, void* buff, size_t size, void** winOut, int flags);
// The calling thread's outermost group ended: `ok` if NCCL's ncclGroupEnd succeeded (else the registrations of the
// group did not happen).
void groupEnded(bool ok);
// Before NCCL deregisters `win`: forgets it and returns its buffer (nullptr if it was never recorded).
void* deregistered(void* comm, void* win);

void registeredLocal(void* comm, void* buff, size_t size, void* handle);
void deregisteredLocal(void* comm, void* handle);

enum class Kind {
  kNone,               // not in any registered buffer of this communicator
  kSymmetricWindow,    // inside a window registered with NCCL_WIN_COLL_SYMMETRIC
  kWindow,             // inside a window without that flag
  kLocalRegistration,  // inside a buffer registered with ncclCommRegister
};
struct Hit {
  void* win = nullptr;  // the window (kSymmetricWindow, kWindow)
  char* base = nullptr;
  size_t size = 0;
};
// Where [p, p + bytes) lies among the communicator's registered buffers.
Kind lookup(void* comm, const void* p, size_t bytes, Hit* hit);

// The communicator is finalized, destroyed or aborted: its records go.
void forgetComm(void* comm);

}  // namespace windows
}  // namespace interposer
}  // namespace tide

#endif  // TIDE_API_INTERPOSER_WINDOWS_H_
