// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Native-thread concurrency check of the host-only C API (docs/reliability.md, "Thread
// safety"): 8 threads at once create/query/destroy layouts, run the host AG and RS (checked against closed-form
// values), query parameters and fail calls with a thread-specific value that tideGetLastError (thread-local) must
// still report. Built and run by tests/unit/test_concurrency.py; with a -DTIDE_SANITIZE=thread library and
// -fsanitize=thread it is the ThreadSanitizer check (no Python interpreter in between).
// Usage: concurrency_driver [iterations per thread].
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tide.h"

static int check(int tid, int iters) {
  unsigned seed = 12345u + 977u * tid;
  auto rnd = [&](unsigned n) { seed = seed * 1664525u + 1013904223u; return (seed >> 8) % n; };
  for (int it = 0; it < iters; ++it) {
    const int world = 4, rpn = (it % 2) ? 2 : 4, n = 1 + rnd(4);
    std::vector<uint64_t> numels(n);
    std::vector<tideDataType_t> dts(n, tideFloat32);
    for (auto& x : numels) x = 1 + rnd(3000);
    tideLayoutDesc_t d{sizeof(d), TIDE_LAYOUT_DESC_VERSION, n, numels.data(), nullptr, dts.data(), world, rpn, 0};
    tideLayout_t lay = nullptr;
    if (tideLayoutCreate(&d, nullptr, &lay) != tideSuccess) {
      printf("FAIL create %s\n", tideGetLastError());
      return 1;
    }
    tideLayoutInfo_t info{}; info.size = sizeof(info); info.version = TIDE_LAYOUT_INFO_VERSION;
    if (tideLayoutGetInfo(lay, &info) != tideSuccess) return 2;
    std::vector<tideParamInfo_t> ps(n);
    for (int i = 0; i < n; ++i) { ps[i].size = sizeof(ps[i]); ps[i].version = TIDE_PARAM_INFO_VERSION;
      if (tideLayoutGetParam(lay, i, &ps[i]) != tideSuccess) return 3; }
    // AG: shards[r][i] = r*1e6 + i*1e4 + k
    std::vector<std::vector<float>> sh(world * n), full(world * n);
    std::vector<const void*> src(world * n); std::vector<void*> dst(world * n);
    for (int r = 0; r < world; ++r) for (int i = 0; i < n; ++i) {
      auto& s = sh[r * n + i]; s.resize(ps[i].shardNumel);
      for (size_t k = 0; k < s.size(); ++k) s[k] = float(r * 100000 + i * 1000 + k % 1000);
      full[r * n + i].assign(ps[i].shardNumel * world, -1.f);
      src[r * n + i] = s.data(); dst[r * n + i] = full[r * n + i].data(); }
    if (tideHostAllGather(lay, src.data(), dst.data()) != tideSuccess) {
      printf("FAIL ag %s\n", tideGetLastError());
      return 4;
    }
    for (int r = 0; r < world; ++r) for (int i = 0; i < n; ++i) for (int s = 0; s < world; ++s)
      if (memcmp(full[r * n + i].data() + s * ps[i].shardNumel, sh[s * n + i].data(), ps[i].shardNumel * 4)) return 5;
    // RS: grads[r][i][k] = r + 1 (exact sums); out = world*(world+1)/2 for valid elements
    std::vector<std::vector<float>> g(world * n), out(world);
    std::vector<const void*> gp(world * n); std::vector<void*> op(world);
    for (int r = 0; r < world; ++r) {
      for (int i = 0; i < n; ++i) {
        g[r * n + i].assign(numels[i], float(r + 1));
        gp[r * n + i] = g[r * n + i].data();
      }
      out[r].assign(info.rsOutNumel, -7.f);
      op[r] = out[r].data();
    }
    if (tideHostReduceScatter(lay, gp.data(), op.data(), tideFloat32, tideSum, 1.f) != tideSuccess) return 6;
    for (int r = 0; r < world; ++r) for (int i = 0; i < n; ++i) {
      uint64_t lo = r * ps[i].shardNumel;
      for (uint64_t k = 0; k < ps[i].shardNumel; ++k) {
        float want = (lo + k < numels[i]) ? 10.f : 0.f;
        if (out[r][ps[i].rsOutOffset + k] != want) {
          printf("FAIL rs r%d i%d k%llu\n", r, i, (unsigned long long)k);
          return 7;
        }
      }
    }
    tideLayoutDestroy(lay);
    int count = 0; const char *nm = nullptr, *val = nullptr;
    if (tideParamCount(&count) != tideSuccess) return 8;
    if (tideParamDescribe(int(rnd(count)), &nm, nullptr, nullptr, nullptr, &val) != tideSuccess) return 8;
    // error path: a thread-specific world size in the message, still there after a yield
    int bad = 70000 + tid * 1000 + int(rnd(1000));
    tideLayoutDesc_t e = d; e.worldSize = bad; e.ranksPerNode = 1;
    tideLayout_t none = nullptr;
    if (tideLayoutCreate(&e, nullptr, &none) == tideSuccess) return 9;
    std::this_thread::yield();
    if (!strstr(tideGetLastError(), std::to_string(bad).c_str())) {
      printf("FAIL lasterr %s\n", tideGetLastError());
      return 10;
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  int threads = 8, iters = argc > 1 ? atoi(argv[1]) : 100;
  std::vector<int> rc(threads, -1);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] { rc[t] = check(t, iters); });
  for (auto& t : ts) t.join();
  for (int t = 0; t < threads; ++t) if (rc[t]) { printf("thread %d failed: %d\n", t, rc[t]); return 1; }
  printf("OK %d threads x %d iterations\n", threads, iters);
  return 0;
}
