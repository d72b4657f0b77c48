#include "tools/bench_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "engine/llm_engine.h"
#include "io/json_file.h"
#include "kv/paged_kv_cache.h"
#include "model/deepseek/deepseek_cost.h"
#include "model/deepseek/deepseek_model.h"
#include "tools/bench_floors.h"
#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_limits.h"
#endif

namespace deepinfer {
namespace {

using json = nlohmann::ordered_json;  // keys in insertion order, as torch_peer.py writes them
using Clock = std::chrono::steady_clock;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Device memory kept free beside the KV pages for step memory (activations, the FP8
// dequantization copy): a cudaMalloc failure aborts, so pages that would crowd it out are refused.
constexpr int64_t kStepReserveBytes = int64_t{2} << 30;

// "4096,16384" → {4096, 16384}; "" → {} (the phase is skipped). Each value in [1, 2^24].
Expected<std::vector<int64_t>> parse_sizes(const std::string& text, const char* flag) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    const std::string item = text.substr(i, j - i);
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 1 || v > (int64_t{1} << 24))
      return make_error(StatusCode::kInvalidArgument, "{}: '{}' is not a size in [1, 16777216]", flag, item);
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

// The config file, with DeepSeek-V3's FP8 quantization_config added for --dtype fp8 when absent.
Expected<DeepseekConfig> load_config(const std::string& path, bool fp8) {
  auto doc = read_json_file(path);
  if (!doc) return Status(StatusCode::kInvalidArgument, "--config: " + doc.status().message());
  if (!doc->is_object()) return make_error(StatusCode::kInvalidArgument, "--config: '{}' is not a JSON object", path);
  if (fp8 && (!doc->contains("quantization_config") || (*doc)["quantization_config"].is_null())) {
    (*doc)["quantization_config"] = {{"quant_method", "fp8"},
                                     {"fmt", "e4m3"},
                                     {"activation_scheme", "dynamic"},
                                     {"weight_block_size", {128, 128}}};
  }
  auto config = parse_deepseek_config(*doc);
  if (!config) return Status(StatusCode::kInvalidArgument, config.status().with_context(path).message());
  return config;
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n == 0 ? 0.0 : (xs[(n - 1) / 2] + xs[n / 2]) / 2.0;
}

json or_null(std::optional<double> v) { return v ? json(*v) : json(nullptr); }

// Writes `doc` to `path` through a temporary file, so a killed run leaves the last whole file.
Status write_json(const std::string& path, const json& doc) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << doc.dump(2) << "\n";
    if (!f) return make_error(StatusCode::kInvalidArgument, "--json: cannot write '{}'", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return make_error(StatusCode::kInvalidArgument, "--json: cannot write '{}': {}", path, ec.message());
  return Status::ok();
}

// One benchmark run: the model on its backend, the limits, and the cases measured on them.
class BenchRun {
 public:
  BenchRun(const BenchCommand& cmd, const DeepseekModel& model, Backend& backend,
           std::optional<double> copy_bytes_per_s, std::optional<double> flops_per_s,
           std::optional<double> fp8_flops_per_s, DType weight_dtype)
      : cmd_(cmd), model_(model), backend_(backend), copy_bytes_per_s_(copy_bytes_per_s), flops_per_s_(flops_per_s),
        fp8_flops_per_s_(fp8_flops_per_s), weight_dtype_(weight_dtype), rng_(static_cast<uint64_t>(cmd.seed) + 1) {}

  MlaPolicy policy() const { return mla_policy_for(backend_, model_.config(), cmd_.batch_invariant); }

