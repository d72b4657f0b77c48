// Sequence: one completion being generated — its tokens, parameters, KV pages and lifecycle.
// A request with n > 1 owns n sequences. Owned by the Scheduler; engine thread only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kv/block_manager.h"
#include "sample/sampling_params.h"

namespace deepinfer {

enum class SeqStatus { kWaiting, kRunning, kFinished };
enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason r);  // "stop" | "length" | "abort" | "error" | ""

struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0;                               // of the chosen token
  std::vector<std::pair<int32_t, float>> top;      // top-n (id, logprob), descending
};

struct Sequence {
  int64_t seq_id = 0;                // unique, assigned by the scheduler
  int64_t request_index = 0;         // which request (engine-level handle)
  int64_t completion_index = 0;      // 0..n-1 within the request
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;
  SamplingParams params;
  uint64_t seed = 0;                 // Philox key for this completion
  uint64_t salt = 0;                 // prefix-cache salt (tenant), server-side only
  SeqStatus status = SeqStatus::kWaiting;
  FinishReason finish = FinishReason::kNone;
  std::string error;                 // set when finish == kError
  KvAllocation kv;                   // kv.kv.n_tokens = tokens whose KV is computed
  // Overlapped execution: positions whose KV is computed or in a launched step, samples
  // launched but not yet appended, and launched steps not yet post-processed.
  int64_t n_scheduled = 0;
  int64_t n_pending = 0;
  int64_t n_inflight_steps = 0;
  int64_t n_preemptions = 0;
  int64_t n_cached_prompt_tokens = 0;  // prefix-cache hit at first admission
  double cumulative_logprob = 0;
  std::vector<TokenLogprobs> logprobs;  // when params.logprobs is set

  int64_t n_tokens() const { return static_cast<int64_t>(prompt_ids.size() + output_ids.size()); }
  // Tokens that exist or are being sampled.
  int64_t n_total() const { return n_tokens() + n_pending; }
  int32_t token_at(int64_t i) const {
    const int64_t np = static_cast<int64_t>(prompt_ids.size());
    return i < np ? prompt_ids[static_cast<size_t>(i)] : output_ids[static_cast<size_t>(i - np)];
  }
  std::vector<int32_t> all_tokens() const {
    std::vector<int32_t> t = prompt_ids;
    t.insert(t.end(), output_ids.begin(), output_ids.end());
    return t;
  }
  int64_t n_computed() const { return kv.kv.n_tokens; }
  bool finished() const { return status == SeqStatus::kFinished; }
};

}  // namespace deepinfer
