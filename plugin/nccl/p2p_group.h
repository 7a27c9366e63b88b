// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// One p2p group of a two-sided step program (prog::Op::kP2p, plugin/core/p2p_plan.h; issued by the sendrecv
// transport, plugin/cuda/internode_transport.h) through the process's NCCL: ncclGroupStart, each transfer as
// ncclSend / ncclRecv of bytes (ncclUint8) on `stream` in the group's order, ncclGroupEnd. NCCL matches a pair's
// sends and receives in this issue order, which is the program order the CPU model (tests/native/nccl_p2p_model.h)
// checks. Host-only: pointers are opaque here.
#ifndef TIDE_NCCL_P2P_GROUP_H_
#define TIDE_NCCL_P2P_GROUP_H_

#include <cstddef>

#include "nccl_lib.h"

namespace tide {
namespace nccl {

// One transfer with its pointer resolved: the send's source or the receive's destination, `bytes` long.
struct P2pCall {
  bool send = true;
  int peer = 0;
  void* buf = nullptr;
  size_t bytes = 0;
};

// Issues calls[0..n) as one group. The group is always closed (ncclGroupEnd) once opened, also after a failed send
// or receive, so that NCCL's group depth stays balanced; the first failure is returned (tideNcclError). A
// nonblocking communicator's ncclInProgress from ncclGroupEnd is waited out with ncclCommGetAsyncError.
tideResult_t issueGroup(const Lib& lib, ncclComm_t comm, cudaStream_t stream, const P2pCall* calls, size_t n);

}  // namespace nccl
}  // namespace tide

#endif  // TIDE_NCCL_P2P_GROUP_H_