  // Batch 1, n tokens from an empty cache, logits of the last row only; median of
  // --prefill-reps runs after one warm-up run.
  json prefill(int64_t n) {
    const DeepseekConfig& c = model_.config();
    const double flops = prefill_flops(c, n);
    json res = {{"phase", "prefill"}, {"tokens", n}, {"batch", 1}, {"flops", flops}};
    // FP8 checkpoints: the linear layers' FLOPs (2·active_params·n) at the FP8 rate, attention's
    // at the bf16 rate.
    const double linear = 2.0 * static_cast<double>(deepseek_cost(c).active_params) * static_cast<double>(n);
    std::optional<double> floor;
    if (flops_per_s_ && weight_dtype_ == DType::kF8E4M3 && fp8_flops_per_s_)
      floor = floor_ms(linear, *fp8_flops_per_s_) + floor_ms(flops - linear, *flops_per_s_);
    else if (flops_per_s_)
      floor = floor_ms(flops, *flops_per_s_);
    res["floor_ms"] = or_null(floor);
    const int64_t bs = cmd_.block_size, n_blocks = (n + bs - 1) / bs;
    if (Status s = check_kv_fits(n_blocks); !s.is_ok()) return failed(res, s);
    PagedKvCache cache(backend_, model_.kv_layers(), n_blocks, bs, backend_.kv_dtype());
    KvSequence kv;
    kv.block_ids = cache.pool().allocate(n_blocks);
    const std::vector<int32_t> tokens = random_tokens(n);
    std::vector<double> ms_all, enqueue_all;
    for (int64_t r = 0; r < 1 + cmd_.prefill_reps; ++r) {
      double enqueue = 0;
      const double ms = time_step(
          [&] {
            ForwardBatch batch;
            batch.add_sequence(kv, tokens.data(), n, bs);
            batch.logits_rows.push_back(static_cast<int32_t>(n - 1));
            (void)model_.forward(backend_, batch, cache, policy());
          },
          &enqueue);
      if (r >= 1) ms_all.push_back(ms), enqueue_all.push_back(enqueue);
    }
    if (cmd_.op_times) {
      res["op_times"] = timed_ops([&] {
        ForwardBatch batch;
        batch.add_sequence(kv, tokens.data(), n, bs);
        batch.logits_rows.push_back(static_cast<int32_t>(n - 1));
        (void)model_.forward(backend_, batch, cache, policy());
      });
    }
    const double ms = median(ms_all);
    res["ms"] = ms;
    res["enqueue_ms"] = median(enqueue_all);
    res["tok_per_s"] = static_cast<double>(n) / (ms / 1e3);
    res["ratio_to_floor"] = floor ? json(*floor / ms) : json(nullptr);
    res["reps"] = ms_all.size();
    res["ms_all"] = ms_all;
    return res;
  }

