// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// plugin/core/node_map: TIDE's nodes follow NCCL's hosts (NCCL_HOSTID honoured as NCCL does) unless
// NCCL_TIDE_RANKS_PER_NODE declares them. Random worlds; every decision is checked against a direct model.
// Usage: node_map_test <trials>; prints "all checks passed".
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "expect.h"
#include "errors.h"
#include "node_map.h"

using tide::nodes::RankHost;

// The model: host h of rank r is hostOf[r]; the split is valid iff every block of `size` ranks is one host, blocks
// are distinct hosts, and each block is one machine.
static int modelSize(const std::vector<int>& hostOf, const std::vector<int>& machineOf) {
  int world = static_cast<int>(hostOf.size());
  for (int size = 1; size <= world; ++size) {
    if (world % size) continue;
    bool ok = true;
    for (int r = 0; r < world && ok; ++r) ok = hostOf[r] == hostOf[r - r % size];
    for (int b = 0; b < world && ok; b += size)
      for (int c = 0; c < b && ok; c += size) ok = hostOf[b] != hostOf[c];
    if (ok) {
      for (int r = 0; r < world; ++r)
        if (machineOf[r] != machineOf[r - r % size]) return -1;
      return size;
    }
  }
  return -1;
}

int main(int argc, char** argv) {
  int trials = argc > 1 ? atoi(argv[1]) : 200;
  std::mt19937_64 rng(12345);
  // NCCL_HOSTID is the identity when set, and only then.
  setenv("NCCL_HOSTID", "tide-test-host-7", 1);
  char buf[256];
  tide::nodes::ncclHostIdentity(buf, sizeof(buf));
  EXPECT(strcmp(buf, "tide-test-host-7") == 0, "identity '%s'", buf);
  RankHost a = tide::nodes::localHost();
  setenv("NCCL_HOSTID", "tide-test-host-8", 1);
  RankHost b = tide::nodes::localHost();
  EXPECT(a.ncclHost != b.ncclHost && a.machine == b.machine, "NCCL_HOSTID changes the NCCL host only");
  unsetenv("NCCL_HOSTID");
  tide::nodes::ncclHostIdentity(buf, sizeof(buf));
  EXPECT(strlen(buf) > 0 && strcmp(buf, "tide-test-host-8") != 0, "unset: hostname + boot id, got '%s'", buf);
  RankHost c = tide::nodes::localHost();
  EXPECT(c.ncclHost == c.machine, "without NCCL_HOSTID the NCCL host is the machine");

  int checked = 0;
  for (int t = 0; t < trials; ++t) {
    int world = 1 + static_cast<int>(rng() % 16);
    int shape = static_cast<int>(rng() % 4);
    std::vector<int> hostOf(world), machineOf(world);
    int per = 1 + static_cast<int>(rng() % world);
    while (world % per) --per;
    for (int r = 0; r < world; ++r) {
      switch (shape) {
        case 0: hostOf[r] = r / per; machineOf[r] = 0; break;           // NCCL_HOSTID per block, one machine
        case 1: hostOf[r] = r / per; machineOf[r] = r / per; break;     // real hosts
        case 2: hostOf[r] = static_cast<int>(rng() % 3); machineOf[r] = 0; break;  // any pattern
        default: hostOf[r] = r / per; machineOf[r] = static_cast<int>(rng() % 2); break;  // a host spans machines
      }
    }
    std::vector<RankHost> all(world);
    for (int r = 0; r < world; ++r) all[r] = {1000u + static_cast<uint64_t>(hostOf[r]), 77u + static_cast<uint64_t>(machineOf[r])};
    int got = -7;
    tideResult_t rc = tide::nodes::decide(all.data(), world, 0, &got);
    int want = modelSize(hostOf, machineOf);
    EXPECT((rc == tideSuccess) == (want > 0), "trial %d world %d: rc %d, model %d", t, world, rc, want);
    if (rc == tideSuccess) EXPECT(got == want, "trial %d: size %d, model %d", t, got, want);
    if (rc != tideSuccess) EXPECT(rc == tideUnsupported && strlen(tide::lastError()) > 0, "trial %d: rc %d", t, rc);
    // The override: any divisor whose blocks are one machine each, whatever NCCL's hosts are.
    int over = 1 + static_cast<int>(rng() % world);
    got = -7;
    rc = tide::nodes::decide(all.data(), world, over, &got);
    bool divides = world % over == 0;
    bool oneMachine = true;
    for (int r = 0; r < world && divides; ++r) oneMachine = oneMachine && machineOf[r] == machineOf[r - r % over];
    if (!divides) {
      EXPECT(rc == tideInvalidArgument, "trial %d: override %d of %d: rc %d", t, over, world, rc);
    } else if (!oneMachine) {
      EXPECT(rc == tideUnsupported && strstr(tide::lastError(), "different machines") != nullptr,
             "trial %d: override spans machines: rc %d", t, rc);
    } else {
      EXPECT(rc == tideSuccess && got == over, "trial %d: override %d: rc %d got %d", t, over, rc, got);
    }
    ++checked;
  }
  if (failures) {
    printf("%d failures\n", failures);
    return 1;
  }
  printf("all checks passed (%d worlds)\n", checked);
  return 0;
}
