// pybind11 bindings: LLM, SamplingParams, RequestOutput and friends, mirroring vLLM's Python
// API. Parameters are validated by the engine; Status errors become ValueError (bad input) or
// RuntimeError. The GIL is released while the engine works.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "engine/llm.h"

namespace py = pybind11;
using namespace deepinfer;

namespace {

[[noreturn]] void raise(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kResourceExhausted:
      throw py::value_error(s.message());
    case StatusCode::kNotFound:
      throw py::value_error(s.message());
    default:
      throw std::runtime_error(s.message());
  }
}

template <typename T>
T unwrap(Expected<T> e) {
  if (!e) raise(e.status());
  return std::move(*e);
}

// A prompt: str, list[int], or {"prompt_token_ids": [...]} / {"prompt": "..."}.
EngineRequest to_request(const py::handle& prompt, const SamplingParams& params) {
  EngineRequest r;
  r.params = params;
  if (py::isinstance<py::str>(prompt)) {
    r.prompt = prompt.cast<std::string>();
  } else if (py::isinstance<py::dict>(prompt)) {
    py::dict d = prompt.cast<py::dict>();
    if (d.contains("prompt_token_ids")) r.prompt_ids = d["prompt_token_ids"].cast<std::vector<int32_t>>();
    if (d.contains("prompt")) r.prompt = d["prompt"].cast<std::string>();
  } else {
    r.prompt_ids = prompt.cast<std::vector<int32_t>>();
  }
  return r;
}

