// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Reduce-scatter plan: pipeline chunking of this rank's packed output and the staging size.
//
// The staging size is a function of ranksPerNode, the chunk and the shard size only, never of worldSize: each rank
// stages, per pipeline buffer, one chunk from each node-local peer (R inputs of the widest gradient type) plus, with
// more than one node, one fp32 chunk for the partial exchanged between nodes. That is what lets staging live in the
// group's vacated AG slot (Slot-Reuse) at any scale.
#include <cinttypes>
#include <climits>

#include "errors.h"
#include "layout.h"

namespace tide {
namespace {
constexpr const char* kComponent = "RsPlan";
}  // namespace

tideResult_t computeRsPlan(Layout* l) {
  RsPlan& rs = l->rs;
  // Chunk in output elements: the configured bytes of fp32 output, a multiple of 8 elements (so every chunk
  // boundary is 32-byte aligned in fp32 and 16-byte aligned in bf16), at least 8, at most the whole output.
  uint64_t chunk = l->rsChunkBytes / 4;
  if (chunk < 1) chunk = 1;
  chunk = chunk / 8 * 8;
  if (chunk < 8) chunk = 8;
  if (chunk > l->rsOutNumel) chunk = l->rsOutNumel;
  rs.chunkNumel = chunk;
  uint64_t numChunks = (l->rsOutNumel + chunk - 1) / chunk;
  if (numChunks > static_cast<uint64_t>(INT_MAX)) {
    return fail(tideInvalidArgument, kComponent,
                "reduce-scatter would need %" PRIu64 " chunks (more than INT_MAX); raise rsChunkBytes (now %" PRIu64
                ")", numChunks, l->rsChunkBytes);
  }
  rs.numChunks = static_cast<int>(numChunks);
  rs.numBuffers = rs.numChunks > 1 ? 2 : 1;

  rs.maxGradElemSize = 0;
  for (const ParamLayout& p : l->params) {
    if (p.elemSize > rs.maxGradElemSize) rs.maxGradElemSize = p.elemSize;
  }
  const uint64_t R = static_cast<uint64_t>(l->ranksPerNode);
  uint64_t peerStride = 0, inputs = 0, partial = 0, perBuffer = 0, total = 0;
  if (__builtin_mul_overflow(chunk, static_cast<uint64_t>(rs.maxGradElemSize), &peerStride) ||
      __builtin_mul_overflow(R, peerStride, &inputs) ||
      __builtin_mul_overflow(l->nNodes > 1 ? chunk : 0, static_cast<uint64_t>(4), &partial) ||
      __builtin_add_overflow(inputs, partial, &perBuffer) ||
      __builtin_mul_overflow(static_cast<uint64_t>(rs.numBuffers), perBuffer, &total)) {
    return fail(tideInvalidArgument, kComponent, "reduce-scatter staging size overflows 64 bits");
  }
  rs.stagingPeerStride = peerStride;
  rs.stagingPartialOffset = 0;
  rs.stagingInputsOffset = partial;
  rs.stagingBufferBytes = perBuffer;
  rs.stagingBytes = total;
  rs.slotReuseFits = rs.stagingBytes <= l->slotBytes;
  return tideSuccess;
}

}  // namespace tide
