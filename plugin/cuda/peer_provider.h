// Peer providers: what a comm's rank gets from the provider it was created on (loopback, CUDA IPC; the NCCL-window
// provider of the NCCL-binding issue), as two per-rank objects, each with its rank bound at construction:
//
//   PeerMemory  (peer_memory.h)   slots, peer addresses, flags, own RS staging, zeros, multicast addresses, abort;
//   IssuePolicy (issue_policy.h)  deferral and scheduling of step groups, prechecks, layout agreement, capture and
//                                 stream checks, and the InterNodeTransport of cross-node operations.
//
// tideComm holds both (comm.h); nothing above the providers knows which provider it runs on. A provider with one
// rank per process (IpcProvider) is one object implementing both; the loopback provider keeps the state of its W
// virtual ranks in one shared world and hands each rank a thin view implementing both (loopback.h).
#ifndef TIDE_CUDA_PEER_PROVIDER_H_
#define TIDE_CUDA_PEER_PROVIDER_H_

#include "issue_policy.h"
#include "peer_memory.h"

#endif  // TIDE_CUDA_PEER_PROVIDER_H_
