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
  blocks_->release(seq->kv, /*cacheable=*/true);
  seq->status = SeqStatus::kWaiting;
  ++seq->n_preemptions;
  ++n_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_front(seq);
}

bool Scheduler::admit(Sequence* seq) {
  // All known tokens need pages now (the prompt, plus output kept across a preemption).
  const std::vector<int32_t> tokens = seq->all_tokens();
  if (!blocks_->can_allocate(tokens, 0, seq->salt)) return false;
  seq->kv = blocks_->allocate(tokens, 0, seq->salt);
  if (seq->n_preemptions == 0) seq->n_cached_prompt_tokens = seq->kv.n_cached_tokens;
  seq->status = SeqStatus::kRunning;
  running_.push_back(seq);
  return true;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  plan.seqs.reserve(running_.size() + 8);
  int64_t budget = config_.max_num_batched_tokens;

  // 1. Decode: every running sequence whose known tokens are all computed but the last.
  std::vector<Sequence*>& decode = decode_scratch_;
  decode.clear();
  for (Sequence* s : running_)
    if (s->n_computed() == s->n_tokens() - 1) decode.push_back(s);
  for (size_t i = 0; i < decode.size() && budget > 0; ++i) {
    Sequence* s = decode[i];
    if (s->status != SeqStatus::kRunning) continue;  // preempted below for an earlier one
    while (!blocks_->can_append(s->kv, 1)) {
      // Preempt the most recently admitted other running sequence; if none, this one cannot
      // grow at all: it ends with "length" (it already holds the whole pool).
      Sequence* victim = nullptr;
      for (auto it = running_.rbegin(); it != running_.rend(); ++it)
        if (*it != s) {
          victim = *it;
          break;
        }
      if (victim == nullptr) break;
      // A victim already in this step's plan gives its slot back.
      plan.seqs.erase(std::remove_if(plan.seqs.begin(), plan.seqs.end(),
                                     [&](const ScheduledSeq& x) { return x.seq == victim; }),
                      plan.seqs.end());
      preempt(victim);
    }
    if (!blocks_->can_append(s->kv, 1)) {
      finish(s, FinishReason::kLength);
      continue;
    }
    blocks_->append(s->kv, 1);
    plan.seqs.push_back({s, s->n_computed(), 1, true});
  }
  plan.n_tokens = static_cast<int64_t>(plan.seqs.size());
  budget -= plan.n_tokens;
  const int64_t n_decode = plan.n_tokens;

  auto chunk_for = [&](Sequence* s) {
    int64_t remaining = s->n_tokens() - s->n_computed();
    int64_t chunk = std::min({remaining, budget, config_.max_prefill_chunk});
    if (config_.chunk_limit) chunk = std::min(chunk, std::max<int64_t>(1, config_.chunk_limit(n_decode, s->n_computed())));
    return chunk;
  };
  // 2. Running prefills continue (chunked), in admission order.
  for (Sequence* s : running_) {
    if (budget <= 0) break;
    if (s->n_computed() == s->n_tokens() - 1) continue;  // scheduled as decode
    const int64_t chunk = chunk_for(s);
    if (chunk <= 0) break;
    const bool done = s->n_computed() + chunk == s->n_tokens();
    plan.seqs.push_back({s, s->n_computed(), chunk, done});
    plan.n_tokens += chunk;
    budget -= chunk;
  }
  // 3. Admit waiting sequences first-come-first-served.
  while (!waiting_.empty() && budget > 0 && static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
    Sequence* s = waiting_.front();
    if (!admit(s)) break;
    waiting_.pop_front();
    const int64_t chunk = chunk_for(s);
    const bool done = s->n_computed() + chunk == s->n_tokens();
    plan.seqs.push_back({s, s->n_computed(), chunk, done});
    plan.n_tokens += chunk;
    budget -= chunk;
  }
  return plan;
}

void Scheduler::on_step_computed(const StepPlan& plan) {
  for (const ScheduledSeq& x : plan.seqs) {
    Sequence* s = x.seq;
    if (s->status != SeqStatus::kRunning) continue;  // finished or preempted meanwhile
    DI_CHECK_EQ(s->n_computed(), x.start);
    s->kv.kv.n_tokens = x.start + x.n_tokens;
    blocks_->commit(s->kv, s->prompt_ids, s->output_ids);
  }
}

void Scheduler::append_token(Sequence* seq, int32_t token) { seq->output_ids.push_back(token); }

void Scheduler::finish(Sequence* seq, FinishReason reason, const std::string& error) {
  if (seq->status == SeqStatus::kFinished) return;
  if (seq->status == SeqStatus::kRunning) {
    blocks_->release(seq->kv, /*cacheable=*/reason != FinishReason::kError);
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
  n_finished_untaken_ = 0;
  for (auto& s : seqs_)
    if (s->finished()) out.push_back(std::move(s));
  seqs_.erase(std::remove(seqs_.begin(), seqs_.end(), nullptr), seqs_.end());
  return out;
}

Status Scheduler::check_invariants() const {
  int64_t refs = 0;
  for (const Sequence* s : running_) refs += static_cast<int64_t>(s->kv.kv.block_ids.size());
  for (const Sequence* s : waiting_)
    if (!s->kv.kv.block_ids.empty())
      return make_error(StatusCode::kInternal, "waiting sequence {} holds pages", s->seq_id);
  return blocks_->check_invariants(refs);
}

}  // namespace deepinfer
