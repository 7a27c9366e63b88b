// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Host-side smoke test of the C API (core engineer's self-check; pytest covers the same ground via ctypes).
// Build: cmake -S . -B /tmp/b -DTIDE_BUILD_CUDA=OFF && cmake --build /tmp/b &&
//   g++ -std=c++17 -O2 -Iinclude -Iplugin/core tests/native/host_smoke.cc plugin/core/dtype.cc -L/tmp/b -lnccl-tide \
//   -Wl,-rpath,/tmp/b -o /tmp/host_smoke && /tmp/host_smoke
// Checks: fp16/bf16 conversions against _Float16 and nearest-even by hand; host AG byte-exact over 16 world/rpn
// shapes x 4 pacing caps (incl. 3, 5, 6, 12, 13 nodes); host RS bit-exact to an independent loop in the documented
// order for every out type and op; staging constant across W; error paths; params; gate.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <random>
#include <thread>
#include <vector>
#include "tide.h"
#include "dtype.h"

#define CK(x) do { tideResult_t r_ = (x); if (r_ != tideSuccess) { printf("FAIL %s:%d %s -> %s: %s\n", __FILE__, __LINE__, #x, tideGetErrorString(r_), tideGetLastError()); exit(1);} } while (0)
static int fails = 0;
#define EXPECT(c) do { if (!(c)) { printf("EXPECT failed line %d: %s\n", __LINE__, #c); ++fails; } } while (0)

std::mt19937_64 rng(42);

