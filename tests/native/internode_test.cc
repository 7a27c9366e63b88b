// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// plugin/core/internode: the choice of a comm's inter-node transport from NCCL_TIDE_INTERNODE and what its provider
// maps, over every combination of setting, mapping and NCCL communicator, and the parameter as this process's
// environment sets it. Usage: internode_test <expected NCCL_TIDE_INTERNODE index, or "invalid">; prints "all checks
// passed".
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "expect.h"
#include "errors.h"
#include "internode.h"
#include "params.h"

using tide::internode::Transport;
using tide::internode::World;
namespace params = tide::params;

static bool has(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  // The parameter as the environment set it: a valid value is the accessor's, an invalid one an error of status().
  if (strcmp(argv[1], "invalid") == 0) {
    EXPECT(params::status(params::kInterNode) == tideInvalidArgument, "an invalid value must fail status()");
    EXPECT(has(tide::lastError(), "NCCL_TIDE_INTERNODE") && has(tide::lastError(), "auto, sendrecv, rma"), "%s",
           tide::lastError());
  } else {
    EXPECT(params::status(params::kInterNode) == tideSuccess, "%s", tide::lastError());
    EXPECT(static_cast<int>(params::interNode()) == atoi(argv[1]), "interNode() is %d, expected %s",
           static_cast<int>(params::interNode()), argv[1]);
  }

  const params::InterNodeSetting settings[] = {params::kInterNodeAuto, params::kInterNodeSendRecv,
                                               params::kInterNodeRma};
  for (params::InterNodeSetting setting : settings) {
    for (int mapsAll = 0; mapsAll < 2; ++mapsAll) {
      for (int nccl = 0; nccl < 2; ++nccl) {
        World w;
        w.worldSize = 4;
        w.ranksPerNode = mapsAll ? 4 : 2;
        w.peerMapsAllRanks = mapsAll;
        w.overNccl = nccl;
        w.provider = "ipc";
        Transport t = Transport::kPeerMapped;
        char line[512] = "";
        const tideResult_t r = tide::internode::choose(setting, w, &t, line, sizeof(line));
        const std::string err = r == tideSuccess ? "" : tide::lastError();
        const std::string text = line;
        // Early check: what does not depend on the node split refuses alike.
        const tideResult_t early = tide::internode::checkSetting(setting, nccl, "ipc");
        if (setting == params::kInterNodeRma) {
          EXPECT(r == tideUnsupported && early == tideUnsupported, "rma must be refused");
          EXPECT(has(err, "NCCL_TIDE_INTERNODE=rma") && has(err, "not built") && has(err, "ncclPutSignal"), "%s",
                 err.c_str());
        } else if (setting == params::kInterNodeSendRecv && !nccl) {
          EXPECT(r == tideUnsupported && early == tideUnsupported, "forced sendrecv without NCCL must be refused");
          EXPECT(has(err, "NCCL_TIDE_INTERNODE=sendrecv") && has(err, "tideCommCreate"), "%s", err.c_str());
        } else if (setting == params::kInterNodeSendRecv) {
          EXPECT(r == tideSuccess && early == tideSuccess && t == Transport::kSendRecv, "forced sendrecv: %s",
                 err.c_str());
          EXPECT(has(text, "inter-node transport sendrecv (forced by NCCL_TIDE_INTERNODE=sendrecv)") &&
                     has(text, "NCCL's kernels, which use SMs"),
                 "%s", line);
        } else if (mapsAll) {
          EXPECT(r == tideSuccess && early == tideSuccess && t == Transport::kPeerMapped, "auto, mapped: %s",
                 err.c_str());
          EXPECT(has(text, "inter-node transport peer-mapped") && has(text, "4 ranks, 4 per node"), "%s", line);
        } else if (nccl) {
          EXPECT(r == tideSuccess && early == tideSuccess && t == Transport::kSendRecv, "auto, not mapped: %s",
                 err.c_str());
          EXPECT(has(text, "inter-node transport sendrecv (2 TIDE nodes of 2 ranks do not map each other's memory)") &&
                     has(text, "grouped ncclSend / ncclRecv") && has(text, "use SMs"),
                 "%s", line);
        } else {
          EXPECT(r == tideUnsupported && early == tideSuccess, "auto, not mapped, no NCCL must be refused");
          EXPECT(has(err, "2 TIDE nodes") && has(err, "tideCommCreate"), "%s", err.c_str());
        }
        EXPECT(strcmp(tide::internode::name(t), t == Transport::kSendRecv ? "sendrecv" : "peer-mapped") == 0,
               "name");
      }
    }
  }
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("all checks passed\n");
  return 0;
}
