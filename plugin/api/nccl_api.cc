// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// C API entry points of the NCCL binding (include/tide.h, "NCCL binding"): tideNcclGetInfo (host only, every build)
// and the communicator constructors over NCCL or a caller's bootstrap (CUDA builds; tideUnsupported otherwise).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api_guard.h"
#include "errors.h"
#include "fnv1a.h"
#include "internode.h"
#include "log.h"
#include "nccl/nccl_lib.h"
#include "nccl/provider_choice.h"
#include "params.h"
#include "tide.h"

#ifdef TIDE_HAVE_CUDA
#include <cuda_runtime.h>

#include "cuda/comm.h"
#include "cuda/cuda_check.h"
#include "cuda/ipc_provider.h"
#include "cuda/window_provider.h"
#endif

namespace {

constexpr const char* kComponent = "Nccl";

#ifdef TIDE_HAVE_CUDA

// Effective plan knobs of a config (a nonzero field wins, else the NCCL_TIDE_* parameter) and NCCL_TIDE_INTERNODE,
// hashed: what must match on every rank for their layouts to agree and their programs to pair.
tideResult_t configHash(const tideConfig_t* config, uint64_t* hash) {
  uint64_t chunk = 0, pace = 0;
  if (config != nullptr) {
    if (config->size < sizeof(tideConfig_t)) {
      return tide::fail(tideInvalidArgument, kComponent, "config->size is %zu; set it to sizeof(tideConfig_t) = %zu",
                        config->size, sizeof(tideConfig_t));
    }
    if (config->version < 1 || config->version > TIDE_CONFIG_VERSION) {
      return tide::fail(tideInvalidArgument, kComponent, "config->version is %u; this library supports 1..%d",
                        config->version, TIDE_CONFIG_VERSION);
    }
    chunk = config->rsChunkBytes;
    pace = config->paceBytes;
  }
  if (chunk == 0) {
    TIDE_CHECK(tide::params::status(tide::params::kRsChunkBytes));
    chunk = tide::params::rsChunkBytes();
  }
  if (pace == 0) {
    TIDE_CHECK(tide::params::status(tide::params::kPaceBytes));
    pace = tide::params::paceBytes();
  }
  TIDE_CHECK(tide::params::status(tide::params::kInterNode));
  const uint64_t interNode = static_cast<uint64_t>(tide::params::interNode());
  // NCCL_TIDE_RANKS_PER_NODE decides the node split, the peers each rank maps and the transport between nodes:
  // ranks that disagree must fail at creation, never hang at a first call.
  TIDE_CHECK(tide::params::status(tide::params::kRanksPerNode));
  const uint64_t declaredNodes = static_cast<uint64_t>(tide::params::ranksPerNodeOverride());
  tide::Fnv1a h;
  for (uint64_t v : {chunk, pace, static_cast<uint64_t>(TIDE_CONFIG_VERSION), interNode, declaredNodes}) h.u64(v);
  *hash = h.value();
  return tideSuccess;
}

// The parent NCCL communicator's health, read with ncclCommGetAsyncError (part of the 2.28 base TIDE requires).
// tideNcclError with a clear message when NCCL reports an asynchronous error (a failed peer, a revoked or aborting
// communicator); ncclInProgress (a non-blocking communicator still initializing) counts as healthy. This is only
// valid while the ncclComm_t exists: ncclCommAbort and ncclCommDestroy free it, and no call can detect a freed
// handle, so the rule is the one of include/tide.h: destroy the TIDE comm before the NCCL communicator.
tideResult_t parentHealth(const tide::nccl::Lib& lib, tide::nccl::ncclComm_t comm, const char* what) {
  tide::nccl::ncclResult_t async = tide::nccl::kNcclSuccess;
  tide::nccl::ncclResult_t r = lib.commGetAsyncError(comm, &async);
  if (r != tide::nccl::kNcclSuccess) return tide::nccl::ncclFail(lib, r, "ncclCommGetAsyncError");
  if (async == tide::nccl::kNcclSuccess || async == tide::nccl::kNcclInProgress) return tideSuccess;
  const char* s = lib.getErrorString ? lib.getErrorString(async) : nullptr;
  return tide::fail(tideNcclError, kComponent,
                    "%s: the parent NCCL communicator reports an asynchronous error: %s (NCCL error %d); it failed or "
                    "is being aborted, so TIDE makes no further call on it. Destroy the TIDE comm, then the NCCL "
                    "communicator (ncclCommAbort), and fall back to stock collectives or restart the job",
                    what, s ? s : "unknown error", async);
}

// Exchange over an NCCL communicator: ncclAllGather of the bytes through a small device buffer on an internal stream.
//
// The host waits for the all-gather by polling an event (not cudaStreamSynchronize, not a D2H copy into pageable
// memory, both of which block with no bound), checking ncclCommGetAsyncError at every poll, up to
// NCCL_TIDE_TIMEOUT_MS (0: no bound). On a timeout the all-gather stays enqueued: only ncclCommAbort, which is the
// owner's call (torch's watchdog, the application), can end a kernel waiting for a rank that never comes; TIDE
// does not own the NCCL communicator and does not abort it. The exchange is then broken: its buffer and stream are
// never freed (a cudaFree would wait for the stuck kernel) and every later exchange fails at once.
struct NcclExchange {
  const tide::nccl::Lib* lib = nullptr;
  tide::nccl::ncclComm_t comm = nullptr;
  int device = 0;
  int world = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  void* buf = nullptr;
  size_t cap = 0;
  bool broken = false;
  // Device work of the current exchange may still be queued on `stream` (from its first enqueue until its event
  // completed). A failure while this is set (a timeout, the parent's async error seen mid-poll, a CUDA error) leaves
  // the all-gather queued: the provider then treats the device as stuck (RankExchange, cuda/rank_exchange.h).
  bool workQueued = false;

