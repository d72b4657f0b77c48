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
                         MlaPolicy policy, bool use_graphs)
    : model_(model),
      backend_(backend),
      cache_(backend, model.kv_layers(), n_blocks, block_size, backend.kv_dtype()),
      policy_(policy),
      use_graphs_(use_graphs) {}

int32_t ModelRunner::future_token(int64_t seq_id, int64_t position) const {
  // Absent only when that earlier sample failed (non-finite logits): the sequence is failing
  // and this step's result for it will be dropped, so any valid id will do.
  auto it = future_.find(seq_id);
  if (it == future_.end()) return 0;
  auto jt = it->second.find(position);
  return jt == it->second.end() ? 0 : jt->second;
}

std::vector<const ScheduledSeq*> ModelRunner::build_batch(const StepPlan& plan, ForwardBatch* batch, bool pending) {
  const int64_t bs = cache_.block_size();
  std::vector<const ScheduledSeq*> sampled;
  std::vector<int32_t> tokens;
  for (const ScheduledSeq& x : plan.seqs) {
    Sequence* s = x.seq;
    tokens.resize(static_cast<size_t>(x.n_tokens));
    auto fut = future_.find(s->seq_id);
    if (fut != future_.end())  // positions the engine has appended need no memory here
      fut->second.erase(fut->second.begin(), fut->second.lower_bound(s->n_tokens()));
    const auto pend = pending ? pending_.find(s->seq_id) : pending_.end();
    for (int64_t i = 0; i < x.n_tokens; ++i) {
      const int64_t pos = x.start + i;
      int32_t t;
      if (pos < s->n_tokens()) {
        t = s->token_at(pos);
      } else if (pend != pending_.end() && pend->second.count(pos)) {
        t = -1 - pend->second.at(pos);  // sampled on the device by the step in flight
      } else {
        t = future_token(s->seq_id, pos);
      }
      tokens[static_cast<size_t>(i)] = t;
    }
    KvSequence kv = s->kv.kv;
    kv.n_tokens = x.start;
    const int32_t row = batch->add_sequence(kv, tokens.data(), x.n_tokens, bs);
    if (x.sample) {
      batch->logits_rows.push_back(static_cast<int32_t>(row + x.n_tokens - 1));
      sampled.push_back(&x);
    }
  }
  return sampled;
}

std::vector<SampledToken> ModelRunner::execute(const StepPlan& plan) {
  resolve_all();  // every earlier token known on the host
  return run_sync(plan);
}

