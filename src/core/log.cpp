#include "core/log.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace deepinfer {

LogLevel log_level() {
  static const LogLevel level = [] {
    const char* v = std::getenv("DEEPINFER_LOG_LEVEL");
    if (v == nullptr) return LogLevel::kInfo;
    if (std::strcmp(v, "debug") == 0) return LogLevel::kDebug;
    if (std::strcmp(v, "warn") == 0) return LogLevel::kWarn;
    if (std::strcmp(v, "error") == 0) return LogLevel::kError;
    return LogLevel::kInfo;
  }();
  return level;
}

void log_write(LogLevel level, const std::string& message) {
  static std::mutex mutex;
  static const char* kNames[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "[deepinfer %s] %s\n", kNames[static_cast<int>(level)], message.c_str());
}

}  // namespace deepinfer
