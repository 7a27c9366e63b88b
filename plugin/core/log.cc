// Copyright The nccl-tide authors
// SPDX-License-Identifier: Apache-2.0
// Line-oriented logging in NCCL's format, governed by NCCL_DEBUG / NCCL_DEBUG_SUBSYS / NCCL_DEBUG_FILE and the
// NCCL_TIDE_DEBUG* overrides (the rules are in log.h and docs/env.md).
#include "log.h"

#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "fork_guard.h"
#include "params.h"

namespace tide {
namespace log {
namespace {

// NCCL's subsystem bits (nccl_common.h, ncclDebugLogSubSys), by name; only the names matter here.
struct NcclSubsys {
  const char* name;
  unsigned bit;
};
constexpr NcclSubsys kNcclSubsys[] = {
    {"INIT", 1u << 0},  {"COLL", 1u << 1},  {"P2P", 1u << 2},       {"SHM", 1u << 3},    {"NET", 1u << 4},
    {"GRAPH", 1u << 5}, {"TUNING", 1u << 6}, {"ENV", 1u << 7},       {"ALLOC", 1u << 8},  {"CALL", 1u << 9},
    {"PROXY", 1u << 10}, {"NVLS", 1u << 11}, {"BOOTSTRAP", 1u << 12}, {"REG", 1u << 13}, {"PROFILE", 1u << 14},
    {"RAS", 1u << 15}};
constexpr unsigned kNcclAll = ~0u;
unsigned ncclBit(const char* name) {
  for (const NcclSubsys& s : kNcclSubsys)
    if (strcasecmp(s.name, name) == 0) return s.bit;
  return 0;
}

// TIDE's components and the NCCL subsystems each one belongs to (a line passes NCCL_DEBUG_SUBSYS if any of them is
// selected). Creation-time work (comms, layouts, plans, the NCCL binding, the interposer's per-communicator
// decision) is INIT, as NCCL's own init lines are; per-call data movement is COLL; IPC mapping P2P; params ENV.
struct Component {
  const char* name;
  const char* ncclSubsys;  // comma-separated
};
constexpr Component kComponents[] = {
    {"API", "INIT"},      {"Cuda", "COLL"},           {"HostAG", "COLL"},   {"HostRS", "COLL"},
    {"Interposer", "INIT,COLL"}, {"Ipc", "INIT,P2P,ALLOC"}, {"Layout", "INIT"}, {"Multicast", "NVLS"}, {"Nodes", "INIT"},
    {"Nccl", "INIT"},     {"Params", "ENV"},          {"RsPlan", "INIT"},   {"Schedule", "INIT"},
    {"Window", "INIT,P2P,ALLOC"},
    {"Python", "INIT"}};  // the Python glue's lines: written by the glue itself, under this same rule (_log.py)
constexpr int kNumComponents = static_cast<int>(sizeof(kComponents) / sizeof(kComponents[0]));
constexpr unsigned kAllComponents = (1u << kNumComponents) - 1;
// Lines from a component missing from the table pass whenever any INFO/TRACE line would.
int componentIndex(const char* name) {
  if (name == nullptr) return -1;
  for (int i = 0; i < kNumComponents; ++i)
    if (strcmp(kComponents[i].name, name) == 0) return i;
  return -1;
}

// Applies a comma-separated list with an optional leading ^ (NCCL_DEBUG_SUBSYS grammar). lookup maps a name to
// a component mask (0: unknown). Returns the mask; *unknown gets the first unknown name.
template <typename Lookup>
unsigned parseList(const char* text, Lookup lookup, std::string* unknown) {
  bool invert = text[0] == '^';
  if (invert) ++text;
  unsigned mask = 0;
  std::string list(text);
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string name = list.substr(pos, end - pos);
    if (!name.empty()) {
      unsigned m = strcasecmp(name.c_str(), "ALL") == 0 ? kAllComponents : lookup(name.c_str());
      if (m == 0 && unknown->empty()) *unknown = name;
      mask |= m;
    }
    pos = end + 1;
  }
  return invert ? (kAllComponents & ~mask) : mask;
}

unsigned componentsOfNcclMask(unsigned ncclMask) {
  unsigned mask = 0;
  for (int i = 0; i < kNumComponents; ++i) {
    std::string list(kComponents[i].ncclSubsys);
    size_t pos = 0;
    while (pos <= list.size()) {
      size_t end = list.find(',', pos);
      if (end == std::string::npos) end = list.size();
      if (ncclBit(list.substr(pos, end - pos).c_str()) & ncclMask) mask |= 1u << i;
      pos = end + 1;
    }
  }
  return mask;
}

unsigned ncclMaskOf(const char* text) {
  bool invert = text[0] == '^';
  if (invert) ++text;
  unsigned mask = 0;
  std::string list(text);
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string name = list.substr(pos, end - pos);
    mask |= strcasecmp(name.c_str(), "ALL") == 0 ? kNcclAll : ncclBit(name.c_str());  // NCCL ignores unknown names
    pos = end + 1;
  }
  return invert ? ~mask : mask;
}

const char* hostName() {
  // Resolved once, cut at the first '.' as NCCL does; a magic static is thread-safe and cannot recurse.
  static const struct Host {
    char name[64];
    Host() {
      if (gethostname(name, sizeof(name)) != 0) snprintf(name, sizeof(name), "unknown");
      name[sizeof(name) - 1] = '\0';
      char* dot = strchr(name, '.');
      if (dot != nullptr) *dot = '\0';
    }
  } host;
  return host.name;
}

// %h -> host, %p -> pid, %% -> %, as NCCL expands NCCL_DEBUG_FILE.
std::string expandPath(const char* pattern) {
  std::string out;
  for (const char* p = pattern; *p != '\0'; ++p) {
    if (*p == '%' && p[1] == 'h') {
      out += hostName();
      ++p;
    } else if (*p == '%' && p[1] == 'p') {
      out += std::to_string(static_cast<long>(getpid()));
      ++p;
    } else if (*p == '%' && p[1] == '%') {
      out += '%';
      ++p;
    } else {
      out += *p;
    }
  }
  return out;
}

struct Settings {
  int level = kWarn;           // INFO/TRACE/WARN threshold
  bool returned = false;       // print fail()'s lines
  bool version = false;        // print the version line
  unsigned mask = kAllComponents;
  FILE* out = stderr;
  std::string note;            // a problem found while reading the settings, logged once after
};

std::atomic<const Settings*> gSettings{nullptr};
std::atomic<DeviceQuery> gDeviceQuery{nullptr};
// Taken for the one load of the settings; held across fork() (a child never waits for a load of another thread).
std::mutex gLoadMu;
[[maybe_unused]] const bool gForkGuarded = forkguard::guard(forkguard::kLogSettings, &gLoadMu);

// Level words of NCCL_DEBUG; NCCL ignores other values, and so does TIDE (NCCL_DEBUG is NCCL's to validate).
bool ncclLevel(const char* text, Settings* s) {
  if (strcasecmp(text, "VERSION") == 0) {
    s->version = true;
  } else if (strcasecmp(text, "WARN") == 0) {
    s->version = s->returned = true;
  } else if (strcasecmp(text, "INFO") == 0 || strcasecmp(text, "ABORT") == 0) {
    s->version = s->returned = true;
    s->level = kInfo;
  } else if (strcasecmp(text, "TRACE") == 0) {
    s->version = s->returned = true;
    s->level = kTrace;
  } else {
    return false;
  }
  return true;
}

const Settings* load() {
  // Never freed: lines may be written from static destructors and from any thread, after function statics are
  // gone (a global pointer keeps it reachable, so leak checkers do not report it).
  Settings& s = *new Settings();
  (void)hostName();  // its magic static is initialized here, under gLoadMu, which fork() waits for
  bool ownLevel = false;
  switch (params::debugSetting()) {
    case params::kDebugNccl: {
      const char* nccl = getenv("NCCL_DEBUG");
      if (nccl != nullptr) ncclLevel(nccl, &s);
      break;
    }
    case params::kDebugNone:
      s.level = kNone;
      ownLevel = true;
      break;
    case params::kDebugVersion:
      s.version = ownLevel = true;
      break;
    case params::kDebugWarn:
      ownLevel = ncclLevel("WARN", &s);
      break;
    case params::kDebugInfo:
      ownLevel = ncclLevel("INFO", &s);
      break;
    case params::kDebugTrace:
      ownLevel = ncclLevel("TRACE", &s);
      break;
  }
  std::string unknown;
  if (const char* own = params::debugSubsysText()) {
    s.mask = parseList(
        own, [](const char* name) -> unsigned {
          for (int i = 0; i < kNumComponents; ++i)
            if (strcasecmp(kComponents[i].name, name) == 0) return 1u << i;
          return 0;
        },
        &unknown);
    if (!unknown.empty()) s.note = "NCCL_TIDE_DEBUG_SUBSYS: unknown component '" + unknown + "' ignored";
  } else if (const char* nccl = getenv("NCCL_DEBUG_SUBSYS")) {
    s.mask = componentsOfNcclMask(ncclMaskOf(nccl));
  } else if (!ownLevel) {
    s.mask = componentsOfNcclMask(ncclBit("INIT") | ncclBit("BOOTSTRAP") | ncclBit("ENV"));  // NCCL's default
  }
  std::string path;
  if (const char* own = params::debugFileText()) {
    path = expandPath(own);
  } else if (const char* nccl = getenv("NCCL_DEBUG_FILE")) {
    if (nccl[0] != '\0') path = expandPath(nccl) + ".tide";
  }
  if (!path.empty() && s.level != kNone) {
    // Append: the Python glue writes its lines to the same file (pytorch_glue/nccl_tide/_log.py), and ranks that
    // share a name must not truncate each other's lines.
    FILE* f = fopen(path.c_str(), "a");
    if (f != nullptr) {
      setvbuf(f, nullptr, _IOLBF, 0);
      s.out = f;
    } else {
      s.note = "cannot open the log file '" + path + "' (" + strerror(errno) + "); logging to stderr";
    }
  }
  return &s;
}

const Settings& settings() {
  const Settings* s = gSettings.load(std::memory_order_acquire);
  if (s != nullptr) return *s;
  // Reading the parameters never logs (params::state() is silent), so this cannot recurse.
  {
    std::lock_guard<std::mutex> lock(gLoadMu);
    s = gSettings.load(std::memory_order_acquire);
    if (s == nullptr) {
      s = load();
      gSettings.store(s, std::memory_order_release);
    }
  }
  static std::atomic<bool> noted{false};
  if (!s->note.empty() && !noted.exchange(true)) write(kWarn, "Params", "%s", s->note.c_str());
  return *s;
}

void emit(Level level, const char* component, const char* fmt, va_list ap) {
  const Settings& s = settings();
  char message[1024];
  vsnprintf(message, sizeof(message), fmt, ap);
  char dev[16] = "-";
  DeviceQuery query = gDeviceQuery.load(std::memory_order_acquire);
  int d = query != nullptr ? query() : -1;
  if (d >= 0) snprintf(dev, sizeof(dev), "%d", d);
  char line[1280];
  int n = snprintf(line, sizeof(line), "%s:%d:%ld [%s] NCCL TIDE %s %s: %s\n", hostName(), static_cast<int>(getpid()),
                   static_cast<long>(syscall(SYS_gettid)), dev, levelName(level), component ? component : "TIDE",
                   message);
  if (n < 0) return;
  size_t len = static_cast<size_t>(n) < sizeof(line) ? static_cast<size_t>(n) : sizeof(line) - 1;
  if (line[len - 1] != '\n') line[len - 1] = '\n';
  // One fwrite per line keeps lines from different threads whole.
  fwrite(line, 1, len, s.out);
}

}  // namespace

