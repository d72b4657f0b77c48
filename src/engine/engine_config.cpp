#include "engine/engine_config.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

namespace deepinfer {
namespace {

Status read_int_env(const char* name, int64_t lo, int64_t hi, int64_t* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return Status::ok();
  int64_t value = 0;
  const char* end = v + std::strlen(v);
  auto [ptr, ec] = std::from_chars(v, end, value);
  if (ec != std::errc() || ptr != end || value < lo || value > hi)
    return make_error(StatusCode::kInvalidArgument, "environment variable {}='{}' must be an integer in [{}, {}]",
                      name, v, lo, hi);
  *out = value;
  return Status::ok();
}

}  // namespace

Expected<EngineConfig> EngineConfig::from_env() {
  EngineConfig c;
  if (const char* v = std::getenv("DEEPINFER_HF_MODEL_DIR")) c.model_dir = v;
  if (const char* v = std::getenv("DEEPINFER_DEVICE"); v != nullptr && *v != '\0') c.device = v;
  int64_t threads = c.n_threads;
  DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_NUM_THREADS", 0, 4096, &threads));
  c.n_threads = static_cast<int>(threads);
  DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_KV_BLOCK_SIZE", 1, 4096, &c.kv_block_size));
  DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_MAX_MODEL_LEN", 0, int64_t{1} << 32, &c.max_model_len));
  DI_RETURN_IF_ERROR(c.validate());
  return c;
}

Status EngineConfig::validate() const {
  if (device != "cpu" && device != "reference")
    return make_error(StatusCode::kInvalidArgument, "device '{}' is not available: expected cpu or reference", device);
  if (n_threads < 0) return make_error(StatusCode::kInvalidArgument, "n_threads must be >= 0, got {}", n_threads);
  if (kv_block_size < 1 || kv_block_size > 4096)
    return make_error(StatusCode::kInvalidArgument, "kv_block_size must be in [1, 4096], got {}", kv_block_size);
  if (max_model_len < 0)
    return make_error(StatusCode::kInvalidArgument, "max_model_len must be >= 0, got {}", max_model_len);
  return Status::ok();
}

}  // namespace deepinfer
