#include "engine/calibrate.h"

#include <algorithm>
#include <chrono>

namespace deepinfer {

Expected<ChunkCostModel> calibrate_chunk_cost(const DeepseekModel& model, Backend& backend,
                                              const CalibrationOptions& options, std::vector<CostSample>* samples) {
  const int64_t limit = std::min(options.max_tokens, model.config().max_position_embeddings);
  if (limit < 16) return make_error(StatusCode::kInvalidArgument, "calibration needs at least 16 tokens of context");
  const int64_t bs = 64;
  PagedKvCache cache(backend, model.kv_layers(), (limit + bs - 1) / bs, bs, backend.kv_dtype());
  KvSequence kv;
  kv.block_ids = cache.pool().allocate(cache.pool().n_blocks());
  std::vector<CostSample> out;
  for (int64_t c : {int64_t{0}, limit / 8, limit / 2}) {
    for (int64_t q : {int64_t{1}, int64_t{8}, limit / 16, limit / 4, limit / 2}) {
      if (q < 1 || q + c > limit) continue;
      std::vector<int32_t> tokens(static_cast<size_t>(q));
      for (int64_t i = 0; i < q; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>(2 + (i * 7) % (model.config().vocab_size - 2));
      kv.n_tokens = c;  // the prefix's KV content does not matter for timing
      ForwardBatch batch;
      batch.add_sequence(kv, tokens.data(), q, bs);
      batch.logits_rows.push_back(static_cast<int32_t>(q - 1));
      double best = 1e30;
      for (int r = 0; r < std::max(1, options.repeats); ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        (void)model.forward(backend, batch, cache);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      out.push_back({static_cast<double>(q), static_cast<double>(c), best});
    }
  }
  if (samples) *samples = out;
  return ChunkCostModel::fit(out);
}

}  // namespace deepinfer
