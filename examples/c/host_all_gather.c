/* Copyright The nccl-tide authors
 * SPDX-License-Identifier: Apache-2.0 */
/* All-gather of one FSDP-style parameter group over simulated ranks, with the C API of libnccl-tide.so.
 *
 * The host executor (tideHostAllGather) runs every rank in this one process: no GPU, no NCCL. It is the oracle the
 * CUDA data path is checked against, and shows the layout a TIDE all-gather fills: every rank's unsharded storage of
 * parameter i holds shard i of rank s at element s * shardNumel_i (tide.h, "AG result").
 *
 * The group: three parameters as FSDP2 shards them (dim 0 split over the ranks, padded at the end), 8 ranks in 2
 * nodes of 4, so the inter-node schedule runs too, paced in small steps. Every element of every rank's output is
 * compared with the shard it must come from. Exit status 0 when all match, 1 otherwise (or on any TIDE error).
 *
 * Build and run: examples/README.md (make -C examples/c run).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tide.h"

#define WORLD 8
#define RANKS_PER_NODE 4
#define NPARAMS 3

#define CHECK(call)                                                                                   \
  do {                                                                                                \
    tideResult_t rc_ = (call);                                                                        \
    if (rc_ != tideSuccess) {                                                                         \
      fprintf(stderr, "%s failed: %s: %s\n", #call, tideGetErrorString(rc_), tideGetLastError()); \
      exit(1);                                                                                        \
    }                                                                                                 \
  } while (0)

/* A value that differs for every (rank, parameter, element), so a misplaced or missing copy shows. */
static uint32_t pattern(int rank, int param, uint64_t k) {
  uint64_t x = ((uint64_t)rank << 48) ^ ((uint64_t)param << 40) ^ k;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return (uint32_t)x;
}

static void* alloc_or_die(size_t bytes) {
  void* p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
    exit(1);
  }
  return p;
}

int main(void) {
  /* An attention weight [37 x 26] and an MLP weight [45 x 26] in bf16, a norm weight [26] in fp32. */
  const uint64_t numels[NPARAMS] = {37 * 26, 26, 45 * 26};
  const uint64_t rowNumels[NPARAMS] = {26, 1, 26};
  const tideDataType_t dtypes[NPARAMS] = {tideBfloat16, tideFloat32, tideBfloat16};

  tideLayoutDesc_t desc;
  memset(&desc, 0, sizeof desc);
  desc.size = sizeof desc;
  desc.version = TIDE_LAYOUT_DESC_VERSION;
  desc.nParams = NPARAMS;
  desc.numels = numels;
  desc.rowNumels = rowNumels;
  desc.dtypes = dtypes;
  desc.worldSize = WORLD;
  desc.ranksPerNode = RANKS_PER_NODE;
  desc.rank = 0; /* the host executor runs every rank; the layout is the same for all */

  tideConfig_t config;
  memset(&config, 0, sizeof config);
  config.size = sizeof config;
  config.version = TIDE_CONFIG_VERSION;
  config.paceBytes = 512; /* at most 512 bytes per inter-node step: several steps per round */

  tideLayout_t layout;
  CHECK(tideLayoutCreate(&desc, &config, &layout));
  tideLayoutInfo_t info;
  memset(&info, 0, sizeof info);
  info.size = sizeof info;
  info.version = TIDE_LAYOUT_INFO_VERSION;
  CHECK(tideLayoutGetInfo(layout, &info));
  int steps = 0;
  CHECK(tideLayoutGetScheduleLength(layout, 0, &steps));
  printf("layout: %d parameters, %d ranks in %d nodes of %d; per rank %llu send bytes, %llu slot bytes; "
         "inter-node schedule: %d steps per node\n",
         info.nParams, info.worldSize, info.nNodes, info.ranksPerNode, (unsigned long long)info.sendBytes,
         (unsigned long long)info.slotBytes, steps);

  tideParamInfo_t params[NPARAMS];
  for (int i = 0; i < NPARAMS; ++i) {
    memset(&params[i], 0, sizeof params[i]);
    params[i].size = sizeof params[i];
    params[i].version = TIDE_PARAM_INFO_VERSION;
    CHECK(tideLayoutGetParam(layout, i, &params[i]));
    /* FSDP2's padded shard, computed here independently: ceil(rows / W) rows. */
    uint64_t rows = numels[i] / rowNumels[i];
    uint64_t expected = (rows + WORLD - 1) / WORLD * rowNumels[i];
    if (params[i].shardNumel != expected) {
      fprintf(stderr, "parameter %d: shardNumel %llu, expected %llu\n", i,
              (unsigned long long)params[i].shardNumel, (unsigned long long)expected);
      return 1;
    }
  }

  /* Pointer tables indexed [rank * NPARAMS + i]: each rank's shard in, each rank's unsharded storage out. */
  void* shards[WORLD * NPARAMS];
  void* outs[WORLD * NPARAMS];
  for (int r = 0; r < WORLD; ++r) {
    for (int i = 0; i < NPARAMS; ++i) {
      const tideParamInfo_t* p = &params[i];
      unsigned char* shard = alloc_or_die(p->shardNumel * p->elemSize);
      for (uint64_t k = 0; k < p->shardNumel; ++k) {
        uint32_t v = pattern(r, i, k);
        memcpy(shard + k * p->elemSize, &v, p->elemSize);
      }
      shards[r * NPARAMS + i] = shard;
      outs[r * NPARAMS + i] = alloc_or_die(p->shardNumel * WORLD * p->elemSize);
      memset(outs[r * NPARAMS + i], 0xA5, p->shardNumel * WORLD * p->elemSize); /* nothing may survive */
    }
  }

  CHECK(tideHostAllGather(layout, (const void* const*)shards, outs));

  /* Every element on every rank: out(rank r, param i)[s * shardNumel + k] == shard(rank s, param i)[k]. */
  uint64_t checked = 0, wrong = 0;
  for (int r = 0; r < WORLD; ++r) {
    for (int i = 0; i < NPARAMS; ++i) {
      const tideParamInfo_t* p = &params[i];
      const unsigned char* out = outs[r * NPARAMS + i];
      for (int s = 0; s < WORLD; ++s) {
        for (uint64_t k = 0; k < p->shardNumel; ++k) {
          uint32_t v = pattern(s, i, k);
          if (memcmp(out + (s * p->shardNumel + k) * p->elemSize, &v, p->elemSize) != 0) {
            if (wrong < 5) {
              fprintf(stderr, "rank %d parameter %d: element %llu (from rank %d) is wrong\n", r, i,
                      (unsigned long long)(s * p->shardNumel + k), s);
            }
            ++wrong;
          }
          ++checked;
        }
      }
    }
  }
  printf("all-gather: %llu elements checked on %d ranks, %llu wrong\n", (unsigned long long)checked, WORLD,
         (unsigned long long)wrong);

  for (int j = 0; j < WORLD * NPARAMS; ++j) {
    free(shards[j]);
    free(outs[j]);
  }
  CHECK(tideLayoutDestroy(layout));
  printf("%s\n", wrong == 0 ? "OK" : "FAILED");
  return wrong == 0 ? 0 : 1;
}
