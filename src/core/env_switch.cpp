#include "core/env_switch.h"

#include <cerrno>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/log.h"

namespace deepinfer {

bool read_env_switch(const char* name, bool& flag) {
  const char* value = std::getenv(name);
  if (value == nullptr) return false;
  const std::string_view v(value);
  if (v == "0" || v == "1") {
    flag = v == "1";
    return true;
  }
  if (!v.empty()) log_warn("{}='{}' ignored: it must be 0 or 1", name, v);
  return false;
}

bool read_env_int(const char* name, int64_t lo, int64_t hi, int64_t step, int64_t& value) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  const bool starts = (*v >= '0' && *v <= '9') || *v == '-';  // strtoll would skip blanks, take '+'
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  if (starts && end != v && *end == '\0' && errno == 0 && n >= lo && n <= hi && step >= 1 && (n - lo) % step == 0) {
    value = n;
    return true;
  }
  log_warn("{}='{}' ignored: it must be an integer in [{}, {}]{}", name, v, lo, hi,
           step > 1 ? fmt::format(", {} plus a multiple of {}", lo, step) : std::string());
  return false;
}

}  // namespace deepinfer
