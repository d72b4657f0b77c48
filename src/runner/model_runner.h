// ModelRunner: executes one StepPlan — builds the ForwardBatch (token rows, positions, slots,
// CSR block tables), runs the model over the paged cache, then for every sequence that reached
// its last known token samples where the logits are (Backend::sample: its logits processors as
// token lists, seeded by the sequence's seed and the new token's position); only tokens and
// log-probabilities come back. Owns the KV pages' memory; not the page bookkeeping.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "kv/paged_kv_cache.h"
#include "model/deepseek/deepseek_model.h"
#include "sched/scheduler.h"

namespace deepinfer {

struct SampledToken {
  Sequence* seq = nullptr;
  int32_t token = 0;
  float logprob = 0;                            // log-softmax of the raw logits at `token`
  std::vector<std::pair<int32_t, float>> top;   // when the sequence asked for logprobs
  bool non_finite = false;                      // the row held NaN/Inf: the sequence must fail
};

// Runs steps. The engine sees only this interface, so tests and benchmarks can substitute a
// fake (a null executor for bookkeeping cost, a delayed one for the overlap logic) and the
// CUDA runner can execute asynchronously behind it.
class Executor {
 public:
  virtual ~Executor() = default;
  // Executes the step (the new tokens' KV is written) and returns one SampledToken per
  // ScheduledSeq with sample == true, in plan order. A row at a position the sequence has not
  // appended yet takes the token this executor sampled there in an earlier step (a "future"
  // token of an overlapped step).
  virtual std::vector<SampledToken> execute(const StepPlan& plan) = 0;
  // Asynchronous form: launch starts a step (later steps queue behind it), collect waits for
  // the oldest launched step and returns its samples. The default runs at launch.
  virtual void launch(const StepPlan& plan) { done_.push_back(execute(plan)); }
  virtual std::vector<SampledToken> collect() {
    std::vector<SampledToken> out = std::move(done_.front());
    done_.pop_front();
    return out;
  }
  // The engine is done with a sequence: drop what the executor remembers of it.
  virtual void forget(int64_t seq_id) { (void)seq_id; }

 private:
  std::deque<std::vector<SampledToken>> done_;
};

class ModelRunner : public Executor {
 public:
  // use_graphs: decode-only steps replay CUDA graphs on backends that have them.
  ModelRunner(const DeepseekModel& model, Backend& backend, int64_t n_blocks, int64_t block_size,
              MlaPolicy policy, bool use_graphs = true);

  // Runs the step; returns one SampledToken per ScheduledSeq with sample == true, in plan order.
  std::vector<SampledToken> execute(const StepPlan& plan) override;
  // On a device backend, every step is enqueued whole (forward, sampling, the tokens' copy into
  // pinned memory, a fence) and launch returns at once; tokens of a step still in flight reach
  // the next step on the device (ForwardBatch::pending_tokens) and its penalties
  // (LogitsProcessors::pending). Host backends run the step at launch, as execute.
  void launch(const StepPlan& plan) override;
  std::vector<SampledToken> collect() override;
  void forget(int64_t seq_id) override {
    future_.erase(seq_id);
    pending_.erase(seq_id);
  }
  PagedKvCache& cache() { return cache_; }

  // The device timeline of asynchronous steps: time the GPU spent on steps and the gaps between
  // consecutive ones (the idle time overlap is meant to remove).
  struct Timeline {
    int64_t n_steps = 0;
    double busy_ms = 0;
    double idle_ms = 0;  // Σ (start of step N+1 − end of step N) over consecutive async steps
    int64_t n_overlapped = 0;  // async launches made while an earlier step was still running
  };
  const Timeline& timeline() const { return timeline_; }
  int64_t n_graph_replays() const { return graphs_.n_replays; }

 private:
  // A launched step: its result, or what is needed to read it once the device is done.
  struct InFlight {
    bool async = false;
    bool resolved = false;
    std::vector<SampledToken> samples;                // synchronous steps: ready at launch
    struct Row {
      Sequence* seq;     // handed back in the SampledToken; not dereferenced here
      int64_t seq_id;
      int64_t position;  // of the new token
    };
    std::vector<Row> rows;                            // async: one per sampled row
    int slot = 0;                                     // async: half of the token buffers it wrote
    int64_t n_top = 0;                                // async: top log-probability columns it wrote
    int64_t start_fence = -1, end_fence = -1;
  };
  int32_t future_token(int64_t seq_id, int64_t position) const;
  // Builds the step's batch; with `pending`, positions sampled by an in-flight async step become
  // placeholders into the device token buffer. Returns the sampled rows in plan order.
  std::vector<const ScheduledSeq*> build_batch(const StepPlan& plan, ForwardBatch* batch, bool pending);
  void resolve(InFlight& f);  // waits for an async step and turns its pinned tokens into samples
  void resolve_all();
  std::vector<SampledToken> run_sync(const StepPlan& plan);
  // The sampled rows' Backend::sample arguments: sampler, Philox key, processors (pointing into
  // `procs`), top-n. With `pending`, output tokens of in-flight steps are dev_tokens_ indices.
  struct SampleSetup {
    std::vector<SampleRow> rows;
    std::deque<LogitsProcessors> procs;  // stable addresses for SampleRow::processors
    int64_t n_top = 0;                   // the most top log-probabilities a row wants
  };
  SampleSetup prepare_sampling(const std::vector<const ScheduledSeq*>& sampled, bool pending);
  static SampledToken make_sample(Sequence* seq, int32_t token, float logprob, const int32_t* top_ids,
                                  const float* top_lps, int64_t n_top);

  const DeepseekModel& model_;
  Backend& backend_;
  PagedKvCache cache_;
  MlaPolicy policy_;
  // Tokens sampled but possibly not yet appended by the engine: seq_id → (position → token).
  std::unordered_map<int64_t, std::map<int64_t, int32_t>> future_;
  // Tokens an in-flight async step is sampling: seq_id → (position → index into dev_tokens_).
  std::unordered_map<int64_t, std::map<int64_t, int32_t>> pending_;
  std::deque<InFlight> inflight_;
  // Two halves of `capacity_` rows each, alternating between consecutive async steps.
  int64_t capacity_ = 0;
  Tensor dev_tokens_, dev_logprobs_;    // [2 · capacity] I32 / F32, device
  Tensor host_tokens_, host_logprobs_;  // [2 · capacity] pinned staging
  int64_t top_capacity_ = 0;            // columns of the top log-probability buffers
  Tensor dev_top_ids_, dev_top_lps_;    // [2 · capacity, top_capacity] I32 / F32, device
  Tensor host_top_ids_, host_top_lps_;  // [2 · capacity, top_capacity] pinned staging
  int next_slot_ = 0;
  int64_t last_end_fence_ = -1;
  bool use_graphs_;
  DecodeGraphs graphs_;
  Timeline timeline_;
};

}  // namespace deepinfer
