#include "engine/llm_engine.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include "engine/kv_sizing.h"
#include "engine/request_checks.h"
#include "io/json_file.h"
#include "sched/cost_model.h"

namespace deepinfer {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

Expected<std::unique_ptr<LLMEngine>> LLMEngine::create(const EngineConfig& config) {
  DI_RETURN_IF_ERROR(config.validate());
  if (config.model_dir.empty())
    return make_error(StatusCode::kInvalidArgument, "no model given: pass a model directory or set DEEPINFER_HF_MODEL_DIR");
  DI_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(config.model_dir));
  DI_ASSIGN_OR_RETURN(std::unique_ptr<DeepseekModel> model, DeepseekModel::load(checkpoint));
  DI_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_backend(config.device, config.n_threads));
  DI_RETURN_IF_ERROR(model->place(*backend));
  backend->set_batch_invariant(config.batch_invariant);  // before the profiling step sizes the scratch
  EngineConfig sized = config;
  DI_ASSIGN_OR_RETURN(sized.num_kv_blocks, plan_kv_blocks(*model, *backend, config));
  if (!config.chunk_cost_model.empty()) {  // fail at start-up, not on the first long prompt
    DI_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(config.chunk_cost_model));
    if (auto m = ChunkCostModel::from_json(j); !m) return m.status().with_context(config.chunk_cost_model);
  }
  std::unique_ptr<Tokenizer> tokenizer;
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::filesystem::path(config.model_dir) / "tokenizer.json", ec)) {
    DI_ASSIGN_OR_RETURN(tokenizer, Tokenizer::load(config.model_dir));
  }
  return std::make_unique<LLMEngine>(sized, std::move(model), std::move(backend), std::move(tokenizer));
}

LLMEngine::LLMEngine(EngineConfig config, std::unique_ptr<DeepseekModel> model, std::unique_ptr<Backend> backend,
                     std::unique_ptr<Tokenizer> tokenizer)
    : config_(std::move(config)), model_(std::move(model)), backend_(std::move(backend)), tokenizer_(std::move(tokenizer)) {
  overlap_ = config_.overlap.value_or(!backend_->on_host());
  backend_->set_batch_invariant(config_.batch_invariant);
  const int64_t bs = config_.kv_block_size;
  const int64_t n_blocks = config_.num_kv_blocks > 0 ? config_.num_kv_blocks : *plan_kv_blocks(*model_, *backend_, config_);
  const MlaPolicy policy = mla_policy_for(*backend_, model_->config(), config_.batch_invariant);
  SchedulerConfig sc;
  sc.max_num_seqs = config_.max_num_seqs;
  sc.share_prompt_pages_only = policy == MlaPolicy::kByOrigin;
  sc.max_num_batched_tokens = config_.max_num_batched_tokens;
  if (!config_.chunk_cost_model.empty()) {
    // Validated in create(); the decode tokens of a step take k1 each out of the budget.
    const ChunkCostModel cost = *ChunkCostModel::from_json(*read_json_file(config_.chunk_cost_model));
    const double budget_s = config_.step_time_budget_ms / 1000.0;
    sc.chunk_limit = [cost, budget_s](int64_t n_decode, int64_t n_cached) {
      return cost.max_chunk(n_cached, budget_s - cost.k1 * static_cast<double>(n_decode), 32768);
    };
  }
  scheduler_ = std::make_unique<Scheduler>(sc, std::make_unique<BlockManager>(n_blocks, bs, config_.enable_prefix_caching));
  executor_ = std::make_unique<ModelRunner>(*model_, *backend_, n_blocks, bs, policy, config_.cuda_graphs);
}

void LLMEngine::set_overlap(bool on) {
  DI_CHECK(!inflight_);
  overlap_ = on;
}

int64_t LLMEngine::max_model_len() const {
  return effective_max_model_len(config_.max_model_len, model_->config().max_position_embeddings);
}

double LLMEngine::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

Expected<EngineRequest> LLMEngine::prepare(EngineRequest req) const {
  const DeepseekConfig& mc = model_->config();
  if (req.prompt_ids.empty() && !req.prompt.empty()) {
    if (!tokenizer_) return make_error(StatusCode::kInvalidArgument, "text prompts need a tokenizer (the model ships no tokenizer.json)");
    EncodeOptions options;
    options.add_special_tokens = true;
    DI_ASSIGN_OR_RETURN(req.prompt_ids, tokenizer_->encode(req.prompt, options));
  }
  DI_RETURN_IF_ERROR(check_prompt(req.prompt_ids, mc.vocab_size, req.params.max_tokens, max_model_len()));
  ParamLimits limits;
  limits.vocab_size = mc.vocab_size;
  DI_RETURN_IF_ERROR(validate_sampling_params(req.params, limits));
  if (!req.params.stop.empty()) {
    if (!tokenizer_)
      return make_error(StatusCode::kInvalidArgument, "stop strings need a tokenizer (the model ships no tokenizer.json); use stop_token_ids");
    auto matcher = StopStringMatcher::create(req.params.stop);
    if (!matcher) return matcher.status().with_context("stop");
  }
  const int64_t n_prompt = static_cast<int64_t>(req.prompt_ids.size());
  if (!scheduler_->fits_alone(n_prompt + req.params.max_tokens - 1) && !scheduler_->fits_alone(n_prompt))
    return make_error(StatusCode::kResourceExhausted, "the prompt ({} tokens) does not fit the KV cache ({} pages of {})",
                      n_prompt, scheduler_->blocks().n_blocks(), scheduler_->blocks().block_size());
  return req;
}

