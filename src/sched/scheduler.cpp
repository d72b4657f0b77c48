#include "sched/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace deepinfer {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: return "";
  }
  return "";
}

Scheduler::Scheduler(SchedulerConfig config, std::unique_ptr<BlockManager> blocks)
    : config_(std::move(config)), blocks_(std::move(blocks)) {
  DI_CHECK_GT(config_.max_num_seqs, 0);
  DI_CHECK_GT(config_.max_num_batched_tokens, 0);
}

bool Scheduler::fits_alone(int64_t n_tokens) const {
  return (n_tokens + 1 + blocks_->block_size() - 1) / blocks_->block_size() <= blocks_->n_blocks();
}

Sequence* Scheduler::add(std::unique_ptr<Sequence> seq) {
  seq->seq_id = next_seq_id_++;
  seq->status = SeqStatus::kWaiting;
  Sequence* raw = seq.get();
  seqs_.push_back(std::move(seq));
  waiting_.push_back(raw);
  return raw;
}

Sequence* Scheduler::find(int64_t seq_id) {
  for (auto& s : seqs_)
    if (s->seq_id == seq_id) return s.get();
  return nullptr;
}

void Scheduler::preempt(Sequence* seq) {
  DI_CHECK_EQ(seq->n_inflight_steps, 0);
  blocks_->release(seq->kv, /*cacheable=*/true);
  seq->status = SeqStatus::kWaiting;
  seq->n_scheduled = 0;
  ++seq->n_preemptions;
  ++n_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
}

bool Scheduler::admit(Sequence* seq) {
  // All known tokens need pages now (the prompt, plus output kept across a preemption).
  const std::vector<int32_t> tokens = seq->all_tokens();
  // Unbounded unless prompt pages only: the output this sequence will generate is shareable too.
  const int64_t n_prompt = static_cast<int64_t>(seq->prompt_ids.size());
  const int64_t n_shareable = config_.share_prompt_pages_only ? n_prompt : INT64_MAX;
  if (!blocks_->can_allocate(tokens, 0, seq->salt, n_shareable)) return false;
  seq->kv = blocks_->allocate(tokens, 0, seq->salt, n_shareable);
  seq->n_scheduled = seq->kv.kv.n_tokens;  // the prefix-cache hit is already computed
  if (seq->n_preemptions == 0) seq->n_cached_prompt_tokens = seq->kv.n_cached_tokens;
  seq->status = SeqStatus::kRunning;
  running_.push_back(seq);
  return true;
}

namespace {
// Pages to add so that `a` can hold n_tokens tokens.
int64_t pages_short(const KvAllocation& a, int64_t n_tokens, int64_t block_size) {
  const int64_t need = (n_tokens + block_size - 1) / block_size - static_cast<int64_t>(a.kv.block_ids.size());
  return need > 0 ? need : 0;
}
}  // namespace