  // `batch` sequences holding --context pretend-cached tokens each (their KV contents do not
  // matter for timing); --warmup + --steps single-token steps, each sequence growing by one
  // token per step; median ms of the timed steps.
  json decode(int64_t batch) {
    const DeepseekConfig& c = model_.config();
    const int64_t kv_value_bytes = static_cast<int64_t>(dtype_size(backend_.kv_dtype()));
    const double kv_tokens = mean_kv_tokens(cmd_.context, cmd_.warmup, cmd_.steps);
    const double nbytes = decode_bytes(c, batch, kv_tokens, weight_dtype_, kv_value_bytes);
    json res = {{"phase", "decode"},        {"batch", batch},         {"context", cmd_.context},
                {"bytes", nbytes},          {"kv_tokens", kv_tokens}, {"distinct_experts", expected_distinct_experts(c, batch)},
                {"kv_value_bytes", kv_value_bytes}};
    const std::optional<double> floor =
        copy_bytes_per_s_ ? std::optional<double>(floor_ms(nbytes, *copy_bytes_per_s_)) : std::nullopt;
    res["floor_ms"] = or_null(floor);
    const int64_t bs = cmd_.block_size;
    const int64_t blocks_per_seq = (cmd_.context + cmd_.warmup + cmd_.steps + bs - 1) / bs;
    if (Status s = check_kv_fits(batch * blocks_per_seq); !s.is_ok()) return failed(res, s);
    PagedKvCache cache(backend_, model_.kv_layers(), batch * blocks_per_seq, bs, backend_.kv_dtype());
    std::vector<KvSequence> seqs(static_cast<size_t>(batch));
    for (KvSequence& kv : seqs) {
      kv.block_ids = cache.pool().allocate(blocks_per_seq);
      kv.n_tokens = cmd_.context;
    }
    std::vector<double> ms_all, enqueue_all;
    DecodeGraphs graphs;  // decode steps replay a CUDA graph after the first two (warm-up)
    for (int64_t i = 0; i < cmd_.warmup + cmd_.steps; ++i) {
      const std::vector<int32_t> tokens = random_tokens(batch);
      double enqueue = 0;
      const double ms = time_step(
          [&] {
            ForwardBatch step;
            for (int64_t b = 0; b < batch; ++b) {
              step.add_sequence(seqs[static_cast<size_t>(b)], &tokens[static_cast<size_t>(b)], 1, bs,
                                /*is_generated=*/true);
              step.logits_rows.push_back(static_cast<int32_t>(b));
            }
            (void)model_.forward(backend_, step, cache, policy(), cmd_.graphs ? &graphs : nullptr);
          },
          &enqueue);
      for (KvSequence& kv : seqs) kv.n_tokens += 1;
      if (i >= cmd_.warmup) ms_all.push_back(ms), enqueue_all.push_back(enqueue);
    }
    if (cmd_.op_times) {  // one more step, eager, each op between two events
      const std::vector<int32_t> tokens = random_tokens(batch);
      res["op_times"] = timed_ops([&] {
        ForwardBatch step;
        for (int64_t b = 0; b < batch; ++b) {
          const size_t k = static_cast<size_t>(b);
          step.add_sequence(seqs[k], &tokens[k], 1, bs, /*is_generated=*/true);
          step.logits_rows.push_back(static_cast<int32_t>(b));
        }
        (void)model_.forward(backend_, step, cache, policy(), nullptr);
      });
    }
    const double ms = median(ms_all);
    res["ms_per_step"] = ms;
    res["enqueue_ms"] = median(enqueue_all);
    res["tok_per_s"] = static_cast<double>(batch) / (ms / 1e3);
    res["ratio_to_floor"] = floor ? json(*floor / ms) : json(nullptr);
    res["steps"] = ms_all.size();
    res["cuda_graph_replays"] = graphs.n_replays;
    res["warmup_steps"] = cmd_.warmup;
    res["ms_all"] = ms_all;
    return res;
  }

 private:
  // One untimed step with op timing on: device ms per op kind, largest first (printed too).
  template <typename Step>
  json timed_ops(Step&& step) {
    backend_.set_op_timing(true);
    backend_.synchronize();
    (void)backend_.take_op_times();
    step();
    const std::vector<OpTime> times = backend_.take_op_times();
    backend_.set_op_timing(false);
    json out = json::array();
    double total = 0;
    for (const OpTime& t : times) total += t.ms;
    std::printf("  op times (one eager step, %.3f ms in ops):\n", total);
    for (const OpTime& t : times) {
      out.push_back({{"op", t.op}, {"calls", t.calls}, {"ms", t.ms}});
      if (t.ms >= 0.01 * total) std::printf("    %-32s %5lld calls %9.3f ms  %5.1f %%\n", t.op.c_str(),
                                            static_cast<long long>(t.calls), t.ms, 100.0 * t.ms / total);
    }
    return out;
  }

  // Wall time of one step in ms, from an idle device to a finished step (host work included).
  // `enqueue_ms` (optional): the host's share — until the step's call returned, its work queued.
  // Near the wall time, the host (launches, waits inside the step) bounds the step, not the GPU.
  template <typename Step>
  double time_step(Step&& step, double* enqueue_ms = nullptr) {
    backend_.synchronize();
    const auto t0 = Clock::now();
    step();
    const auto t1 = Clock::now();
    backend_.synchronize();
    if (enqueue_ms != nullptr) *enqueue_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }

  // Ok when n_blocks KV pages fit in free device memory beside kStepReserveBytes (host backends: always).
  Status check_kv_fits(int64_t n_blocks) const {
    const auto [free_bytes, total_bytes] = backend_.memory_info();
    if (total_bytes == 0) return Status::ok();
    const int64_t need =
        n_blocks * PagedKvCache::bytes_per_block(model_.kv_layers(), cmd_.block_size, backend_.kv_dtype());
    if (need + kStepReserveBytes <= free_bytes) return Status::ok();
    return make_error(StatusCode::kResourceExhausted,
                      "not enough device memory for the KV pages: {} pages need {:.2f} GiB (+ {:.0f} GiB kept for "
                      "step memory), {:.2f} GiB free after the weights",
                      n_blocks, static_cast<double>(need) / kGiB, static_cast<double>(kStepReserveBytes) / kGiB,
                      static_cast<double>(free_bytes) / kGiB);
  }

