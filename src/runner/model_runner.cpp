#include "runner/model_runner.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {

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
    // Rows past the prompt are generated tokens. Under kByOrigin they take another attention
    // form than the prompt's, so a chunk that crosses the prompt's end (a recompute after
    // preemption) becomes two entries over the same pages: the second attends to the first's
    // keys, all written before attention.
    KvSequence kv = s->kv.kv;
    kv.n_tokens = x.start;
    const int64_t n_prompt = static_cast<int64_t>(s->prompt_ids.size());
    const int64_t n_first = policy_ == MlaPolicy::kByOrigin && x.start < n_prompt && x.start + x.n_tokens > n_prompt
                                ? n_prompt - x.start
                                : x.n_tokens;
    const int32_t row = batch->add_sequence(kv, tokens.data(), n_first, bs, /*is_generated=*/x.start >= n_prompt);
    if (n_first < x.n_tokens) {
      kv.n_tokens = n_prompt;
      batch->add_sequence(kv, tokens.data() + n_first, x.n_tokens - n_first, bs, /*is_generated=*/true);
    }
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
  ForwardBatch batch;
  const std::vector<const ScheduledSeq*> sampled = build_batch(plan, &batch, false);
  std::vector<SampledToken> out;
  if (batch.n_tokens() == 0) return out;
  // [R, vocab] F32, backend memory
  const Tensor logits = model_.forward(backend_, batch, cache_, policy_, use_graphs_ ? &graphs_ : nullptr);

  // Every row is sampled where the logits are (processors and top-n included): only tokens and
  // log-probabilities come back.
  const int64_t R = static_cast<int64_t>(sampled.size());
  SampleSetup setup = prepare_sampling(sampled, false);
  Tensor tok = backend_.empty(DType::kI32, {R});
  Tensor lp = backend_.empty(DType::kF32, {R});
  SampleExtras extras;
  if (setup.n_top > 0) {
    extras.top_ids = backend_.empty(DType::kI32, {R, setup.n_top});
    extras.top_logprobs = backend_.empty(DType::kF32, {R, setup.n_top});
  }
  backend_.sample(logits, setup.rows, tok, lp, &extras);
  const Tensor h_tok = backend_.to_host(tok);  // the step's one synchronization (host backends: no copy)
  const Tensor h_lp = backend_.to_host(lp);
  Tensor h_top_ids, h_top_lps;
  if (setup.n_top > 0) {
    h_top_ids = backend_.to_host(extras.top_ids);
    h_top_lps = backend_.to_host(extras.top_logprobs);
  }
  for (int64_t i = 0; i < R; ++i) {
    const ScheduledSeq& x = *sampled[static_cast<size_t>(i)];
    SampledToken t = make_sample(x.seq, h_tok.data<int32_t>()[i], h_lp.data<float>()[i],
                                 setup.n_top > 0 ? h_top_ids.data<int32_t>() + i * setup.n_top : nullptr,
                                 setup.n_top > 0 ? h_top_lps.data<float>() + i * setup.n_top : nullptr, setup.n_top);
    if (!t.non_finite) future_[x.seq->seq_id][x.start + x.n_tokens] = t.token;
    out.push_back(std::move(t));
  }
  return out;
}

SampledToken ModelRunner::make_sample(Sequence* seq, int32_t token, float logprob, const int32_t* top_ids,
                                      const float* top_lps, int64_t n_top) {
  SampledToken t;
  t.seq = seq;
  t.non_finite = token < 0;
  if (t.non_finite) return t;
  t.token = token;
  t.logprob = logprob;
  for (int64_t j = 0; j < n_top && top_ids[j] >= 0; ++j) t.top.emplace_back(top_ids[j], top_lps[j]);
  return t;
}

ModelRunner::SampleSetup ModelRunner::prepare_sampling(const std::vector<const ScheduledSeq*>& sampled, bool pending) {
  const DeepseekConfig& mc = model_.config();
  SampleSetup setup;
  setup.rows.resize(sampled.size());
  std::vector<int32_t> output;
  for (size_t i = 0; i < sampled.size(); ++i) {
    const ScheduledSeq& x = *sampled[i];
    const Sequence* s = x.seq;
    const SamplingParams& p = s->params;
    const int64_t position = x.start + x.n_tokens;  // the new token's position
    SampleRow& row = setup.rows[i];
    row = {p.sampler(), s->seed, static_cast<uint64_t>(position)};
    row.n_top_logprobs = p.logprobs ? static_cast<int32_t>(*p.logprobs) : 0;
    setup.n_top = std::max<int64_t>(setup.n_top, row.n_top_logprobs);
    if (!has_logits_processors(p, position - static_cast<int64_t>(s->prompt_ids.size()))) continue;
    // The output so far: appended tokens, then samples of earlier overlapped steps — known here
    // (future_) or still on the device (pending_: their buffer indices).
    output = s->output_ids;
    std::vector<int32_t> pending_idx;
    const auto pend = pending ? pending_.find(s->seq_id) : pending_.end();
    for (int64_t q = s->n_tokens(); q < position; ++q) {
      if (pend != pending_.end() && pend->second.count(q))
        pending_idx.push_back(pend->second.at(q));
      else
        output.push_back(future_token(s->seq_id, q));
    }
    setup.procs.push_back(make_logits_processors(p, s->prompt_ids, output, static_cast<int64_t>(pending_idx.size()),
                                                 mc.eos_token_ids));
    setup.procs.back().pending = std::move(pending_idx);
    row.processors = &setup.procs.back();
  }
  return setup;
}

