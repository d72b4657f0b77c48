// EngineConfig: every engine setting in one struct, filled from CLI flags, Python kwargs and
// DEEPINFER_* environment variables (env first, explicit settings override).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"

namespace deepinfer {

struct EngineConfig {
  std::string model_dir;         // DEEPINFER_HF_MODEL_DIR
  std::string device = "cpu";    // DEEPINFER_DEVICE: cpu | cuda | reference
  int n_threads = 0;             // DEEPINFER_NUM_THREADS; 0 = all cores
  int64_t kv_block_size = 64;    // DEEPINFER_KV_BLOCK_SIZE: tokens per KV page
  int64_t max_model_len = 0;     // DEEPINFER_MAX_MODEL_LEN; 0 = the model's max_position_embeddings
  // Serving runtime.
  int64_t max_num_seqs = 256;              // DEEPINFER_MAX_NUM_SEQS
  int64_t max_num_batched_tokens = 2048;   // DEEPINFER_MAX_NUM_BATCHED_TOKENS: tokens per step
  int64_t kv_cache_bytes = int64_t{1} << 30;  // DEEPINFER_KV_CACHE_BYTES: page memory (host backends)
  // DEEPINFER_GPU_MEMORY_UTILIZATION: on a GPU, KV pages take what is free once the weights and
  // a profiled step's scratch are resident, up to this fraction of the card's memory (vLLM's rule).
  double gpu_memory_utilization = 0.9;
  // DEEPINFER_CUDA_GRAPHS=0: decode steps launch every kernel from the host instead of replaying
  // a CUDA graph per batch size.
  bool cuda_graphs = true;
  int64_t num_kv_blocks = 0;               // overrides kv_cache_bytes when > 0 (tests)
  bool enable_prefix_caching = true;       // DEEPINFER_ENABLE_PREFIX_CACHING=0 turns it off
  // DEEPINFER_BATCH_INVARIANT=1: every attention row uses the absorbed MLA form and the backend
  // its batch-invariant kernels (Backend::set_batch_invariant; the CPU's always are), so outputs
  // are bitwise independent of batching, chunking, preemption and prefix-cache hits.
  bool batch_invariant = false;
  // DEEPINFER_OVERLAP=0|1: schedule step N+1 while step N executes (the executor resolves N's
  // samples as N+1's inputs). Outputs are identical either way. Unset: on for device backends
  // (the host enqueues N+1 while the GPU runs N), off on the CPU (its executor is synchronous,
  // so overlap would only compute a token per finished sequence that is then dropped).
  std::optional<bool> overlap;
  // Chunked prefill against a time budget: a fitted cost model (`deepinfer calibrate`) and
  // the per-step budget. Both unset: chunks are limited by max_num_batched_tokens alone.
  std::string chunk_cost_model;            // DEEPINFER_CHUNK_COST_MODEL: path to the JSON
  double step_time_budget_ms = 0;          // DEEPINFER_STEP_TIME_BUDGET_MS

  // Defaults overridden by any DEEPINFER_* variables that are set. Bad values name the variable.
  static Expected<EngineConfig> from_env();
  Status validate() const;
};

}  // namespace deepinfer