static void convTests() {
  using namespace tide::dtype;
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 ref; uint16_t hh = h; memcpy(&ref, &hh, 2);
    float a = halfToFloat(h), b = (float)ref;
    if (std::isnan(b)) { EXPECT(std::isnan(a)); continue; }
    if (memcmp(&a, &b, 4) != 0) { printf("h2f %x\n", h); ++fails; break; }
    uint16_t back = floatToHalf(a); if (back != h) { printf("roundtrip %x -> %x\n", h, back); ++fails; break; }
  }
  for (uint64_t i = 0; i < (1ull << 32); i += 977) {
    uint32_t u = (uint32_t)i; float f; memcpy(&f, &u, 4);
    _Float16 r = (_Float16)f; uint16_t rb; memcpy(&rb, &r, 2);
    uint16_t mine = floatToHalf(f);
    if (std::isnan(f)) { EXPECT((mine & 0x7c00) == 0x7c00 && (mine & 0x3ff)); continue; }
    if (mine != rb) { printf("f2h %08x: %04x vs %04x\n", u, mine, rb); ++fails; break; }
    // bf16 reference: RNE via double? exact: compare with rounding by hand using long arithmetic
    uint16_t bf = floatToBf16(f); float back = bf16ToFloat(bf);
    if (std::isinf(back) && !std::isinf(f)) continue;
    // back must be nearest among bf16 neighbors
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u; float flo, fhi; memcpy(&flo, &lo, 4); memcpy(&fhi, &hi, 4);
    double dl = std::fabs((double)f - flo), dh = std::fabs((double)fhi - f);
    uint16_t expect = dl < dh ? lo >> 16 : dh < dl ? hi >> 16 : (((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
    if (std::isinf(fhi) || std::isnan(fhi)) continue;
    if (bf != expect) { printf("f2bf %08x: %04x vs %04x\n", u, bf, expect); ++fails; break; }
  }
}

struct L { tideLayout_t l; tideLayoutInfo_t info; std::vector<tideParamInfo_t> p; };
static L make(std::vector<uint64_t> numels, std::vector<uint64_t> rows, std::vector<tideDataType_t> dts, int W, int R, uint64_t chunk, uint64_t pace) {
  tideLayoutDesc_t d{}; d.size = sizeof d; d.version = TIDE_LAYOUT_DESC_VERSION; d.nParams = numels.size();
  d.numels = numels.data(); d.rowNumels = rows.empty() ? nullptr : rows.data(); d.dtypes = dts.data(); d.worldSize = W; d.ranksPerNode = R; d.rank = 0;
  tideConfig_t c{}; c.size = sizeof c; c.version = TIDE_CONFIG_VERSION; c.rsChunkBytes = chunk; c.paceBytes = pace;
  L x; CK(tideLayoutCreate(&d, &c, &x.l));
  x.info.size = sizeof x.info; x.info.version = TIDE_LAYOUT_INFO_VERSION; CK(tideLayoutGetInfo(x.l, &x.info));
  for (int i = 0; i < d.nParams; ++i) { tideParamInfo_t pi{}; pi.size = sizeof pi; pi.version = 1; CK(tideLayoutGetParam(x.l, i, &pi)); x.p.push_back(pi); }
  return x;
}

static void agTest(int W, int R, int nP, uint64_t pace) {
  std::vector<uint64_t> numels, rows; std::vector<tideDataType_t> dts;
  for (int i = 0; i < nP; ++i) { uint64_t r = 1 + rng() % 40, c = 1 + rng() % 5; numels.push_back(r * c); rows.push_back(c); dts.push_back((tideDataType_t)(rng() % 7)); }
  L x = make(numels, rows, dts, W, R, 0, pace);
  std::vector<std::vector<unsigned char>> shards(W * nP), params(W * nP);
  std::vector<const void*> sp(W * nP); std::vector<void*> pp(W * nP);
  for (int r = 0; r < W; ++r) for (int i = 0; i < nP; ++i) {
    auto& s = shards[r * nP + i]; s.resize(x.p[i].shardNumel * x.p[i].elemSize); for (auto& b : s) b = rng();
    auto& p = params[r * nP + i]; p.assign(s.size() * W, 0xAB); sp[r * nP + i] = s.data(); pp[r * nP + i] = p.data();
  }
  CK(tideHostAllGather(x.l, sp.data(), pp.data()));
  for (int r = 0; r < W; ++r) for (int i = 0; i < nP; ++i) for (int s = 0; s < W; ++s) {
    size_t sb = shards[s * nP + i].size();
    if (memcmp(params[r * nP + i].data() + s * sb, shards[s * nP + i].data(), sb)) { printf("AG mismatch W=%d R=%d r=%d i=%d s=%d\n", W, R, r, i, s); ++fails; return; }
  }
  // schedule properties
  int len0 = -1;
  for (int n = 0; n < x.info.nNodes; ++n) { int len; CK(tideLayoutGetScheduleLength(x.l, n, &len)); if (len0 < 0) len0 = len; EXPECT(len == len0);
    for (int k = 0; k < len; ++k) { tideScheduleStep_t st{}; st.size = sizeof st; st.version = 1; CK(tideLayoutGetScheduleStep(x.l, n, k, &st)); EXPECT(st.bytes >= 1 && st.bytes <= x.info.paceBytes); } }
  if (x.info.nNodes == 1) EXPECT(len0 == 0);
  tideLayoutDestroy(x.l);
}

static float ld(const void* p, tideDataType_t t, uint64_t k) {
  if (t == tideFloat32) return ((const float*)p)[k];
  uint16_t h = ((const uint16_t*)p)[k];
  return t == tideBfloat16 ? tide::dtype::bf16ToFloat(h) : tide::dtype::halfToFloat(h);
}

static void rsTest(int W, int R, int nP, tideDataType_t outT, tideRedOp_t op, uint64_t chunk) {
  std::vector<uint64_t> numels; std::vector<tideDataType_t> dts;
  for (int i = 0; i < nP; ++i) { numels.push_back(1 + rng() % 100); dts.push_back((tideDataType_t)(rng() % 3)); }
  L x = make(numels, {}, dts, W, R, chunk, 0);
  std::vector<std::vector<unsigned char>> g(W * nP); std::vector<const void*> gp(W * nP);
  std::normal_distribution<float> nd;
  for (int r = 0; r < W; ++r) for (int i = 0; i < nP; ++i) {
    size_t es = x.p[i].elemSize; g[r * nP + i].resize(numels[i] * es);
    for (uint64_t k = 0; k < numels[i]; ++k) { float v = nd(rng); if (es == 4) memcpy(&g[r*nP+i][k*4], &v, 4); else { uint16_t h = dts[i] == tideBfloat16 ? tide::dtype::floatToBf16(v) : tide::dtype::floatToHalf(v); memcpy(&g[r*nP+i][k*2], &h, 2);} }
    gp[r * nP + i] = g[r * nP + i].data();
  }
  size_t oes; tideDataTypeSize(outT, &oes);
  std::vector<std::vector<unsigned char>> o(W, std::vector<unsigned char>(x.info.rsOutNumel * oes, 0xCD)); std::vector<void*> op_(W);
  for (int r = 0; r < W; ++r) op_[r] = o[r].data();
  float scale = 0.37f;
  CK(tideHostReduceScatter(x.l, gp.data(), op_.data(), outT, op, scale));
  int N = W / R; double maxerr = 0;
  for (int r = 0; r < W; ++r) for (int i = 0; i < nP; ++i) for (uint64_t k = 0; k < x.p[i].shardNumel; ++k) {
    uint64_t j = r * x.p[i].shardNumel + k; float tot = 0; double ref = 0;
    for (int m = 0; m < N; ++m) { float part = 0;
      for (int q = 0; q < R; ++q) { int s = m * R + q; float v = j < numels[i] ? ld(gp[s*nP+i], dts[i], j) : 0.f; ref += (double)v * (op == tidePremulSum ? scale : 1);
        if (op == tidePremulSum) v = v * scale; part = q == 0 ? v : part + v; }
      tot = m == 0 ? part : tot + part; }
    if (op == tideAvg) { tot = tot / (float)W; ref /= W; }
    float got = ld(o[r].data(), outT, x.p[i].rsOutOffset + k);
    float want = outT == tideFloat32 ? tot : outT == tideBfloat16 ? tide::dtype::bf16ToFloat(tide::dtype::floatToBf16(tot)) : tide::dtype::halfToFloat(tide::dtype::floatToHalf(tot));
    if (memcmp(&got, &want, 4)) { printf("RS mismatch W=%d r=%d i=%d k=%llu got %g want %g\n", W, r, i, (unsigned long long)k, got, want); ++fails; return; }
    maxerr = std::fmax(maxerr, std::fabs(ref - tot));
  }
  EXPECT(maxerr < 1e-3 * W);
  tideLayoutDestroy(x.l);
}

// checked handles (destroyed, double destroy, garbage, wrong type), a destroy racing host AGs on other
// threads, misaligned bf16 buffers, canonical NaN results. Under ASan (leak detection on) and valgrind.
static void handleTests() {
  uint64_t n[1] = {64}; tideDataType_t dt[1] = {tideFloat32};
  tideLayoutDesc_t d{}; d.size = sizeof d; d.version = 1; d.nParams = 1; d.numels = n; d.dtypes = dt; d.worldSize = 2; d.ranksPerNode = 2;
  tideLayout_t dead = nullptr; CK(tideLayoutCreate(&d, nullptr, &dead)); CK(tideLayoutDestroy(dead));
  std::vector<unsigned char> junk(512, 0xab);
  int onStack = 0;
  tideLayout_t bad[] = {dead, (tideLayout_t)(void*)junk.data(), (tideLayout_t)(void*)&onStack, (tideLayout_t)0x1234560};
  tideLayoutInfo_t info{}; info.size = sizeof info; info.version = 1;
  tideParamInfo_t pi{}; pi.size = sizeof pi; pi.version = 1;
  tideScheduleStep_t st{}; st.size = sizeof st; st.version = 1;
  std::vector<float> a(64), b(64); const void* in[2] = {a.data(), b.data()}; void* out[2] = {a.data(), b.data()};
  for (tideLayout_t h : bad) {
    int c = -1;
    EXPECT(tideLayoutGetInfo(h, &info) == tideInvalidArgument && strstr(tideGetLastError(), "not a live tideLayout_t"));
    EXPECT(tideLayoutGetParam(h, 0, &pi) == tideInvalidArgument);
    EXPECT(tideLayoutGetScheduleLength(h, 0, &c) == tideInvalidArgument && c == -1);
    EXPECT(tideLayoutGetScheduleStep(h, 0, 0, &st) == tideInvalidArgument);
    EXPECT(tideHostAllGather(h, in, out) == tideInvalidArgument);
    EXPECT(tideHostReduceScatter(h, in, out, tideFloat32, tideSum, 1.f) == tideInvalidArgument);
    EXPECT(tideAttachLayout((struct ncclComm*)0x1000, (void*)0x2000, h) == tideInvalidArgument);
    EXPECT(tideLayoutDestroy(h) == tideInvalidArgument);
  }
  EXPECT(strstr((tideLayoutGetInfo(dead, &info), tideGetLastError()), "destroyed") != nullptr);
  tideLayout_t again = nullptr; CK(tideLayoutCreate(&d, nullptr, &again)); EXPECT(again != dead); CK(tideLayoutDestroy(again));
  // A layout handle passed as a comm (host-only build: tideUnsupported; never a dereference).
  int r = 0, w = 0; EXPECT(tideCommGetRank((tideComm_t)(void*)junk.data(), &r, &w) != tideSuccess);
  // Destroy while 3 threads run host all-gathers on it: each call completes or is refused; nothing is freed under one.
  for (int round = 0; round < 20; ++round) {
    uint64_t big[2] = {1 << 16, 1 << 14}; tideDataType_t dts[2] = {tideFloat32, tideBfloat16};
    tideLayoutDesc_t dd = d; dd.nParams = 2; dd.numels = big; dd.dtypes = dts; dd.worldSize = 4; dd.ranksPerNode = 2;
    tideLayout_t l = nullptr; CK(tideLayoutCreate(&dd, nullptr, &l));
    std::vector<std::thread> ts; std::vector<int> bads(3, 0);
    for (int t = 0; t < 3; ++t) ts.emplace_back([&, t] {
      std::vector<std::vector<char>> sh(8), pa(8); const void* s8[8]; void* p8[8];
      for (int k = 0; k < 8; ++k) { size_t e = k % 2 ? 2 : 4, num = big[k % 2]; sh[k].assign(num / 4 * e, 1); pa[k].assign(num * e, 0); s8[k] = sh[k].data(); p8[k] = pa[k].data(); }
      for (int it = 0; it < 4; ++it) { tideResult_t rc = tideHostAllGather(l, s8, p8); if (rc != tideSuccess && rc != tideInvalidArgument) ++bads[t]; }
    });
    std::this_thread::sleep_for(std::chrono::microseconds(200 * (round % 5)));
    CK(tideLayoutDestroy(l));
    for (auto& t : ts) t.join();
    for (int x : bads) EXPECT(x == 0);
  }
  // Misaligned bf16 gradient and output: refused, nothing written.
  uint64_t n2[1] = {8}; tideDataType_t bf[1] = {tideBfloat16}; tideLayoutDesc_t db = d; db.numels = n2; db.dtypes = bf;
  tideLayout_t lb = nullptr; CK(tideLayoutCreate(&db, nullptr, &lb));
  std::vector<unsigned char> raw(64, 0x11); const void* g2[2] = {raw.data() + 1, raw.data() + 20}; void* o2[2] = {raw.data() + 40, raw.data() + 52};
  EXPECT(tideHostReduceScatter(lb, g2, o2, tideBfloat16, tideSum, 1.f) == tideInvalidArgument && strstr(tideGetLastError(), "aligned"));
  g2[0] = raw.data() + 2; o2[1] = raw.data() + 53;
  EXPECT(tideHostReduceScatter(lb, g2, o2, tideBfloat16, tideSum, 1.f) == tideInvalidArgument && strstr(tideGetLastError(), "outs[1]"));
  for (size_t k = 40; k < 64; ++k) EXPECT(raw[k] == 0x11);
  CK(tideLayoutDestroy(lb));
  // NaN + (-NaN) and NaN payloads: every NaN result is the canonical one, in vector bodies and scalar tails.
  uint64_t n3[1] = {74}; tideLayoutDesc_t dn = d; dn.numels = n3;
  tideLayout_t ln = nullptr; CK(tideLayoutCreate(&dn, nullptr, &ln));
  std::vector<uint32_t> x0(74), x1(74), y0(37, 0), y1(37, 0);
  for (int k = 0; k < 74; ++k) { x0[k] = k % 3 ? 0x7fc00000u : 0x7fa00001u; x1[k] = k % 2 ? 0xffc00000u : 0xffe12345u; }
  const void* g3[2] = {x0.data(), x1.data()}; void* o3[2] = {y0.data(), y1.data()};
  CK(tideHostReduceScatter(ln, g3, o3, tideFloat32, tideSum, 1.f));
  for (int k = 0; k < 37; ++k) EXPECT(y0[k] == TIDE_CANONICAL_NAN_F32 && y1[k] == TIDE_CANONICAL_NAN_F32);
  std::vector<uint16_t> h0(37), h1(37); void* o4[2] = {h0.data(), h1.data()};
  CK(tideHostReduceScatter(ln, g3, o4, tideBfloat16, tideAvg, 1.f));
  for (int k = 0; k < 37; ++k) EXPECT(h0[k] == TIDE_CANONICAL_NAN_BF16 && h1[k] == TIDE_CANONICAL_NAN_BF16);
  CK(tideHostReduceScatter(ln, g3, o4, tideFloat16, tidePremulSum, 0.5f));
  for (int k = 0; k < 37; ++k) EXPECT(h0[k] == TIDE_CANONICAL_NAN_FP16 && h1[k] == TIDE_CANONICAL_NAN_FP16);
  CK(tideLayoutDestroy(ln));
  printf("handles/threads/alignment/NaN: done\n");
}

int main() {
  convTests();
  handleTests();
  int configs[][2] = {{1,1},{2,1},{2,2},{3,1},{4,2},{5,1},{6,2},{6,1},{8,8},{12,1},{12,2},{24,2},{16,1},{48,4},{13,1},{64,8}};
  for (auto& c : configs) for (uint64_t pace : {0ull, 1ull, 7ull, 4096ull}) agTest(c[0], c[1], 1 + rng() % 5, pace);
  for (auto& c : configs) for (int t = 0; t < 3; ++t) for (int op = 0; op < 3; ++op) rsTest(c[0], c[1], 1 + rng() % 4, (tideDataType_t)t, (tideRedOp_t)op, 1 + rng() % 200);
  // staging invariant
  uint64_t st0 = 0;
  for (int W : {16, 64, 512}) { std::vector<uint64_t> n{(uint64_t)W * 1000}; L x = make(n, {}, {tideBfloat16}, W, 8, 0, 0);
    if (!st0) st0 = x.info.rsStagingBytes; EXPECT(x.info.rsStagingBytes == st0); printf("W=%d staging=%llu slot=%llu fits=%d chunks=%d hash=%016llx\n", W, (unsigned long long)x.info.rsStagingBytes, (unsigned long long)x.info.slotBytes, x.info.slotReuseFits, x.info.rsNumChunks, (unsigned long long)x.info.hash); tideLayoutDestroy(x.l); }
  // errors
  tideLayout_t l = (tideLayout_t)0x1; tideLayoutDesc_t d{}; d.size = sizeof d; d.version = 1;
  EXPECT(tideLayoutCreate(&d, nullptr, &l) == tideInvalidArgument && l == nullptr); printf("msg: %s\n", tideGetLastError());
  EXPECT(tideLayoutCreate(nullptr, nullptr, &l) == tideInvalidArgument);
  uint64_t nn[1] = {10}, rr[1] = {3}; tideDataType_t dt[1] = {tideFloat32}; d.nParams = 1; d.numels = nn; d.dtypes = dt; d.worldSize = 6; d.ranksPerNode = 4;
  EXPECT(tideLayoutCreate(&d, nullptr, &l) == tideInvalidArgument); printf("msg: %s\n", tideGetLastError());
  d.ranksPerNode = 3; d.rowNumels = rr; EXPECT(tideLayoutCreate(&d, nullptr, &l) == tideInvalidArgument); printf("msg: %s\n", tideGetLastError());
  d.rowNumels = nullptr; dt[0] = (tideDataType_t)9; EXPECT(tideLayoutCreate(&d, nullptr, &l) == tideInvalidArgument); printf("msg: %s\n", tideGetLastError());
  dt[0] = tideInt8; CK(tideLayoutCreate(&d, nullptr, &l));
  std::vector<char> buf(1000, 7); const void* gp[6]; void* outs[6]; for (int i = 0; i < 6; ++i) { gp[i] = buf.data(); outs[i] = buf.data() + 100 + i * 16; }
  EXPECT(tideHostReduceScatter(l, gp, outs, tideFloat32, tideSum, 1.f) == tideInvalidArgument); printf("msg: %s\n", tideGetLastError());
  EXPECT(tideHostAllGather(l, nullptr, outs) == tideInvalidArgument);
  void* params[6]; for (int i = 0; i < 6; ++i) params[i] = buf.data() + i * 5;  // overlapping
  EXPECT(tideHostAllGather(l, gp, params) == tideInvalidArgument); printf("msg: %s\n", tideGetLastError());
  tideLayoutDestroy(l);
  EXPECT(tideCommDestroy(nullptr) == tideSuccess);
  tideComm_t cs[2] = {(tideComm_t)0x5a, (tideComm_t)0x5a}; tideResult_t lr = tideLoopbackCreate(2, 0, cs);
  EXPECT(lr != tideSuccess && cs[0] == nullptr && cs[1] == nullptr); printf("loopback: %s / %s\n", tideGetErrorString(lr), tideGetLastError());
  int cnt; CK(tideParamCount(&cnt));
  for (int i = 0; i < cnt; ++i) { const char *a, *b, *c, *dd, *v; CK(tideParamDescribe(i, &a, &b, &c, &dd, &v)); printf("| %s | %s | %s | %s | (value %s)\n", a, b, c, dd, v); }
  int allowed = -1; CK(tideMulticastAllowed(&allowed)); printf("multicast %d\n", allowed);
  for (int i = 0; i <= tideNumResults; ++i) EXPECT(tideGetErrorString((tideResult_t)i) != nullptr);
  printf("%s (%d failures)\n", fails ? "FAILED" : "OK", fails);
  return fails ? 1 : 0;
}
