// LLM: the user-facing API, shaped like vLLM's. One engine thread owns the LLMEngine and runs
// steps while any request is unfinished; callers on any thread submit requests and receive
// RequestOutput snapshots (streaming) or final outputs (generate). Submission validates on the
// caller's thread (LLMEngine::prepare reads only immutable state), so an invalid request is
// rejected before admission; valid ones and aborts reach the engine thread through a queue it
// drains between steps, so callers never wait for a step to finish.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/llm_engine.h"
#include "tokenizer/chat_encoder.h"

namespace deepinfer {

class LLM;

// Outputs of one request as they are produced; the last one has finished == true.
class RequestStream {
 public:
  // Blocks until the next snapshot; false once the final one has been returned.
  bool next(RequestOutput* out);
  const std::string& request_id() const { return id_; }

 private:
  friend class LLM;
  std::string id_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  bool done_ = false;     // the final snapshot has been queued
  bool drained_ = false;  // ... and returned
};

class LLM {
 public:
  // Loads the model (and its tokenizer, if it ships one) and starts the engine thread.
  static Expected<std::unique_ptr<LLM>> create(const EngineConfig& config);
  ~LLM();
  LLM(const LLM&) = delete;
  LLM& operator=(const LLM&) = delete;

  // Offline batch: every prompt with the same parameters; outputs in input order. A prompt
  // that fails validation fails the call before anything runs.
  Expected<std::vector<RequestOutput>> generate(const std::vector<std::vector<int32_t>>& prompts,
                                                const SamplingParams& params);
  Expected<std::vector<RequestOutput>> generate(const std::vector<std::string>& prompts, const SamplingParams& params);
  // Requests with their own parameters (text or ids each); the two overloads above build these.
  Expected<std::vector<RequestOutput>> generate(std::vector<EngineRequest> requests);
  // One conversation in the model's chat format (needs a tokenizer).
  Expected<RequestOutput> chat(const std::vector<ChatMessage>& messages, const SamplingParams& params,
                               const ChatOptions& options = {});
  // Streaming: snapshots as tokens arrive.
  Expected<std::shared_ptr<RequestStream>> stream(EngineRequest request);
  // Ends the request with "abort"; false if unknown or finished.
  bool abort(const std::string& request_id);

  const DeepseekModel& model() const { return engine_->model(); }
  const Tokenizer* tokenizer() const { return engine_->tokenizer(); }

 private:
  explicit LLM(std::unique_ptr<LLMEngine> engine);
  void loop();
  void deliver(std::vector<RequestOutput> outputs);

  std::unique_ptr<LLMEngine> engine_;  // engine thread only (prepare() excepted)
  std::mutex mutex_;                   // guards the queues, streams_, next_id_, stop_
  std::condition_variable work_cv_;
  std::deque<EngineRequest> incoming_;
  std::deque<std::string> aborts_;
  std::map<std::string, std::shared_ptr<RequestStream>> streams_;
  int64_t next_id_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace deepinfer