Expected<std::string> LLMEngine::add_request(EngineRequest req) {
  DI_ASSIGN_OR_RETURN(EngineRequest prepared, prepare(std::move(req)));
  return enqueue(std::move(prepared));
}

Expected<std::string> LLMEngine::enqueue(EngineRequest req) {
  if (req.request_id.empty()) req.request_id = std::to_string(next_request_id_++);
  if (requests_.count(req.request_id))
    return make_error(StatusCode::kInvalidArgument, "request id '{}' is already in flight", req.request_id);

  uint64_t base_seed;
  if (req.params.seq_seed) {
    base_seed = *req.params.seq_seed;
  } else {
    std::random_device rd;
    base_seed = (static_cast<uint64_t>(rd()) << 32) | rd();
  }
  RequestState& r = requests_[req.request_id];
  r.id = req.request_id;
  r.prompt = req.prompt;
  r.prompt_ids = req.prompt_ids;
  r.metrics.arrival_time = now();
  r.stream = req.stream;
  r.outputs.resize(static_cast<size_t>(req.params.n));
  for (int64_t i = 0; i < req.params.n; ++i) {
    auto seq = std::make_unique<Sequence>();
    seq->completion_index = i;
    seq->prompt_ids = req.prompt_ids;
    seq->params = req.params;
    // Completion 0 uses seq_seed itself, so n = 1 reproduces a single request exactly.
    seq->seed = i == 0 ? base_seed : splitmix64(base_seed + static_cast<uint64_t>(i));
    seq->salt = req.salt;
    r.outputs[static_cast<size_t>(i)].index = i;
    r.outputs[static_cast<size_t>(i)].seed = seq->seed;
    Sequence* raw = scheduler_->add(std::move(seq));
    r.seqs.push_back(raw);
    if (tokenizer_) {
      TextState ts{IncrementalDetokenizer(*tokenizer_), std::nullopt, {}};
      if (!req.params.stop.empty()) ts.stops = *StopStringMatcher::create(req.params.stop);
      text_.emplace(raw->seq_id, std::move(ts));
    }
    seq_to_request_[raw->seq_id] = &r;
  }
  r.n_live = req.params.n;
  return r.id;
}

void LLMEngine::finish_sequence(Sequence* s, FinishReason reason, const std::string& error) {
  scheduler_->finish(s, reason, error);
}

bool LLMEngine::abort_request(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  for (Sequence* s : it->second.seqs)
    if (s != nullptr) finish_sequence(s, FinishReason::kAbort);
  return true;
}

void LLMEngine::check_stop(Sequence* s) {
  const SamplingParams& p = s->params;
  const int32_t tok = s->output_ids.back();
  const int64_t n_out = static_cast<int64_t>(s->output_ids.size());
  const auto& eos = model_->config().eos_token_ids;
  if (n_out >= p.min_tokens) {
    if (!p.ignore_eos && std::find(eos.begin(), eos.end(), tok) != eos.end()) return finish_sequence(s, FinishReason::kStop);
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end())
      return finish_sequence(s, FinishReason::kStop);
  }
  if (n_out >= p.max_tokens || s->n_tokens() >= max_model_len() + 1) return finish_sequence(s, FinishReason::kLength);
}

RequestOutput LLMEngine::snapshot(const RequestState& r) const {
  RequestOutput out;
  out.request_id = r.id;
  out.prompt = r.prompt;
  out.prompt_token_ids = r.prompt_ids;
  out.outputs = r.outputs;
  out.metrics = r.metrics;
  for (Sequence* s : r.seqs) {
    if (s == nullptr) continue;
    CompletionOutput& c = out.outputs[static_cast<size_t>(s->completion_index)];
    c.token_ids = s->output_ids;
    if (auto it = text_.find(s->seq_id); it != text_.end()) c.text = it->second.text;
    c.logprobs = s->logprobs;
    c.cumulative_logprob = s->cumulative_logprob;
  }
  out.finished = r.n_live == 0;
  return out;
}

