// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Which engine runs a device-to-device copy on this GPU: a copy engine, or SMs (a kernel)?
//
// Why: the eager-graph route (NCCL_TIDE_EAGER_GRAPHS=1) captures copies as graph memcpy nodes, and tide-perf showed
// kernel time in TIDE all-gather rows with it on (as measured on an H200). TIDE promises SM-free transport,
// so every form of copy the library may issue (eager, batched with the overlap hint, captured, explicit nodes,
// memsets) is checked here the same way.
//
// How: a spinner kernel holds every SM (two 1024-thread CTAs per SM fill its thread slots) for SPIN ms on stream A;
// the copy is issued on stream B once the spinner runs. A copy run by copy engines ends while the spinner still
// runs; one run as a kernel cannot start until the spinner's CTAs exit. Prints one line per (form, size):
//   form bytes  end_ms (copy end, from the spinner's start)  spin_ms  verdict
// Build: nvcc -O2 -arch=sm_90 benchmarks/copy_engine_probe.cu -o /tmp/copy_engine_probe
#include <cuda.h>  // types only: driver entry points come from cudaGetDriverEntryPointByVersion (no -lcuda)
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

__global__ void spinKernel(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

namespace {

constexpr float kSpinMs = 20.0f;
int g_sms = 0;

// What one form does on a stream; returns a failure text (empty when it was issued).
using Issue = std::function<std::string(cudaStream_t)>;

struct Buffers {
  std::vector<void*> src, dst;
  size_t bytes = 0;
  static constexpr int kPieces = 4;  // a batch of four segments, as a small program would issue
};

std::string batchCopy(const Buffers& b, cudaStream_t s, bool hint) {
  std::vector<void*> d(b.dst);
  std::vector<const void*> src(b.src.begin(), b.src.end());
  std::vector<size_t> sizes(Buffers::kPieces, b.bytes / Buffers::kPieces);
  cudaMemcpyAttributes attr = {};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = hint ? cudaMemcpyFlagPreferOverlapWithCompute : 0;
  size_t idx = 0;
  cudaError_t e = cudaMemcpyBatchAsync(d.data(), src.data(), sizes.data(), Buffers::kPieces, &attr, &idx, 1, s);
  return e == cudaSuccess ? "" : std::string("cudaMemcpyBatchAsync: ") + cudaGetErrorString(e);
}

std::string plainCopies(const Buffers& b, cudaStream_t s) {
  for (int i = 0; i < Buffers::kPieces; ++i) {
    cudaError_t e = cudaMemcpyAsync(b.dst[i], b.src[i], b.bytes / Buffers::kPieces, cudaMemcpyDeviceToDevice, s);
    if (e != cudaSuccess) return std::string("cudaMemcpyAsync: ") + cudaGetErrorString(e);
  }
  return "";
}

std::string memsets(const Buffers& b, cudaStream_t s) {
  for (int i = 0; i < Buffers::kPieces; ++i) {
    cudaError_t e = cudaMemsetAsync(b.dst[i], 0, b.bytes / Buffers::kPieces, s);
    if (e != cudaSuccess) return std::string("cudaMemsetAsync: ") + cudaGetErrorString(e);
  }
  return "";
}

__global__ void touchKernel(int* p) { p[threadIdx.x] += 1; }

std::string copy2D(const Buffers& b, cudaStream_t s) {
  // rows of 4 KiB with a source pitch of 8 KiB: a strided copy, which drivers have long given to copy engines
  size_t width = 4096, rows = b.bytes / Buffers::kPieces / 2 / width;
  if (rows == 0) return "too small for the 2D form";
  for (int i = 0; i < Buffers::kPieces; ++i) {
    cudaError_t e = cudaMemcpy2DAsync(b.dst[i], width, b.src[i], 2 * width, width, rows, cudaMemcpyDeviceToDevice, s);
    if (e != cudaSuccess) return std::string("cudaMemcpy2DAsync: ") + cudaGetErrorString(e);
  }
  return "";
}

std::string peerCopies(const Buffers& b, cudaStream_t s) {
  for (int i = 0; i < Buffers::kPieces; ++i) {
    cudaError_t e = cudaMemcpyPeerAsync(b.dst[i], 0, b.src[i], 0, b.bytes / Buffers::kPieces, s);
    if (e != cudaSuccess) return std::string("cudaMemcpyPeerAsync: ") + cudaGetErrorString(e);
  }
  return "";
}

std::string batchAnyOrder(const Buffers& b, cudaStream_t s) {
  std::vector<void*> d(b.dst);
  std::vector<const void*> src(b.src.begin(), b.src.end());
  std::vector<size_t> sizes(Buffers::kPieces, b.bytes / Buffers::kPieces);
  cudaMemcpyAttributes attr = {};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderAny;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t idx = 0;
  cudaError_t e = cudaMemcpyBatchAsync(d.data(), src.data(), sizes.data(), Buffers::kPieces, &attr, &idx, 1, s);
  return e == cudaSuccess ? "" : std::string("cudaMemcpyBatchAsync(any order): ") + cudaGetErrorString(e);
}

// Device memory from the VMM API (cuMemCreate + cuMemMap), as a peer-mapped slot would be.
template <class F>
F driverFn(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q));
  if (fn == nullptr) {
    std::fprintf(stderr, "no driver entry point %s\n", name);
    std::exit(1);
  }
  return reinterpret_cast<F>(fn);
}

