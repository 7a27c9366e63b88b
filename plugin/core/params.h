// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// NCCL_TIDE_* parameters: one registry (name, type, default, one-line doc) from which the typed accessors below,
// tideParamCount/tideParamDescribe and docs/env.md all come (a test fails when docs/env.md drifts).
//
// Parsing is strict (the whole string must match; bytes accept a plain integer or a K/M/G/KiB/MiB/GiB suffix,
// powers of 1024; bool accepts 0/1; ranges are checked). The environment is read once, on first use; every value
// that came from the environment is logged at INFO. An invalid value makes the accessor return the default (with
// one WARN) and makes status()/describe() report tideInvalidArgument naming the variable and the accepted form.
#ifndef TIDE_CORE_PARAMS_H_
#define TIDE_CORE_PARAMS_H_

#include <cstdint>

#include "log.h"
#include "tide.h"

namespace tide {
namespace params {

enum class Type { kBool, kInt64, kUint64, kBytes, kString };

// Indices into the registry (order = order of tideParamDescribe and of docs/env.md).
enum Id : int {
  kDebug = 0,         // NCCL_TIDE_DEBUG
  kRsChunkBytes = 1,  // NCCL_TIDE_RS_CHUNK_BYTES
  kPaceBytes = 2,     // NCCL_TIDE_PACE_BYTES
  kNvls = 3,          // NCCL_TIDE_NVLS
  kEnable = 4,          // NCCL_TIDE_ENABLE
  kEnableMinBytes = 5,  // NCCL_TIDE_ENABLE_MIN_BYTES
  kRanksPerNode = 6,    // NCCL_TIDE_RANKS_PER_NODE
  kTimeoutMs = 7,       // NCCL_TIDE_TIMEOUT_MS
  kRsAccum = 8,         // NCCL_TIDE_RS_ACCUM
  kDebugSubsys = 9,     // NCCL_TIDE_DEBUG_SUBSYS
  kDebugFile = 10,      // NCCL_TIDE_DEBUG_FILE
  kLinkGBps = 11,       // NCCL_TIDE_LINK_GBPS
  kEagerGraphs = 12,    // NCCL_TIDE_EAGER_GRAPHS
  kTokenRsChunks = 13,  // NCCL_TIDE_TOKEN_RS_CHUNKS
  kInterNode = 14,      // NCCL_TIDE_INTERNODE
  kProvider = 15,       // NCCL_TIDE_PROVIDER
#ifdef TIDE_TEST_SWITCHES
  // Test-only switches (a build with -DTIDE_TEST_SWITCHES=ON; docs/env.md, "Test builds"): their environment value
  // counts only with NCCL_TIDE_TEST_SWITCHES=1.
  kTestSwitches = 16,      // NCCL_TIDE_TEST_SWITCHES
  kSignalKernels = 17,     // NCCL_TIDE_SIGNAL_KERNELS
  kMergeFlagBatches = 18,  // NCCL_TIDE_MERGE_FLAG_BATCHES
  kPairTokens = 19,        // NCCL_TIDE_PAIR_TOKENS
  kAgSignalKernels = 20,   // NCCL_TIDE_AG_SIGNAL_KERNELS
  kNumParams = 21
#else
  kNumParams = 16
#endif
};

// Typed accessors (effective values: environment if valid, else default).
// Logging (log.cc reads these without logging): NCCL_TIDE_DEBUG as an index into
// NCCL|NONE|VERSION|WARN|INFO|TRACE (0 = follow NCCL_DEBUG); NCCL_TIDE_DEBUG_SUBSYS / NCCL_TIDE_DEBUG_FILE as text,
// nullptr when unset, invalid or "NCCL" (follow NCCL_DEBUG_SUBSYS / NCCL_DEBUG_FILE).
enum DebugSetting : int { kDebugNccl = 0, kDebugNone, kDebugVersion, kDebugWarn, kDebugInfo, kDebugTrace };
DebugSetting debugSetting();
const char* debugSubsysText();
const char* debugFileText();
uint64_t rsChunkBytes();
uint64_t paceBytes();
bool nvlsRequested();  // NCCL_TIDE_NVLS=1; only one of the conditions of the multicast gate (see multicast.h)
bool interposerEnabled();         // NCCL_TIDE_ENABLE: the LD_PRELOAD interposer classifies calls (plugin/api/interposer.cc)
uint64_t interposerMinBytes();    // NCCL_TIDE_ENABLE_MIN_BYTES: smallest call (bytes) the interposer considers
int ranksPerNodeOverride();       // NCCL_TIDE_RANKS_PER_NODE: virtual nodes of this many ranks; 0 = discover
uint64_t timeoutMs();             // NCCL_TIDE_TIMEOUT_MS: bound on host-side waits; 0 = none
bool rsAccumFp32();               // NCCL_TIDE_RS_ACCUM=FP32: the interposer may take bf16/fp16 reduce-scatters
uint64_t linkGBps();              // NCCL_TIDE_LINK_GBPS: the rate the RS reduce kernel keeps pace with
bool eagerGraphs();               // NCCL_TIDE_EAGER_GRAPHS: eager calls of capturable programs as graph replays
int tokenRsChunks();              // NCCL_TIDE_TOKEN_RS_CHUNKS: most RS pipeline chunks of a token (graph) program
// NCCL_TIDE_INTERNODE: what carries the steps between TIDE nodes (plugin/core/internode.h decides with it).
enum InterNodeSetting : int { kInterNodeAuto = 0, kInterNodeSendRecv = 1, kInterNodeRma = 2 };
InterNodeSetting interNode();
// NCCL_TIDE_PROVIDER: where a comm over an NCCL communicator keeps the memory its node's ranks share
// (plugin/nccl/provider_choice.h decides with it).
enum ProviderSetting : int { kProviderAuto = 0, kProviderIpc = 1, kProviderWindow = 2 };
ProviderSetting provider();
// Four protocol choices that measurement settled (docs/protocol.md, "How a graph is built"): every build takes the
// measured side, these constants. A test build (-DTIDE_TEST_SWITCHES=ON) lets the tests select the other side
// through the test-only switches named below, honoured only with NCCL_TIDE_TEST_SWITCHES=1 (docs/env.md).
constexpr bool kSignalKernelsDefault = true;     // RS graphs write flags by a kernel node, not a memop node
constexpr bool kMergeFlagBatchesDefault = true;  // adjacent flag batches in a graph as one memop node
constexpr bool kPairTokensDefault = true;        // token barriers waited for / reset two words per memop
constexpr bool kAgSignalKernelsDefault = false;  // AG graphs write flags by a kernel node too
#ifdef TIDE_TEST_SWITCHES
bool signalKernels();     // NCCL_TIDE_SIGNAL_KERNELS
bool mergeFlagBatches();  // NCCL_TIDE_MERGE_FLAG_BATCHES
bool pairTokens();        // NCCL_TIDE_PAIR_TOKENS
bool agSignalKernels();   // NCCL_TIDE_AG_SIGNAL_KERNELS
#else
constexpr bool signalKernels() { return kSignalKernelsDefault; }
constexpr bool mergeFlagBatches() { return kMergeFlagBatchesDefault; }
constexpr bool pairTokens() { return kPairTokensDefault; }
constexpr bool agSignalKernels() { return kAgSignalKernelsDefault; }
#endif

// NCCL_TIDE_TOKEN_RS_CHUNKS's default (a macro: the registry holds it as text); the layout agreement salts its key
// only for other values, and mismatch reports name them.
#define TIDE_TOKEN_RS_CHUNKS_DEFAULT 64
#define TIDE_STRINGIFY_(x) #x
#define TIDE_STRINGIFY(x) TIDE_STRINGIFY_(x)
constexpr int kTokenRsChunksDefault = TIDE_TOKEN_RS_CHUNKS_DEFAULT;

// tideSuccess if the environment value of parameter `id` (if any) parses; else records and returns
// tideInvalidArgument with a message naming the variable and the accepted form.
tideResult_t status(Id id);

// Registry access for the C API.
int count();
// Static strings; any output may be NULL. Errors: index out of range, or an unparsable environment value.
tideResult_t describe(int index, const char** name, const char** type, const char** defaultValue, const char** doc,
                      const char** value);

// Strict parsers, exposed for the multicast gate (which re-reads its variables at every call) and for tests.
bool parseBool(const char* text, bool* out);
bool parseBytes(const char* text, uint64_t* out);
bool parseInt64(const char* text, int64_t* out);
bool parseUint64(const char* text, uint64_t* out);

}  // namespace params
}  // namespace tide

#endif  // TIDE_CORE_PARAMS_H_