std::vector<RequestOutput> LLMEngine::step() {
  ++n_steps_;
  if (!overlap_) {
    StepPlan plan = scheduler_->schedule();
    if (plan.empty()) return postprocess(plan, {});
    executor_->launch(plan);
    return postprocess(plan, executor_->collect());
  }
  // Overlap: schedule and launch N+1 while N runs, then post-process N.
  std::vector<RequestOutput> outputs;
  StepPlan next = scheduler_->schedule();
  if (next.needs_drain && inflight_) {
    // A page can only come from a sequence of the running step: finish that step first.
    for (const ScheduledSeq& x : next.seqs) {  // withdraw the unlaunched plan
      x.seq->n_scheduled -= x.n_tokens;
      x.seq->n_pending -= x.sample ? 1 : 0;
      --x.seq->n_inflight_steps;
    }
    StepPlan running = std::move(*inflight_);
    inflight_.reset();
    outputs = postprocess(running, executor_->collect());
    next = scheduler_->schedule();
  }
  if (!next.empty()) executor_->launch(next);
  if (inflight_) {
    StepPlan running = std::move(*inflight_);
    inflight_.reset();
    auto more = postprocess(running, executor_->collect());
    outputs.insert(outputs.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  if (!next.empty()) inflight_ = std::move(next);
  else if (outputs.empty()) outputs = postprocess(StepPlan{}, {});  // collect finishes from schedule()
  return outputs;
}

std::vector<RequestOutput> LLMEngine::postprocess(const StepPlan& plan, const std::vector<SampledToken>& sampled) {
  scheduler_->on_step_computed(plan);
  std::vector<RequestState*> changed;
  for (const SampledToken& t : sampled) {
    Sequence* s = t.seq;
    if (s->status != SeqStatus::kRunning) continue;  // finished while the step ran: drop
    RequestState& r = *seq_to_request_.at(s->seq_id);
    if (r.stream) changed.push_back(&r);
    if (t.non_finite) {
      scheduler_->drop_sample(s);
      finish_sequence(s, FinishReason::kError, "the model produced non-finite logits");
      continue;
    }
    scheduler_->append_token(s, t.token);
    if (auto it = text_.find(s->seq_id); it != text_.end()) {
      TextState& ts = it->second;
      std::string delta = ts.detokenizer.push(t.token);
      if (ts.stops) {
        ts.stops->push(delta, ts.text);
        if (ts.stops->stopped()) {
          finish_sequence(s, FinishReason::kStop);
          continue;
        }
      } else {
        ts.text += delta;
      }
    }
    s->cumulative_logprob += t.logprob;
    if (s->params.logprobs) s->logprobs.push_back({t.token, t.logprob, t.top});
    if (r.metrics.first_token_time < 0) r.metrics.first_token_time = now();
    check_stop(s);
  }
  // Sequences finished here, by schedule() ("length") or by an abort: move them into outputs.
  for (auto& s : scheduler_->take_finished()) {
    RequestState& r = *seq_to_request_.at(s->seq_id);
    seq_to_request_.erase(s->seq_id);
    executor_->forget(s->seq_id);
    CompletionOutput& c = r.outputs[static_cast<size_t>(s->completion_index)];
    if (auto it = text_.find(s->seq_id); it != text_.end()) {
      TextState& ts = it->second;
      if (!ts.stops || !ts.stops->stopped()) {
        std::string tail = ts.detokenizer.finish();
        if (ts.stops) {
          ts.stops->push(tail, ts.text);
          ts.stops->finish(ts.text);
        } else {
          ts.text += tail;
        }
      }
      c.text = std::move(ts.text);
      text_.erase(it);
    }
    c.token_ids = std::move(s->output_ids);
    c.finish_reason = finish_reason_name(s->finish);
    c.error = s->error;
    c.logprobs = std::move(s->logprobs);
    c.cumulative_logprob = s->cumulative_logprob;
    if (s->completion_index == 0) r.metrics.n_cached_prompt_tokens = s->n_cached_prompt_tokens;
    r.metrics.n_preemptions += s->n_preemptions;
    for (Sequence*& p : r.seqs)
      if (p == s.get()) p = nullptr;
    --r.n_live;
    changed.push_back(&r);
  }
  std::sort(changed.begin(), changed.end());
  changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
  std::vector<RequestOutput> outputs;
  for (RequestState* r : changed) {
    if (r->n_live == 0 && r->metrics.finished_time < 0) r->metrics.finished_time = now();
    outputs.push_back(snapshot(*r));
  }
  for (RequestState* r : changed)
    if (r->n_live == 0) requests_.erase(r->id);
  // Deterministic order for callers: by request id.
  std::sort(outputs.begin(), outputs.end(),
            [](const RequestOutput& a, const RequestOutput& b) { return a.request_id < b.request_id; });
  return outputs;
}

}  // namespace deepinfer
