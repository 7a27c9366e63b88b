// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Layout creation: validation with messages that name the offending field, offset derivation (include/tide.h, top),
// the cross-rank hash, and the plans (rs_plan.cc, schedule.cc).
#include "layout.h"

#include <cinttypes>
#include <new>

#include "c_enum.h"
#include "dtype.h"
#include "errors.h"
#include "fnv1a.h"
#include "log.h"
#include "params.h"
#include "schedule.h"

namespace tide {
namespace {

constexpr const char* kComponent = "Layout";

inline bool addOv(uint64_t a, uint64_t b, uint64_t* r) { return __builtin_add_overflow(a, b, r); }
inline bool mulOv(uint64_t a, uint64_t b, uint64_t* r) { return __builtin_mul_overflow(a, b, r); }

// Aligns up, reporting overflow. align is a power of two or any positive value.
inline bool alignUpOv(uint64_t v, uint64_t align, uint64_t* r) {
  uint64_t t;
  if (addOv(v, align - 1, &t)) return true;
  *r = t / align * align;
  return false;
}

tideResult_t validateDesc(const tideLayoutDesc_t* d) {
  if (d == nullptr) return fail(tideInvalidArgument, kComponent, "desc is NULL");
  if (d->size < sizeof(tideLayoutDesc_t)) {
    return fail(tideInvalidArgument, kComponent, "desc->size is %zu; set it to sizeof(tideLayoutDesc_t) = %zu",
                d->size, sizeof(tideLayoutDesc_t));
  }
  if (d->version < 1 || d->version > TIDE_LAYOUT_DESC_VERSION) {
    return fail(tideInvalidArgument, kComponent, "desc->version is %u; this library supports 1..%d (set it to "
                "TIDE_LAYOUT_DESC_VERSION)", d->version, TIDE_LAYOUT_DESC_VERSION);
  }
  if (d->nParams < 1 || d->nParams > TIDE_MAX_PARAMS) {
    return fail(tideInvalidArgument, kComponent, "nParams is %d; must be in [1, %d]", d->nParams, TIDE_MAX_PARAMS);
  }
  if (d->numels == nullptr) return fail(tideInvalidArgument, kComponent, "numels is NULL");
  if (d->dtypes == nullptr) return fail(tideInvalidArgument, kComponent, "dtypes is NULL");
  if (d->worldSize < 1 || d->worldSize > TIDE_MAX_WORLD_SIZE) {
    return fail(tideInvalidArgument, kComponent, "worldSize is %d; must be in [1, %d]", d->worldSize,
                TIDE_MAX_WORLD_SIZE);
  }
  int maxRpn = d->worldSize < TIDE_MAX_RANKS_PER_NODE ? d->worldSize : TIDE_MAX_RANKS_PER_NODE;
  if (d->ranksPerNode < 1 || d->ranksPerNode > maxRpn) {
    return fail(tideInvalidArgument, kComponent, "ranksPerNode is %d; must be in [1, min(worldSize=%d, %d)]",
                d->ranksPerNode, d->worldSize, TIDE_MAX_RANKS_PER_NODE);
  }
  if (d->worldSize % d->ranksPerNode != 0) {
    return fail(tideInvalidArgument, kComponent, "ranksPerNode=%d does not divide worldSize=%d", d->ranksPerNode,
                d->worldSize);
  }
  if (d->rank < 0 || d->rank >= d->worldSize) {
    return fail(tideInvalidArgument, kComponent, "rank is %d; must be in [0, worldSize=%d)", d->rank, d->worldSize);
  }
  for (int i = 0; i < d->nParams; ++i) {
    uint64_t n = d->numels[i];
    if (n < 1 || n > TIDE_MAX_PARAM_NUMEL) {
      return fail(tideInvalidArgument, kComponent, "numels[%d] is %" PRIu64 "; must be in [1, 2^40]", i, n);
    }
    const int rawDtype = rawEnum(d->dtypes[i]);  // the caller's int: never load it as the enum before checking
    if (!enumInRange(rawDtype, tideNumDataTypes)) {
      return fail(tideInvalidArgument, kComponent, "dtypes[%d] is %d, not a tideDataType_t", i, rawDtype);
    }
    if (d->rowNumels != nullptr) {
      uint64_t c = d->rowNumels[i];
      if (c < 1 || c > n || n % c != 0) {
        return fail(tideInvalidArgument, kComponent,
                    "rowNumels[%d] is %" PRIu64 "; must be >= 1 and divide numels[%d] = %" PRIu64, i, c, i, n);
      }
    }
  }
  return tideSuccess;
}

// Picks the effective knobs: a nonzero config field wins, else the NCCL_TIDE_* parameter (which must parse).
tideResult_t effectiveConfig(const tideConfig_t* config, uint64_t* rsChunkBytes, uint64_t* paceBytes) {
  uint64_t chunk = 0, pace = 0;
  if (config != nullptr) {
    if (config->size < sizeof(tideConfig_t)) {
      return fail(tideInvalidArgument, kComponent, "config->size is %zu; set it to sizeof(tideConfig_t) = %zu",
                  config->size, sizeof(tideConfig_t));
    }
    if (config->version < 1 || config->version > TIDE_CONFIG_VERSION) {
      return fail(tideInvalidArgument, kComponent, "config->version is %u; this library supports 1..%d",
                  config->version, TIDE_CONFIG_VERSION);
    }
    chunk = config->rsChunkBytes;
    pace = config->paceBytes;
  }
  if (chunk == 0) {
    TIDE_CHECK(params::status(params::kRsChunkBytes));
    chunk = params::rsChunkBytes();
  }
  if (pace == 0) {
    TIDE_CHECK(params::status(params::kPaceBytes));
    pace = params::paceBytes();
  }
  *rsChunkBytes = chunk;
  *paceBytes = pace;
  return tideSuccess;
}

tideResult_t overflow(const char* what, int index) {
  return fail(tideInvalidArgument, kComponent, "derived size overflows 64 bits (%s, parameter %d)", what, index);
}

tideResult_t deriveOffsets(Layout* l) {
  const uint64_t W = static_cast<uint64_t>(l->worldSize);
  uint64_t send = 0, slot = 0, rsOut = 0;
  for (int i = 0; i < l->nParams; ++i) {
    ParamLayout& p = l->params[i];
    uint64_t rows = p.numel / p.rowNumel;
    p.shardNumel = (rows + W - 1) / W * p.rowNumel;  // <= numel + rowNumel: no overflow under the limits
    p.elemSize = dtype::size(p.dtype);
    uint64_t unshardedBytes = 0;
    if (mulOv(p.shardNumel, p.elemSize, &p.shardBytes) || mulOv(p.shardBytes, W, &unshardedBytes)) {
      return overflow("shard bytes", i);
    }
    if (alignUpOv(send, p.elemSize, &p.sendOffset) || addOv(p.sendOffset, p.shardBytes, &send)) {
      return overflow("send buffer", i);
    }
    if (alignUpOv(slot, TIDE_SLOT_ALIGN, &p.slotOffset) || addOv(p.slotOffset, unshardedBytes, &slot)) {
      return overflow("slot", i);
    }
    p.rsOutOffset = rsOut;
    if (addOv(rsOut, p.shardNumel, &rsOut)) return overflow("RS output", i);
  }
  l->sendBytes = send;
  l->slotBytes = slot;
  l->rsOutNumel = rsOut;
  return tideSuccess;
}

}  // namespace

uint64_t layoutHash(const Layout& l) {
  Fnv1a h;
  static const char kTag[] = "nccl-tide/layout/v1";  // bump when the encoding changes
  h.bytes(kTag, sizeof(kTag) - 1);
  h.u64(static_cast<uint64_t>(l.nParams));
  for (const ParamLayout& p : l.params) {
    h.u64(p.numel);
    h.u64(p.rowNumel);
    h.u64(static_cast<uint64_t>(p.dtype));
  }
  h.u64(static_cast<uint64_t>(l.worldSize));
  h.u64(static_cast<uint64_t>(l.ranksPerNode));
  h.u64(l.rsChunkBytes);
  h.u64(l.paceBytes);
  return h.value();
}

tideResult_t createLayout(const tideLayoutDesc_t* desc, const tideConfig_t* config, std::unique_ptr<Layout>* out) {
  out->reset();
  TIDE_CHECK(validateDesc(desc));
  uint64_t rsChunkBytes = 0, paceBytes = 0;
  TIDE_CHECK(effectiveConfig(config, &rsChunkBytes, &paceBytes));

  std::unique_ptr<Layout> l(new (std::nothrow) Layout());
  if (!l) return fail(tideOutOfMemory, kComponent, "cannot allocate a layout");
  l->nParams = desc->nParams;
  l->worldSize = desc->worldSize;
  l->ranksPerNode = desc->ranksPerNode;
  l->nNodes = desc->worldSize / desc->ranksPerNode;
  l->rank = desc->rank;
  l->rsChunkBytes = rsChunkBytes;
  l->paceBytes = paceBytes;
  l->params.resize(static_cast<size_t>(desc->nParams));  // bad_alloc is translated by the API guard
  for (int i = 0; i < desc->nParams; ++i) {
    ParamLayout& p = l->params[i];
    p.numel = desc->numels[i];
    p.rowNumel = desc->rowNumels ? desc->rowNumels[i] : 1;
    p.dtype = desc->dtypes[i];
  }
  TIDE_CHECK(deriveOffsets(l.get()));
  TIDE_CHECK(computeRsPlan(l.get()));
  TIDE_CHECK(computeSchedule(l.get()));
  l->hash = layoutHash(*l);
  TIDE_TRACE(kComponent,
             "layout: %d params, W=%d R=%d rank=%d, send %" PRIu64 " B, slot %" PRIu64 " B, RS out %" PRIu64
             " elems, chunk %" PRIu64 " x %d, staging %" PRIu64 " B, schedule %d steps, hash %016" PRIx64,
             l->nParams, l->worldSize, l->ranksPerNode, l->rank, l->sendBytes, l->slotBytes, l->rsOutNumel,
             l->rs.chunkNumel, l->rs.numChunks, l->rs.stagingBytes, l->schedule.length, l->hash);
  *out = std::move(l);
  return tideSuccess;
}

}  // namespace tide
