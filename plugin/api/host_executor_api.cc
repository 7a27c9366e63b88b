// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// C API: the host executor (all ranks simulated in one process).
#include "api_guard.h"
#include "c_enum.h"
#include "errors.h"
#include "handles.h"
#include "host_executor.h"
#include "tide.h"

extern "C" {

TIDE_EXPORT tideResult_t tideHostAllGather(tideLayout_t handle, const void* const* shards, void* const* params) {
  TIDE_API_BEGIN
  std::shared_ptr<const tide::Layout> layout;  // keeps the layout alive if another thread destroys the handle
  TIDE_CHECK(tide::checkHandle(handle, tide::HandleKind::kLayout, __func__, "layout", &layout));
  return tide::hostAllGather(*layout, shards, params);
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideHostReduceScatter(tideLayout_t handle, const void* const* grads, void* const* outs,
                                               tideDataType_t outType, tideRedOp_t op, float scale) {
  TIDE_API_BEGIN
  std::shared_ptr<const tide::Layout> layout;
  TIDE_CHECK(tide::checkHandle(handle, tide::HandleKind::kLayout, __func__, "layout", &layout));
  // Range-check the caller's ints before they are used as enums (plugin/core/c_enum.h); the core validates the rest.
  const int rawOut = tide::rawEnum(outType), rawOp = tide::rawEnum(op);
  if (!tide::enumInRange(rawOp, tideNumRedOps)) {
    return tide::fail(tideInvalidArgument, "HostRS", "op is %d; use tideSum, tideAvg or tidePremulSum", rawOp);
  }
  if (!tide::enumInRange(rawOut, tideNumDataTypes)) {
    return tide::fail(tideInvalidArgument, "HostRS",
                      "outType is %d (unknown); use tideFloat32, tideBfloat16 or tideFloat16", rawOut);
  }
  return tide::hostReduceScatter(*layout, grads, outs, static_cast<tideDataType_t>(rawOut),
                                 static_cast<tideRedOp_t>(rawOp), scale);
  TIDE_API_END
}

}  // extern "C"
