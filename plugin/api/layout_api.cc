// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// C API: layouts and plan queries.
#include <memory>

#include "api_guard.h"
#include "errors.h"
#include "handles.h"
#include "layout.h"
#include "schedule.h"
#include "tide.h"

namespace {

constexpr const char* kComponent = "API";

// Output structs: the caller announces the struct it was compiled with; anything older than version 1's size, or a
// version newer than this library knows, is refused rather than half-filled.
template <typename T>
tideResult_t checkOutStruct(const T* s, const char* fn, const char* what, unsigned int maxVersion) {
  if (s == nullptr) return tide::fail(tideInvalidArgument, kComponent, "%s: %s is NULL", fn, what);
  if (s->size < sizeof(T)) {
    return tide::fail(tideInvalidArgument, kComponent, "%s: %s->size is %zu; set it to sizeof = %zu", fn, what,
                      s->size, sizeof(T));
  }
  if (s->version < 1 || s->version > maxVersion) {
    return tide::fail(tideInvalidArgument, kComponent, "%s: %s->version is %u; this library supports 1..%u", fn,
                      what, s->version, maxVersion);
  }
  return tideSuccess;
}

using LayoutRef = std::shared_ptr<const tide::Layout>;

tideResult_t checkLayout(tideLayout_t handle, const char* fn, LayoutRef* out) {
  return tide::checkHandle(handle, tide::HandleKind::kLayout, fn, "layout", out);
}

tideResult_t checkNode(const LayoutRef& layout, int node, const char* fn) {
  if (node < 0 || node >= layout->nNodes) {
    return tide::fail(tideInvalidArgument, kComponent, "%s: node %d out of range [0, %d)", fn, node, layout->nNodes);
  }
  return tideSuccess;
}

}  // namespace

extern "C" {

TIDE_EXPORT tideResult_t tideLayoutCreate(const tideLayoutDesc_t* desc, const tideConfig_t* config,
                                          tideLayout_t* layout) {
  TIDE_API_BEGIN
  if (layout == nullptr) return tide::fail(tideInvalidArgument, kComponent, "tideLayoutCreate: layout is NULL");
  *layout = nullptr;
  std::unique_ptr<tide::Layout> created;
  TIDE_CHECK(tide::createLayout(desc, config, &created));
  std::shared_ptr<tide::Layout> shared(created.release());
  *layout = static_cast<tideLayout_t>(const_cast<void*>(tide::handles::add(tide::HandleKind::kLayout, shared)));
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideLayoutDestroy(tideLayout_t layout) {
  TIDE_API_BEGIN
  if (layout == nullptr) return tideSuccess;
  // The object is freed when the last call using it (on another thread) returns.
  if (!tide::handles::remove(layout, tide::HandleKind::kLayout)) {
    return tide::handles::failBad(layout, tide::HandleKind::kLayout, __func__, "layout");
  }
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideLayoutGetInfo(tideLayout_t handle, tideLayoutInfo_t* info) {
  TIDE_API_BEGIN
  LayoutRef layout;
  TIDE_CHECK(checkLayout(handle, __func__, &layout));
  TIDE_CHECK(checkOutStruct(info, __func__, "info", TIDE_LAYOUT_INFO_VERSION));
  info->nParams = layout->nParams;
  info->worldSize = layout->worldSize;
  info->ranksPerNode = layout->ranksPerNode;
  info->nNodes = layout->nNodes;
  info->rank = layout->rank;
  info->hash = layout->hash;
  info->sendBytes = layout->sendBytes;
  info->slotBytes = layout->slotBytes;
  info->rsOutNumel = layout->rsOutNumel;
  info->rsChunkNumel = layout->rs.chunkNumel;
  info->rsNumChunks = layout->rs.numChunks;
  info->rsStagingBytes = layout->rs.stagingBytes;
  info->slotReuseFits = layout->rs.slotReuseFits ? 1 : 0;
  info->paceBytes = layout->paceBytes;
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideLayoutGetParam(tideLayout_t handle, int index, tideParamInfo_t* info) {
  TIDE_API_BEGIN
  LayoutRef layout;
  TIDE_CHECK(checkLayout(handle, __func__, &layout));
  TIDE_CHECK(checkOutStruct(info, __func__, "info", TIDE_PARAM_INFO_VERSION));
  if (index < 0 || index >= layout->nParams) {
    return tide::fail(tideInvalidArgument, kComponent, "%s: index %d out of range [0, %d)", __func__, index,
                      layout->nParams);
  }
  const tide::ParamLayout& p = layout->params[index];
  info->numel = p.numel;
  info->rowNumel = p.rowNumel;
  info->shardNumel = p.shardNumel;
  info->dtype = p.dtype;
  info->elemSize = p.elemSize;
  info->sendOffset = p.sendOffset;
  info->slotOffset = p.slotOffset;
  info->rsOutOffset = p.rsOutOffset;
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideLayoutGetScheduleLength(tideLayout_t handle, int node, int* count) {
  TIDE_API_BEGIN
  LayoutRef layout;
  TIDE_CHECK(checkLayout(handle, __func__, &layout));
  if (count == nullptr) return tide::fail(tideInvalidArgument, kComponent, "%s: count is NULL", __func__);
  TIDE_CHECK(checkNode(layout, node, __func__));
  *count = tide::scheduleLength(*layout);
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideLayoutGetScheduleStep(tideLayout_t handle, int node, int index,
                                                   tideScheduleStep_t* step) {
  TIDE_API_BEGIN
  LayoutRef layout;
  TIDE_CHECK(checkLayout(handle, __func__, &layout));
  TIDE_CHECK(checkOutStruct(step, __func__, "step", TIDE_SCHEDULE_STEP_VERSION));
  TIDE_CHECK(checkNode(layout, node, __func__));
  int length = tide::scheduleLength(*layout);
  if (index < 0 || index >= length) {
    return tide::fail(tideInvalidArgument, kComponent, "%s: index %d out of range [0, %d)", __func__, index, length);
  }
  tide::ScheduleStep s = tide::scheduleStep(*layout, node, index);
  step->round = s.round;
  step->sendToNode = s.sendToNode;
  step->recvFromNode = s.recvFromNode;
  step->sendBlockNode = s.sendBlockNode;
  step->recvBlockNode = s.recvBlockNode;
  step->offset = s.offset;
  step->bytes = s.bytes;
  return tideSuccess;
  TIDE_API_END
}

}  // extern "C"
