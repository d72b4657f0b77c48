#include "engine/kv_sizing.h"

#include <algorithm>

#include "core/log.h"

namespace deepinfer {

Expected<int64_t> plan_kv_blocks(const DeepseekModel& model, Backend& backend, const EngineConfig& config) {
  const int64_t bs = config.kv_block_size;
  const auto layers = model.kv_layers();
  const int64_t block_bytes = PagedKvCache::bytes_per_block(layers, bs, backend.kv_dtype());
  if (config.num_kv_blocks > 0) return config.num_kv_blocks;
  if (backend.on_host()) return std::max<int64_t>(1, config.kv_cache_bytes / block_bytes);

  // Profiling step: the largest chunk the scheduler will ever send, one sequence — as prompt
  // tokens, and under kByOrigin also as generated ones (a recompute after preemption sends
  // those as one chunk too, on the absorbed form, whose scratch differs).
  const int64_t T = std::max<int64_t>(1, std::min(config.max_num_batched_tokens, model.config().max_position_embeddings));
  {
    PagedKvCache scratch(backend, layers, (T + bs - 1) / bs, bs, backend.kv_dtype());
    KvSequence kv;
    kv.block_ids = scratch.pool().allocate(scratch.pool().n_blocks());
    std::vector<int32_t> tokens(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>(i % model.config().vocab_size);
    const MlaPolicy policy = mla_policy_for(backend, model.config(), config.batch_invariant);
    for (bool generated : {false, true}) {
      if (generated && policy != MlaPolicy::kByOrigin) break;
      ForwardBatch batch;
      batch.add_sequence(kv, tokens.data(), T, bs, generated);
      batch.logits_rows.push_back(static_cast<int32_t>(T - 1));
      (void)model.forward(backend, batch, scratch, policy);
      (void)model.forward(backend, batch, scratch, policy);  // the second step runs on the merged arena
    }
    backend.synchronize();
  }
  const auto [free_b, total_b] = backend.memory_info();
  const int64_t keep = static_cast<int64_t>(static_cast<double>(total_b) * (1.0 - config.gpu_memory_utilization));
  const int64_t budget = free_b - keep;
  const int64_t n = budget / block_bytes;
  log_info("KV cache: {} pages of {} tokens ({:.2f} GiB; free {:.2f} of {:.2f} GiB after weights and {:.2f} GiB step scratch)",
           n, bs, static_cast<double>(n * block_bytes) / (1 << 30), static_cast<double>(free_b) / (1 << 30),
           static_cast<double>(total_b) / (1 << 30), static_cast<double>(backend.step_memory_bytes()) / (1 << 30));
  if (n < 1)
    return make_error(StatusCode::kResourceExhausted,
                      "no GPU memory left for the KV cache: {:.2f} GiB free, {:.2f} GiB must stay unused "
                      "(gpu_memory_utilization {}); lower max_num_batched_tokens or raise the utilization",
                      static_cast<double>(free_b) / (1 << 30), static_cast<double>(keep) / (1 << 30),
                      config.gpu_memory_utilization);
  return n;
}

}  // namespace deepinfer