// generate()'s first argument: one prompt or a list of prompts (a list of ints is one prompt).
std::vector<EngineRequest> to_requests(const py::object& prompts, const SamplingParams& params) {
  std::vector<EngineRequest> out;
  if (py::isinstance<py::list>(prompts) || py::isinstance<py::tuple>(prompts)) {
    py::sequence seq = prompts.cast<py::sequence>();
    if (seq.size() > 0 && py::isinstance<py::int_>(seq[0])) {
      out.push_back(to_request(prompts, params));
    } else {
      for (const auto& p : seq) out.push_back(to_request(p, params));
    }
  } else {
    out.push_back(to_request(prompts, params));
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_deepinfer, m) {
  m.doc() = "DeepInfer: inference for DeepSeek-architecture models";

  py::class_<SamplingParams>(m, "SamplingParams")
      .def(py::init([](int64_t n, float temperature, int64_t top_k, float top_p, float min_p, float presence_penalty,
                       float frequency_penalty, float repetition_penalty, int64_t max_tokens, int64_t min_tokens,
                       std::optional<std::vector<std::string>> stop, std::optional<std::vector<int32_t>> stop_token_ids,
                       bool ignore_eos, std::optional<int64_t> logprobs, std::optional<uint64_t> seq_seed,
                       std::optional<uint64_t> seed) {
             SamplingParams p;
             p.n = n;
             p.temperature = temperature;
             p.top_k = top_k;
             p.top_p = top_p;
             p.min_p = min_p;
             p.presence_penalty = presence_penalty;
             p.frequency_penalty = frequency_penalty;
             p.repetition_penalty = repetition_penalty;
             p.max_tokens = max_tokens;
             p.min_tokens = min_tokens;
             if (stop) p.stop = *stop;
             if (stop_token_ids) p.stop_token_ids = *stop_token_ids;
             p.ignore_eos = ignore_eos;
             p.logprobs = logprobs;
             p.seq_seed = seq_seed ? seq_seed : seed;  // vLLM's `seed` is accepted as an alias
             return p;
           }),
           py::arg("n") = 1, py::arg("temperature") = 1.0f, py::arg("top_k") = 0, py::arg("top_p") = 1.0f,
           py::arg("min_p") = 0.0f, py::arg("presence_penalty") = 0.0f, py::arg("frequency_penalty") = 0.0f,
           py::arg("repetition_penalty") = 1.0f, py::arg("max_tokens") = 16, py::arg("min_tokens") = 0,
           py::arg("stop") = py::none(), py::arg("stop_token_ids") = py::none(), py::arg("ignore_eos") = false,
           py::arg("logprobs") = py::none(), py::arg("seq_seed") = py::none(), py::arg("seed") = py::none())
      .def_readwrite("n", &SamplingParams::n)
      .def_readwrite("temperature", &SamplingParams::temperature)
      .def_readwrite("top_k", &SamplingParams::top_k)
      .def_readwrite("top_p", &SamplingParams::top_p)
      .def_readwrite("min_p", &SamplingParams::min_p)
      .def_readwrite("presence_penalty", &SamplingParams::presence_penalty)
      .def_readwrite("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_readwrite("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_readwrite("max_tokens", &SamplingParams::max_tokens)
      .def_readwrite("min_tokens", &SamplingParams::min_tokens)
      .def_readwrite("stop", &SamplingParams::stop)
      .def_readwrite("stop_token_ids", &SamplingParams::stop_token_ids)
      .def_readwrite("ignore_eos", &SamplingParams::ignore_eos)
      .def_readwrite("logprobs", &SamplingParams::logprobs)
      .def_readwrite("seq_seed", &SamplingParams::seq_seed)
      .def("__repr__", [](const SamplingParams& p) {
        return fmt::format("SamplingParams(n={}, temperature={}, top_k={}, top_p={}, min_p={}, max_tokens={}, seq_seed={})",
                           p.n, p.temperature, p.top_k, p.top_p, p.min_p, p.max_tokens,
                           p.seq_seed ? std::to_string(*p.seq_seed) : "None");
      });

  py::class_<TokenLogprobs>(m, "TokenLogprobs")
      .def_readonly("token", &TokenLogprobs::token)
      .def_readonly("logprob", &TokenLogprobs::logprob)
      .def_readonly("top", &TokenLogprobs::top);

  py::class_<CompletionOutput>(m, "CompletionOutput")
      .def_readonly("index", &CompletionOutput::index)
      .def_readonly("text", &CompletionOutput::text)
      .def_readonly("token_ids", &CompletionOutput::token_ids)
      .def_property_readonly("finish_reason",
                             [](const CompletionOutput& c) -> py::object {
                               if (c.finish_reason.empty()) return py::none();
                               return py::str(c.finish_reason);
                             })
      .def_readonly("error", &CompletionOutput::error)
      .def_readonly("logprobs", &CompletionOutput::logprobs)
      .def_readonly("cumulative_logprob", &CompletionOutput::cumulative_logprob)
      .def_readonly("seed", &CompletionOutput::seed)
      .def("__repr__", [](const CompletionOutput& c) {
        return fmt::format("CompletionOutput(index={}, text='{}', n_tokens={}, finish_reason={})", c.index, c.text,
                           c.token_ids.size(), c.finish_reason);
      });

  py::class_<RequestMetrics>(m, "RequestMetrics")
      .def_readonly("arrival_time", &RequestMetrics::arrival_time)
      .def_readonly("first_token_time", &RequestMetrics::first_token_time)
      .def_readonly("finished_time", &RequestMetrics::finished_time)
      .def_readonly("num_cached_tokens", &RequestMetrics::n_cached_prompt_tokens)
      .def_readonly("num_preemptions", &RequestMetrics::n_preemptions);

  py::class_<RequestOutput>(m, "RequestOutput")
      .def_readonly("request_id", &RequestOutput::request_id)
      .def_readonly("prompt", &RequestOutput::prompt)
      .def_readonly("prompt_token_ids", &RequestOutput::prompt_token_ids)
      .def_readonly("outputs", &RequestOutput::outputs)
      .def_readonly("finished", &RequestOutput::finished)
      .def_readonly("metrics", &RequestOutput::metrics)
      .def("__repr__", [](const RequestOutput& o) {
        return fmt::format("RequestOutput(request_id='{}', n_prompt_tokens={}, n_outputs={}, finished={})", o.request_id,
                           o.prompt_token_ids.size(), o.outputs.size(), o.finished);
      });

  py::class_<RequestStream, std::shared_ptr<RequestStream>>(m, "RequestStream")
      .def("__iter__", [](std::shared_ptr<RequestStream> s) { return s; })
      .def("__next__", [](RequestStream& s) {
        RequestOutput out;
        bool more;
        {
          py::gil_scoped_release release;
          more = s.next(&out);
        }
        if (!more) throw py::stop_iteration();
        return out;
      })
      .def_property_readonly("request_id", &RequestStream::request_id);

  py::class_<LLM>(m, "LLM")
      .def(py::init([](std::optional<std::string> model, std::optional<int> num_threads, std::optional<int64_t> max_num_seqs,
                       std::optional<int64_t> max_num_batched_tokens, std::optional<int64_t> max_model_len,
                       std::optional<bool> enable_prefix_caching, std::optional<bool> batch_invariant,
                       std::optional<int64_t> kv_cache_bytes, std::optional<std::string> device) {
             EngineConfig c = unwrap(EngineConfig::from_env());
             if (model) c.model_dir = *model;
             if (num_threads) c.n_threads = *num_threads;
             if (max_num_seqs) c.max_num_seqs = *max_num_seqs;
             if (max_num_batched_tokens) c.max_num_batched_tokens = *max_num_batched_tokens;
             if (max_model_len) c.max_model_len = *max_model_len;
             if (enable_prefix_caching) c.enable_prefix_caching = *enable_prefix_caching;
             if (batch_invariant) c.batch_invariant = *batch_invariant;
             if (kv_cache_bytes) c.kv_cache_bytes = *kv_cache_bytes;
             if (device) c.device = *device;
             std::unique_ptr<LLM> llm;
             {
               py::gil_scoped_release release;
               auto e = LLM::create(c);
               if (!e) {
                 py::gil_scoped_acquire acquire;
                 raise(e.status());
               }
               llm = std::move(*e);
             }
             return llm;
           }),
           py::arg("model") = py::none(), py::arg("num_threads") = py::none(), py::arg("max_num_seqs") = py::none(),
           py::arg("max_num_batched_tokens") = py::none(), py::arg("max_model_len") = py::none(),
           py::arg("enable_prefix_caching") = py::none(), py::arg("batch_invariant") = py::none(),
           py::arg("kv_cache_bytes") = py::none(), py::arg("device") = py::none())
      .def(
          "generate",
          [](LLM& llm, const py::object& prompts, std::optional<SamplingParams> params) {
            const SamplingParams p = params ? *params : SamplingParams{};
            std::vector<EngineRequest> reqs = to_requests(prompts, p);
            Expected<std::vector<RequestOutput>> outs = make_error(StatusCode::kInternal, "unset");
            {
              py::gil_scoped_release release;
              outs = llm.generate(std::move(reqs));  // all submitted together, outputs in input order
            }
            return unwrap(std::move(outs));
          },
          py::arg("prompts"), py::arg("sampling_params") = py::none())
      .def(
          "stream",
          [](LLM& llm, const py::object& prompt, std::optional<SamplingParams> params) {
            auto reqs = to_requests(prompt, params ? *params : SamplingParams{});
            if (reqs.size() != 1) throw py::value_error("stream takes one prompt");
            return unwrap(llm.stream(std::move(reqs.front())));
          },
          py::arg("prompt"), py::arg("sampling_params") = py::none())
      .def(
          "chat",
          [](LLM& llm, const py::object& messages, std::optional<SamplingParams> params, bool add_generation_prompt) {
            py::module_ json = py::module_::import("json");
            const std::string text = json.attr("dumps")(messages).cast<std::string>();
            auto parsed = nlohmann::json::parse(text, nullptr, false);
            auto msgs = unwrap(ChatEncoder::parse_messages(parsed));
            ChatOptions options;
            options.add_generation_prompt = add_generation_prompt;
            const SamplingParams p = params ? *params : SamplingParams{};
            Expected<RequestOutput> out = make_error(StatusCode::kInternal, "unset");
            {
              py::gil_scoped_release release;
              out = llm.chat(msgs, p, options);
            }
            return unwrap(std::move(out));
          },
          py::arg("messages"), py::arg("sampling_params") = py::none(), py::arg("add_generation_prompt") = true)
      .def("abort", &LLM::abort, py::arg("request_id"))
      .def("encode",
           [](LLM& llm, const std::string& text, bool add_special_tokens) {
             if (llm.tokenizer() == nullptr) throw py::value_error("the model ships no tokenizer");
             EncodeOptions o;
             o.add_special_tokens = add_special_tokens;
             return unwrap(llm.tokenizer()->encode(text, o));
           },
           py::arg("text"), py::arg("add_special_tokens") = false)
      .def("decode",
           [](LLM& llm, const std::vector<int32_t>& ids, bool skip_special_tokens) {
             if (llm.tokenizer() == nullptr) throw py::value_error("the model ships no tokenizer");
             return llm.tokenizer()->decode(ids, skip_special_tokens);
           },
           py::arg("token_ids"), py::arg("skip_special_tokens") = true)
      .def_property_readonly("vocab_size", [](const LLM& llm) { return llm.model().config().vocab_size; });
}
