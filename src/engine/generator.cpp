#include "engine/generator.h"

#include "engine/request_checks.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

namespace deepinfer {

Expected<std::unique_ptr<Generator>> Generator::create(const EngineConfig& config) {
  DI_RETURN_IF_ERROR(config.validate());
  if (config.model_dir.empty())
    return make_error(StatusCode::kInvalidArgument, "no model given: pass --model DIR or set DEEPINFER_HF_MODEL_DIR");
  DI_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(config.model_dir));
  DI_ASSIGN_OR_RETURN(std::unique_ptr<DeepseekModel> model, DeepseekModel::load(checkpoint));
  DI_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_backend(config.device, config.n_threads));
  DI_RETURN_IF_ERROR(model->place(*backend));
  return std::make_unique<Generator>(config, std::move(model), std::move(backend));
}

Generator::Generator(EngineConfig config, std::unique_ptr<DeepseekModel> model, std::unique_ptr<Backend> backend)
    : config_(std::move(config)), model_(std::move(model)), backend_(std::move(backend)) {
  backend_->set_batch_invariant(config_.batch_invariant);
}

int64_t Generator::max_model_len() const {
  return effective_max_model_len(config_.max_model_len, model_->config().max_position_embeddings);
}

Status Generator::validate(const GenerateRequest& r) const {
  DI_RETURN_IF_ERROR(check_prompt(r.prompt_ids, model_->config().vocab_size, r.max_tokens, max_model_len()));
  return validate_sampler_params(r.sampler);
}

Expected<std::vector<GenerateResult>> Generator::generate(const std::vector<GenerateRequest>& requests) {
  if (requests.empty()) return make_error(StatusCode::kInvalidArgument, "no requests to generate");
  for (size_t i = 0; i < requests.size(); ++i) {
    Status s = validate(requests[i]);
    if (!s.is_ok()) return requests.size() == 1 ? s : s.with_context(fmt::format("request {}", i));
  }
  const DeepseekConfig& mc = model_->config();
  const int64_t bs = config_.kv_block_size, vocab = mc.vocab_size, n = static_cast<int64_t>(requests.size());
  // Pages for every request's whole lifetime, allocated up front (no preemption here).
  int64_t n_blocks = 0;
  for (const auto& r : requests)
    n_blocks += (static_cast<int64_t>(r.prompt_ids.size()) + r.max_tokens + bs - 1) / bs;
  PagedKvCache cache(*backend_, model_->kv_layers(), n_blocks, bs, backend_->kv_dtype());

  std::vector<GenerateResult> results(static_cast<size_t>(n));
  std::vector<KvSequence> seqs(static_cast<size_t>(n));
  std::vector<bool> done(static_cast<size_t>(n), false);
  std::vector<int32_t> last_token(static_cast<size_t>(n));
  std::random_device rd;
  for (int64_t i = 0; i < n; ++i) {
    const auto& r = requests[static_cast<size_t>(i)];
    results[static_cast<size_t>(i)].seed = r.seed ? *r.seed : (static_cast<uint64_t>(rd()) << 32 | rd());
    auto& kv = seqs[static_cast<size_t>(i)];
    kv.block_ids = cache.pool().allocate((static_cast<int64_t>(r.prompt_ids.size()) + r.max_tokens + bs - 1) / bs);
  }
  std::vector<float> scratch;
  auto is_eos = [&](int32_t t) {
    return std::find(mc.eos_token_ids.begin(), mc.eos_token_ids.end(), t) != mc.eos_token_ids.end();
  };
  // Appends a sampled token; returns whether the sequence continues.
  auto accept = [&](int64_t i, const float* logits) {
    const auto& r = requests[static_cast<size_t>(i)];
    auto& res = results[static_cast<size_t>(i)];
    // Keyed by the new token's position (the sequence already holds n_tokens tokens).
    const int64_t position = seqs[static_cast<size_t>(i)].n_tokens;
    for (int64_t v = 0; v < vocab; ++v) {
      if (!std::isfinite(logits[v])) {  // a broken model or weights: end this request, not the process
        res.finish_reason = "error";
        return false;
      }
    }
    const int32_t tok = sample_token(logits, vocab, r.sampler, res.seed, static_cast<uint64_t>(position), &scratch);
    if (r.return_step_logits) res.step_logits.insert(res.step_logits.end(), logits, logits + vocab);
    res.token_ids.push_back(tok);
    last_token[static_cast<size_t>(i)] = tok;
    if (!r.ignore_eos && is_eos(tok)) {
      res.finish_reason = "stop";
      return false;
    }
    if (static_cast<int64_t>(res.token_ids.size()) >= r.max_tokens) {
      res.finish_reason = "length";
      return false;
    }
    return true;
  };

  const MlaPolicy policy = mla_policy_for(*backend_, model_->config(), config_.batch_invariant);
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  {  // Prefill every prompt in one step.
    ForwardBatch batch;
    std::vector<int64_t> first_row(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const auto& p = requests[static_cast<size_t>(i)].prompt_ids;
      first_row[static_cast<size_t>(i)] =
          batch.add_sequence(seqs[static_cast<size_t>(i)], p.data(), static_cast<int64_t>(p.size()), bs);
      const int64_t np = static_cast<int64_t>(p.size());
      if (requests[static_cast<size_t>(i)].return_prompt_logits) {
        for (int64_t j = 0; j < np; ++j) batch.logits_rows.push_back(static_cast<int32_t>(first_row[static_cast<size_t>(i)] + j));
      } else {
        batch.logits_rows.push_back(static_cast<int32_t>(first_row[static_cast<size_t>(i)] + np - 1));
      }
    }
    const Tensor logits = backend_->to_host(model_->forward(*backend_, batch, cache, policy));
    int64_t row = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto& r = requests[static_cast<size_t>(i)];
      const int64_t np = static_cast<int64_t>(r.prompt_ids.size());
      seqs[static_cast<size_t>(i)].n_tokens = np;
      const int64_t n_rows = r.return_prompt_logits ? np : 1;
      const float* base = logits.data<float>() + row * vocab;
      if (r.return_prompt_logits) results[static_cast<size_t>(i)].prompt_logits.assign(base, base + np * vocab);
      row += n_rows;
      done[static_cast<size_t>(i)] = !accept(i, base + (n_rows - 1) * vocab);
    }
  }
  auto t1 = clock::now();
  for (;;) {  // Decode all live sequences together.
    ForwardBatch batch;
    std::vector<int64_t> live;
    for (int64_t i = 0; i < n; ++i) {
      if (done[static_cast<size_t>(i)]) continue;
      live.push_back(i);
      const size_t k = static_cast<size_t>(i);
      batch.logits_rows.push_back(batch.add_sequence(seqs[k], &last_token[k], 1, bs, /*is_generated=*/true));
    }
    if (live.empty()) break;
    const Tensor logits = backend_->to_host(model_->forward(*backend_, batch, cache, policy));
    for (size_t j = 0; j < live.size(); ++j) {
      const int64_t i = live[j];
      seqs[static_cast<size_t>(i)].n_tokens += 1;
      done[static_cast<size_t>(i)] = !accept(i, logits.data<float>() + static_cast<int64_t>(j) * vocab);
    }
  }
  auto t2 = clock::now();
  for (auto& res : results) {
    res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
    res.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  }
  return results;
}

}  // namespace deepinfer
