// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// CUDA graphs the library captures itself, for eager calls on the token route (docs/architecture.md "Eager calls as
// graph replays"). A bound token program (program_exec.h) is captured on the comm's private capture stream, never
// on a caller's stream, instantiated once and launched on the caller's stream for later calls with the same
// binding and call values.
#ifndef TIDE_CUDA_GRAPH_REPLAY_H_
#define TIDE_CUDA_GRAPH_REPLAY_H_

#include <cuda_runtime.h>

#include <functional>
#include <string>

namespace tide {
namespace cuda {

// The calling thread's capture interaction mode set to relaxed for one scope: what runs in it (an instantiation,
// enqueues, creating a private stream or event) is then never a "potentially unsafe" call that would invalidate
// another thread's global-mode capture.
class RelaxedThreadMode {
 public:
  RelaxedThreadMode() {
    ok_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess;
    if (!ok_) (void)cudaGetLastError();
  }
  ~RelaxedThreadMode() {
    if (ok_) (void)cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedThreadMode(const RelaxedThreadMode&) = delete;
  RelaxedThreadMode& operator=(const RelaxedThreadMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool ok_ = false;
};

// Captures what `enqueue` puts on the stream it is given (the private `captureStream`, in relaxed capture mode so
// that neither this capture nor another thread's is invalidated by the other) and instantiates it. Returns false
// with the reason in *why when anything fails; the capture is always ended first, so the private stream never stays
// in capture mode, the CUDA error state is cleared, and nothing was enqueued on any stream that runs. enqueue's
// failures count as capture failures (it must not have side effects beyond the stream).
bool captureGraph(cudaStream_t captureStream, const std::function<bool(cudaStream_t)>& enqueue, cudaGraphExec_t* out,
                  std::string* why);

// cudaGraphLaunch on `stream`. False (error state cleared, reason in *why) if the launch was refused.
bool launchGraph(cudaGraphExec_t graph, cudaStream_t stream, std::string* why);

// cudaGraphExecDestroy; a graph still running is freed by the driver when it completes. Safe on nullptr.
void destroyGraph(cudaGraphExec_t graph);

// Logs a failed capture or launch: one WARN per process (the call itself falls back to direct issue and succeeds,
// so no caller hears about it), TRACE afterwards.
void noteGraphFallback(const char* what, const std::string& why);

}  // namespace cuda
}  // namespace tide

#endif  // TIDE_CUDA_GRAPH_REPLAY_H_