void ModelRunner::launch(const StepPlan& plan) {
  const bool async = !backend_.on_host();
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
  int64_t n_top = 0;
  for (const ScheduledSeq* x : sampled)
    n_top = std::max<int64_t>(n_top, x->seq->params.logprobs ? *x->seq->params.logprobs : 0);
  if (R > capacity_ || n_top > top_capacity_) {  // grow the buffers (nothing may be in flight in them)
    resolve_all();
    if (R > capacity_) capacity_ = std::max<int64_t>(R, 2 * capacity_);
    top_capacity_ = std::max<int64_t>(n_top, top_capacity_);
    dev_tokens_ = backend_.allocate(DType::kI32, {2 * capacity_});
    dev_logprobs_ = backend_.allocate(DType::kF32, {2 * capacity_});
    host_tokens_ = backend_.allocate_staging(DType::kI32, {2 * capacity_});
    host_logprobs_ = backend_.allocate_staging(DType::kF32, {2 * capacity_});
    if (top_capacity_ > 0) {
      dev_top_ids_ = backend_.allocate(DType::kI32, {2 * capacity_, top_capacity_});
      dev_top_lps_ = backend_.allocate(DType::kF32, {2 * capacity_, top_capacity_});
      host_top_ids_ = backend_.allocate_staging(DType::kI32, {2 * capacity_, top_capacity_});
      host_top_lps_ = backend_.allocate_staging(DType::kF32, {2 * capacity_, top_capacity_});
    }
    pending_.clear();
    batch = ForwardBatch();
    build_batch(plan, &batch, false);
  }
  if (!pending_.empty()) batch.pending_tokens = dev_tokens_;
  f.async = true;
  f.slot = next_slot_;
  f.n_top = n_top > 0 ? top_capacity_ : 0;
  next_slot_ ^= 1;
  f.start_fence = backend_.record_fence();
  for (const InFlight& g : inflight_) timeline_.n_overlapped += g.async && !g.resolved ? 1 : 0;
  if (batch.n_tokens() > 0) {
    const Tensor logits = model_.forward(backend_, batch, cache_, policy_, use_graphs_ ? &graphs_ : nullptr);
    if (R > 0) {  // a step of middle prefill chunks samples nothing
      SampleSetup setup = prepare_sampling(sampled, true);
      const int64_t base = f.slot * capacity_;
      Tensor tok = dev_tokens_.slice_rows(base, base + R), lp = dev_logprobs_.slice_rows(base, base + R);
      SampleExtras extras;
      extras.pending_tokens = dev_tokens_;  // the other half: the step in flight (this step writes its own)
      if (f.n_top > 0) {
        extras.top_ids = dev_top_ids_.slice_rows(base, base + R);
        extras.top_logprobs = dev_top_lps_.slice_rows(base, base + R);
      }
      backend_.sample(logits, setup.rows, tok, lp, &extras);
      Tensor htok = host_tokens_.slice_rows(base, base + R), hlp = host_logprobs_.slice_rows(base, base + R);
      backend_.copy_to_host_async(tok, htok);
      backend_.copy_to_host_async(lp, hlp);
      if (f.n_top > 0) {
        Tensor hti = host_top_ids_.slice_rows(base, base + R), htl = host_top_lps_.slice_rows(base, base + R);
        backend_.copy_to_host_async(extras.top_ids, hti);
        backend_.copy_to_host_async(extras.top_logprobs, htl);
      }
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
    const int64_t at = base + static_cast<int64_t>(i);
    SampledToken t = make_sample(r.seq, host_tokens_.data<int32_t>()[at], host_logprobs_.data<float>()[at],
                                 f.n_top > 0 ? host_top_ids_.data<int32_t>() + at * f.n_top : nullptr,
                                 f.n_top > 0 ? host_top_lps_.data<float>() + at * f.n_top : nullptr, f.n_top);
    // A sequence the engine forgot meanwhile (aborted) has no pending entry: remember nothing.
    auto it = pending_.find(r.seq_id);
    const bool known = it != pending_.end() && it->second.erase(r.position) > 0;
    if (it != pending_.end() && it->second.empty()) pending_.erase(it);
    if (!t.non_finite && known) future_[r.seq_id][r.position] = t.token;
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
