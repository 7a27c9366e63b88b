// The CUDA executors of TIDE-AG and TIDE-RS. Both validate everything before enqueueing anything, then enqueue
// stream-ordered work on the caller's stream (and, for RS, an internal stream forked from and joined to it).
#ifndef TIDE_CUDA_EXECUTORS_H_
#define TIDE_CUDA_EXECUTORS_H_

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "comm.h"

namespace tide {
namespace cuda {

// cap: whether `stream` is being captured into a CUDA graph (queryCapture). Captured calls are first refused if the
// provider cannot capture (checkCapturable), then validated like eager ones (with capture-safe queries), then
// refused if their shape cannot be captured (tideUnsupported, nothing enqueued) or enqueued with the replay-safe
// protocol of captured.cc. They skip the provider's per-call stream/health check (checkStream: IPC's parent-NCCL
// async-error query). Eager calls (cap.active false) take the paths below unchanged.
tideResult_t allGather(tideComm* comm, tideLayout_t layout, const void* sendbuff, const void* const* shardPtrs,
                       void* slot, cudaStream_t stream, const CaptureState& cap);

tideResult_t reduceScatter(tideComm* comm, tideLayout_t layout, const void* const* grads, void* out,
                           tideDataType_t outType, tideRedOp_t op, float scale, void* staging, cudaStream_t stream,
                           const CaptureState& cap);

// Captured single-node collectives (captured.cc), called once every argument is validated. They never touch the
// comm's eager epochs or counters, nor the eager flag words.
tideResult_t allGatherCaptured(tideComm* comm, const LayoutView& v, const std::vector<const char*>& src,
                               const std::vector<char*>& slotOf, cudaStream_t stream, const CaptureState& cap);
struct RsCall;
tideResult_t reduceScatterCaptured(const RsCall& c, const CaptureState& cap);

// Multi-node layouts (nNodes > 1), called by the two above once every argument is validated and the epoch is taken
// (internode_ag.cc, internode_rs.cc).

// AG: src[i] = this rank's shard of parameter i; slotOf[r] = rank r's slot region as this rank addresses it.
// Validates the schedule, then takes the comm's AG epoch and enqueues on stream (nothing taken or enqueued on error).
tideResult_t allGatherMultiNode(tideComm* comm, const std::shared_ptr<const LayoutView>& view, tideLayout_t layout,
                                const std::vector<const char*>& src, const std::vector<char*>& slotOf,
                                cudaStream_t stream);

// RS: everything reduceScatter derived, for the multi-node enqueue.
struct RsCall {
  tideComm* comm = nullptr;
  const LayoutView* v = nullptr;
  const void* const* grads = nullptr;
  void* out = nullptr;
  tideDataType_t inType = tideFloat32, outType = tideFloat32;
  tideRedOp_t op = tideSum;
  float scale = 1.0f;
  std::vector<char*> stagingOf;  // [W] every rank's staging as this rank addresses it
  uint32_t epoch = 0;
  uint64_t g0 = 0;               // task t has global number g0 + t + 1
  uint64_t chunk = 0;            // elements
  int numChunks = 0;
  int nb = 1;                    // staging buffers
  uint64_t srcStride = 0;        // bytes between the R inputs of a buffer
  uint64_t bufBytes = 0;         // R inputs + one fp32 partial chunk
  size_t inElem = 0, outElem = 0;
  cudaStream_t stream = nullptr;
};
tideResult_t reduceScatterMultiNode(const RsCall& c);

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_EXECUTORS_H_
