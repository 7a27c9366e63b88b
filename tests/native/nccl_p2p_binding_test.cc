// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The NCCL binding of two-sided p2p groups without a GPU (tests/unit/test_nccl_p2p_binding.py): loads a stub
// libnccl.so.2 (tests/native/stub_nccl/recording_stub_nccl.c, which logs every call) as a framework would, resolves it with
// nccl::resolve() by its version, and issues p2p groups with nccl::issueGroup(). Prints "EXPECT <line>" for every
// call the stub must log, in order, and "RESULT <tideResult_t> <message>".
//
// Usage: nccl_p2p_binding_test STUB programs N R RANK   every p2p group of RANK's two-sided AG and RS programs of a
//                                                        layout of N nodes x R ranks (pointers: a fake base per
//                                                        memory kind + the transfer's offset)
//        nccl_p2p_binding_test STUB fail PEER           one group of a send to peer 0, a send to PEER, a receive
//                                                        from peer 1 (the stub fails the calls with PEER)
#include <dlfcn.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "errors.h"
#include "layout.h"
#include "nccl/nccl_lib.h"
#include "nccl/p2p_group.h"
#include "program.h"

using namespace tide;

namespace {

void* const kComm = reinterpret_cast<void*>(0xc0ffee00);
void* const kStream = reinterpret_cast<void*>(0x5eed0000);

[[noreturn]] void die(const char* what) {
  printf("FAIL: %s\n", what);
  exit(1);
}

void expect(const nccl::P2pCall& c) {
  printf("EXPECT %s %p %zu %d %d %p %p\n", c.send ? "SEND" : "RECV", c.buf, c.bytes, nccl::kNcclUint8, c.peer, kComm,
         kStream);
}

// Issues calls as one group; prints the lines the stub must log (all of them: the stub fails none here).
tideResult_t group(const nccl::Lib& lib, const std::vector<nccl::P2pCall>& calls) {
  printf("EXPECT GS\n");
  for (const nccl::P2pCall& c : calls) expect(c);
  printf("EXPECT GE\n");
  return nccl::issueGroup(lib, kComm, kStream, calls.data(), calls.size());
}

// Where a transfer's memory would be: a fake base per memory kind (never dereferenced), plus the offset.
void* pointerOf(const prog::Addr& a) {
  const uintptr_t base = a.mem == prog::Mem::kSlot ? 0x10000000u : a.mem == prog::Mem::kStaging ? 0x20000000u : 0;
  if (base == 0) die("a p2p transfer outside the slot and staging");
  return reinterpret_cast<void*>(base + a.offset);
}

tideResult_t programs(const nccl::Lib& lib, int N, int R, int rank) {
  const std::vector<uint64_t> numels = {1000, 77, 4097};
  const std::vector<tideDataType_t> dts(numels.size(), tideBfloat16);
  tideLayoutDesc_t d{sizeof(tideLayoutDesc_t), TIDE_LAYOUT_DESC_VERSION, static_cast<int>(numels.size()),
                     numels.data(), nullptr, dts.data(), N * R, R, rank};
  tideConfig_t cfg{sizeof(tideConfig_t), TIDE_CONFIG_VERSION, 2048, 1000};
  std::unique_ptr<Layout> l;
  if (createLayout(&d, &cfg, &l) != tideSuccess) die("createLayout failed");
  prog::Options opt;
  opt.transport = prog::Transport::kTwoSided;
  int groups = 0;
  for (int coll = 0; coll < 2; ++coll) {
    prog::Program p;
    if ((coll == 0 ? prog::compileAllGather(*l, opt, &p) : prog::compileReduceScatter(*l, opt, &p)) != tideSuccess) {
      die("compile failed");
    }
    for (const prog::Op& op : p.ops) {
      if (op.kind != prog::Op::kP2p) continue;
      std::vector<nccl::P2pCall> calls;
      for (uint32_t x = op.begin; x < op.end; ++x) {
        const prog::P2pXfer& t = p.p2p[x];
        calls.push_back(nccl::P2pCall{t.kind == prog::P2pXfer::kSend, t.peer, pointerOf(t.addr), t.bytes});
      }
      TIDE_CHECK(group(lib, calls));
      ++groups;
    }
  }
  printf("groups %d\n", groups);
  return tideSuccess;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) die("usage: nccl_p2p_binding_test STUB programs N R RANK | STUB fail PEER");
  if (dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr) die(dlerror());
  const nccl::Lib* lib = nullptr;
  if (nccl::resolve(&lib) != tideSuccess) die(lastError());
  printf("resolved NCCL %d.%d.%d, transport %s\n", lib->major, lib->minor, lib->patch, lib->transport);
  tideResult_t r = tideSuccess;
  if (strcmp(argv[2], "programs") == 0 && argc == 6) {
    r = programs(*lib, atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
  } else if (strcmp(argv[2], "fail") == 0) {
    const int peer = atoi(argv[3]);
    const std::vector<nccl::P2pCall> calls = {{true, 0, reinterpret_cast<void*>(0x1000), 64},
                                              {true, peer, reinterpret_cast<void*>(0x2000), 32},
                                              {false, 1, reinterpret_cast<void*>(0x3000), 16}};
    printf("EXPECT GS\n");
    expect(calls[0]);
    expect(calls[1]);  // fails: the receive after it is not issued, the group is still closed
    printf("EXPECT GE\n");
    r = nccl::issueGroup(*lib, kComm, kStream, calls.data(), calls.size());
  } else {
    die("unknown mode");
  }
  printf("RESULT %d %s\n", static_cast<int>(r), r == tideSuccess ? "" : lastError());
  return 0;
}