const char* levelName(Level level) {
  switch (level) {
    case kNone:
      return "NONE";
    case kWarn:
      return "WARN";
    case kInfo:
      return "INFO";
    case kTrace:
      return "TRACE";
  }
  return "?";
}

bool enabled(Level level, const char* component) {
  const Settings& s = settings();
  if (level == kNone || static_cast<int>(level) > s.level) return false;
  if (level == kWarn) return true;
  int i = componentIndex(component);
  return i < 0 ? s.mask != 0 : (s.mask & (1u << i)) != 0;
}

bool returnedErrorsEnabled() {
  const Settings& s = settings();
  return s.returned && s.level != kNone;
}

void writeV(Level level, const char* component, const char* fmt, va_list ap) { emit(level, component, fmt, ap); }

void write(Level level, const char* component, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit(level, component, fmt, ap);
  va_end(ap);
}

void writeReturned(const char* component, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit(kWarn, component, fmt, ap);
  va_end(ap);
}

void versionOnce(const char* text) {
  static std::atomic<bool> said{false};
  const Settings& s = settings();
  if (!s.version || s.level == kNone || said.exchange(true)) return;
  char line[512];
  int n = snprintf(line, sizeof(line), "%s:%d:%ld [-] NCCL TIDE version %s\n", hostName(), static_cast<int>(getpid()),
                   static_cast<long>(syscall(SYS_gettid)), text);
  if (n > 0) fwrite(line, 1, static_cast<size_t>(n) < sizeof(line) ? static_cast<size_t>(n) : sizeof(line) - 1, s.out);
}

void setDeviceQuery(DeviceQuery query) { gDeviceQuery.store(query, std::memory_order_release); }

}  // namespace log
}  // namespace tide
