// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Prebuilt driver arguments: a flag batch as the cuStreamBatchMemOp parameter array (values patched per call) and a
// copy batch as the cudaMemcpyBatchAsync arrays. Built once per bound program (program_exec.h); issuing one costs one
// driver call and no allocation.
#ifndef TIDE_CUDA_PREBUILT_H_
#define TIDE_CUDA_PREBUILT_H_

#include <cuda.h>  // driver types only; no symbol of libcuda is linked
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../core/copy_runs.h"
#include "../core/program.h"
#include "tide.h"

namespace tide {
namespace cuda {

struct MemOpBatch {
  std::vector<CUstreamBatchMemOpParams> params;
  std::vector<prog::FlagOp> ops;  // the symbolic ops, same order: their values are patched into params per call
  // params [kernelFrom, size): the batch's trailing writes that a graph may carry as a signal kernel
  // (prog::kernelTail; signal_kernel.h), the first kernelOrdered of them stored before the rest; size(): none.
  size_t kernelFrom = 0, kernelOrdered = 0;
  // Sets every value for a call with this epoch and RS task base (a pair's values are constants, set by addPair).
  void patch(uint64_t epoch, uint64_t task) {
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].pairNext) continue;
      const uint32_t v = ops[i].value(epoch, task);
      if (ops[i].kind == prog::FlagOp::kWait) params[i].waitValue.value = v; else params[i].writeValue.value = v;
    }
  }
  void add(const prog::FlagOp& op, uint32_t* addr);
  // One 64-bit operation for a token pair (prog::FlagOp::pairNext): lo's word at addr (8-byte aligned), hi's after
  // it; a wait passes when both equal their values. ops gets lo (pairNext set), so params and ops stay parallel.
  void addPair(const prog::FlagOp& lo, const prog::FlagOp& hi, uint32_t* addr);
};

struct CopyBatch {
  std::vector<void*> dst;
  std::vector<const void*> src;
  std::vector<size_t> bytes;
  // Cross-node batches only (InterNodeTransport::put): each entry's destination as the program names it (whose slot
  // or staging, byte offset), parallel to dst; empty for node-local batches.
  std::vector<prog::Addr> peerDst;
  // The same copies as strided runs (plugin/core/copy_runs.h), kept only when there are fewer runs than copies: what
  // the per-copy path issues (a capture's memcpy nodes, one per run instead of one per copy). planRuns() sets it.
  std::vector<CopyRun> runs;
  size_t size() const { return dst.size(); }
  // group[i]: which copies may share a run (bind: one destination buffer each). Largest pitch: kMaxCopyPitch.
  void planRuns(const std::vector<uint32_t>& group);
};

// The largest pitch a 2D copy is given (cudaDevAttrMaxPitch is 2^31 - 1 on the GPUs this library builds for, sm_90
// and newer); a larger stride leaves the copies apart.
constexpr uint64_t kMaxCopyPitch = (uint64_t(1) << 31) - 1;

// Enqueues the batch (cuStreamBatchMemOp in pieces of at most 128 ops; per-op calls where the driver lacks it), or
// its first n operations.
tideResult_t enqueueMemOps(cudaStream_t stream, CUstreamBatchMemOpParams* ops, size_t n);
inline tideResult_t enqueueMemOps(cudaStream_t stream, MemOpBatch& batch) {
  return enqueueMemOps(stream, batch.params.data(), batch.params.size());
}

// Enqueues the copies: one cudaMemcpyBatchAsync with cudaMemcpyFlagPreferOverlapWithCompute if batchApi, else one
// cudaMemcpyAsync each (capture, the legacy stream, or a runtime without the batch API), or,
// when the batch has strided runs, one cudaMemcpy2DAsync per run of several copies.
tideResult_t enqueueCopyBatch(cudaStream_t stream, int device, const CopyBatch& batch, bool batchApi);

// True once the runtime refused a 2D copy of a strided run (runs go row by row from then on, process-wide): a capture
// that failed on that refusal is worth one more try.
bool copyRunsRefused();

// Whether a call on `stream` may use the batch API: not the legacy stream, not being captured
// (capturing: cudaMemcpyAsync becomes a memcpy graph node). No driver query.
bool batchApiFor(cudaStream_t stream, bool capturing);

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_PREBUILT_H_
