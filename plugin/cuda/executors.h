// The CUDA executors of TIDE-AG and TIDE-RS. Both validate everything before enqueueing anything, then enqueue
// stream-ordered work on the caller's stream (and, for RS, an internal stream forked from and joined to it).
#ifndef TIDE_CUDA_EXECUTORS_H_
#define TIDE_CUDA_EXECUTORS_H_

#include <cuda_runtime.h>

#include "comm.h"

namespace tide {
namespace cuda {

tideResult_t allGather(tideComm* comm, tideLayout_t layout, const void* sendbuff, const void* const* shardPtrs,
                       void* slot, cudaStream_t stream);

tideResult_t reduceScatter(tideComm* comm, tideLayout_t layout, const void* const* grads, void* out,
                           tideDataType_t outType, tideRedOp_t op, float scale, void* staging, cudaStream_t stream);

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_EXECUTORS_H_
