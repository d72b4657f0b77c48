#include "runner/model_runner.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {

ModelRunner::ModelRunner(const DeepseekModel& model, Backend& backend, int64_t n_blocks, int64_t block_size,
                         MlaPolicy policy)
    : model_(model), backend_(backend), cache_(model.kv_layers(), n_blocks, block_size), policy_(policy) {}

std::vector<SampledToken> ModelRunner::execute(const StepPlan& plan) {
  const int64_t bs = cache_.block_size();
  const DeepseekConfig& mc = model_.config();
  const int64_t vocab = mc.vocab_size;
  ForwardBatch batch;
  std::vector<const ScheduledSeq*> sampled;
  std::vector<int32_t> tokens;
  for (const ScheduledSeq& x : plan.seqs) {
    Sequence* s = x.seq;
    tokens.resize(static_cast<size_t>(x.n_tokens));
    for (int64_t i = 0; i < x.n_tokens; ++i) tokens[static_cast<size_t>(i)] = s->token_at(x.start + i);
    KvSequence kv = s->kv.kv;
    kv.n_tokens = x.start;
    const int32_t row = batch.add_sequence(kv, tokens.data(), x.n_tokens, bs);
    if (x.sample) {
      batch.logits_rows.push_back(static_cast<int32_t>(row + x.n_tokens - 1));
      sampled.push_back(&x);
    }
  }
  std::vector<SampledToken> out;
  if (batch.n_tokens() == 0) return out;
  Tensor logits = model_.forward(backend_, batch, cache_, policy_);
  std::vector<float> row(static_cast<size_t>(vocab));
  for (size_t i = 0; i < sampled.size(); ++i) {
    const ScheduledSeq& x = *sampled[i];
    Sequence* s = x.seq;
    const float* raw = logits.data<float>() + static_cast<int64_t>(i) * vocab;
    SampledToken t;
    t.seq = s;
    bool finite = true;
    for (int64_t v = 0; v < vocab; ++v) finite &= std::isfinite(raw[v]);
    if (!finite) {
      t.non_finite = true;
      out.push_back(std::move(t));
      continue;
    }
    std::copy(raw, raw + vocab, row.begin());
    apply_logits_processors(row.data(), vocab, s->params, s->prompt_ids, s->output_ids, mc.eos_token_ids, &counts_);
    const int64_t position = x.start + x.n_tokens;  // the new token's position
    t.token = sample_token(row.data(), vocab, s->params.sampler(), s->seed, static_cast<uint64_t>(position), &scratch_);
    // Log-probabilities of the model's raw distribution (before penalties and temperature).
    double mx = raw[0];
    for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(raw[v]));
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(raw[v]) - mx);
    const double lse = mx + std::log(sum);
    t.logprob = static_cast<float>(raw[t.token] - lse);
    if (s->params.logprobs && *s->params.logprobs > 0) {
      const int64_t n = std::min<int64_t>(*s->params.logprobs, vocab);
      std::vector<int32_t> ids(static_cast<size_t>(vocab));
      for (int64_t v = 0; v < vocab; ++v) ids[static_cast<size_t>(v)] = static_cast<int32_t>(v);
      std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                        [&](int32_t a, int32_t b) { return raw[a] > raw[b] || (raw[a] == raw[b] && a < b); });
      for (int64_t j = 0; j < n; ++j)
        t.top.emplace_back(ids[static_cast<size_t>(j)], static_cast<float>(raw[ids[static_cast<size_t>(j)]] - lse));
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace deepinfer
