// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Host cost of the CUDA calls a TIDE collective issues, per call, with the stream gated behind a sleeping kernel so
// the host runs ahead of the GPU (nothing here waits for the device). Prints one line per call kind:
//   name  n  us_per_call  us_per_item
// It answers: what does one cudaMemcpyBatchAsync entry, one cuStreamBatchMemOp op, one pointer query cost on the
// host? The floor under tide-perf's `host us` column. Build: nvcc -O2 -arch=sm_90 host_cost_probe.cu -o p
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

__global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
__global__ void tiny(int* p) {
  if (p) p[threadIdx.x] += 1;
}

using BatchMemOpFn = CUresult (*)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);
using StreamGetCtxFn = CUresult (*)(CUstream, CUcontext*);

static double nowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median over reps of (host time of `calls` invocations of f) / calls; the stream is gated first, and so is every
// stream of `alsoGated` (f may issue on them too).
static double measure(cudaStream_t s, int calls, const std::function<void()>& f,
                      const std::vector<cudaStream_t>& alsoGated = {}) {
  std::vector<double> v;
  for (int rep = 0; rep < 9; ++rep) {
    spin<<<1, 1, 0, s>>>(400000000LL);  // ~200 ms: covers the issue
    cudaEvent_t ev;
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CK(cudaEventRecord(ev, s));
    for (cudaStream_t g : alsoGated) CK(cudaStreamWaitEvent(g, ev, 0));
    double t0 = nowUs();
    for (int i = 0; i < calls; ++i) f();
    double t1 = nowUs();
    bool gated = cudaEventQuery(ev) == cudaErrorNotReady;
    (void)cudaGetLastError();
    CK(cudaStreamSynchronize(s));
    for (cudaStream_t g : alsoGated) CK(cudaStreamSynchronize(g));
    CK(cudaEventDestroy(ev));
    if (gated) v.push_back((t1 - t0) / calls);
  }
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // line-buffered: a run cut by a time limit keeps what it printed
  CK(cudaSetDevice(0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  BatchMemOpFn batchMemOp = nullptr;
  StreamGetCtxFn getCtx = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuStreamBatchMemOp", reinterpret_cast<void**>(&batchMemOp), 12000,
                                      cudaEnableDefault, &q));
  CK(cudaGetDriverEntryPointByVersion("cuStreamGetCtx", reinterpret_cast<void**>(&getCtx), 12000, cudaEnableDefault,
                                      &q));
  const size_t kItem = 64 << 10;
  const int kMax = 1024;
  char *a, *b;
  CK(cudaMalloc(&a, kItem * kMax));
  CK(cudaMalloc(&b, kItem * kMax));
  uint32_t* flags;
  CK(cudaMalloc(&flags, 4096 * 4));
  CK(cudaMemset(flags, 0, 4096 * 4));
  CK(cudaDeviceSynchronize());
  tiny<<<1, 32, 0, s>>>(nullptr);
  CK(cudaStreamSynchronize(s));
  printf("%-44s %6s %12s %12s\n", "call", "n", "us/call", "us/item");
  auto row = [&](const char* name, int n, double us) { printf("%-44s %6d %12.2f %12.3f\n", name, n, us, us / n); };

  for (int n : {1, 2, 8, 16, 64, 256, 1024}) {
    std::vector<void*> dst(n);
    std::vector<const void*> src(n);
    std::vector<size_t> sz(n, kItem);
    for (int i = 0; i < n; ++i) {
      dst[i] = b + i * kItem;
      src[i] = a + i * kItem;
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = cudaMemLocationTypeDevice;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t idx = 0;
    const int calls = std::max(1, 128 / n);  // a full device queue would make the host wait for the GPU
    double us = measure(s, calls, [&] {
      CK(cudaMemcpyBatchAsync(dst.data(), src.data(), sz.data(), n, &attr, &idx, 1, s));
    });
    row("cudaMemcpyBatchAsync (hinted, 64 KiB each)", n, us);
    if (n == 8) {
      // Variants: which attribute makes an entry expensive?
      cudaMemcpyAttributes plain{};
      plain.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      plain.srcLocHint.type = cudaMemLocationTypeDevice;
      plain.dstLocHint.type = cudaMemLocationTypeDevice;
      us = measure(s, calls, [&] { (void)cudaMemcpyBatchAsync(dst.data(), src.data(), sz.data(), n, &plain, &idx, 1, s); });
      row("cudaMemcpyBatchAsync (no overlap hint)", n, us);
      cudaMemcpyAttributes any = attr;
      any.srcAccessOrder = cudaMemcpySrcAccessOrderAny;
      us = measure(s, calls, [&] { (void)cudaMemcpyBatchAsync(dst.data(), src.data(), sz.data(), n, &any, &idx, 1, s); });
      row("cudaMemcpyBatchAsync (hinted, srcAccessOrderAny)", n, us);
      std::vector<size_t> small(n, 4096);
      us = measure(s, calls, [&] { (void)cudaMemcpyBatchAsync(dst.data(), src.data(), small.data(), n, &attr, &idx, 1, s); });
      row("cudaMemcpyBatchAsync (hinted, 4 KiB each)", n, us);
      // One strided 3D op doing the same 8 copies (64 KiB rows, destination pitch 128 KiB).
      cudaMemcpy3DBatchOp op{};
      op.src.type = cudaMemcpyOperandTypePointer;
      op.src.op.ptr.ptr = a;
      op.src.op.ptr.rowLength = kItem;
      op.src.op.ptr.layerHeight = n;
      op.src.op.ptr.locHint.type = cudaMemLocationTypeDevice;
      op.dst.type = cudaMemcpyOperandTypePointer;
      op.dst.op.ptr.ptr = b;
      op.dst.op.ptr.rowLength = 2 * kItem;
      op.dst.op.ptr.layerHeight = n;
      op.dst.op.ptr.locHint.type = cudaMemLocationTypeDevice;
      op.extent = make_cudaExtent(kItem, n / 2, 1);
      op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      op.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      cudaError_t e3 = cudaMemcpy3DBatchAsync(1, &op, 0, s);
      (void)cudaGetLastError();
      CK(cudaStreamSynchronize(s));
      if (e3 == cudaSuccess) {
        us = measure(s, calls, [&] { (void)cudaMemcpy3DBatchAsync(1, &op, 0, s); });
        row("cudaMemcpy3DBatchAsync (1 op, 4 strided rows)", 1, us);
      } else {
        printf("cudaMemcpy3DBatchAsync failed: %s\n", cudaGetErrorString(e3));
      }
    }
  }
  {
    // GPU time of one hinted batch copy of 128 MiB (2 entries of 64 MiB): the bound for a flat 64 MiB AG of 2 ranks.
    const size_t big = 64 << 20;
    char *x, *y;
    CK(cudaMalloc(&x, 2 * big));
    CK(cudaMalloc(&y, 2 * big));
    void* d2[2] = {y, y + big};
    const void* s2[2] = {x, x + big};
    size_t z2[2] = {big, big};
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = cudaMemLocationTypeDevice;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t idx = 0;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int i = 0; i < 15; ++i) {
      CK(cudaEventRecord(e0, s));
      CK(cudaMemcpyBatchAsync(d2, s2, z2, 2, &attr, &idx, 1, s));
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float t = 0;
      CK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    printf("GPU: hinted batch copy of 128 MiB (2 x 64 MiB): median %.1f us (%.0f GB/s read+write)\n", ms[7] * 1e3,
           2.0 * 2 * big / (ms[7] * 1e-3) / 1e9);
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
  for (int n : {1, 8, 64}) {
    double us = measure(s, std::max(1, 128 / n), [&] {
      for (int i = 0; i < n; ++i) CK(cudaMemcpyAsync(b + i * kItem, a + i * kItem, kItem, cudaMemcpyDeviceToDevice, s));
    });
    row("cudaMemcpyAsync x n", n, us);
  }
  for (int n : {1, 2, 8, 16, 64, 128}) {
    std::vector<CUstreamBatchMemOpParams> ops(n);
    for (int i = 0; i < n; ++i) {
      ops[i] = {};
      if (i % 2 == 0) {
        ops[i].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
        ops[i].writeValue.address = reinterpret_cast<CUdeviceptr>(flags + i);
        ops[i].writeValue.value = 1;
      } else {
        ops[i].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
        ops[i].waitValue.address = reinterpret_cast<CUdeviceptr>(flags + 2048 + i);
        ops[i].waitValue.value = 0;
        ops[i].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
      }
    }
    double us = measure(s, 20, [&] { batchMemOp(s, n, ops.data(), 0); });
    row("cuStreamBatchMemOp (half waits, half writes)", n, us);
  }
  {
    double us = measure(s, 200, [&] {
      cudaPointerAttributes at{};
      CK(cudaPointerGetAttributes(&at, a + 64));
    });
    row("cudaPointerGetAttributes", 1, us);
    us = measure(s, 200, [&] {
      cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
      CK(cudaThreadExchangeStreamCaptureMode(&m));
      CK(cudaThreadExchangeStreamCaptureMode(&m));
    });
    row("cudaThreadExchangeStreamCaptureMode x2", 1, us);
    us = measure(s, 200, [&] {
      cudaStreamCaptureStatus st;
      unsigned long long id;
      CK(cudaStreamGetCaptureInfo(s, &st, &id));
    });
    row("cudaStreamGetCaptureInfo", 1, us);
    us = measure(s, 200, [&] {
      cudaStreamCaptureStatus st;
      CK(cudaStreamIsCapturing(s, &st));
    });
    row("cudaStreamIsCapturing", 1, us);
    us = measure(s, 200, [&] {
      CUcontext c;
      getCtx(reinterpret_cast<CUstream>(s), &c);
    });
    row("cuStreamGetCtx", 1, us);
    us = measure(s, 200, [&] {
      int d;
      CK(cudaGetDevice(&d));
    });
    row("cudaGetDevice", 1, us);
    us = measure(s, 200, [&] { tiny<<<4, 32, 0, s>>>(reinterpret_cast<int*>(b)); });
    row("kernel launch <<<>>>", 1, us);
    us = measure(s, 200, [&] {
      tiny<<<4, 32, 0, s>>>(reinterpret_cast<int*>(b));
      (void)cudaGetLastError();
    });
    row("kernel launch + cudaGetLastError", 1, us);
    cudaEvent_t ev;
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    us = measure(s, 200, [&] { CK(cudaEventRecord(ev, s)); });
    row("cudaEventRecord", 1, us);
    cudaStream_t s2;
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    us = measure(s, 200, [&] {
      CK(cudaEventRecord(ev, s));
      CK(cudaStreamWaitEvent(s2, ev, 0));
    });
    row("cudaEventRecord + cudaStreamWaitEvent", 1, us);
    CK(cudaStreamSynchronize(s2));

    // cudaGraphLaunch of graphs shaped like one issue round of a token RS (is a round's fork what its
    // launch costs?): a wait batch, `nc` memcpy nodes, a kernel, a write batch; "chain": all in one line; "forked":
    // the copies on a second branch (event fork and join), as a captured two-lane round is.
    std::vector<CUstreamBatchMemOpParams> waitOp(1), writeOp(1);
    waitOp[0] = {};
    waitOp[0].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    waitOp[0].waitValue.address = reinterpret_cast<CUdeviceptr>(flags + 4000);
    waitOp[0].waitValue.value = 0;
    waitOp[0].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    writeOp[0] = {};
    writeOp[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    writeOp[0].writeValue.address = reinterpret_cast<CUdeviceptr>(flags + 4001);
    writeOp[0].writeValue.value = 1;
    cudaStream_t cap, side;
    CK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    cudaEvent_t fk, jn;
    CK(cudaEventCreateWithFlags(&fk, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&jn, cudaEventDisableTiming));
    // Ends the capture on `cap` and returns the host cost of one cudaGraphLaunch of what it captured.
    auto launchUs = [&]() {
      cudaGraph_t g;
      CK(cudaStreamEndCapture(cap, &g));
      cudaGraphExec_t ge;
      CK(cudaGraphInstantiate(&ge, g, 0));
      CK(cudaGraphUpload(ge, s));
      CK(cudaStreamSynchronize(s));
      double t = measure(s, 100, [&] { CK(cudaGraphLaunch(ge, s)); });
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
      return t;
    };
    // Begins a capture on `cap` and enqueues a round-like graph into it: a wait batch, nc copies, a kernel, a write
    // batch; forked: the copies on a second branch.
    auto captureRoundLike = [&](int nc, bool forked) {
      CK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeRelaxed));
      batchMemOp(cap, 1, waitOp.data(), 0);
      cudaStream_t copies = cap;
      if (forked) {
        CK(cudaEventRecord(fk, cap));
        CK(cudaStreamWaitEvent(side, fk, 0));
        copies = side;
      }
      for (int i = 0; i < nc; ++i) {
        CK(cudaMemcpyAsync(b + i * kItem, a + i * kItem, kItem, cudaMemcpyDeviceToDevice, copies));
      }
      tiny<<<4, 32, 0, cap>>>(reinterpret_cast<int*>(b));
      if (forked) {
        CK(cudaEventRecord(jn, side));
        CK(cudaStreamWaitEvent(cap, jn, 0));
      }
      batchMemOp(cap, 1, writeOp.data(), 0);
    };
    for (int forked = 0; forked < 2; ++forked) {
      for (int nc : {1, 8, 64}) {
        captureRoundLike(nc, forked != 0);
        char name[96];
        snprintf(name, sizeof(name), "cudaGraphLaunch, round-like graph, %s, copies", forked ? "forked" : "chain");
        row(name, nc, launchUs());
      }
    }
    // On loopback the last rank's call launches every rank's round graphs, rank after rank, one stream
    // each, and cost about 7 us per launch (host_issue --per-rank) where one round-like graph relaunched on one stream
    // costs about 3: does alternating between 8 graphs on 8 streams cost more? The chained round-like graph (8
    // copies), 8 instances on 8 gated streams, launched in turn (per launch).
    {
      const int kStreams = 8;
      std::vector<cudaStream_t> rs(kStreams);
      std::vector<cudaGraphExec_t> ge(kStreams);
      for (int k = 0; k < kStreams; ++k) {
        CK(cudaStreamCreateWithFlags(&rs[k], cudaStreamNonBlocking));
        captureRoundLike(8, false);
        cudaGraph_t g;
        CK(cudaStreamEndCapture(cap, &g));
        CK(cudaGraphInstantiate(&ge[k], g, 0));
        CK(cudaGraphUpload(ge[k], rs[k]));
        CK(cudaGraphDestroy(g));
      }
      CK(cudaDeviceSynchronize());
      const int rounds = 12;
      for (int alternate = 0; alternate < 2; ++alternate) {
        // alternate = 0: the same launches grouped by stream (12 in a row on each); 1: rank-minor, as loopback.
        int i = 0;
        double us = measure(s, rounds * kStreams, [&] {
          const int k = alternate ? i % kStreams : i / rounds;
          i = (i + 1) % (rounds * kStreams);
          CK(cudaGraphLaunch(ge[k], rs[k]));
        }, rs);
        row(alternate ? "cudaGraphLaunch, 8 round-like graphs on 8 streams, in turn" :
                        "cudaGraphLaunch, 8 round-like graphs on 8 streams, 12 per stream in a row",
            1, us);  // per launch
      }
      for (int k = 0; k < kStreams; ++k) {
        CK(cudaGraphExecDestroy(ge[k]));
        CK(cudaStreamDestroy(rs[k]));
      }
    }
    // Per-node cost by kind (does the reduce's launch split, up to 26 kernel launches per rank in a
    // Llama-8B RS of 4 chunks at 2 MiB per CTA, cost host time in a round graph? Do separate flag batches?): a chain
    // of k kernel nodes; a chain of k memop nodes of one op each; one memop node of k ops.
    for (int kind = 0; kind < 3; ++kind) {
      for (int k : {1, 8, 26}) {
        CK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeRelaxed));
        std::vector<CUstreamBatchMemOpParams> many(k, writeOp[0]);
        if (kind == 0) {
          for (int i = 0; i < k; ++i) tiny<<<4, 32, 0, cap>>>(reinterpret_cast<int*>(b));
        } else if (kind == 1) {
          for (int i = 0; i < k; ++i) batchMemOp(cap, 1, writeOp.data(), 0);
        } else {
          batchMemOp(cap, k, many.data(), 0);
        }
        static const char* kNames[] = {"cudaGraphLaunch, chain of kernel nodes", "cudaGraphLaunch, chain of 1-op memop nodes",
                                       "cudaGraphLaunch, one memop node of k ops"};
        row(kNames[kind], k, launchUs());
      }
    }
    // A lever for loopback's deferred rounds (not built in the library): one graph holding round g of all 8 ranks
    // instead of 8 graphs. Each branch starts at an external event wait (the rank's stream, recorded just before the
    // launch) and ends at an external event record that the rank's stream waits for after it, so no rank waits for
    // another's round. Per round: 8 cudaEventRecord + 1 cudaGraphLaunch + 8 cudaStreamWaitEvent; printed per rank (/ 8)
    // beside the 8 separate launches of the row "8 round-like graphs on 8 streams, in turn", and the launch alone.
    {
      const int kRanks = 8;
      std::vector<cudaStream_t> rs(kRanks), br(kRanks);
      std::vector<cudaEvent_t> before(kRanks), after(kRanks), jn8(kRanks);
      for (int r = 0; r < kRanks; ++r) {
        CK(cudaStreamCreateWithFlags(&rs[r], cudaStreamNonBlocking));
        CK(cudaStreamCreateWithFlags(&br[r], cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&before[r], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&after[r], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&jn8[r], cudaEventDisableTiming));
      }
      cudaStream_t launch;
      CK(cudaStreamCreateWithFlags(&launch, cudaStreamNonBlocking));
      CK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeRelaxed));
      CK(cudaEventRecord(fk, cap));
      for (int r = 0; r < kRanks; ++r) {
        CK(cudaStreamWaitEvent(br[r], fk, 0));
        CK(cudaStreamWaitEvent(br[r], before[r], cudaEventWaitExternal));
        batchMemOp(br[r], 1, waitOp.data(), 0);
        for (int i = 0; i < 8; ++i) {
          CK(cudaMemcpyAsync(b + i * kItem, a + i * kItem, kItem, cudaMemcpyDeviceToDevice, br[r]));
        }
        tiny<<<4, 32, 0, br[r]>>>(reinterpret_cast<int*>(b));
        batchMemOp(br[r], 1, writeOp.data(), 0);
        CK(cudaEventRecordWithFlags(after[r], br[r], cudaEventRecordExternal));
        CK(cudaEventRecord(jn8[r], br[r]));
        CK(cudaStreamWaitEvent(cap, jn8[r], 0));
      }
      cudaGraph_t g;
      CK(cudaStreamEndCapture(cap, &g));
      cudaGraphExec_t ge;
      CK(cudaGraphInstantiate(&ge, g, 0));
      CK(cudaGraphUpload(ge, launch));
      CK(cudaGraphDestroy(g));
      CK(cudaDeviceSynchronize());
      std::vector<cudaStream_t> gated(rs);
      gated.push_back(launch);
      const double round = measure(s, 12, [&] {
        for (int r = 0; r < kRanks; ++r) CK(cudaEventRecord(before[r], rs[r]));
        CK(cudaGraphLaunch(ge, launch));
        for (int r = 0; r < kRanks; ++r) CK(cudaStreamWaitEvent(rs[r], after[r], 0));
      }, gated);
      row("one graph for 8 ranks' round-like work, events included, per rank", kRanks, round < 0 ? -1 : round / kRanks);
      const double only = measure(s, 12, [&] { CK(cudaGraphLaunch(ge, launch)); }, gated);
      row("the same graph, cudaGraphLaunch alone, per rank", kRanks, only < 0 ? -1 : only / kRanks);
      CK(cudaGraphExecDestroy(ge));
      for (int r = 0; r < kRanks; ++r) {
        CK(cudaStreamDestroy(rs[r]));
        CK(cudaStreamDestroy(br[r]));
        CK(cudaEventDestroy(before[r]));
        CK(cudaEventDestroy(after[r]));
        CK(cudaEventDestroy(jn8[r]));
      }
      CK(cudaStreamDestroy(launch));
    }
  }
  CK(cudaDeviceSynchronize());
  printf("done\n");
  return 0;
}
