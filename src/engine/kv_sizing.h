// How many KV pages an engine gets. Host backends: kv_cache_bytes / bytes per page. Device
// backends (vLLM's rule): run one profiling step of max_num_batched_tokens tokens so the step
// scratch reaches its high-water mark, then give the pages what is left of
// gpu_memory_utilization × total memory.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "engine/engine_config.h"
#include "model/deepseek/deepseek_model.h"

namespace deepinfer {

// Pages of `block_size` tokens for `model` on `backend`; an error when not even one fits.
Expected<int64_t> plan_kv_blocks(const DeepseekModel& model, Backend& backend, const EngineConfig& config);

}  // namespace deepinfer
