// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
#include "graph_replay.h"

#include <atomic>

#include "../core/log.h"

namespace tide {
namespace cuda {
namespace {

std::atomic<bool> g_fallbackLogged{false};

std::string cudaWhy(const char* call, cudaError_t err) {
  return std::string(call) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}


}  // namespace

bool captureGraph(cudaStream_t captureStream, const std::function<bool(cudaStream_t)>& enqueue, cudaGraphExec_t* out,
                  std::string* why) {
  *out = nullptr;
  RelaxedThreadMode relaxed;
  cudaError_t err = cudaStreamBeginCapture(captureStream, cudaStreamCaptureModeRelaxed);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    *why = cudaWhy("cudaStreamBeginCapture", err);
    return false;
  }
  const bool enqueued = enqueue(captureStream);
  cudaGraph_t graph = nullptr;
  err = cudaStreamEndCapture(captureStream, &graph);  // always: the stream must leave capture mode
  (void)cudaGetLastError();
  if (!enqueued || err != cudaSuccess || graph == nullptr) {
    if (graph) (void)cudaGraphDestroy(graph);
    // Belt and braces: a stream still capturing here would make every later capture fail; end it once more.
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(captureStream, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
      cudaGraph_t g = nullptr;
      (void)cudaStreamEndCapture(captureStream, &g);
      if (g) (void)cudaGraphDestroy(g);
    }
    (void)cudaGetLastError();
    *why = !enqueued ? "enqueueing the program into the capture failed"
                     : (err != cudaSuccess ? cudaWhy("cudaStreamEndCapture", err) : "the capture produced no graph");
    return false;
  }
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    *why = cudaWhy("cudaGraphInstantiateWithFlags", err);
    return false;
  }
  *out = exec;
  return true;
}

bool launchGraph(cudaGraphExec_t graph, cudaStream_t stream, std::string* why) {
  cudaError_t err = cudaGraphLaunch(graph, stream);
  if (err == cudaSuccess) return true;
  (void)cudaGetLastError();
  *why = cudaWhy("cudaGraphLaunch", err);
  return false;
}

void destroyGraph(cudaGraphExec_t graph) {
  if (graph == nullptr) return;
  (void)cudaGraphExecDestroy(graph);
  (void)cudaGetLastError();
}

void noteGraphFallback(const char* what, const std::string& why) {
  if (!g_fallbackLogged.exchange(true)) {
    TIDE_WARN("Cuda",
              "eager graph route: %s failed (%s); this binding's calls are issued directly from now on (same token "
              "protocol, host cost per copy entry; NCCL_TIDE_EAGER_GRAPHS=0 returns to the epoch protocol). Logged "
              "once; later fallbacks at TRACE",
              what, why.c_str());
  } else {
    TIDE_TRACE("Cuda", "eager graph route: %s failed (%s); issuing directly", what, why.c_str());
  }
}

}  // namespace cuda
}  // namespace tide
