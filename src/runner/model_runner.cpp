#include "runner/model_runner.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {

bool needs_host_sampling(const SamplingParams& p, int64_t n_output_tokens) {
  const bool masks = n_output_tokens < p.min_tokens && (!p.ignore_eos || !p.stop_token_ids.empty());
  return masks || p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f ||
         (p.logprobs && *p.logprobs > 0);
}

ModelRunner::ModelRunner(const DeepseekModel& model, Backend& backend, int64_t n_blocks, int64_t block_size,
                         MlaPolicy policy)
    : model_(model),
      backend_(backend),
      cache_(backend, model.kv_layers(), n_blocks, block_size, backend.kv_dtype()),
      policy_(policy) {}

int32_t ModelRunner::future_token(int64_t seq_id, int64_t position) const {
  // Absent only when that earlier sample failed (non-finite logits): the sequence is failing
  // and this step's result for it will be dropped, so any valid id will do.
  auto it = future_.find(seq_id);
  if (it == future_.end()) return 0;
  auto jt = it->second.find(position);
  return jt == it->second.end() ? 0 : jt->second;
}

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
    auto fut = future_.find(s->seq_id);
    if (fut != future_.end())  // positions the engine has appended need no memory here
      fut->second.erase(fut->second.begin(), fut->second.lower_bound(s->n_tokens()));
    for (int64_t i = 0; i < x.n_tokens; ++i) {
      const int64_t pos = x.start + i;
      tokens[static_cast<size_t>(i)] = pos < s->n_tokens() ? s->token_at(pos) : future_token(s->seq_id, pos);
    }
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
  const Tensor logits = model_.forward(backend_, batch, cache_, policy_);  // [R, vocab] F32, backend memory

  // Rows whose logits processors or top-n log-probabilities need the whole row on the host; on
  // host backends that is every row. The others are sampled where the logits are.
  std::vector<uint8_t> on_host(sampled.size(), 1);
  if (!backend_.on_host()) {
    for (size_t i = 0; i < sampled.size(); ++i) {
      const Sequence* s = sampled[i]->seq;
      const int64_t n_out = sampled[i]->start + sampled[i]->n_tokens - static_cast<int64_t>(s->prompt_ids.size());
      on_host[i] = needs_host_sampling(s->params, n_out);
    }
  }
  std::vector<int32_t> host_rows;
  for (size_t i = 0; i < sampled.size(); ++i)
    if (on_host[i]) host_rows.push_back(static_cast<int32_t>(i));
  Tensor host_logits;  // [host_rows, vocab] F32 on the host
  if (backend_.on_host()) {
    host_logits = logits;
  } else if (!host_rows.empty()) {
    Tensor idx = Tensor::empty_host(DType::kI32, {static_cast<int64_t>(host_rows.size())});
    std::copy(host_rows.begin(), host_rows.end(), idx.data<int32_t>());
    Tensor rows = backend_.empty(DType::kF32, {static_cast<int64_t>(host_rows.size()), vocab});
    backend_.gather_rows(logits, backend_.upload(idx), rows);
    host_logits = backend_.to_host(rows);
  }
  Tensor dev_tokens, dev_logprobs;  // [R] on the host, from the device sampler
  if (host_rows.size() < sampled.size()) {
    std::vector<SampleRow> rows(sampled.size());
    for (size_t i = 0; i < sampled.size(); ++i) {
      const ScheduledSeq& x = *sampled[i];
      rows[i] = {x.seq->params.sampler(), x.seq->seed, static_cast<uint64_t>(x.start + x.n_tokens)};
    }
    Tensor tok = backend_.empty(DType::kI32, {static_cast<int64_t>(sampled.size())});
    Tensor lp = backend_.empty(DType::kF32, {static_cast<int64_t>(sampled.size())});
    backend_.sample(logits, rows, tok, lp);
    dev_tokens = backend_.to_host(tok);  // the step's one synchronization
    dev_logprobs = backend_.to_host(lp);
  }

  int64_t next_host_row = 0;
  std::vector<float> row(static_cast<size_t>(vocab));
  for (size_t i = 0; i < sampled.size(); ++i) {
    const ScheduledSeq& x = *sampled[i];
    Sequence* s = x.seq;
    const int64_t position = x.start + x.n_tokens;  // the new token's position
    SampledToken t;
    t.seq = s;
    if (!on_host[i]) {
      const int32_t tok = dev_tokens.data<int32_t>()[i];
      t.non_finite = tok < 0;
      if (!t.non_finite) {
        t.token = tok;
        t.logprob = dev_logprobs.data<float>()[i];
        future_[s->seq_id][position] = t.token;
      }
      out.push_back(std::move(t));
      continue;
    }
    const float* raw = host_logits.data<float>() + next_host_row++ * vocab;
    bool finite = true;
    for (int64_t v = 0; v < vocab; ++v) finite &= std::isfinite(raw[v]);
    if (!finite) {
      t.non_finite = true;
      out.push_back(std::move(t));
      continue;
    }
    std::copy(raw, raw + vocab, row.begin());
    // The output so far includes samples of earlier overlapped steps not yet appended.
    const std::vector<int32_t>* output = &s->output_ids;
    std::vector<int32_t> with_future;
    if (position > s->n_tokens()) {
      with_future = s->output_ids;
      for (int64_t p = s->n_tokens(); p < position; ++p) with_future.push_back(future_token(s->seq_id, p));
      output = &with_future;
    }
    apply_logits_processors(row.data(), vocab, s->params, s->prompt_ids, *output, mc.eos_token_ids, &counts_);
    t.token = sample_token(row.data(), vocab, s->params.sampler(), s->seed, static_cast<uint64_t>(position), &scratch_);
    future_[s->seq_id][position] = t.token;
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
