#include "engine/llm.h"

namespace deepinfer {

bool RequestStream::next(RequestOutput* out) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return !queue_.empty() || drained_; });
  if (queue_.empty()) return false;
  *out = std::move(queue_.front());
  queue_.pop_front();
  if (done_ && queue_.empty()) drained_ = true;
  return true;
}

Expected<std::unique_ptr<LLM>> LLM::create(const EngineConfig& config) {
  DI_ASSIGN_OR_RETURN(std::unique_ptr<LLMEngine> engine, LLMEngine::create(config));
  return std::unique_ptr<LLM>(new LLM(std::move(engine)));
}

LLM::LLM(std::unique_ptr<LLMEngine> engine) : engine_(std::move(engine)) {
  thread_ = std::thread([this] { loop(); });
}

LLM::~LLM() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void LLM::deliver(std::vector<RequestOutput> outputs) {
  for (auto& o : outputs) {
    std::shared_ptr<RequestStream> s;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = streams_.find(o.request_id);
      if (it == streams_.end()) continue;
      s = it->second;
      if (o.finished) streams_.erase(it);
    }
    std::lock_guard<std::mutex> sl(s->mutex_);
    s->done_ |= o.finished;
    s->queue_.push_back(std::move(o));
    s->cv_.notify_all();
  }
}

void LLM::loop() {
  for (;;) {
    std::deque<EngineRequest> incoming;
    std::deque<std::string> aborts;
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || !incoming_.empty() || !aborts_.empty() || engine_->has_unfinished(); });
      incoming.swap(incoming_);
      aborts.swap(aborts_);
      stopping = stop_;
    }
    for (auto& r : incoming) {
      const std::string id = r.request_id;
      auto added = engine_->enqueue(std::move(r));
      if (!added) {  // ids are unique per LLM, so this is an internal error: end the stream
        RequestOutput o;
        o.request_id = id;
        o.finished = true;
        o.outputs.resize(1);
        o.outputs[0].finish_reason = "error";
        o.outputs[0].error = added.status().message();
        deliver({o});
      }
    }
    for (const auto& id : aborts) engine_->abort_request(id);
    if (stopping) {
      // Nothing is lost: every open request ends with "abort".
      std::vector<std::string> open;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto& [id, s] : streams_) open.push_back(id);
      }
      for (const auto& id : open) engine_->abort_request(id);
      while (engine_->has_unfinished()) deliver(engine_->step());
      return;
    }
    if (engine_->has_unfinished()) deliver(engine_->step());
  }
}

Expected<std::shared_ptr<RequestStream>> LLM::stream(EngineRequest request) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (request.request_id.empty()) request.request_id = "llm-" + std::to_string(next_id_++);
  }
  request.stream = true;
  DI_ASSIGN_OR_RETURN(EngineRequest prepared, engine_->prepare(std::move(request)));
  auto s = std::make_shared<RequestStream>();
  s->id_ = prepared.request_id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (streams_.count(s->id_))
      return make_error(StatusCode::kInvalidArgument, "request id '{}' is already in flight", s->id_);
    streams_[s->id_] = s;
    incoming_.push_back(std::move(prepared));
  }
  work_cv_.notify_all();
  return s;
}

bool LLM::abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!streams_.count(request_id)) return false;
    aborts_.push_back(request_id);
  }
  work_cv_.notify_all();
  return true;
}

Expected<std::vector<RequestOutput>> LLM::generate(std::vector<EngineRequest> requests) {
  // Validate everything first: an invalid prompt fails the call before anything runs.
  std::vector<EngineRequest> prepared;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto p = engine_->prepare(std::move(requests[i]));
    if (!p) return p.status().with_context(fmt::format("prompt {}", i));
    prepared.push_back(std::move(*p));
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& r : prepared) {
      r.request_id = "llm-" + std::to_string(next_id_++);
      auto s = std::make_shared<RequestStream>();
      s->id_ = r.request_id;
      streams_[s->id_] = s;
      streams.push_back(s);
      incoming_.push_back(std::move(r));
    }
  }
  work_cv_.notify_all();
  std::vector<RequestOutput> results;
  for (auto& s : streams) {
    RequestOutput last;
    while (s->next(&last)) {
    }
    results.push_back(std::move(last));
  }
  return results;
}

Expected<std::vector<RequestOutput>> LLM::generate(const std::vector<std::vector<int32_t>>& prompts,
                                                   const SamplingParams& params) {
  std::vector<EngineRequest> reqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    reqs[i].prompt_ids = prompts[i];
    reqs[i].params = params;
  }
  return generate(std::move(reqs));
}

Expected<std::vector<RequestOutput>> LLM::generate(const std::vector<std::string>& prompts,
                                                   const SamplingParams& params) {
  std::vector<EngineRequest> reqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    reqs[i].prompt = prompts[i];
    reqs[i].params = params;
  }
  return generate(std::move(reqs));
}

Expected<RequestOutput> LLM::chat(const std::vector<ChatMessage>& messages, const SamplingParams& params,
                                  const ChatOptions& options) {
  if (engine_->tokenizer() == nullptr)
    return make_error(StatusCode::kInvalidArgument, "chat needs a tokenizer (the model ships no tokenizer.json)");
  DI_ASSIGN_OR_RETURN(ChatEncoder encoder, ChatEncoder::create(*engine_->tokenizer()));
  DI_ASSIGN_OR_RETURN(std::vector<int32_t> ids, encoder.encode(messages, options));
  EngineRequest r;
  r.prompt_ids = std::move(ids);
  r.params = params;
  std::vector<EngineRequest> one(1);
  one[0] = std::move(r);
  DI_ASSIGN_OR_RETURN(std::vector<RequestOutput> out, generate(std::move(one)));
  return std::move(out.front());
}

}  // namespace deepinfer
