// CPU prefill and decode throughput on a DeepSeek-shaped model with random weights, each as a
// fraction of this machine's limits measured in the same run: decode against the bytes a
// token must read / read bandwidth, prefill against FLOPs / fp32 FMA peak.
// Usage: cpu_bench [--config bench/configs/deepseek_0p7b.json] [--dtype bf16|f32|fp8]
//                  [--prompt-len 256] [--decode-tokens 32] [--threads 0] [--json OUT]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "io/json_file.h"
#include "machine_limits.h"
#include "model/deepseek/deepseek_cost.h"
#include "model/deepseek/deepseek_random.h"

using namespace deepinfer;

int main(int argc, char** argv) {
  CLI::App app{"DeepInfer CPU benchmark"};
  std::string config_path = std::string(DEEPINFER_BENCH_DIR) + "/configs/deepseek_0p7b.json";
  std::string dtype_name = "bf16", json_out, cache_dir = "/tmp/deepinfer-bench";
  int64_t prompt_len = 256, decode_tokens = 32;
  int threads = 0;
  app.add_option("--config", config_path, "DeepSeek config.json to instantiate with random weights");
  app.add_option("--dtype", dtype_name, "bf16 | f32 | fp8");
  app.add_option("--prompt-len", prompt_len);
  app.add_option("--decode-tokens", decode_tokens);
  app.add_option("--threads", threads);
  app.add_option("--cache-dir", cache_dir, "Where the random checkpoint is written once");
  app.add_option("--json", json_out, "Write the results as JSON here");
  CLI11_PARSE(app, argc, argv);

  auto cfg_json = read_json_file(config_path);
  if (!cfg_json) {
    std::fprintf(stderr, "%s\n", cfg_json.status().to_string().c_str());
    return 1;
  }
  DType dtype = dtype_name == "f32" ? DType::kF32 : dtype_name == "fp8" ? DType::kF8E4M3 : DType::kBF16;
  nlohmann::json cj = *cfg_json;
  if (dtype == DType::kF8E4M3)
    cj["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                 {"weight_block_size", {128, 128}}};
  auto config = parse_deepseek_config(cj);
  if (!config) {
    std::fprintf(stderr, "%s\n", config.status().to_string().c_str());
    return 1;
  }
  const std::string dir = cache_dir + "/" + std::to_string(std::hash<std::string>{}(cj.dump())) + "_" + dtype_name;
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    std::fprintf(stderr, "writing random checkpoint to %s ...\n", dir.c_str());
    Status s = write_random_deepseek_checkpoint(dir, cj, 42, dtype, false);
    if (!s.is_ok()) {
      std::fprintf(stderr, "%s\n", s.to_string().c_str());
      return 1;
    }
  }
  EngineConfig ec;
  ec.model_dir = dir;
  ec.n_threads = threads;
  auto gen = Generator::create(ec);
  if (!gen) {
    std::fprintf(stderr, "%s\n", gen.status().to_string().c_str());
    return 1;
  }
  ThreadPool pool(threads);
  const double bandwidth = bench::measure_read_bandwidth(pool, size_t{1} << 30);
  const double peak = bench::measure_peak_flops(pool);

  auto run = [&](int64_t n_prompt, int64_t n_decode) {
    GenerateRequest r;
    for (int64_t i = 0; i < n_prompt; ++i) r.prompt_ids.push_back(static_cast<int32_t>(2 + (i * 7919) % (config->vocab_size - 2)));
    r.max_tokens = n_decode + 1;  // the first token comes from the prefill
    r.sampler.temperature = 0;
    r.ignore_eos = true;
    auto out = (*gen)->generate({r});
    if (!out) {
      std::fprintf(stderr, "%s\n", out.status().to_string().c_str());
      std::exit(1);
    }
    return out->front();
  };
  run(16, 2);  // warm-up: page in the weights, spin up threads
  const GenerateResult res = run(prompt_len, decode_tokens);

  const DeepseekCost cost = deepseek_cost(*config);
  const double weight_bytes = dtype == DType::kF32 ? 4.0 : dtype == DType::kBF16 ? 2.0 : 1.0;
  // Decode floor: active weights at their stored width (norm vectors and router are negligible)
  // plus the fp32 latent cache read at the mean context of the decode phase.
  const double mean_ctx = static_cast<double>(prompt_len) + static_cast<double>(decode_tokens) / 2.0;
  const double decode_bytes = static_cast<double>(cost.active_params) * weight_bytes +
                              mean_ctx * static_cast<double>(cost.kv_values_per_token) * 4.0;
  const double decode_tps = static_cast<double>(decode_tokens) / res.decode_seconds;
  const double decode_floor_tps = bandwidth / decode_bytes;
  const double prefill_tps = static_cast<double>(prompt_len) / res.prefill_seconds;
  const double prefill_flops = cost.prefill_flops(prompt_len);
  const double prefill_floor_tps = peak / (prefill_flops / static_cast<double>(prompt_len));

  std::printf("model: %s, %s, %.3f B params (%.1f M active per token), threads %d\n", config_path.c_str(),
              dtype_name.c_str(), static_cast<double>(cost.total_params) / 1e9,
              static_cast<double>(cost.active_params) / 1e6, pool.n_threads());
  std::printf("machine: read bandwidth %.2f GB/s, fp32 FMA peak %.1f GFLOP/s\n", bandwidth / 1e9, peak / 1e9);
  std::printf("prefill %lld tokens: %.1f tok/s  (floor %.1f tok/s at peak FLOPs: %.1f%%)\n",
              static_cast<long long>(prompt_len), prefill_tps, prefill_floor_tps, 100.0 * prefill_tps / prefill_floor_tps);
  std::printf("decode %lld tokens: %.2f tok/s  (floor %.2f tok/s at read bandwidth, %.1f MB/token: %.1f%%)\n",
              static_cast<long long>(decode_tokens), decode_tps, decode_floor_tps, decode_bytes / 1e6,
              100.0 * decode_tps / decode_floor_tps);
  if (!json_out.empty()) {
    nlohmann::json j = {{"config", config_path}, {"dtype", dtype_name}, {"threads", pool.n_threads()},
                        {"total_params", cost.total_params}, {"active_params", cost.active_params},
                        {"read_bandwidth_gbps", bandwidth / 1e9}, {"peak_gflops", peak / 1e9},
                        {"prefill_tokens", prompt_len}, {"prefill_tps", prefill_tps},
                        {"prefill_fraction_of_peak", prefill_tps / prefill_floor_tps},
                        {"decode_tokens", decode_tokens}, {"decode_tps", decode_tps},
                        {"decode_bytes_per_token", decode_bytes},
                        {"decode_fraction_of_bandwidth", decode_tps / decode_floor_tps}};
    std::ofstream(json_out) << j.dump(2) << "\n";
  }
  return 0;
}