  ~NcclExchange() {
    if (broken) return;  // see above: the stuck all-gather may still write into buf
    (void)cudaSetDevice(device);
    if (buf) (void)cudaFree(buf);
    if (done) (void)cudaEventDestroy(done);
    if (stream) (void)cudaStreamDestroy(stream);
    (void)cudaGetLastError();
  }

  tideResult_t run(const void* mine, void* all, size_t bytes) {
    if (broken) {
      return tide::fail(tideInvalidUsage, kComponent,
                        "an earlier TIDE exchange over this NCCL communicator failed or timed out; the TIDE comm is "
                        "unusable (destroy it, and abort the NCCL communicator)");
    }
    tideResult_t r = runOnce(mine, all, bytes);
    if (r != tideSuccess) broken = true;
    return r;
  }

  tideResult_t runOnce(const void* mine, void* all, size_t bytes) {
    TIDE_CHECK(parentHealth(*lib, comm, "TIDE exchange"));
    TIDE_CUDA_CHECK(cudaSetDevice(device));
    if (stream == nullptr) TIDE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (done == nullptr) TIDE_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    size_t need = bytes * static_cast<size_t>(world + 1);
    if (need > cap) {
      if (buf) TIDE_CUDA_CHECK(cudaFree(buf));
      buf = nullptr;
      cap = 0;
      TIDE_CUDA_CHECK(cudaMalloc(&buf, need));
      cap = need;
    }
    char* recv = static_cast<char*>(buf);
    char* send = recv + bytes * static_cast<size_t>(world);
    workQueued = true;
    TIDE_CUDA_CHECK(cudaMemcpyAsync(send, mine, bytes, cudaMemcpyHostToDevice, stream));
    tide::nccl::ncclResult_t r = lib->allGather(send, recv, bytes, tide::nccl::kNcclUint8, comm, stream);
    while (r == tide::nccl::kNcclInProgress) {  // non-blocking communicator
      tide::nccl::ncclResult_t async = tide::nccl::kNcclSuccess;
      if (lib->commGetAsyncError(comm, &async) != tide::nccl::kNcclSuccess) break;
      r = async;
    }
    if (r != tide::nccl::kNcclSuccess) return tide::nccl::ncclFail(*lib, r, "ncclAllGather (TIDE exchange)");
    TIDE_CUDA_CHECK(cudaEventRecord(done, stream));
    const uint64_t ms = tide::params::timeoutMs();
    const auto start = std::chrono::steady_clock::now();
    auto nap = std::chrono::microseconds(20);
    for (;;) {
      cudaError_t q = cudaEventQuery(done);
      if (q == cudaSuccess) {
        workQueued = false;
        break;
      }
      if (q != cudaErrorNotReady) {
        return tide::cuda::cudaFail(q, "cudaEventQuery (TIDE exchange)", __FILE__, __LINE__);
      }
      TIDE_CHECK(parentHealth(*lib, comm, "TIDE exchange (waiting for ncclAllGather)"));
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      if (ms > 0 && static_cast<uint64_t>(waited.count()) >= ms) {
        return tide::fail(tideTimeout, kComponent,
                          "TIDE exchange: ncclAllGather of %zu bytes per rank did not complete within %llu ms "
                          "(NCCL_TIDE_TIMEOUT_MS): a rank has not reached the same collective TIDE call (create, "
                          "tideSlotAlloc/Free, own-staging growth, a new layout, destroy). The all-gather stays "
                          "enqueued until the NCCL communicator is aborted; this TIDE comm is unusable",
                          bytes, static_cast<unsigned long long>(ms));
      }
      std::this_thread::sleep_for(nap);
      if (nap < std::chrono::microseconds(1000)) nap *= 2;
    }
    TIDE_CUDA_CHECK(cudaMemcpyAsync(all, recv, bytes * static_cast<size_t>(world), cudaMemcpyDeviceToHost, stream));
    TIDE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return tideSuccess;
  }
};

// The NCCL communicator a comm is created on, and the process's NCCL (both null for a bootstrap comm).
struct NcclParent {
  const tide::nccl::Lib* lib = nullptr;
  tide::nccl::ncclComm_t comm = nullptr;
};

// Builds the comm around the provider chosen for it (plugin/nccl/provider_choice.h): NCCL windows, or CUDA IPC, to
// which every rank falls back alike when NCCL has no windows for the comm's nodes (unless the window provider was
// forced). On failure *comm stays NULL and nothing leaks. `health`, if set, runs before every AG/RS
// (Provider::checkStream); *why says which provider and why, for the INFO line of tideCommCreate.
tideResult_t createComm(int rank, int world, int device, const tideConfig_t* config, NcclParent parent,
                        tide::cuda::ExchangeFn ex, tideComm_t* comm, tide::cuda::HealthFn health,
                        tide::cuda::WorkLeftFn workLeft, std::string* why) {
  const bool overNccl = parent.comm != nullptr;
  uint64_t hash = 0;
  tide::nccl::ProviderChoice choice;
  tideResult_t local = configHash(config, &hash);
  // commInit's own parameters are checked here too, before the exchange: a rank that failed alone after its peers
  // had set up would leave them paired with its provider's teardown barrier.
  if (local == tideSuccess) local = tide::params::status(tide::params::kLinkGBps);
  if (local == tideSuccess) local = tide::params::status(tide::params::kRanksPerNode);
  if (local == tideSuccess) local = tide::params::status(tide::params::kProvider);
  if (local == tideSuccess) local = tide::nccl::chooseProvider(tide::params::provider(), parent.lib, &choice);
  if (local == tideSuccess) {
    local = tide::internode::checkSetting(tide::params::interNode(), overNccl, tide::nccl::providerName(choice.kind));
  }
  // A rank that failed still takes part in the first exchange (both providers start with the same one), where the
  // others fail with tideMismatch; the choice is part of the hash, so ranks that chose differently fail alike.
  if (local == tideSuccess) {
    tide::Fnv1a withChoice;
    withChoice.u64(hash);
    withChoice.u64(static_cast<uint64_t>(choice.kind));
    hash = withChoice.value();
  } else {
    hash = ~0ULL;
  }
  *why = choice.why;
  std::shared_ptr<tide::cuda::Provider> provider;
  if (local == tideSuccess && choice.kind == tide::nccl::ProviderKind::kWindow) {
    std::shared_ptr<tide::cuda::WindowProvider> windows;
    std::string unavailable;
    TIDE_CHECK(tide::cuda::WindowProvider::create(*parent.lib, parent.comm, rank, world, device, hash, ex, workLeft,
                                                  &windows, &unavailable));
    if (windows != nullptr) {
      if (health) windows->setHealthCheck(health);
      *why += "; windows on ";
      *why += windows->windowsWhere();
      provider = windows;
    } else {
      TIDE_CHECK(tide::nccl::windowFallback(choice, unavailable, why));
    }
  }
  if (provider == nullptr) {
    std::shared_ptr<tide::cuda::IpcProvider> ipc;
    tideResult_t r = tide::cuda::IpcProvider::create(rank, world, device, hash, overNccl, std::move(ex), &ipc,
                                                     std::move(workLeft));
    if (local != tideSuccess) return local;
    TIDE_CHECK(r);
    if (health) ipc->setHealthCheck(std::move(health));
    provider = ipc;
  }
  std::unique_ptr<tideComm> c(new tideComm());
  c->rank = rank;
  c->worldSize = world;
  c->device = device;
  c->provider = provider;
  c->ncclLib = parent.lib;
  c->ncclComm = parent.comm;
  tideResult_t res = tide::cuda::commInit(c.get());
  if (res != tideSuccess) {
    tide::cuda::commRelease(c.get());
    return res;
  }
  *comm = tide::cuda::registerComm(std::move(c));
  return tideSuccess;
}

tideResult_t checkDevice(int device, const char* fn) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return tide::fail(tideUnsupported, "API", "%s: no CUDA device is available (%s)", fn,
                      err == cudaSuccess ? "device count is 0" : cudaGetErrorName(err));
  }
  if (device < 0 || device >= count) {
    return tide::fail(tideInvalidArgument, "API", "%s: device %d does not exist (%d devices)", fn, device, count);
  }
  return tideSuccess;
}

