// C API: the host executor (all ranks simulated in one process).
#include "api_guard.h"
#include "errors.h"
#include "host_executor.h"
#include "tide.h"

extern "C" {

TIDE_EXPORT tideResult_t tideHostAllGather(tideLayout_t layout, const void* const* shards, void* const* params) {
  TIDE_API_BEGIN
  if (layout == nullptr) return tide::fail(tideInvalidArgument, "API", "tideHostAllGather: layout is NULL");
  return tide::hostAllGather(*layout, shards, params);
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideHostReduceScatter(tideLayout_t layout, const void* const* grads, void* const* outs,
                                               tideDataType_t outType, tideRedOp_t op, float scale) {
  TIDE_API_BEGIN
  if (layout == nullptr) return tide::fail(tideInvalidArgument, "API", "tideHostReduceScatter: layout is NULL");
  return tide::hostReduceScatter(*layout, grads, outs, outType, op, scale);
  TIDE_API_END
}

}  // extern "C"
