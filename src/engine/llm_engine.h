// LLMEngine: the serving runtime's core loop, synchronous form. Requests are validated at
// add_request (nothing invalid reaches the scheduler); each step() schedules one continuous-
// batching step, executes it, samples, applies stop conditions and returns snapshots of the
// requests that progressed. Every accepted request ends with "stop", "length", "abort" or
// "error" — never silently. Single-threaded: call from one thread (the engine thread).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine_config.h"
#include "engine/request_output.h"
#include "runner/model_runner.h"
#include "sched/scheduler.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/stop_string_matcher.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

struct EngineRequest {
  std::string request_id;                  // empty: assigned ("0", "1", ...)
  std::string prompt;                      // tokenized (with BOS per tokenizer_config) when prompt_ids is empty
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  uint64_t salt = 0;                       // prefix-cache salt; server-side only
  bool stream = false;                     // step() reports progress, not only the final output
};

class LLMEngine {
 public:
  static Expected<std::unique_ptr<LLMEngine>> create(const EngineConfig& config);
  LLMEngine(EngineConfig config, std::unique_ptr<DeepseekModel> model, std::unique_ptr<Backend> backend,
            std::unique_ptr<Tokenizer> tokenizer = nullptr);
  // Switches the overlapped loop (EngineConfig::overlap) on or off between workloads, so a
  // benchmark compares both on one engine. Precondition: no step in flight (has_unfinished()
  // is false). Engine thread only.
  void set_overlap(bool on);
  // Replaces the model runner (tests and benchmarks: null or delayed executors).
  void set_executor(std::unique_ptr<Executor> executor) { executor_ = std::move(executor); }

  const DeepseekModel& model() const { return *model_; }
  // The model directory's tokenizer (tokenizer.json), or null when it ships none.
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const EngineConfig& config() const { return config_; }
  int64_t max_model_len() const;

  // Validates and queues. Returns the request id. Errors name the offending parameter.
  Expected<std::string> add_request(EngineRequest request);
  // The validation half of add_request: tokenizes a text prompt and checks everything. Reads
  // only immutable state, so any thread may call it while the engine thread steps.
  Expected<EngineRequest> prepare(EngineRequest request) const;
  // The queueing half. Precondition: `request` came from prepare(). Fails only on a duplicate
  // in-flight request id. Engine thread only.
  Expected<std::string> enqueue(EngineRequest request);
  // Ends every completion of the request with "abort" and frees its pages. False if unknown.
  bool abort_request(const std::string& request_id);
  // One step. Returns a snapshot of every request that finished, and of every streaming
  // request that produced tokens. With overlap, a call launches step N+1 and then
  // post-processes step N, so outputs trail the launches by one step.
  std::vector<RequestOutput> step();
  bool has_unfinished() const { return !requests_.empty() || inflight_.has_value(); }
  int64_t n_unfinished() const { return static_cast<int64_t>(requests_.size()); }

  Scheduler& scheduler() { return *scheduler_; }
  Executor& executor() { return *executor_; }
  const Scheduler& scheduler() const { return *scheduler_; }
  int64_t n_steps() const { return n_steps_; }

 private:
  struct RequestState {
    std::string id;
    std::string prompt;
    std::vector<int32_t> prompt_ids;
    std::vector<Sequence*> seqs;           // live sequences (null once finished and taken)
    std::vector<CompletionOutput> outputs; // filled as sequences finish
    RequestMetrics metrics;
    int64_t n_live = 0;
    bool stream = false;
  };
  // Detokenized text of one sequence, with its stop-string matcher.
  struct TextState {
    IncrementalDetokenizer detokenizer;
    std::optional<StopStringMatcher> stops;
    std::string text;
  };
  double now() const;
  void finish_sequence(Sequence* s, FinishReason reason, const std::string& error = {});
  RequestOutput snapshot(const RequestState& r) const;
  // Applies a completed step's samples: appends tokens, stop checks, finished outputs.
  std::vector<RequestOutput> postprocess(const StepPlan& plan, const std::vector<SampledToken>& sampled);
  void check_stop(Sequence* s);

  EngineConfig config_;
  std::unique_ptr<DeepseekModel> model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::map<int64_t, TextState> text_;      // seq_id → text, when there is a tokenizer
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Executor> executor_;
  bool overlap_ = false;                   // config_.overlap resolved for this backend
  std::optional<StepPlan> inflight_;       // overlap: the launched, not yet post-processed step
  std::map<std::string, RequestState> requests_;
  std::unordered_map<int64_t, RequestState*> seq_to_request_;  // nodes of requests_ are stable
  int64_t next_request_id_ = 0;
  int64_t n_steps_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace deepinfer
