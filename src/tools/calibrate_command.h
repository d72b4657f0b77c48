// `deepinfer calibrate`: fits the chunked-prefill cost model on this machine for one model and
// writes it as JSON (the file DEEPINFER_CHUNK_COST_MODEL points the engine at).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace deepinfer {

struct CalibrateCommand {
  std::string model_dir;
  std::string out_path = "chunk_cost_model.json";
  int64_t max_tokens = 2048;
  int threads = 0;
  CLI::App* app = nullptr;

  // Registers the subcommand and its flags on `parent`.
  void add_to(CLI::App& parent);
  // Runs it (after parsing, when app->parsed()). Returns the process exit code.
  int run() const;
};

}  // namespace deepinfer