void* vmmAlloc(size_t bytes) {
  static auto create = driverFn<CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                                             unsigned long long)>("cuMemCreate");
  static auto reserve =
      driverFn<CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)>("cuMemAddressReserve");
  static auto map = driverFn<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                          unsigned long long)>("cuMemMap");
  static auto access = driverFn<CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t)>("cuMemSetAccess");
  static auto gran = driverFn<CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags)>(
      "cuMemGetAllocationGranularity");
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0;
  if (gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) std::exit(2);
  size_t size = (bytes + g - 1) / g * g;
  CUmemGenericAllocationHandle h;
  CUdeviceptr p;
  if (create(&h, size, &prop, 0) != CUDA_SUCCESS || reserve(&p, size, g, 0, 0) != CUDA_SUCCESS ||
      map(p, size, 0, h, 0) != CUDA_SUCCESS) {
    std::fprintf(stderr, "VMM allocation failed\n");
    std::exit(2);
  }
  CUmemAccessDesc d = {};
  d.location = prop.location;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (access(p, size, &d, 1) != CUDA_SUCCESS) std::exit(2);
  return reinterpret_cast<void*>(p);  // leaked on purpose: a probe process
}

// Captures `body` on a side stream into an executable graph; the returned form launches it.
// Instantiates g into *keep (the caller destroys it), destroys g, and returns an Issue that launches the graph.
Issue launcher(cudaGraph_t g, cudaGraphExec_t* keep) {
  CHECK(cudaGraphInstantiateWithFlags(keep, g, 0));
  CHECK(cudaGraphDestroy(g));
  cudaGraphExec_t exec = *keep;
  return [exec](cudaStream_t s) {
    cudaError_t e = cudaGraphLaunch(exec, s);
    return e == cudaSuccess ? std::string() : std::string("cudaGraphLaunch: ") + cudaGetErrorString(e);
  };
}

Issue captured(const Issue& body, std::string* why, cudaGraphExec_t* keep) {
  cudaStream_t cs;
  CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed));
  std::string err = body(cs);
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamEndCapture(cs, &g);
  (void)cudaGetLastError();
  CHECK(cudaStreamDestroy(cs));
  if (!err.empty() || e != cudaSuccess || g == nullptr) {
    *why = !err.empty() ? err : std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e);
    if (g) cudaGraphDestroy(g);
    return nullptr;
  }
  size_t n = 0;
  CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  std::string kinds;
  for (auto node : nodes) {
    cudaGraphNodeType t;
    CHECK(cudaGraphNodeGetType(node, &t));
    kinds += t == cudaGraphNodeTypeMemcpy ? "memcpy " : t == cudaGraphNodeTypeMemset ? "memset "
             : t == cudaGraphNodeTypeKernel ? "kernel " : ("type" + std::to_string(int(t)) + " ");
  }
  *why = "nodes: " + kinds;
  return launcher(g, keep);
}

Issue explicitNodes(const Buffers& b, cudaGraphExec_t* keep) {
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  for (int i = 0; i < Buffers::kPieces; ++i) {
    cudaGraphNode_t node;
    CHECK(cudaGraphAddMemcpyNode1D(&node, g, nullptr, 0, b.dst[i], b.src[i], b.bytes / Buffers::kPieces,
                                   cudaMemcpyDeviceToDevice));
  }
  return launcher(g, keep);
}

void probe(const char* form, const Buffers& b, const Issue& issue, const std::string& note) {
  cudaStream_t a, s;
  CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a0, a1, b0, b1;
  for (cudaEvent_t* e : {&a0, &a1, &b0, &b1}) CHECK(cudaEventCreate(e));
  // Alone first (warm-up, and the form's own duration).
  CHECK(cudaEventRecord(b0, s));
  std::string err = issue(s);
  CHECK(cudaEventRecord(b1, s));
  CHECK(cudaStreamSynchronize(s));
  float alone = 0;
  CHECK(cudaEventElapsedTime(&alone, b0, b1));
  if (!err.empty()) {
    std::printf("%-34s %10zu  FAILED: %s\n", form, b.bytes, err.c_str());
    return;
  }
  CHECK(cudaEventRecord(a0, a));
  spinKernel<<<2 * g_sms, 1024, 0, a>>>((unsigned long long)(kSpinMs * 1e6));
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(a1, a));
  std::this_thread::sleep_for(std::chrono::milliseconds(3));  // the spinner holds every SM by now
  err = issue(s);
  CHECK(cudaEventRecord(b1, s));
  CHECK(cudaDeviceSynchronize());
  float end = 0, spin = 0;
  CHECK(cudaEventElapsedTime(&end, a0, b1));
  CHECK(cudaEventElapsedTime(&spin, a0, a1));
  const char* verdict = end < spin - 1.0f ? "COPY ENGINE (ran beside a full-GPU kernel)"
                                          : "SM (waited for the spinner: a kernel)";
  std::printf("%-34s %10zu  alone %8.3f ms  end %7.3f ms  spin %7.3f ms  %s  %s\n", form, b.bytes, alone, end, spin,
              verdict, note.c_str());
  for (cudaEvent_t e : {a0, a1, b0, b1}) CHECK(cudaEventDestroy(e));
  CHECK(cudaStreamDestroy(a));
  CHECK(cudaStreamDestroy(s));
}

}  // namespace

