// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Which runtime/driver queries keep a global-mode stream capture valid (CUDA graph capture).
//
// The capture path of tideAllGather / tideReduceScatter validates its arguments while the caller's stream is being
// captured; a query that the driver treats as illegal during capture fails with cudaErrorStreamCaptureUnsupported and
// invalidates the capture. This probe makes each query once on (or beside) a stream under a global-mode capture and
// prints whether the call succeeded and whether the capture is still active afterwards. It documents the facts
// plugin/cuda/comm.cc relies on; tests/gpu/test_graph_capture.py is what verifies the library.
//
// Build and run (on a GPU machine): nvcc -arch=sm_90 -o capture_probe tests/gpu/capture_probe.cu && ./capture_probe
// (driver functions come from cudaGetDriverEntryPointByVersion, as in the library: no -lcuda).
// Exit status 0 if every query the library uses while capturing kept the capture valid.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>

namespace {

struct Probe {
  const char* name;
  bool usedByLibrary;  // the capture path of the library makes this call
  std::function<int(cudaStream_t captured, cudaStream_t other, void* dev)> call;  // returns the error code
};

int runProbe(const Probe& p, void* dev) {
  cudaStream_t captured = nullptr, other = nullptr;
  cudaStreamCreateWithFlags(&captured, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
  cudaStreamBeginCapture(captured, cudaStreamCaptureModeGlobal);
  cudaMemsetAsync(dev, 1, 256, captured);  // the capture holds a node before the query
  int err = p.call(captured, other, dev);
  if (err != 0) (void)cudaGetLastError();
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(captured, &st);
  cudaGraph_t graph = nullptr;
  cudaError_t end = cudaStreamEndCapture(captured, &graph);
  (void)cudaGetLastError();
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(captured);
  cudaStreamDestroy(other);
  const bool valid = st == cudaStreamCaptureStatusActive && end == cudaSuccess;
  std::printf("%-58s call %-34s capture %s%s\n", p.name, err ? cudaGetErrorName(static_cast<cudaError_t>(err)) : "ok",
              valid ? "valid" : "INVALIDATED", p.usedByLibrary ? "  [used by the library]" : "");
  return p.usedByLibrary && (err != 0 || !valid) ? 1 : 0;
}

template <typename Fn>
Fn driverFn(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
  return reinterpret_cast<Fn>(fn);
}

// Resolved before any capture begins.
CUresult (*getCtx)(CUstream, CUcontext*) = nullptr;
CUresult (*getCurrent)(CUcontext*) = nullptr;

class Relaxed {
 public:
  Relaxed() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~Relaxed() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace

int main() {
  void* dev = nullptr;
  if (cudaMalloc(&dev, 1 << 20) != cudaSuccess) {
    std::printf("cudaMalloc failed\n");
    return 2;
  }
  getCtx = driverFn<CUresult (*)(CUstream, CUcontext*)>("cuStreamGetCtx");
  getCurrent = driverFn<CUresult (*)(CUcontext*)>("cuCtxGetCurrent");
  if (!getCtx || !getCurrent) {
    std::printf("driver entry points not found\n");
    return 2;
  }
  const Probe probes[] = {
      {"cudaStreamGetCaptureInfo(captured)", true,
       [](cudaStream_t s, cudaStream_t, void*) {
         cudaStreamCaptureStatus st;
         unsigned long long id;
         return static_cast<int>(cudaStreamGetCaptureInfo(s, &st, &id));
       }},
      {"cudaStreamIsCapturing(other)", true,
       [](cudaStream_t, cudaStream_t o, void*) {
         cudaStreamCaptureStatus st;
         return static_cast<int>(cudaStreamIsCapturing(o, &st));
       }},
      {"cuStreamGetCtx(captured) + cuCtxGetCurrent", true,
       [](cudaStream_t s, cudaStream_t, void*) {
         CUcontext a = nullptr, b = nullptr;
         int r = getCtx(reinterpret_cast<CUstream>(s), &a);
         if (r == 0) r = getCurrent(&b);
         return r == 0 && a != b ? -1 : r;
       }},
      {"cudaPointerGetAttributes(dev), relaxed thread mode", true,
       [](cudaStream_t, cudaStream_t, void* d) {
         Relaxed relaxed;
         cudaPointerAttributes a{};
         return static_cast<int>(cudaPointerGetAttributes(&a, d));
       }},
      {"cudaPointerGetAttributes(dev), global thread mode", false,
       [](cudaStream_t, cudaStream_t, void* d) {
         cudaPointerAttributes a{};
         return static_cast<int>(cudaPointerGetAttributes(&a, d));
       }},
      {"cudaStreamGetDevice(captured)", false,
       [](cudaStream_t s, cudaStream_t, void*) {
         int d = -1;
         return static_cast<int>(cudaStreamGetDevice(s, &d));
       }},
      {"cudaStreamGetDevice(other)", false,
       [](cudaStream_t, cudaStream_t o, void*) {
         int d = -1;
         return static_cast<int>(cudaStreamGetDevice(o, &d));
       }},
      {"cudaStreamGetDevice(captured), relaxed thread mode", false,
       [](cudaStream_t s, cudaStream_t, void*) {
         Relaxed relaxed;
         int d = -1;
         return static_cast<int>(cudaStreamGetDevice(s, &d));
       }},
  };
  int bad = 0;
  for (const Probe& p : probes) bad += runProbe(p, dev);
  cudaFree(dev);
  std::printf("capture_probe: %d of the library's queries broke a capture\n", bad);
  return bad ? 1 : 0;
}
