// Line-oriented logging to stderr (or an installed sink), gated by NCCL_TIDE_DEBUG.
#include "log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "params.h"

namespace tide {
namespace log {
namespace {

std::atomic<int> gLevel{-1};  // -1: not read yet
std::atomic<Sink> gSink{nullptr};

const char* hostName() {
  // Resolved once; a magic static is thread-safe and cannot recurse into logging.
  static const struct Host {
    char name[64];
    Host() {
      if (gethostname(name, sizeof(name)) != 0) snprintf(name, sizeof(name), "unknown");
      name[sizeof(name) - 1] = '\0';
    }
  } host;
  return host.name;
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

bool enabled(Level level) {
  int current = gLevel.load(std::memory_order_relaxed);
  if (current < 0) {
    // Publish a provisional level first: reading the parameters may itself log (the values it took from the
    // environment), and those nested calls must not recurse here.
    gLevel.store(kWarn, std::memory_order_relaxed);
    current = static_cast<int>(params::debugLevel());
    gLevel.store(current, std::memory_order_relaxed);
  }
  return level != kNone && static_cast<int>(level) <= current;
}

void writeV(Level level, const char* component, const char* fmt, va_list ap) {
  char message[1024];
  vsnprintf(message, sizeof(message), fmt, ap);
  Sink sink = gSink.load(std::memory_order_acquire);
  if (sink != nullptr) {
    sink(level, component, message);
    return;
  }
  char line[1280];
  int n = snprintf(line, sizeof(line), "%s:%d:%ld TIDE/%s %s %s\n", hostName(), static_cast<int>(getpid()),
                   static_cast<long>(syscall(SYS_gettid)), component, levelName(level), message);
  if (n < 0) return;
  size_t len = static_cast<size_t>(n) < sizeof(line) ? static_cast<size_t>(n) : sizeof(line) - 1;
  if (line[len - 1] != '\n') line[len - 1] = '\n';
  // One fwrite per line keeps lines from different threads whole.
  fwrite(line, 1, len, stderr);
}

void write(Level level, const char* component, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  writeV(level, component, fmt, ap);
  va_end(ap);
}

void setSink(Sink sink) { gSink.store(sink, std::memory_order_release); }

}  // namespace log
}  // namespace tide