  json failed(json res, const Status& s) {
    res["error"] = s.message();
    return res;
  }

  std::vector<int32_t> random_tokens(int64_t n) {
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(model_.config().vocab_size - 1));
    std::vector<int32_t> out(static_cast<size_t>(n));
    for (int32_t& t : out) t = pick(rng_);
    return out;
  }

  const BenchCommand& cmd_;
  const DeepseekModel& model_;
  Backend& backend_;
  std::optional<double> copy_bytes_per_s_, flops_per_s_, fp8_flops_per_s_;
  DType weight_dtype_;
  std::mt19937_64 rng_;
};

std::string fmt_or_dash(const json& v, const char* format) {
  if (!v.is_number()) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v.get<double>());
  return buf;
}

void print_row(const json& r) {
  const bool prefill = r["phase"] == "prefill";
  const json ms = prefill ? r.value("ms", json()) : r.value("ms_per_step", json());
  std::printf("%-8s %6lld %6s %10s %11s %9s %7s  %s\n", r["phase"].get<std::string>().c_str(),
              static_cast<long long>(prefill ? r["tokens"].get<int64_t>() : r["batch"].get<int64_t>()),
              prefill ? "-" : std::to_string(r["context"].get<int64_t>()).c_str(), fmt_or_dash(ms, "%.2f").c_str(),
              fmt_or_dash(r.value("tok_per_s", json()), "%.1f").c_str(),
              fmt_or_dash(r.value("floor_ms", json()), "%.3f").c_str(),
              fmt_or_dash(r.value("ratio_to_floor", json()), "%.3f").c_str(), r.value("error", "").c_str());
  std::fflush(stdout);
}

}  // namespace

void BenchCommand::add_to(CLI::App& parent) {
  app = parent.add_subcommand("bench", "Prefill and decode throughput against roofline floors (dummy weights)");
  app->add_option("--config", config_path, "Model config.json")->required();
  app->add_option("--load-format", load_format, "Where the weights come from")->check(CLI::IsMember({"dummy"}));
  app->add_option("--device", device, "cuda | cpu");
  app->add_option("--dtype", dtype, "Weight dtype: bf16 | fp8 (e4m3, 128x128 blocks)")->check(CLI::IsMember({"bf16", "fp8"}));
  app->add_option("--prefill", prefill, "Comma-separated prefill lengths, batch 1 (empty: none)");
  app->add_option("--decode-batch", decode_batch, "Comma-separated decode batch sizes (empty: none)");
  app->add_option("--context", context, "Cached tokens per sequence before the decode steps")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app->add_option("--steps", steps, "Timed decode steps")->check(CLI::Range(int64_t{1}, int64_t{100000}));
  app->add_option("--warmup", warmup, "Untimed decode steps before the timed ones")
      ->check(CLI::Range(int64_t{0}, int64_t{100000}));
  app->add_option("--prefill-reps", prefill_reps, "Timed prefill runs per length (after one warm-up run)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  app->add_option("--block-size", block_size, "KV page size in tokens")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app->add_option("--seed", seed, "Seed of the dummy weights and token ids")->check(CLI::NonNegativeNumber);
  app->add_option("--threads", threads, "CPU threads for --device cpu (0 = all cores)");
  app->add_flag("--op-times", op_times,
                "After each case, one more step with every op timed by device events (printed, and in the JSON)");
  app->add_flag("!--no-graphs", graphs, "Decode without CUDA graphs (every kernel launched by the host)");
  app->add_flag("--batch-invariant", batch_invariant,
                "Measure the batch-invariant mode (DEEPINFER_BATCH_INVARIANT=1: invariant kernels, absorbed MLA)");
  app->add_option("--serve", serve,
                  "Serving-loop phase: this many requests of --context random prompt tokens, --steps greedy tokens "
                  "each, through the engine synchronous then overlapped (0: skip)")
      ->check(CLI::Range(int64_t{0}, int64_t{4096}));
  app->add_option("--json", json_path, "Write the results here (rewritten after every case)");
}

int BenchCommand::run() const {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "deepinfer: error: %s\n", s.message().c_str());
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  };
  const auto t_start = Clock::now();
  auto prefill_sizes = parse_sizes(prefill, "--prefill");
  if (!prefill_sizes) return fail(prefill_sizes.status());
  auto batch_sizes = parse_sizes(decode_batch, "--decode-batch");
  if (!batch_sizes) return fail(batch_sizes.status());
  const bool fp8 = dtype == "fp8";
  auto config = load_config(config_path, fp8);
  if (!config) return fail(config.status());
  const int64_t max_pos = config->max_position_embeddings;
  for (int64_t n : *prefill_sizes)
    if (n > max_pos)
      return fail(make_error(StatusCode::kInvalidArgument, "--prefill {} exceeds max_position_embeddings {}", n, max_pos));
  if (!batch_sizes->empty() && context + warmup + steps > max_pos)
    return fail(make_error(StatusCode::kInvalidArgument,
                           "--context + --warmup + --steps = {} exceeds max_position_embeddings {}",
                           context + warmup + steps, max_pos));

  auto backend_or = make_backend(device, threads);
  if (!backend_or) return fail(Status(StatusCode::kInvalidArgument, "--device: " + backend_or.status().message()));
  Backend& backend = **backend_or;
  backend.set_batch_invariant(batch_invariant);

  // Limits first, on an empty device (they need ~4.4 GiB for a moment).
  std::optional<double> copy_bytes_per_s, flops_per_s, fp8_flops_per_s;
  std::string gpu = "none (" + backend.name() + " backend)";