#endif  // TIDE_HAVE_CUDA

}  // namespace

extern "C" {

TIDE_EXPORT tideResult_t tideNcclGetInfo(tideNcclInfo_t* info) {
  TIDE_API_BEGIN
  if (info == nullptr) return tide::fail(tideInvalidArgument, "API", "tideNcclGetInfo: info is NULL");
  if (info->size < sizeof(tideNcclInfo_t) || info->version < 1 || info->version > TIDE_NCCL_INFO_VERSION) {
    return tide::fail(tideInvalidArgument, "API",
                      "tideNcclGetInfo: info->size %zu / version %u; set sizeof(tideNcclInfo_t) = %zu and "
                      "TIDE_NCCL_INFO_VERSION",
                      info->size, info->version, sizeof(tideNcclInfo_t));
  }
  const tide::nccl::Lib* lib = nullptr;
  TIDE_CHECK(tide::nccl::resolve(&lib));
  info->headerVersion = tide::nccl::headerVersion();
  info->runtimeVersion = lib->runtimeVersion;
  info->effectiveVersion = lib->effectiveVersion;
  info->features = lib->features;
  TIDE_CHECK(tide::params::status(tide::params::kProvider));
  tide::nccl::ProviderChoice choice;
  TIDE_CHECK(tide::nccl::chooseProvider(tide::params::provider(), lib, &choice));
  info->provider = tide::nccl::providerName(choice.kind);
  info->transport = lib->transport;
  return tideSuccess;
  TIDE_API_END
}

#ifdef TIDE_HAVE_CUDA

TIDE_EXPORT tideResult_t tideCommCreate(struct ncclComm* ncclComm, const tideConfig_t* config, tideComm_t* comm) {
  TIDE_API_BEGIN
  if (comm == nullptr) return tide::fail(tideInvalidArgument, "API", "tideCommCreate: comm is NULL");
  *comm = nullptr;
  if (ncclComm == nullptr) return tide::fail(tideInvalidArgument, "API", "tideCommCreate: ncclComm is NULL");
  const tide::nccl::Lib* lib = nullptr;
  TIDE_CHECK(tide::nccl::resolve(&lib));
  TIDE_CHECK(parentHealth(*lib, ncclComm, "tideCommCreate"));
  int rank = -1, world = 0, device = -1;
  tide::nccl::ncclResult_t r = lib->commUserRank(ncclComm, &rank);
  if (r != tide::nccl::kNcclSuccess) return tide::nccl::ncclFail(*lib, r, "ncclCommUserRank");
  r = lib->commCount(ncclComm, &world);
  if (r != tide::nccl::kNcclSuccess) return tide::nccl::ncclFail(*lib, r, "ncclCommCount");
  r = lib->commCuDevice(ncclComm, &device);
  if (r != tide::nccl::kNcclSuccess) return tide::nccl::ncclFail(*lib, r, "ncclCommCuDevice");
  TIDE_CHECK(checkDevice(device, "tideCommCreate"));
  auto ex = std::make_shared<NcclExchange>();
  ex->lib = lib;
  ex->comm = ncclComm;
  ex->device = device;
  ex->world = world;
  tide::cuda::ExchangeFn fn = [ex](const void* mine, void* all, size_t bytes) { return ex->run(mine, all, bytes); };
  // A parent in error means a failed peer: fail the call instead of enqueueing waits (or, with the sendrecv
  // transport, p2p groups) for it. Valid while the ncclComm_t exists (include/tide.h: destroy the TIDE comm first);
  // ncclCommGetAsyncError only reads the communicator's error state.
  tide::cuda::HealthFn health = [lib, ncclComm](const char* what) { return parentHealth(*lib, ncclComm, what); };
  tide::cuda::WorkLeftFn workLeft = [ex] { return ex->workQueued; };
  std::string why;
  TIDE_CHECK(createComm(rank, world, device, config, NcclParent{lib, ncclComm}, std::move(fn), comm, std::move(health),
                        std::move(workLeft), &why));
  {
    char version[96];
    snprintf(version, sizeof(version), "%s over NCCL %d.%d.%d", TIDE_VERSION_STRING, lib->major, lib->minor,
             lib->patch);
    tide::log::versionOnce(version);
  }
  // The comm exists on every rank now: this line only reports it, and never turns the creation into a failure.
  tide::cuda::CommRef made;
  if (tide::cuda::checkComm(*comm, "tideCommCreate", &made) == tideSuccess) {
    TIDE_INFO(kComponent,
              "tideCommCreate: rank %d of %d on device %d over NCCL %d.%d.%d, provider %s (%s), inter-node %s", rank,
              world, device, lib->major, lib->minor, lib->patch, made->provider->name(), why.c_str(),
              tide::internode::name(made->interNode));
  }
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideCommCreateWithBootstrap(int rank, int worldSize, int device,
                                                     const tideBootstrap_t* bootstrap, const tideConfig_t* config,
                                                     tideComm_t* comm) {
  TIDE_API_BEGIN
  if (comm == nullptr) return tide::fail(tideInvalidArgument, "API", "tideCommCreateWithBootstrap: comm is NULL");
  *comm = nullptr;
  if (bootstrap == nullptr || bootstrap->allgather == nullptr) {
    return tide::fail(tideInvalidArgument, "API", "tideCommCreateWithBootstrap: bootstrap or its allgather is NULL");
  }
  if (bootstrap->size < sizeof(tideBootstrap_t) || bootstrap->version < 1 ||
      bootstrap->version > TIDE_BOOTSTRAP_VERSION) {
    return tide::fail(tideInvalidArgument, "API",
                      "tideCommCreateWithBootstrap: bootstrap->size %zu / version %u; set sizeof(tideBootstrap_t) = "
                      "%zu and TIDE_BOOTSTRAP_VERSION",
                      bootstrap->size, bootstrap->version, sizeof(tideBootstrap_t));
  }
  if (worldSize < 1 || worldSize > TIDE_MAX_RANKS_PER_NODE || rank < 0 || rank >= worldSize) {
    return tide::fail(tideInvalidArgument, "API",
                      "tideCommCreateWithBootstrap: rank %d of worldSize %d; need 0 <= rank < worldSize <= %d (one "
                      "node)",
                      rank, worldSize, TIDE_MAX_RANKS_PER_NODE);
  }
  TIDE_CHECK(checkDevice(device, "tideCommCreateWithBootstrap"));
  tideAllGatherFn_t cb = bootstrap->allgather;
  void* user = bootstrap->user;
  tide::cuda::ExchangeFn fn = [cb, user](const void* mine, void* all, size_t bytes) -> tideResult_t {
    // TIDE cannot bound a caller's callback from here (it may hold the GIL, a lock, a socket): the callback bounds
    // itself (nccl_tide.comm.make_gloo_allgather waits at most NCCL_TIDE_TIMEOUT_MS) and returns tideTimeout (9)
    // when it gave up, which is reported as such; any other nonzero value is a callback failure.
    int rc = cb(mine, all, bytes, user);
    if (rc == static_cast<int>(tideTimeout)) {
      return tide::fail(tideTimeout, kComponent,
                        "bootstrap all-gather callback timed out on %zu bytes (a rank has not reached the same "
                        "collective TIDE call); this comm is unusable: destroy it",
                        bytes);
    }
    if (rc != 0) {
      return tide::fail(tideSystemError, kComponent, "bootstrap all-gather callback failed (returned %d) on %zu bytes",
                        rc, bytes);
    }
    return tideSuccess;
  };
  std::string why;
  TIDE_CHECK(createComm(rank, worldSize, device, config, NcclParent{}, std::move(fn), comm, nullptr, nullptr, &why));
  return tideSuccess;
  TIDE_API_END
}

TIDE_EXPORT tideResult_t tideCommGetProvider(tideComm_t handle, const char** name) {
  TIDE_API_BEGIN
  if (name == nullptr) return tide::fail(tideInvalidArgument, "API", "tideCommGetProvider: name is NULL");
  tide::cuda::CommRef comm;
  TIDE_CHECK(tide::cuda::checkComm(handle, "tideCommGetProvider", &comm));
  *name = comm->provider->name();
  return tideSuccess;
  TIDE_API_END
}

#else  // host-only build

namespace {
tideResult_t unsupported(const char* fn) {
  return tide::fail(tideUnsupported, "API",
                    "%s: this libnccl-tide.so was built without CUDA; rebuild with nvcc on PATH (or "
                    "-DTIDE_BUILD_CUDA=ON)",
                    fn);
}
}  // namespace

TIDE_EXPORT tideResult_t tideCommCreate(struct ncclComm*, const tideConfig_t*, tideComm_t* comm) {
  if (comm) *comm = nullptr;
  return unsupported(__func__);
}

TIDE_EXPORT tideResult_t tideCommCreateWithBootstrap(int, int, int, const tideBootstrap_t*, const tideConfig_t*,
                                                     tideComm_t* comm) {
  if (comm) *comm = nullptr;
  return unsupported(__func__);
}

TIDE_EXPORT tideResult_t tideCommGetProvider(tideComm_t, const char**) { return unsupported(__func__); }

#endif  // TIDE_HAVE_CUDA

}  // extern "C"
