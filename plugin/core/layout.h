// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Layout: the immutable description of one FSDP parameter group and every plan derived from it.
//
// Created once by createLayout() (validated, hashed, plans computed), never modified afterwards, so a layout may be
// shared by any number of threads without locking. The offset math is documented at the top of include/tide.h;
// docs/architecture.md explains the plans.
#ifndef TIDE_CORE_LAYOUT_H_
#define TIDE_CORE_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "tide.h"

namespace tide {

struct ParamLayout {
  uint64_t numel = 0;
  uint64_t rowNumel = 1;
  uint64_t shardNumel = 0;   // ceil(rows / W) * rowNumel
  tideDataType_t dtype = tideFloat32;
  size_t elemSize = 0;
  uint64_t shardBytes = 0;   // shardNumel * elemSize: one rank's shard, and the stride between ranks in the slot
  uint64_t sendOffset = 0;   // bytes, packed send buffer; aligned to elemSize
  uint64_t slotOffset = 0;   // bytes, slot; multiple of TIDE_SLOT_ALIGN
  uint64_t rsOutOffset = 0;  // elements, packed RS output

  // Where rank r's shard lives in a slot region.
  uint64_t slotPos(int r) const { return slotOffset + static_cast<uint64_t>(r) * shardBytes; }
};

// Reduce-scatter pipeline plan (see docs/architecture.md for the staging formula).
struct RsPlan {
  uint64_t chunkNumel = 0;       // output elements per pipeline chunk (multiple of 8 unless rsOutNumel < 8)
  int numChunks = 0;             // ceil(rsOutNumel / chunkNumel)
  int numBuffers = 0;            // 2 (double buffering) if numChunks > 1, else 1
  size_t maxGradElemSize = 0;    // largest element size over the group's parameters
  uint64_t stagingBytes = 0;     // numBuffers * (R * chunk * maxGradElemSize + (nNodes > 1 ? chunk * 4 : 0))
  // Inside one staging buffer: (multi-node) the fp32 partial first, so it is 4-byte aligned whatever R and the
  // gradient type, then the R node-local inputs.
  uint64_t stagingPeerStride = 0;    // bytes per node-local input: chunk * maxGradElemSize
  uint64_t stagingPartialOffset = 0; // 0
  uint64_t stagingInputsOffset = 0;  // nNodes > 1 ? chunk * 4 : 0
  uint64_t stagingBufferBytes = 0;   // stagingBytes / numBuffers
  bool slotReuseFits = false;    // stagingBytes <= slotBytes
};

// Inter-node schedule parameters; steps are computed on demand by schedule.h (pure functions of these).
struct SchedulePlan {
  int numRounds = 0;                  // ceil(log2 nNodes)
  uint64_t piecesPerBlock = 0;        // ceil(sendBytes / paceBytes)
  std::vector<uint64_t> roundStart;   // first step index of each round, plus the total at the end
  int length = 0;                     // steps per node (0 for one node)
};

// What a tideLayout_t refers to (plugin/core/handles.h: the handle is a registry key, never this object's address;
// struct tideLayout stays incomplete so that no code can dereference a handle). Plain data: every field is final
// after createLayout().
struct Layout {
  int nParams = 0;
  int worldSize = 0;
  int ranksPerNode = 0;
  int nNodes = 0;
  int rank = 0;
  std::vector<tide::ParamLayout> params;
  uint64_t sendBytes = 0;
  uint64_t slotBytes = 0;
  uint64_t rsOutNumel = 0;
  uint64_t rsChunkBytes = 0;  // effective (config, else NCCL_TIDE_RS_CHUNK_BYTES)
  uint64_t paceBytes = 0;     // effective (config, else NCCL_TIDE_PACE_BYTES)
  uint64_t hash = 0;
  tide::RsPlan rs;
  tide::SchedulePlan schedule;
};

// Validates desc and config (config may be NULL), derives every offset and plan, and on success stores a new layout
// in *out. On failure *out is left empty and the error is recorded (tideInvalidArgument, tideOutOfMemory).
tideResult_t createLayout(const tideLayoutDesc_t* desc, const tideConfig_t* config, std::unique_ptr<Layout>* out);

// The stable 64-bit hash over everything that must match across ranks (not rank). Exposed for tests.
uint64_t layoutHash(const Layout& layout);

// Node and local index of a rank.
inline int nodeOf(const Layout& l, int rank) { return rank / l.ranksPerNode; }
inline int localOf(const Layout& l, int rank) { return rank % l.ranksPerNode; }

// Fills the RS plan of a layout whose params, sizes and rsChunkBytes are set. Errors on overflow.
tideResult_t computeRsPlan(Layout* layout);

}  // namespace tide

#endif  // TIDE_CORE_LAYOUT_H_
