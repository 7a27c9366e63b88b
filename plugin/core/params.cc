// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// The NCCL_TIDE_* registry, strict parsers and typed accessors.
#include "params.h"

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <strings.h>

#include "errors.h"
#include "fork_guard.h"

extern char** environ;  // POSIX: the process environment, scanned once for NCCL_TIDE_* names nobody reads

namespace tide {
namespace params {
namespace {

constexpr const char* kComponent = "Params";
constexpr uint64_t kKiB = 1024;
constexpr uint64_t kTiB = kKiB * kKiB * kKiB * kKiB;

struct Def {
  const char* name;
  Type type;
  const char* typeName;
  const char* defaultValue;  // canonical text: what describe() reports as value when the variable is unset
  const char* doc;           // one line, no '|' (it is a cell of the docs/env.md table)
  uint64_t minValue;         // numeric types: inclusive range
  uint64_t maxValue;
  const char* choices;       // string type: '|'-separated accepted values (case-insensitive)
  const char* form;          // the accepted form, for error messages
};

// THE registry. docs/env.md must list exactly these rows (a test compares them): the main table, and in a test build
// also the table of "Test builds".
const Def kDefs[kNumParams] = {
    {"NCCL_TIDE_DEBUG", Type::kString, "string", "NCCL",
     "Log level of TIDE's lines, overriding NCCL_DEBUG: NONE, VERSION, WARN, INFO or TRACE; NCCL follows NCCL_DEBUG "
     "(unset there too: only faults no caller is told about).",
     0, 0, "NCCL|NONE|VERSION|WARN|INFO|TRACE", "one of NCCL, NONE, VERSION, WARN, INFO, TRACE"},
    {"NCCL_TIDE_RS_CHUNK_BYTES", Type::kBytes, "bytes", "33554432",
     "Reduce-scatter pipeline chunk in bytes of this rank's fp32 output (4 KiB to 1 TiB); part of the layout hash.",
     4 * kKiB, kTiB, nullptr,
     "an integer number of bytes, optionally with K, M, G, T, KiB, MiB, GiB or TiB, from 4K to 1T"},
    {"NCCL_TIDE_PACE_BYTES", Type::kBytes, "bytes", "8388608",
     "Inter-node cap on bytes in flight per schedule step and rank (4 KiB to 1 TiB); part of the layout hash.",
     4 * kKiB, kTiB, nullptr,
     "an integer number of bytes, optionally with K, M, G, T, KiB, MiB, GiB or TiB, from 4K to 1T"},
    {"NCCL_TIDE_NVLS", Type::kBool, "bool", "0",
     "1 allows NVLink multicast, and only if NCCL_NVLS_ENABLE is not 0 and TORCH_SYMM_MEM_DISABLE_MULTICAST and "
     "NVSHMEM_DISABLE_NVLS are unset.",
     0, 1, nullptr, "0 or 1"},
    {"NCCL_TIDE_ENABLE", Type::kBool, "bool", "0",
     "1 lets the preloaded interposer run eligible ncclAllGather/ncclReduceScatter calls through TIDE (docs/usage.md); "
     "0 is pure pass-through.",
     0, 1, nullptr, "0 or 1"},
    {"NCCL_TIDE_ENABLE_MIN_BYTES", Type::kBytes, "bytes", "1048576",
     "Interposer: smallest call that can be eligible for TIDE, in bytes per rank (sendcount for all-gather, "
     "recvcount for reduce-scatter, times the element size).",
     0, kTiB, nullptr, "an integer number of bytes, optionally with K, M, G, T, KiB, MiB, GiB or TiB, up to 1T"},
    {"NCCL_TIDE_RANKS_PER_NODE", Type::kUint64, "uint64", "0",
     "TIDE's nodes: every this many consecutive ranks are one node (must divide the world size; a node's ranks must "
     "share a machine), also across NCCL hosts; nodes reach each other through the inter-node transport. 0 follows "
     "NCCL's hosts (NCCL_HOSTID honoured). Must match on every rank.",
     0, 64, nullptr, "an integer from 0 to 64"},
    {"NCCL_TIDE_TIMEOUT_MS", Type::kUint64, "uint64", "0",
     "Bound in milliseconds on TIDE's host-side waits for peers (docs/reliability.md lists them); 0 waits forever.",
     0, 86400000, nullptr, "an integer number of milliseconds from 0 to 86400000"},
    {"NCCL_TIDE_RS_ACCUM", Type::kString, "string", "OFF",
     "Interposer: FP32 lets TIDE take bf16/fp16 ncclReduceScatter calls (fp32 accumulation: more accurate than "
     "NCCL's, so not bitwise NCCL's); OFF passes them to NCCL. fp32 calls are eligible either way.",
     0, 0, "OFF|FP32", "one of OFF, FP32"},
    {"NCCL_TIDE_DEBUG_SUBSYS", Type::kString, "string", "NCCL",
     "Components whose INFO/TRACE lines are logged, overriding NCCL_DEBUG_SUBSYS: comma-separated TIDE component "
     "names or ALL, a leading ^ excludes them; NCCL follows NCCL_DEBUG_SUBSYS (docs/env.md, Logging).",
     0, 0, nullptr, "comma-separated component names (API, Cuda, HostAG, HostRS, Interposer, Ipc, Layout, Multicast, "
     "Nccl, Params, RsPlan, Schedule, Window, ALL), optionally starting with ^"},
    {"NCCL_TIDE_DEBUG_FILE", Type::kString, "string", "NCCL",
     "File for TIDE's lines (%h = host, %p = pid), overriding NCCL_DEBUG_FILE; NCCL writes to NCCL_DEBUG_FILE with "
     ".tide appended when that is set, else to stderr.",
     0, 0, nullptr, "a file path (%h and %p are substituted)"},
    {"NCCL_TIDE_LINK_GBPS", Type::kUint64, "uint64", "370",
     "Reduce-scatter: the rate (GB/s) at which other ranks' inputs reach this GPU; the reduce kernel takes only as "
     "many SMs as keep pace with it (docs/architecture.md, Reduce kernel shape).",
     1, 100000, nullptr, "an integer number of GB/s from 1 to 100000"},
    {"NCCL_TIDE_EAGER_GRAPHS", Type::kBool, "bool", "1",
     "1 (the default) runs eager calls whose program can be captured (one node; RS with at most "
     "NCCL_TIDE_TOKEN_RS_CHUNKS chunks) with the token protocol, replaying a CUDA graph the library captured "
     "(docs/architecture.md, Eager calls as graph replays): the least host time per call. 0 issues every eager call's "
     "operations directly (the epoch protocol): the library captures no graphs of its own (a profile shows each copy "
     "and flag operation as issued), and on loopback a virtual rank's next call is never refused because its token "
     "call still waits for a peer. Must match on all ranks.",
     0, 1, nullptr, "0 or 1"},
    {"NCCL_TIDE_TOKEN_RS_CHUNKS", Type::kUint64, "uint64", TIDE_STRINGIFY(TIDE_TOKEN_RS_CHUNKS_DEFAULT),
     "Most pipeline chunks of a reduce-scatter on the token protocol (eager graph route, CUDA graph capture); an "
     "eager RS of more chunks runs the epoch protocol, and a captured one is refused (tideUnsupported). Raise it to "
     "capture a larger reduce-scatter without raising rsChunkBytes. Above 2 chunks a token RS reuses 2 staging "
     "buffers behind consumed tokens (docs/architecture.md, More chunks than buffers). Must match on all ranks.",
     2, 4096, nullptr, "an integer from 2 to 4096"},
    {"NCCL_TIDE_INTERNODE", Type::kString, "string", "auto",
     "What carries the steps between TIDE nodes: auto (peer-mapped copies where every rank maps every other's memory, "
     "else sendrecv), sendrecv (grouped ncclSend/ncclRecv on NCCL's kernels, which take SMs; also between virtual "
     "nodes that could be peer-mapped) or rma (ncclPutSignal/ncclWaitSignal: not built, tideCommCreate refuses it). "
     "Must match on all ranks.",
     0, 0, "auto|sendrecv|rma", "one of auto, sendrecv, rma"},
    {"NCCL_TIDE_PROVIDER", Type::kString, "string", "auto",
     "Where a comm created on an NCCL communicator keeps the memory the ranks of a TIDE node share: auto (NCCL "
     "windows where the loaded NCCL is 2.29.2 or newer and has symmetric memory for the node's ranks, else CUDA IPC; "
     "tideCommCreate's INFO line says which and why), ipc (TIDE's own cudaMalloc memory through CUDA IPC) or window "
     "(ncclMemAlloc memory registered with ncclCommWindowRegister; tideCommCreate fails where NCCL cannot). A comm on "
     "a caller's bootstrap uses ipc (window is refused there). Must match on all ranks.",
     0, 0, "auto|ipc|window", "one of auto, ipc, window"},
#ifdef TIDE_TEST_SWITCHES
    {"NCCL_TIDE_TEST_SWITCHES", Type::kBool, "bool", "0",
     "Tests only: 1 lets the test-only switches below take effect (they select the other side of a measured choice "
     "so that the tests keep both sides working); 0: a test-only switch that is set is ignored, with one WARN.",
     0, 1, nullptr, "0 or 1"},
    {"NCCL_TIDE_SIGNAL_KERNELS", Type::kBool, "bool", kSignalKernelsDefault ? "1" : "0",
     "Test-only. 1: in the CUDA graphs of a reduce-scatter the trailing writes of each flag batch are a one-warp "
     "kernel node (a launched graph's memop node costs the host about 0.8 us, a kernel node a few hundredths); 0: "
     "stream memory operations.",
     0, 1, nullptr, "0 or 1"},
    {"NCCL_TIDE_MERGE_FLAG_BATCHES", Type::kBool, "bool", kMergeFlagBatchesDefault ? "1" : "0",
     "Test-only. 1: in a CUDA graph of a TIDE collective, flag batches that follow each other on one stream are "
     "captured as one memop node (a captured all-gather: 2 memop nodes per rank instead of 4); 0: one node per "
     "batch.",
     0, 1, nullptr, "0 or 1"},
    {"NCCL_TIDE_PAIR_TOKENS", Type::kBool, "bool", kPairTokensDefault ? "1" : "0",
     "Test-only. 1: the token programs wait for and reset two token words per 64-bit stream memory operation where "
     "the device has them (a captured all-gather at 8 ranks: 33 operations instead of 45); 0: one 32-bit operation "
     "per word. Local to each rank.",
     0, 1, nullptr, "0 or 1"},
    {"NCCL_TIDE_AG_SIGNAL_KERNELS", Type::kBool, "bool", kAgSignalKernelsDefault ? "1" : "0",
     "Test-only. 1: in the CUDA graphs of an all-gather too, the trailing writes of each flag batch are one-warp "
     "kernel nodes (no less host time per replay; more GPU time at 2 ranks); 0: all-gathers use no SM for flags.",
     0, 1, nullptr, "0 or 1"},
#endif
};

struct Entry {
  bool fromEnv = false;
  bool valid = true;
#ifdef TIDE_TEST_SWITCHES
  bool ignored = false;  // a test-only switch set without NCCL_TIDE_TEST_SWITCHES=1: the default is in force
#endif
  uint64_t value = 0;   // bool / bytes / uint64; int64 stored two's complement; string: index into choices
  char text[256] = {0};  // canonical effective value
  char envText[256] = {0};
};

struct State {
  Entry entries[kNumParams];
};

bool parseChoice(const Def& def, const char* text, uint64_t* index) {
  const char* p = def.choices;
  for (uint64_t i = 0; p != nullptr && *p != '\0'; ++i) {
    const char* end = strchr(p, '|');
    size_t len = end ? static_cast<size_t>(end - p) : strlen(p);
    if (strlen(text) == len && strncasecmp(text, p, len) == 0) {
      *index = i;
      return true;
    }
    p = end ? end + 1 : nullptr;
  }
  return false;
}

void choiceText(const Def& def, uint64_t index, char* out, size_t outBytes) {
  const char* p = def.choices;
  for (uint64_t i = 0; i < index && p; ++i) {
    p = strchr(p, '|');
    if (p) ++p;
  }
  const char* end = p ? strchr(p, '|') : nullptr;
  size_t len = p ? (end ? static_cast<size_t>(end - p) : strlen(p)) : 0;
  snprintf(out, outBytes, "%.*s", static_cast<int>(len), p ? p : "");
}

// Parses text by def's type and range; on success stores value and canonical text.
bool parseValue(const Def& def, const char* text, Entry* e) {
  uint64_t u = 0;
  int64_t s = 0;
  switch (def.type) {
    case Type::kBool: {
      bool b = false;
      if (!parseBool(text, &b)) return false;
      e->value = b ? 1 : 0;
      snprintf(e->text, sizeof(e->text), "%d", b ? 1 : 0);
      return true;
    }
    case Type::kBytes:
    case Type::kUint64:
      if (!(def.type == Type::kBytes ? parseBytes(text, &u) : parseUint64(text, &u))) return false;
      if (u < def.minValue || u > def.maxValue) return false;
      e->value = u;
      snprintf(e->text, sizeof(e->text), "%" PRIu64, u);
      return true;
    case Type::kInt64:
      if (!parseInt64(text, &s)) return false;
      if (s < static_cast<int64_t>(def.minValue) || s > static_cast<int64_t>(def.maxValue)) return false;
      e->value = static_cast<uint64_t>(s);
      snprintf(e->text, sizeof(e->text), "%" PRId64, s);
      return true;
    case Type::kString:
      if (def.choices == nullptr) {  // free-form text (checked by its user), never empty, never cut
        if (text[0] == '\0' || strlen(text) >= sizeof(e->text)) return false;
        e->value = 0;
        snprintf(e->text, sizeof(e->text), "%s", text);
        return true;
      }
      if (!parseChoice(def, text, &u)) return false;
      e->value = u;
      choiceText(def, u, e->text, sizeof(e->text));
      return true;
  }
  return false;
}

#ifdef TIDE_TEST_SWITCHES
// Switches that select the other side of a measured choice, for the tests that keep both sides working: honoured only
// with NCCL_TIDE_TEST_SWITCHES=1 (parsed before them: it precedes them in the registry).
bool testOnly(Id id) {
  return id == kSignalKernels || id == kMergeFlagBatches || id == kPairTokens || id == kAgSignalKernels;
}

void gateTestSwitches(State* st) {
  const bool gate = st->entries[kTestSwitches].valid && st->entries[kTestSwitches].value != 0;
  for (int i = 0; i < kNumParams; ++i) {
    Entry& e = st->entries[i];
    if (!testOnly(static_cast<Id>(i)) || !e.fromEnv || gate) continue;
    Entry dflt;
    parseValue(kDefs[i], kDefs[i].defaultValue, &dflt);
    snprintf(dflt.envText, sizeof(dflt.envText), "%s", e.envText);
    dflt.fromEnv = true;
    dflt.ignored = true;
    e = dflt;
  }
}
#endif

// Reads the environment once. Must not log: logging asks for the debug level, which comes from here.
State load() {
  State st;
  for (int i = 0; i < kNumParams; ++i) {
    const Def& def = kDefs[i];
    Entry& e = st.entries[i];
    if (!parseValue(def, def.defaultValue, &e)) e.valid = false;  // a registry bug; caught by tests
    const char* env = getenv(def.name);
    if (env == nullptr) continue;
    e.fromEnv = true;
    snprintf(e.envText, sizeof(e.envText), "%s", env);
    Entry parsed = e;
    if (parseValue(def, env, &parsed)) {
      e = parsed;
    } else {
      e.valid = false;  // keeps the default's value and text
    }
  }
#ifdef TIDE_TEST_SWITCHES
  gateTestSwitches(&st);
#endif
  return st;
}

// The one read of the environment, under a lock held across fork() (a function-local static's guard would leave a
// child forked during the read waiting forever). Never freed, like the log settings that read it.
std::mutex gStateMu;
std::atomic<const State*> gState{nullptr};
[[maybe_unused]] const bool gForkGuarded = forkguard::guard(forkguard::kParams, &gStateMu);

const State& state() {
  const State* st = gState.load(std::memory_order_acquire);
  if (st != nullptr) return *st;
  std::lock_guard<std::mutex> lock(gStateMu);
  st = gState.load(std::memory_order_acquire);
  if (st == nullptr) {
    st = new State(load());
    gState.store(st, std::memory_order_release);
  }
  return *st;
}

std::atomic<bool> gLogged{false};

// Parameters that change plans or the world's shape (part of the layout/config hash, or NCCL_TIDE_RANKS_PER_NODE):
// an invalid value is an error of every call that needs it (status() below), never silently the default, which
// could differ from what the other ranks use. The others fall back to their default with a WARN.
bool strictWhenInvalid(Id id) {
  // NCCL_TIDE_EAGER_GRAPHS picks the wire protocol of eager calls (epoch or token words): a default that differs from
  // what the other ranks use would deadlock.
  // NCCL_TIDE_TOKEN_RS_CHUNKS likewise (which reduce-scatters take the token words).
  // NCCL_TIDE_INTERNODE picks the programs' cross-node operations (puts and flags, or p2p groups).
  // NCCL_TIDE_PROVIDER picks how ranks map each other's memory, a collective choice.
  return id == kRsChunkBytes || id == kPaceBytes || id == kRanksPerNode || id == kEagerGraphs ||
         id == kTokenRsChunks || id == kInterNode || id == kProvider;
}

// NCCL_TIDE_* variables that are not parameters of this library but are read elsewhere (docs/env.md, "Read by the
// Python package only" and "Read by the build scripts"; benchmarks/bench_lib.py): not reported as unknown.
constexpr const char* kReadElsewhere[] = {"NCCL_TIDE_LIBRARY_PATH",  "NCCL_TIDE_FSDP",
                                          "NCCL_TIDE_FSDP_CAST_IN_PLACE", "NCCL_TIDE_RANKS_PER_GPU",
                                          "NCCL_TIDE_OFFLINE",       "NCCL_TIDE_BENCH_LIBRARY_PATH"};

bool knownName(const char* name, size_t n) {
  for (const Def& d : kDefs) {
    if (strlen(d.name) == n && strncmp(d.name, name, n) == 0) return true;
  }
  for (const char* k : kReadElsewhere) {
    if (strlen(k) == n && strncmp(k, name, n) == 0) return true;
  }
  return false;
}

// Parameters this library no longer has, and what it does instead.
struct Removed {
  const char* name;
  const char* instead;
};
constexpr Removed kRemoved[] = {
    {"NCCL_TIDE_AG_BATCH", "copies use cudaMemcpyBatchAsync wherever the CUDA runtime and the stream allow it"},
};

// A NCCL_TIDE_* variable nobody reads is a setting the user believes in and TIDE ignores (a removed switch, a typo):
// one WARN each, once per process.
void warnUnknownNames() {
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (strncmp(*e, "NCCL_TIDE_", 10) != 0) continue;
    const char* eq = strchr(*e, '=');
    const size_t n = eq != nullptr ? static_cast<size_t>(eq - *e) : strlen(*e);
    if (knownName(*e, n)) continue;
    const Removed* removed = nullptr;
    for (const Removed& r : kRemoved) {
      if (strlen(r.name) == n && strncmp(r.name, *e, n) == 0) removed = &r;
    }
    if (removed != nullptr) {
      TIDE_WARN(kComponent, "%s was removed and is ignored: %s (docs/env.md)", removed->name, removed->instead);
      continue;
    }
    TIDE_WARN(kComponent, "%.*s is not a TIDE parameter and is ignored (docs/env.md lists them)", static_cast<int>(n),
              *e);
  }
}

// Logs, once per process, every value that came from the environment, and the NCCL_TIDE_* names nobody reads.
const State& loggedState() {
  const State& st = state();
  if (!gLogged.exchange(true)) {
    for (int i = 0; i < kNumParams; ++i) {
      const Entry& e = st.entries[i];
      if (!e.fromEnv) continue;
#ifdef TIDE_TEST_SWITCHES
      if (e.ignored) {
        TIDE_WARN(kComponent, "%s is a test-only switch and is ignored without NCCL_TIDE_TEST_SWITCHES=1 (docs/env.md)",
                  kDefs[i].name);
        continue;
      }
#endif
      if (e.valid) {
        TIDE_INFO(kComponent, "%s=%s (from the environment)", kDefs[i].name, e.text);
      } else if (strictWhenInvalid(static_cast<Id>(i))) {
        TIDE_WARN(kComponent, "%s='%s' is not valid (accepted: %s); the calls that use it fail until it is fixed or "
                  "unset (docs/env.md)", kDefs[i].name, e.envText, kDefs[i].form);
      } else {
        TIDE_WARN(kComponent, "%s='%s' is not valid (accepted: %s); using the default %s", kDefs[i].name, e.envText,
                  kDefs[i].form, kDefs[i].defaultValue);
      }
    }
    warnUnknownNames();
  }
  return st;
}

}  // namespace

bool parseBool(const char* text, bool* out) {
  if (text == nullptr) return false;
  if (strcmp(text, "0") == 0) {
    *out = false;
    return true;
  }
  if (strcmp(text, "1") == 0) {
    *out = true;
    return true;
  }
  return false;
}

bool parseUint64(const char* text, uint64_t* out) {
  if (text == nullptr || !isdigit(static_cast<unsigned char>(text[0]))) return false;  // no sign, no space
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') return false;
  *out = v;
  return true;
}

bool parseInt64(const char* text, int64_t* out) {
  if (text == nullptr) return false;
  const char* digits = text[0] == '-' ? text + 1 : text;
  if (!isdigit(static_cast<unsigned char>(digits[0]))) return false;
  errno = 0;
  char* end = nullptr;
  long long v = strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') return false;
  *out = v;
  return true;
}

bool parseBytes(const char* text, uint64_t* out) {
  if (text == nullptr || !isdigit(static_cast<unsigned char>(text[0]))) return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || end == text) return false;
  struct Suffix {
    const char* text;
    uint64_t multiplier;
  };
  static const Suffix kSuffixes[] = {{"", 1},
                                     {"K", kKiB},
                                     {"M", kKiB * kKiB},
                                     {"G", kKiB * kKiB * kKiB},
                                     {"T", kTiB},
                                     {"KiB", kKiB},
                                     {"MiB", kKiB * kKiB},
                                     {"GiB", kKiB * kKiB * kKiB},
                                     {"TiB", kTiB}};
  for (const Suffix& s : kSuffixes) {
    if (strcmp(end, s.text) != 0) continue;
    uint64_t result = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(v), s.multiplier, &result)) return false;
    *out = result;
    return true;
  }
  return false;
}

