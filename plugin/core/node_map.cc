// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "node_map.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "errors.h"
#include "fnv1a.h"

namespace tide {
namespace nodes {
namespace {

constexpr const char* kComponent = "Nodes";

uint64_t hashOf(const char* s) {
  Fnv1a h;
  h.bytes(s, strlen(s));
  return h.value();
}

// hostname followed by the boot id (containers may share a hostname across machines; the boot id tells kernels
// apart), as NCCL builds it.
void machineIdentity(char* buf, int len) {
  if (gethostname(buf, len - 1) != 0) snprintf(buf, len, "unknown");
  buf[len - 1] = '\0';
  size_t used = strlen(buf);
  if (FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char id[64] = {0};
    if (fscanf(f, "%63s", id) == 1) snprintf(buf + used, len - used, "%s", id);
    fclose(f);
  }
}

}  // namespace

void ncclHostIdentity(char* buf, int len) {
  const char* id = getenv("NCCL_HOSTID");
  if (id != nullptr) {
    snprintf(buf, len, "%s", id);
    return;
  }
  machineIdentity(buf, len);
}

RankHost localHost() {
  char buf[1024];
  RankHost h{};
  ncclHostIdentity(buf, sizeof(buf));
  h.ncclHost = hashOf(buf);
  machineIdentity(buf, sizeof(buf));
  h.machine = hashOf(buf);
  return h;
}

tideResult_t decide(const RankHost* all, int world, int override, int* ranksPerNode) {
  if (override > 0) {
    if (world % override != 0) {
      return fail(tideInvalidArgument, kComponent,
                  "NCCL_TIDE_RANKS_PER_NODE=%d does not divide the world size %d; set a divisor (or 0 to follow "
                  "NCCL's hosts)",
                  override, world);
    }
    for (int r = 0; r < world; ++r) {
      int first = r - r % override;
      if (all[r].machine != all[first].machine) {
        return fail(tideUnsupported, kComponent,
                    "NCCL_TIDE_RANKS_PER_NODE=%d declares ranks %d and %d one TIDE node, but they run on different "
                    "machines (hostname and boot id differ), so they cannot map each other's memory; choose a node "
                    "size whose ranks share a machine",
                    override, first, r);
      }
    }
    *ranksPerNode = override;
    return tideSuccess;
  }
  // NCCL's hosts: the first change of host after rank 0 gives the node size; every block must then be one host,
  // and every block a host of its own.
  int size = world;
  for (int r = 1; r < world; ++r) {
    if (all[r].ncclHost != all[0].ncclHost) {
      size = r;
      break;
    }
  }
  for (int r = 0; r < world; ++r) {
    int first = r - r % size;
    bool sameBlock = all[r].ncclHost == all[first].ncclHost;
    bool newHost = true;
    for (int q = 0; q < first && newHost; q += size) newHost = all[q].ncclHost != all[first].ncclHost;
    if (world % size != 0 || !sameBlock || !newHost) {
      return fail(tideUnsupported, kComponent,
                  "NCCL's hosts are not consecutive blocks of equally many ranks (rank %d breaks the pattern of "
                  "%d ranks per host): TIDE's node of rank r is r / ranks-per-node; launch ranks host-major, or set "
                  "NCCL_TIDE_RANKS_PER_NODE",
                  r, size);
    }
    if (all[r].machine != all[first].machine) {
      return fail(tideUnsupported, kComponent,
                  "ranks %d and %d are one NCCL host (same NCCL_HOSTID) but run on different machines (hostname and "
                  "boot id differ); they cannot map each other's memory: give each machine its own NCCL_HOSTID",
                  first, r);
    }
  }
  *ranksPerNode = size;
  return tideSuccess;
}

}  // namespace nodes
}  // namespace tide
