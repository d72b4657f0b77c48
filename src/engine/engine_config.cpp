#include "engine/engine_config.h"

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

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

// The demo model committed under models/demo (DEEPINFER_DEFAULT_MODEL_DIR, set by CMake), when the
// source tree is still there; otherwise "" and Generator::create asks for a model.
std::string default_model_dir() {
#ifdef DEEPINFER_DEFAULT_MODEL_DIR
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::filesystem::path(DEEPINFER_DEFAULT_MODEL_DIR) / "config.json", ec))
    return DEEPINFER_DEFAULT_MODEL_DIR;
#endif
  return "";
}

}  // namespace

Expected<EngineConfig> EngineConfig::from_env() {
  EngineConfig c;
  // Set but empty means "no model" (no fallback to the demo model).
  if (const char* v = std::getenv("DEEPINFER_HF_MODEL_DIR")) c.model_dir = v;
  else c.model_dir = default_model_dir();
  if (const char* v = std::getenv("DEEPINFER_DEVICE"); v != nullptr && *v != '\0') {
    c.device = v;
    if (c.device != "cpu" && c.device != "reference" && c.device != "cuda")
      return make_error(StatusCode::kInvalidArgument, "environment variable DEEPINFER_DEVICE='{}' must be cpu, cuda or reference", v);
  }
  int64_t threads = c.n_threads;
  DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_NUM_THREADS", 0, 4096, &threads));
  c.n_threads = static_cast<int>(threads);
  DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_KV_BLOCK_SIZE", 1, 4096, &c.kv_block_size));
  DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_MAX_MODEL_LEN", 0, int64_t{1} << 32, &c.max_model_len));
  DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_MAX_NUM_SEQS", 1, 1 << 20, &c.max_num_seqs));
  DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_MAX_NUM_BATCHED_TOKENS", 1, 1 << 24, &c.max_num_batched_tokens));
  DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_KV_CACHE_BYTES", 1 << 20, int64_t{1} << 44, &c.kv_cache_bytes));
  if (const char* v = std::getenv("DEEPINFER_GPU_MEMORY_UTILIZATION"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    c.gpu_memory_utilization = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(c.gpu_memory_utilization > 0.0 && c.gpu_memory_utilization <= 1.0))
      return make_error(StatusCode::kInvalidArgument,
                        "environment variable DEEPINFER_GPU_MEMORY_UTILIZATION='{}' must be a number in (0, 1]", v);
  }
  int64_t flag = c.enable_prefix_caching ? 1 : 0;
  DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_ENABLE_PREFIX_CACHING", 0, 1, &flag));
  c.enable_prefix_caching = flag != 0;
  if (const char* v = std::getenv("DEEPINFER_CHUNK_COST_MODEL"); v != nullptr) c.chunk_cost_model = v;
  int64_t budget_ms = 0;
  DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_STEP_TIME_BUDGET_MS", 0, 3600000, &budget_ms));
  if (budget_ms > 0) c.step_time_budget_ms = static_cast<double>(budget_ms);
  if (const char* v = std::getenv("DEEPINFER_OVERLAP"); v != nullptr && *v != '\0') {
    flag = 0;
    DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_OVERLAP", 0, 1, &flag));
    c.overlap = flag != 0;
  }
  flag = c.cuda_graphs ? 1 : 0;
  DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_CUDA_GRAPHS", 0, 1, &flag));
  c.cuda_graphs = flag != 0;
  flag = c.batch_invariant ? 1 : 0;
  DI_RETURN_IF_ERROR(read_int_env("DEEPINFER_BATCH_INVARIANT", 0, 1, &flag));
  c.batch_invariant = flag != 0;
  DI_RETURN_IF_ERROR(c.validate());
  return c;
}

Status EngineConfig::validate() const {
  if (device != "cpu" && device != "reference" && device != "cuda")
    return make_error(StatusCode::kInvalidArgument, "device '{}' is not available: expected cpu, cuda or reference", device);
  if (!(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0))
    return make_error(StatusCode::kInvalidArgument, "gpu_memory_utilization must be in (0, 1], got {}", gpu_memory_utilization);
  if (n_threads < 0) return make_error(StatusCode::kInvalidArgument, "n_threads must be >= 0, got {}", n_threads);
  if (kv_block_size < 1 || kv_block_size > 4096)
    return make_error(StatusCode::kInvalidArgument, "kv_block_size must be in [1, 4096], got {}", kv_block_size);
  if (max_num_seqs < 1) return make_error(StatusCode::kInvalidArgument, "max_num_seqs must be >= 1, got {}", max_num_seqs);
  if (max_num_batched_tokens < 1)
    return make_error(StatusCode::kInvalidArgument, "max_num_batched_tokens must be >= 1, got {}", max_num_batched_tokens);
  if (num_kv_blocks < 0) return make_error(StatusCode::kInvalidArgument, "num_kv_blocks must be >= 0, got {}", num_kv_blocks);
  if (kv_cache_bytes < 1) return make_error(StatusCode::kInvalidArgument, "kv_cache_bytes must be positive, got {}", kv_cache_bytes);
  if (!(step_time_budget_ms >= 0))
    return make_error(StatusCode::kInvalidArgument, "step_time_budget_ms must be >= 0, got {}", step_time_budget_ms);
  if (!chunk_cost_model.empty() && step_time_budget_ms <= 0)
    return make_error(StatusCode::kInvalidArgument, "a chunk cost model needs a step time budget (DEEPINFER_STEP_TIME_BUDGET_MS)");
  if (max_model_len < 0)
    return make_error(StatusCode::kInvalidArgument, "max_model_len must be >= 0, got {}", max_model_len);
  return Status::ok();
}

}  // namespace deepinfer