std::vector<SampledToken> ModelRunner::run_sync(const StepPlan& plan) {
  const DeepseekConfig& mc = model_.config();
  const int64_t vocab = mc.vocab_size;
  ForwardBatch batch;
  const std::vector<const ScheduledSeq*> sampled = build_batch(plan, &batch, false);
  std::vector<SampledToken> out;
  if (batch.n_tokens() == 0) return out;
  // [R, vocab] F32, backend memory
  const Tensor logits = model_.forward(backend_, batch, cache_, policy_, use_graphs_ ? &graphs_ : nullptr);

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

void ModelRunner::launch(const StepPlan& plan) {
  bool async = !backend_.on_host();
  for (const ScheduledSeq& x : plan.seqs)
    if (x.sample && needs_host_sampling(x.seq->params, x.start + x.n_tokens - static_cast<int64_t>(x.seq->prompt_ids.size())))
      async = false;
  InFlight f;
  if (!async) {
    resolve_all();
    if (last_end_fence_ >= 0) {  // the timeline measures gaps between consecutive async steps only
      backend_.release_fence(last_end_fence_);
      last_end_fence_ = -1;
    }
    f.samples = run_sync(plan);
    f.resolved = true;
    inflight_.push_back(std::move(f));
    return;
  }
  // The buffer half this step writes must not hold an unread step (at most two in flight).
  for (InFlight& g : inflight_)
    if (g.async && !g.resolved && g.slot == next_slot_) resolve(g);
  ForwardBatch batch;
  const std::vector<const ScheduledSeq*> sampled = build_batch(plan, &batch, true);
  const int64_t R = static_cast<int64_t>(sampled.size());
  if (R > capacity_) {  // grow the token buffers (nothing may be in flight in them)
    resolve_all();
    capacity_ = std::max<int64_t>(R, 2 * capacity_);
    dev_tokens_ = backend_.allocate(DType::kI32, {2 * capacity_});
    dev_logprobs_ = backend_.allocate(DType::kF32, {2 * capacity_});
    host_tokens_ = backend_.allocate_staging(DType::kI32, {2 * capacity_});
    host_logprobs_ = backend_.allocate_staging(DType::kF32, {2 * capacity_});
    pending_.clear();
    batch = ForwardBatch();
    build_batch(plan, &batch, false);
  }
  if (!pending_.empty()) batch.pending_tokens = dev_tokens_;
  f.async = true;
  f.slot = next_slot_;
  next_slot_ ^= 1;
  f.start_fence = backend_.record_fence();
  for (const InFlight& g : inflight_) timeline_.n_overlapped += g.async && !g.resolved ? 1 : 0;
  if (batch.n_tokens() > 0) {
    const Tensor logits = model_.forward(backend_, batch, cache_, policy_, use_graphs_ ? &graphs_ : nullptr);
    std::vector<SampleRow> rows(static_cast<size_t>(R));
    for (int64_t i = 0; i < R; ++i) {
      const ScheduledSeq& x = *sampled[static_cast<size_t>(i)];
      rows[static_cast<size_t>(i)] = {x.seq->params.sampler(), x.seq->seed, static_cast<uint64_t>(x.start + x.n_tokens)};
    }
    if (R > 0) {  // a step of middle prefill chunks samples nothing
      const int64_t base = f.slot * capacity_;
      Tensor tok = dev_tokens_.slice_rows(base, base + R), lp = dev_logprobs_.slice_rows(base, base + R);
      backend_.sample(logits, rows, tok, lp);
      Tensor htok = host_tokens_.slice_rows(base, base + R), hlp = host_logprobs_.slice_rows(base, base + R);
      backend_.copy_to_host_async(tok, htok);
      backend_.copy_to_host_async(lp, hlp);
    }
  }
  f.end_fence = backend_.record_fence();
  for (int64_t i = 0; i < R; ++i) {
    const ScheduledSeq& x = *sampled[static_cast<size_t>(i)];
    const int64_t position = x.start + x.n_tokens;
    f.rows.push_back({x.seq, x.seq->seq_id, position});
    pending_[x.seq->seq_id][position] = static_cast<int32_t>(f.slot * capacity_ + i);
  }
  inflight_.push_back(std::move(f));
}

void ModelRunner::resolve(InFlight& f) {
  if (f.resolved) return;
  backend_.wait_fence(f.end_fence);
  const int64_t base = f.slot * capacity_;
  for (size_t i = 0; i < f.rows.size(); ++i) {
    const InFlight::Row& r = f.rows[i];
    SampledToken t;
    t.seq = r.seq;
    const int32_t tok = host_tokens_.data<int32_t>()[base + static_cast<int64_t>(i)];
    t.non_finite = tok < 0;
    // A sequence the engine forgot meanwhile (aborted) has no pending entry: remember nothing.
    auto it = pending_.find(r.seq_id);
    const bool known = it != pending_.end() && it->second.erase(r.position) > 0;
    if (it != pending_.end() && it->second.empty()) pending_.erase(it);
    if (!t.non_finite) {
      t.token = tok;
      t.logprob = host_logprobs_.data<float>()[base + static_cast<int64_t>(i)];
      if (known) future_[r.seq_id][r.position] = tok;
    }
    f.samples.push_back(std::move(t));
  }
  // Timeline: this step's device time, and the gap since the previous async step ended.
  const double busy = backend_.fence_elapsed_ms(f.start_fence, f.end_fence);
  timeline_.busy_ms += busy;
  ++timeline_.n_steps;
  if (last_end_fence_ >= 0) {
    timeline_.idle_ms += std::max(0.0, backend_.fence_elapsed_ms(last_end_fence_, f.start_fence));
    backend_.release_fence(last_end_fence_);
  }
  backend_.release_fence(f.start_fence);
  last_end_fence_ = f.end_fence;
  f.resolved = true;
}

void ModelRunner::resolve_all() {
  for (InFlight& f : inflight_) resolve(f);
}

std::vector<SampledToken> ModelRunner::collect() {
  DI_CHECK(!inflight_.empty());
  InFlight& f = inflight_.front();
  resolve(f);
  std::vector<SampledToken> out = std::move(f.samples);
  inflight_.pop_front();
  return out;
}

}  // namespace deepinfer