// Not loggedState(): the logger calls these to learn its settings.
DebugSetting debugSetting() { return static_cast<DebugSetting>(state().entries[kDebug].value); }

namespace {
const char* followOrText(Id id) {
  const Entry& e = state().entries[id];
  if (!e.fromEnv || !e.valid || strcasecmp(e.text, "NCCL") == 0) return nullptr;
  return e.text;
}
}  // namespace

const char* debugSubsysText() { return followOrText(kDebugSubsys); }
const char* debugFileText() { return followOrText(kDebugFile); }

uint64_t rsChunkBytes() { return loggedState().entries[kRsChunkBytes].value; }
uint64_t paceBytes() { return loggedState().entries[kPaceBytes].value; }
bool nvlsRequested() { return loggedState().entries[kNvls].value != 0; }
bool interposerEnabled() { return loggedState().entries[kEnable].value != 0; }
uint64_t interposerMinBytes() { return loggedState().entries[kEnableMinBytes].value; }
int ranksPerNodeOverride() { return static_cast<int>(loggedState().entries[kRanksPerNode].value); }
uint64_t timeoutMs() { return loggedState().entries[kTimeoutMs].value; }
bool rsAccumFp32() { return loggedState().entries[kRsAccum].value == 1; }
uint64_t linkGBps() { return loggedState().entries[kLinkGBps].value; }
bool eagerGraphs() { return loggedState().entries[kEagerGraphs].value != 0; }
int tokenRsChunks() { return static_cast<int>(loggedState().entries[kTokenRsChunks].value); }
InterNodeSetting interNode() { return static_cast<InterNodeSetting>(loggedState().entries[kInterNode].value); }
ProviderSetting provider() { return static_cast<ProviderSetting>(loggedState().entries[kProvider].value); }
#ifdef TIDE_TEST_SWITCHES
bool signalKernels() { return loggedState().entries[kSignalKernels].value != 0; }
bool mergeFlagBatches() { return loggedState().entries[kMergeFlagBatches].value != 0; }
bool pairTokens() { return loggedState().entries[kPairTokens].value != 0; }
bool agSignalKernels() { return loggedState().entries[kAgSignalKernels].value != 0; }
#endif

tideResult_t status(Id id) {
  if (id < 0 || id >= kNumParams) return fail(tideInvalidArgument, kComponent, "parameter index %d out of range", id);
  const Entry& e = loggedState().entries[id];
  if (e.valid) return tideSuccess;
  return fail(tideInvalidArgument, kComponent, "%s='%s' is not valid: expected %s (default %s)", kDefs[id].name,
              e.envText, kDefs[id].form, kDefs[id].defaultValue);
}

int count() { return kNumParams; }

tideResult_t describe(int index, const char** name, const char** type, const char** defaultValue, const char** doc,
                      const char** value) {
  if (index < 0 || index >= kNumParams) {
    return fail(tideInvalidArgument, kComponent, "parameter index %d out of range [0, %d)", index, kNumParams);
  }
  TIDE_CHECK(status(static_cast<Id>(index)));
  const Def& def = kDefs[index];
  if (name) *name = def.name;
  if (type) *type = def.typeName;
  if (defaultValue) *defaultValue = def.defaultValue;
  if (doc) *doc = def.doc;
  if (value) *value = state().entries[index].text;
  return tideSuccess;
}

}  // namespace params
}  // namespace tide
