// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Host executor: runs the AG and RS plans over all W ranks of a layout in one process. It is the oracle for every
// other executor: its byte placement and its fp32 accumulation order are the contract (include/tide.h, top).
#ifndef TIDE_CORE_HOST_EXECUTOR_H_
#define TIDE_CORE_HOST_EXECUTOR_H_

#include "layout.h"
#include "tide.h"

namespace tide {

// shards[r * nParams + i] -> params[r * nParams + i] (see tideHostAllGather). Validates every pointer and checks
// for overlapping outputs before writing anything.
tideResult_t hostAllGather(const Layout& layout, const void* const* shards, void* const* params);

// grads[r * nParams + i] -> outs[r] (see tideHostReduceScatter). Validates everything before writing anything.
tideResult_t hostReduceScatter(const Layout& layout, const void* const* grads, void* const* outs,
                               tideDataType_t outType, tideRedOp_t op, float scale);

}  // namespace tide

#endif  // TIDE_CORE_HOST_EXECUTOR_H_