int main() {
  CHECK(cudaSetDevice(0));
  CHECK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  int drv = 0, rt = 0;
  CHECK(cudaDriverGetVersion(&drv));
  CHECK(cudaRuntimeGetVersion(&rt));
  std::printf("copy_engine_probe: %d SMs, driver %d, runtime %d, spinner %.0f ms on 2x%d CTAs of 1024 threads\n",
              g_sms, drv, rt, kSpinMs, g_sms);
  for (size_t bytes : {size_t(64) << 10, size_t(1) << 20, size_t(16) << 20}) {
    Buffers b;
    b.bytes = bytes;
    for (int i = 0; i < Buffers::kPieces; ++i) {
      void *s, *d;
      CHECK(cudaMalloc(&s, bytes / Buffers::kPieces));
      CHECK(cudaMalloc(&d, bytes / Buffers::kPieces));
      CHECK(cudaMemset(s, 1, bytes / Buffers::kPieces));
      b.src.push_back(s);
      b.dst.push_back(d);
    }
    {  // controls: a pinned host-to-device copy (copy engine by construction) and a kernel (SM by construction)
      void* host = nullptr;
      CHECK(cudaMallocHost(&host, bytes));
      probe("control: H2D from pinned host", b, [&](cudaStream_t s) {
        cudaError_t e = cudaMemcpyAsync(b.dst[0], host, bytes / Buffers::kPieces, cudaMemcpyHostToDevice, s);
        return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
      }, "");
      probe("control: a one-CTA kernel", b, [&](cudaStream_t s) {
        touchKernel<<<1, 32, 0, s>>>(static_cast<int*>(b.dst[0]));
        cudaError_t e = cudaGetLastError();
        return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
      }, "");
      CHECK(cudaFreeHost(host));
    }
    probe("eager cudaMemcpy2DAsync (pitched)", b, [&](cudaStream_t s) { return copy2D(b, s); }, "");
    probe("eager cudaMemcpyPeerAsync (0->0)", b, [&](cudaStream_t s) { return peerCopies(b, s); }, "");
    probe("eager batch, any order, hint", b, [&](cudaStream_t s) { return batchAnyOrder(b, s); }, "");
    {
      Buffers v;
      v.bytes = bytes;
      for (int i = 0; i < Buffers::kPieces; ++i) {
        v.src.push_back(vmmAlloc(bytes / Buffers::kPieces));
        v.dst.push_back(vmmAlloc(bytes / Buffers::kPieces));
      }
      probe("VMM: eager batch, hint", v, [&](cudaStream_t s) { return batchCopy(v, s, true); }, "");
      probe("VMM: eager cudaMemcpyAsync", v, [&](cudaStream_t s) { return plainCopies(v, s); }, "");
    }
    probe("eager cudaMemcpyAsync", b, [&](cudaStream_t s) { return plainCopies(b, s); }, "");
    probe("eager batch, overlap hint", b, [&](cudaStream_t s) { return batchCopy(b, s, true); }, "");
    probe("eager batch, no hint", b, [&](cudaStream_t s) { return batchCopy(b, s, false); }, "");
    probe("eager cudaMemsetAsync", b, [&](cudaStream_t s) { return memsets(b, s); }, "");
    std::vector<cudaGraphExec_t> execs(5, nullptr);
    struct Form {
      const char* name;
      Issue body;
    } forms[] = {
        {"graph: captured cudaMemcpyAsync", [&](cudaStream_t s) { return plainCopies(b, s); }},
        {"graph: captured batch, hint", [&](cudaStream_t s) { return batchCopy(b, s, true); }},
        {"graph: captured batch, no hint", [&](cudaStream_t s) { return batchCopy(b, s, false); }},
        {"graph: captured cudaMemsetAsync", [&](cudaStream_t s) { return memsets(b, s); }},
    };
    for (int i = 0; i < 4; ++i) {
      std::string why;
      Issue launch = captured(forms[i].body, &why, &execs[i]);
      if (!launch) {
        std::printf("%-34s %10zu  CAPTURE FAILED: %s\n", forms[i].name, bytes, why.c_str());
        continue;
      }
      probe(forms[i].name, b, launch, why);
    }
    probe("graph: cudaGraphAddMemcpyNode1D", b, explicitNodes(b, &execs[4]), "");
    for (auto e : execs)
      if (e) CHECK(cudaGraphExecDestroy(e));
    for (int i = 0; i < Buffers::kPieces; ++i) {
      CHECK(cudaFree(b.src[i]));
      CHECK(cudaFree(b.dst[i]));
    }
  }
  return 0;
}
