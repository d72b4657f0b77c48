// EngineConfig: every engine setting in one struct, filled from CLI flags, Python kwargs and
// DEEPINFER_* environment variables (env first, explicit settings override).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace deepinfer {

struct EngineConfig {
  std::string model_dir;         // DEEPINFER_HF_MODEL_DIR
  std::string device = "cpu";    // DEEPINFER_DEVICE: cpu | reference
  int n_threads = 0;             // DEEPINFER_NUM_THREADS; 0 = all cores
  int64_t kv_block_size = 64;    // DEEPINFER_KV_BLOCK_SIZE: tokens per KV page
  int64_t max_model_len = 0;     // DEEPINFER_MAX_MODEL_LEN; 0 = the model's max_position_embeddings

  // Defaults overridden by any DEEPINFER_* variables that are set. Bad values name the variable.
  static Expected<EngineConfig> from_env();
  Status validate() const;
};

}  // namespace deepinfer
