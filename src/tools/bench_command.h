// `deepinfer bench`: prefill and decode throughput of one model shape with dummy weights, next to
// roofline floors (bench_floors.h) on the card's measured limits (cuda_limits.h); prints a table
// and writes JSON shaped like scripts/bench/torch_peer.py's, so the two engines compare line by
// line (scripts/bench/report.py). Times whole steps with a host clock (host overhead is part of
// the engine); those phases do not schedule or sample. `--serve B` then runs the whole serving
// loop (LLMEngine: scheduler, device sampling) on B requests, synchronous and overlapped, and
// reports the runner's device timeline (busy time, idle gaps between steps).
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace deepinfer {

struct BenchCommand {
  std::string config_path;
  std::string load_format = "dummy";
  std::string device = "cuda";
  std::string dtype = "bf16";
  std::string prefill = "4096,16384";        // prefill lengths (batch 1); empty: none
  std::string decode_batch = "1,32,128,256";  // decode batch sizes; empty: none
  int64_t context = 512;
  int64_t steps = 20;
  int64_t warmup = 3;
  int64_t prefill_reps = 3;
  int64_t block_size = 64;
  int64_t seed = 0;
  int threads = 0;
  bool graphs = true;  // decode steps through CUDA graphs (--no-graphs: eager)
  bool op_times = false;  // per-op device times of one extra step per case
  bool batch_invariant = false;  // --batch-invariant: the DEEPINFER_BATCH_INVARIANT=1 kernels and MLA form
  int64_t serve = 0;   // serving-loop requests (0: no serving phase)
  std::string json_path;
  CLI::App* app = nullptr;

  // Registers the subcommand and its flags on `parent`.
  void add_to(CLI::App& parent);
  // Runs it (after parsing, when app->parsed()). Returns the process exit code: 2 for bad flags
  // or config, 1 when a case failed (the others still run and are written).
  int run() const;
};

}  // namespace deepinfer
