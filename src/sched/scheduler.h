// Scheduler: continuous batching under a per-step token budget. Each step takes every running
// sequence's next decode token first, then continues chunked prefills, then admits waiting
// sequences first-come-first-served while pages and budget last. When a decode cannot get a
// page, the most recently admitted running sequence is preempted by recompute (its pages are
// released — they stay in the prefix cache — and it re-queues at the front with its output so
// far). Steps may overlap: a step can be scheduled while the previous one still runs, counting
// its launched positions and pending samples as done; sequences in a running step are never
// preempted (the plan asks for a drain instead) and release their pages only once no running
// step references them. Owns the sequences and the BlockManager; engine thread only.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "kv/block_manager.h"
#include "sched/sequence.h"

namespace deepinfer {

struct SchedulerConfig {
  int64_t max_num_seqs = 256;            // running sequences at once
  int64_t max_num_batched_tokens = 2048; // tokens per step (decode + prefill chunks)
  int64_t max_prefill_chunk = 32768;     // cap on one sequence's prefill chunk
  // Optional chunk size policy (the fitted cost model): given the step's decode count and a
  // sequence's cached prefix, the largest chunk that fits the time budget. Null = budget only.
  std::function<int64_t(int64_t n_decode, int64_t n_cached)> chunk_limit;
  // Prefix caching over prompt pages only: pages holding generated tokens are neither hit nor
  // registered (MlaPolicy::kByOrigin, where a generated token's KV comes from another attention
  // form than the same token's as a prompt token of a later request).
  bool share_prompt_pages_only = false;
};

// One sequence's share of a step: rows [start, start + n_tokens) of its token list.
struct ScheduledSeq {
  Sequence* seq = nullptr;
  int64_t start = 0;
  int64_t n_tokens = 0;
  bool sample = false;  // the chunk reaches the sequence's last known token: sample the next
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  int64_t n_tokens = 0;
  // A decode needed a page that only preempting a sequence of a running step could free:
  // post-process the running step, then schedule again.
  bool needs_drain = false;
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, std::unique_ptr<BlockManager> blocks);

  const SchedulerConfig& config() const { return config_; }
  BlockManager& blocks() { return *blocks_; }
  const BlockManager& blocks() const { return *blocks_; }

  // Takes ownership; the sequence waits for admission. Precondition: validated, and its prompt
  // alone fits the pool (the engine checks; see fits_alone).
  Sequence* add(std::unique_ptr<Sequence> seq);
  // Whether a sequence of n_tokens could ever hold its pages (plus one for its next token).
  bool fits_alone(int64_t n_tokens) const;

  StepPlan schedule();
  // After the step's KV was written: advances computed counts, registers full pages in the
  // prefix cache, releases pages of sequences that finished while it ran. Sampled tokens are
  // appended by the caller with append_token (or dropped with drop_sample).
  void on_step_computed(const StepPlan& plan);
  void append_token(Sequence* seq, int32_t token);
  // A launched sample that will not be appended (its sequence failed).
  void drop_sample(Sequence* seq);
  // Finishes a sequence: releases its pages (cacheable unless an error), marks it finished.
  void finish(Sequence* seq, FinishReason reason, const std::string& error = {});
  // Removes finished sequences and returns them (the engine turns them into outputs).
  std::vector<std::unique_ptr<Sequence>> take_finished();

  int64_t n_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  Sequence* find(int64_t seq_id);
  int64_t n_preemptions() const { return n_preemptions_; }
  // Every page held is accounted for by a live sequence (tests, debug).
  Status check_invariants() const;

 private:
  void preempt(Sequence* seq);
  bool admit(Sequence* seq);

  SchedulerConfig config_;
  std::unique_ptr<BlockManager> blocks_;
  std::vector<std::unique_ptr<Sequence>> seqs_;  // every live sequence
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;               // in admission order
  int64_t next_seq_id_ = 0;
  int64_t n_preemptions_ = 0;
  int64_t n_finished_untaken_ = 0;       // finished since the last take_finished()
  std::vector<Sequence*> decode_scratch_;
};

}  // namespace deepinfer
