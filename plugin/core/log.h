// Logging: one line per event, `<host>:<pid>:<tid> TIDE/<Component> <LEVEL> message`, to stderr, gated by
// NCCL_TIDE_DEBUG (NONE|WARN|INFO|TRACE, default WARN). The NCCL binding can route lines through NCCL's own
// logger by installing a sink with setSink(); until then (and after setSink(nullptr)) lines go to stderr.
#ifndef TIDE_CORE_LOG_H_
#define TIDE_CORE_LOG_H_

#include <cstdarg>

namespace tide {
namespace log {

enum Level : int { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

// True if a message at `level` would be written (cheap after the first call: the level is read once).
bool enabled(Level level);

// Writes one line. component is the tag without the "TIDE/" prefix ("Layout", "Cuda", ...).
void write(Level level, const char* component, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void writeV(Level level, const char* component, const char* fmt, va_list ap);

// A sink receives fully formatted messages (without the host/pid/tid prefix or trailing newline) and is
// responsible for emitting them. Installing one is thread-safe; nullptr restores stderr.
using Sink = void (*)(Level level, const char* component, const char* message);
void setSink(Sink sink);

// Name of a level ("NONE", "WARN", "INFO", "TRACE").
const char* levelName(Level level);

}  // namespace log
}  // namespace tide

#define TIDE_LOG_AT_(level, component, ...)                                                    \
  do {                                                                                         \
    if (::tide::log::enabled(level)) ::tide::log::write(level, component, __VA_ARGS__);       \
  } while (0)

#define TIDE_WARN(component, ...) TIDE_LOG_AT_(::tide::log::kWarn, component, __VA_ARGS__)
#define TIDE_INFO(component, ...) TIDE_LOG_AT_(::tide::log::kInfo, component, __VA_ARGS__)
#define TIDE_TRACE(component, ...) TIDE_LOG_AT_(::tide::log::kTrace, component, __VA_ARGS__)

#endif  // TIDE_CORE_LOG_H_
