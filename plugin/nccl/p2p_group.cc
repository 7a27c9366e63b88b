// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// p2p groups through NCCL (p2p_group.h).
#include "p2p_group.h"

#include <sched.h>

#include <chrono>

#include "../core/errors.h"
#include "../core/params.h"

namespace tide {
namespace nccl {

tideResult_t issueGroup(const Lib& lib, ncclComm_t comm, cudaStream_t stream, const P2pCall* calls, size_t n) {
  if (n == 0) return tideSuccess;
  ncclResult_t r = lib.groupStart();
  if (r != kNcclSuccess) return ncclFail(lib, r, "ncclGroupStart");
  ncclResult_t first = kNcclSuccess;
  const char* what = nullptr;
  for (size_t i = 0; i < n && first == kNcclSuccess; ++i) {
    const P2pCall& c = calls[i];
    first = c.send ? lib.send(c.buf, c.bytes, kNcclUint8, c.peer, comm, stream)
                   : lib.recv(c.buf, c.bytes, kNcclUint8, c.peer, comm, stream);
    what = c.send ? "ncclSend" : "ncclRecv";
  }
  r = lib.groupEnd();
  // A nonblocking communicator launches the group in the background; the wait is bounded like TIDE's other host
  // waits (NCCL_TIDE_TIMEOUT_MS; 0 waits as long as NCCL takes).
  const uint64_t boundMs = params::timeoutMs();
  const auto start = std::chrono::steady_clock::now();
  while (r == kNcclInProgress) {
    if (boundMs > 0 && std::chrono::steady_clock::now() - start > std::chrono::milliseconds(boundMs)) {
      return fail(tideTimeout, "Nccl", "ncclGroupEnd of a p2p group still in progress after %llu ms "
                  "(NCCL_TIDE_TIMEOUT_MS): a peer has not posted its matching sends and receives",
                  static_cast<unsigned long long>(boundMs));
    }
    sched_yield();
    const ncclResult_t q = lib.commGetAsyncError(comm, &r);
    if (q != kNcclSuccess) return ncclFail(lib, q, "ncclCommGetAsyncError");
  }
  if (first != kNcclSuccess) return ncclFail(lib, first, what);
  if (r != kNcclSuccess) return ncclFail(lib, r, "ncclGroupEnd");
  return tideSuccess;
}

}  // namespace nccl
}  // namespace tide