StepPlan Scheduler::schedule() {
  StepPlan plan;
  plan.seqs.reserve(running_.size() + 8);
  int64_t budget = config_.max_num_batched_tokens;
  const int64_t bs = blocks_->block_size();
  auto add = [&](Sequence* s, int64_t n, bool sample) {
    plan.seqs.push_back({s, s->n_scheduled, n, sample});
    plan.n_tokens += n;
    budget -= n;
    s->n_scheduled += n;
    s->n_pending += sample ? 1 : 0;
    ++s->n_inflight_steps;
  };

  // 1. Decode: every running sequence whose tokens all have KV (or will) but the last, unless
  //    its pending sample already reaches max_tokens.
  std::vector<Sequence*>& decode = decode_scratch_;
  decode.clear();
  for (Sequence* s : running_)
    if (s->n_scheduled == s->n_total() - 1 &&
        static_cast<int64_t>(s->output_ids.size()) + s->n_pending < s->params.max_tokens)
      decode.push_back(s);
  for (size_t i = 0; i < decode.size() && budget > 0; ++i) {
    Sequence* s = decode[i];
    if (s->status != SeqStatus::kRunning) continue;  // preempted below for an earlier one
    while (pages_short(s->kv, s->n_scheduled + 1, bs) > blocks_->n_free()) {
      // Preempt the most recently admitted other running sequence not in a running step; if
      // every candidate is in one, ask for a drain; if there is none at all, this sequence can
      // never grow: it ends with "length".
      Sequence* victim = nullptr;
      for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
        if (*it == s) continue;
        // A victim already in this plan gives its slot back (it is not launched yet).
        const bool in_plan = std::any_of(plan.seqs.begin(), plan.seqs.end(), [&](const ScheduledSeq& x) { return x.seq == *it; });
        if ((*it)->n_inflight_steps > (in_plan ? 1 : 0)) continue;  // in a running step
        victim = *it;
        break;
      }
      if (victim == nullptr) break;
      for (auto it = plan.seqs.begin(); it != plan.seqs.end();) {
        if (it->seq == victim) {
          victim->n_scheduled -= it->n_tokens;
          victim->n_pending -= it->sample ? 1 : 0;
          --victim->n_inflight_steps;
          plan.n_tokens -= it->n_tokens;
          budget += it->n_tokens;
          it = plan.seqs.erase(it);
        } else {
          ++it;
        }
      }
      preempt(victim);
    }
    if (pages_short(s->kv, s->n_scheduled + 1, bs) > blocks_->n_free()) {
      const bool any_busy = std::any_of(running_.begin(), running_.end(),
                                        [&](const Sequence* o) { return o != s && o->n_inflight_steps > 0; });
      if (any_busy || s->n_inflight_steps > 0) {
        plan.needs_drain = true;
        continue;
      }
      finish(s, FinishReason::kLength);
      continue;
    }
    blocks_->append(s->kv, s->n_scheduled + 1 - s->kv.kv.n_tokens);
    add(s, 1, true);
  }
  const int64_t n_decode = plan.n_tokens;

  auto chunk_for = [&](Sequence* s) {
    const int64_t remaining = s->n_total() - s->n_scheduled;
    int64_t chunk = std::min({remaining, budget, config_.max_prefill_chunk});
    if (config_.chunk_limit) chunk = std::min(chunk, std::max<int64_t>(1, config_.chunk_limit(n_decode, s->n_scheduled)));
    return chunk;
  };
  // 2. Running prefills continue (chunked), in admission order.
  for (Sequence* s : running_) {
    if (budget <= 0) break;
    if (s->n_scheduled >= s->n_total() - 1) continue;  // decode (or nothing) this step
    const int64_t chunk = chunk_for(s);
    if (chunk <= 0) break;
    add(s, chunk, s->n_scheduled + chunk == s->n_total());
  }
  // 3. Admit waiting sequences first-come-first-served.
  while (!waiting_.empty() && budget > 0 && static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
    Sequence* s = waiting_.front();
    if (!admit(s)) break;
    waiting_.pop_front();
    const int64_t chunk = chunk_for(s);
    add(s, chunk, s->n_scheduled + chunk == s->n_total());
  }
  return plan;
}

void Scheduler::on_step_computed(const StepPlan& plan) {
  for (const ScheduledSeq& x : plan.seqs) {
    Sequence* s = x.seq;
    --s->n_inflight_steps;
    if (s->status == SeqStatus::kFinished) {
      // Finished (stop, abort, error) while this step ran: its pages are free once no
      // running step writes them.
      if (s->n_inflight_steps == 0 && !s->kv.kv.block_ids.empty())
        blocks_->release(s->kv, /*cacheable=*/s->finish != FinishReason::kError);
      continue;
    }
    DI_CHECK_EQ(s->n_computed(), x.start);
    s->kv.kv.n_tokens = x.start + x.n_tokens;
    blocks_->commit(s->kv, s->prompt_ids, s->output_ids);
  }
}

void Scheduler::append_token(Sequence* seq, int32_t token) {
  DI_CHECK_GT(seq->n_pending, 0);
  --seq->n_pending;
  seq->output_ids.push_back(token);
}

void Scheduler::drop_sample(Sequence* seq) {
  if (seq->n_pending > 0) --seq->n_pending;
}

void Scheduler::finish(Sequence* seq, FinishReason reason, const std::string& error) {
  if (seq->status == SeqStatus::kFinished) return;
  if (seq->status == SeqStatus::kRunning) {
    // Pages stay held while a running step references them (released in on_step_computed).
    if (seq->n_inflight_steps == 0) blocks_->release(seq->kv, /*cacheable=*/reason != FinishReason::kError);
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  } else {
    auto it = std::find(waiting_.begin(), waiting_.end(), seq);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  seq->status = SeqStatus::kFinished;
  seq->finish = reason;
  seq->error = error;
  ++n_finished_untaken_;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::take_finished() {
  std::vector<std::unique_ptr<Sequence>> out;
  if (n_finished_untaken_ == 0) return out;
  // Finished sequences still referenced by a running step stay until it is post-processed.
  for (auto& s : seqs_)
    if (s->finished() && s->n_inflight_steps == 0) out.push_back(std::move(s));
  n_finished_untaken_ -= static_cast<int64_t>(out.size());
  seqs_.erase(std::remove(seqs_.begin(), seqs_.end(), nullptr), seqs_.end());
  return out;
}

Status Scheduler::check_invariants() const {
  int64_t refs = 0;
  // Running sequences hold pages, and so do finished ones a running step still references.
  for (const auto& s : seqs_)
    if (s && (s->status == SeqStatus::kRunning || s->finished())) refs += static_cast<int64_t>(s->kv.kv.block_ids.size());
  for (const Sequence* s : waiting_)
    if (!s->kv.kv.block_ids.empty())
      return make_error(StatusCode::kInternal, "waiting sequence {} holds pages", s->seq_id);
  return blocks_->check_invariants(refs);
}

}  // namespace deepinfer