#ifdef DEEPINFER_HAVE_CUDA
  if (backend.device().kind == DeviceKind::kCuda) {
    const DeviceLimits limits = measure_device_limits(backend);
    copy_bytes_per_s = limits.copy_bytes_per_s;
    flops_per_s = limits.bf16_flops_per_s;
    if (limits.fp8_flops_per_s > 0.0) fp8_flops_per_s = limits.fp8_flops_per_s;
    gpu = limits.gpu_name;
    std::printf("limits: copy %.3f TB/s (read+write), bf16 GEMM %.1f TFLOP/s, FP8 GEMM %.1f TFLOP/s on %s\n",
                *copy_bytes_per_s / 1e12, *flops_per_s / 1e12, limits.fp8_flops_per_s / 1e12, gpu.c_str());
  }
#endif

  const DType weight_dtype = fp8 ? DType::kF8E4M3 : DType::kBF16;
  const auto free_before = backend.memory_info().first;
  const auto t_build = Clock::now();
  auto model = DeepseekModel::dummy(*config, backend, weight_dtype, static_cast<uint64_t>(seed));
  backend.synchronize();
  const double build_s = std::chrono::duration<double>(Clock::now() - t_build).count();
  const DeepseekCost cost = deepseek_cost(model->config());
  const int64_t kv_value_bytes = static_cast<int64_t>(dtype_size(backend.kv_dtype()));
  std::printf("model: %.4g B params (%.4g B active per token), %s weights, built in %.1f s; decode B=1 reads %.3f GB "
              "of weights, KV %lld B/token\n",
              static_cast<double>(cost.total_params) / 1e9, static_cast<double>(cost.active_params) / 1e9,
              dtype.c_str(), build_s, decode_weight_bytes(model->config(), 1, weight_dtype) / 1e9,
              static_cast<long long>(kv_bytes_per_token(model->config(), kv_value_bytes)));

  json doc = {
      {"engine", "deepinfer"},
      {"gpu", gpu},
      {"config", config_path},
      {"dtype", dtype},
      {"device", device},
      {"load_format", load_format},
      {"limits",
       {{"copy_bytes_per_s", or_null(copy_bytes_per_s)},
        {"bf16_flops_per_s", or_null(flops_per_s)},
        {"fp8_flops_per_s", or_null(fp8_flops_per_s)}}},
      {"model",
       {{"total_params", cost.total_params},
        {"active_params", cost.active_params},
        {"decode_weight_bytes_b1", decode_weight_bytes(model->config(), 1, weight_dtype)},
        {"kv_bytes_per_token", kv_bytes_per_token(model->config(), kv_value_bytes)},
        {"build_s", build_s},
        {"weights_gib", static_cast<double>(free_before - backend.memory_info().first) / kGiB}}},
      {"settings",
       {{"prefill", *prefill_sizes}, {"decode_batch", *batch_sizes}, {"context", context}, {"steps", steps},
        {"warmup", warmup}, {"prefill_reps", prefill_reps}, {"prefill_warmup", 1}, {"block_size", block_size},
        {"seed", seed}, {"threads", threads}, {"batch_invariant", batch_invariant},
        {"mla_policy", mla_policy_name(mla_policy_for(backend, model->config(), batch_invariant))}}},
      {"floor_definitions",
       {{"decode", "floor_ms = bytes / limits.copy_bytes_per_s: weights read per step (attention, dense FFN, router, "
                   "shared experts, norms, lm_head, and per MoE layer E*(1-(1-k/E)^B) distinct routed experts; bf16 "
                   "2 B/param, fp8 linears 1 B/element + fp32 scale per 128x128 block, norms/router/lm_head bf16) + "
                   "B*kv_tokens*kv_latent_dim*kv_value_bytes*layers; kv_tokens = mean tokens attended over the timed "
                   "steps"},
        {"prefill", "floor_ms = flops / limits.bf16_flops_per_s: 2*active_params*N + "
                    "2*N(N+1)/2*layers*heads*(qk_head_dim+v_head_dim)"},
        {"prefill_rate", fp8 ? "fp8 weights: 2*active_params*N / limits.fp8_flops_per_s + the attention term / "
                               "limits.bf16_flops_per_s (bf16_flops_per_s for all when no FP8 rate was measured)"
                             : "bf16_flops_per_s"},
        {"ratio_to_floor", "floor_ms / measured ms (1.0 = at the floor)"},
        {"timing", "host steady clock around each step, device synchronized before and after (host overhead "
                   "included); no sampling; enqueue_ms: host time until the step's call returned (its work queued)"}}},
      {"results", json::array()},
      {"finished", false},
  };
  auto emit = [&]() -> Status {
    doc["wall_s"] = std::chrono::duration<double>(Clock::now() - t_start).count();
    return json_path.empty() ? Status::ok() : write_json(json_path, doc);
  };
  if (Status s = emit(); !s.is_ok()) return fail(s);

  std::printf("%-8s %6s %6s %10s %11s %9s %7s  note\n", "phase", "N/B", "ctx", "ms", "tok/s", "floor_ms", "ratio");
  BenchRun bench(*this, *model, backend, copy_bytes_per_s, flops_per_s, fp8_flops_per_s, weight_dtype);
  int n_failed = 0;
  auto record = [&](const json& res, const std::string& label) -> Status {
    doc["results"].push_back(res);
    print_row(res);
    if (res.contains("error")) {
      ++n_failed;
      std::fprintf(stderr, "deepinfer: error: %s: %s\n", label.c_str(), res["error"].get<std::string>().c_str());
    }
    return emit();
  };
  for (int64_t n : *prefill_sizes)
    if (Status s = record(bench.prefill(n), fmt::format("prefill {}", n)); !s.is_ok()) return fail(s);
  for (int64_t b : *batch_sizes)
    if (Status s = record(bench.decode(b), fmt::format("decode B={}", b)); !s.is_ok()) return fail(s);
  if (serve > 0) {
    // The engine takes the model and the backend; the phases above are done with them.
    const DeepseekConfig model_config = model->config();
    EngineConfig ec;
    ec.device = device;
    ec.kv_block_size = block_size;
    ec.max_num_seqs = std::max<int64_t>(serve, 1);
    ec.cuda_graphs = graphs;
    ec.batch_invariant = batch_invariant;
    const int64_t per_seq = (context + steps + block_size - 1) / block_size;
    ec.num_kv_blocks = serve * per_seq + 1;
    const int64_t kv_need = ec.num_kv_blocks * PagedKvCache::bytes_per_block(model->kv_layers(), block_size,
                                                                              backend.kv_dtype());
    const auto [free_bytes, total_bytes] = backend.memory_info();
    json res = {{"phase", "serve"}, {"requests", serve}, {"context", context}, {"tokens_per_request", steps}};
    if (total_bytes > 0 && kv_need + kStepReserveBytes > free_bytes) {
      res["error"] = fmt::format("--serve {}: the KV pages need {:.2f} GiB, {:.2f} GiB free", serve,
                                 static_cast<double>(kv_need) / kGiB, static_cast<double>(free_bytes) / kGiB);
    } else {
      LLMEngine engine(ec, std::move(model), std::move(*backend_or));
      std::mt19937_64 rng(static_cast<uint64_t>(seed) + 7);
      for (bool overlap : {false, true}) {
        engine.set_overlap(overlap);
        for (int64_t i = 0; i < serve; ++i) {
          EngineRequest r;
          r.request_id = fmt::format("{}-{}", overlap ? "o" : "s", i);
          for (int64_t t = 0; t < context; ++t)
            r.prompt_ids.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(model_config.vocab_size)));
          r.params.temperature = 0.0f;
          r.params.max_tokens = steps;
          r.params.ignore_eos = true;
          if (auto id = engine.add_request(std::move(r)); !id) return fail(id.status());
        }
        const ModelRunner::Timeline before = dynamic_cast<ModelRunner&>(engine.executor()).timeline();
        int64_t n_out = 0, n_engine_steps = 0;
        const auto t0 = Clock::now();
        while (engine.has_unfinished()) {
          ++n_engine_steps;
          for (const RequestOutput& o : engine.step())
            if (o.finished) n_out += static_cast<int64_t>(o.outputs[0].token_ids.size());
        }
        const double wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        const ModelRunner::Timeline after = dynamic_cast<ModelRunner&>(engine.executor()).timeline();
        const int64_t n_dev = after.n_steps - before.n_steps;
        const json run = {{"wall_ms", wall_ms},
                          {"output_tokens", n_out},
                          {"output_tok_s", static_cast<double>(n_out) / (wall_ms / 1000.0)},
                          {"device_steps", n_dev},
                          {"launched_while_one_ran", after.n_overlapped - before.n_overlapped},
                          {"busy_ms", after.busy_ms - before.busy_ms},
                          {"idle_ms", after.idle_ms - before.idle_ms},
                          {"idle_ms_per_step", (after.idle_ms - before.idle_ms) / static_cast<double>(std::max<int64_t>(n_dev, 1))}};
        res[overlap ? "overlapped" : "synchronous"] = run;
        std::printf("serve    %6lld %6lld  %s: %lld tokens in %.1f ms (%.0f tok/s), %lld device steps (%lld launched "
                    "while one ran), busy %.1f ms, idle %.2f ms (%.3f ms/step)\n",
                    static_cast<long long>(serve), static_cast<long long>(context), overlap ? "overlapped " : "synchronous",
                    static_cast<long long>(n_out), wall_ms, run["output_tok_s"].get<double>(), static_cast<long long>(n_dev),
                    static_cast<long long>(run["launched_while_one_ran"].get<int64_t>()), run["busy_ms"].get<double>(),
                    run["idle_ms"].get<double>(), run["idle_ms_per_step"].get<double>());
      }
    }
    doc["results"].push_back(res);
    if (res.contains("error")) {
      ++n_failed;
      std::fprintf(stderr, "deepinfer: error: %s\n", res["error"].get<std::string>().c_str());
    }
  }
  doc["finished"] = true;
  if (Status s = emit(); !s.is_ok()) return fail(s);
  if (!json_path.empty()) std::printf("wrote %s\n", json_path.c_str());
  return n_failed == 0 ? 0 : 1;
}

}  // namespace deepinfer
