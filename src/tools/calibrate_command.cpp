#include "tools/calibrate_command.h"

#include <cstdio>
#include <fstream>

#include "backend/backend.h"
#include "engine/calibrate.h"
#include "engine/engine_config.h"
#include "io/checkpoint.h"

namespace deepinfer {

void CalibrateCommand::add_to(CLI::App& parent) {
  app = parent.add_subcommand("calibrate", "Fit the chunked-prefill cost model cost(q, c) on this machine");
  app->add_option("--model", model_dir, "Model directory (default $DEEPINFER_HF_MODEL_DIR or the demo model)");
  app->add_option("--out", out_path, "Where to write the fitted model (JSON)");
  app->add_option("--max-tokens", max_tokens, "Largest q + c measured")->check(CLI::Range(int64_t{16}, int64_t{1} << 20));
  app->add_option("--threads", threads, "CPU threads (0 = all cores)");
}

int CalibrateCommand::run() const {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "deepinfer: error: %s\n", s.message().c_str());
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  };
  auto env = EngineConfig::from_env();
  if (!env) return fail(env.status());
  const std::string dir = model_dir.empty() ? env->model_dir : model_dir;
  if (dir.empty()) return fail(make_error(StatusCode::kInvalidArgument, "no model given: pass --model DIR"));
  auto checkpoint = Checkpoint::open(dir);
  if (!checkpoint) return fail(checkpoint.status());
  auto model = DeepseekModel::load(*checkpoint);
  if (!model) return fail(model.status());
  auto backend = make_backend(env->device, threads);
  if (!backend) return fail(backend.status());
  if (Status s = (*model)->place(**backend); !s.is_ok()) return fail(s);
  CalibrationOptions options;
  options.max_tokens = max_tokens;
  std::vector<CostSample> samples;
  auto fit = calibrate_chunk_cost(**model, **backend, options, &samples);
  if (!fit) return fail(fit.status());
  nlohmann::json j = fit->to_json();
  j["model_dir"] = dir;
  j["device"] = env->device;
  for (const auto& s : samples) {
    j["samples"].push_back({{"q", s.q}, {"c", s.c}, {"seconds", s.seconds}, {"fitted", fit->cost(s.q, s.c)}});
    std::printf("q=%6.0f c=%6.0f  measured %8.2f ms  fitted %8.2f ms\n", s.q, s.c, s.seconds * 1e3, fit->cost(s.q, s.c) * 1e3);
  }
  std::ofstream f(out_path);
  f << j.dump(2) << "\n";
  if (!f) return fail(make_error(StatusCode::kInvalidArgument, "cannot write '{}'", out_path));
  std::printf("wrote %s: cost(q, c) = %.3g + %.3g q + %.3g q c + %.3g q^2 seconds\n", out_path.c_str(), fit->k0, fit->k1,
              fit->k2, fit->k3);
  return 0;
}

}  // namespace deepinfer
