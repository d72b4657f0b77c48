// FP8 block-scaled GEMM (cuda_fp8_gemm.cu) at DeepSeek V2-Lite and V3 shapes: dense projections
// and the grouped routed-expert GEMMs, one JSON line per (shape, M) on stdout.
// Figures: TFLOP/s (2·M·N·K per GEMM; grouped: 2·rows·N·K over the routed rows) and GB/s of weight
// bytes read (dense N·K; grouped: the experts with rows), the latter against a device-to-device
// copy rate measured in the same run (bytes read + written). Timing: CUDA events around replays of
// a CUDA graph holding a batch of launches (a batch lasts ≥ ~1 ms), warm-up first, the median of
// --reps replays. Weights smaller
// than 2× L2 are rotated through enough copies that each launch reads them from HBM.
// Does not check results (tests/backend/cuda_fp8_gemm_test.cpp does). Usage:
//   fp8_gemm_bench [--model v2lite|v3|all] [--m 1,16,64,256,1024,4096,16384] [--variants -1,2,3] [--reps 9]
//                  [--grouped-only | --dense-only] [--clusters 0,1,2] [--row-scales] [--mma-idle] [--stagger]
//                  [--balanced] [--wide-tails] [--n192] [--gather] [--model-form] [--names a,b]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/cuda/cuda_common.h"
#include "cuda_timing.h"

using namespace deepinfer::cuda;
using deepinfer::bench::copy_rate;
using deepinfer::bench::Dev;
using deepinfer::bench::l2_bytes;
using deepinfer::bench::parse_list;
using deepinfer::bench::time_launches;

namespace {

struct DenseShape {
  const char* model;
  const char* name;
  int64_t N, K;
};
struct ExpertShape {
  const char* model;
  const char* name;
  int64_t E, top_k, N, K;
};

const DenseShape kDense[] = {
    {"v2lite", "q_proj", 3072, 2048},        {"v2lite", "kv_a_proj", 576, 2048},
    {"v2lite", "o_proj", 2048, 2048},        {"v2lite", "shared_gate_up", 2816, 2048},
    {"v2lite", "shared_down", 2048, 1408},   {"v2lite", "kv_b_proj", 4096, 512},
    {"v2lite", "dense_gate_up", 21888, 2048}, {"v2lite", "dense_down", 2048, 10944},
    // The model's stacked forms: q_proj | kv_a in one GEMM, the two shared experts' gate | up and
    // down (intermediate 2 × 1,408).
    {"v2lite", "q_kv_a", 3648, 2048},        {"v2lite", "shared2_gate_up", 5632, 2048},
    {"v2lite", "shared2_down", 2048, 2816},
    {"v3", "q_a_proj", 1536, 7168},
    {"v3", "q_b_proj", 24576, 1536},         {"v3", "kv_a_proj", 576, 7168},
    {"v3", "o_proj", 7168, 16384},
};
const ExpertShape kExperts[] = {
    {"v2lite", "experts_gate_up", 64, 6, 2816, 2048},
    {"v2lite", "experts_down", 64, 6, 2048, 1408},
    {"v3", "experts_gate_up", 256, 8, 4096, 7168},
    {"v3", "experts_down", 256, 8, 7168, 2048},
};

// Split-K workspace: one buffer grown on the host before timing (alloc must not grow it then).
struct Workspace {
  std::unique_ptr<Dev> buf;
  size_t bytes = 0;
  static void* alloc(void* ctx, size_t n) {
    auto* w = static_cast<Workspace*>(ctx);
    DI_CUDA_REQUIRE(n <= w->bytes);
    return w->buf->p;
  }
  void reserve(size_t n) {
    if (n <= bytes) return;
    buf.reset();
    buf = std::make_unique<Dev>(n);
    bytes = n;
  }
};

// Random e4m3 (N(0,1) rounded) and positive scales, all on the device.
void fill_fp8(void* p, int64_t n, uint64_t seed, cudaStream_t s) { fill_random(p, Elem::kF8, n, seed, true, 1.0f, 0, s); }
void fill_scales(void* p, int64_t n, uint64_t seed, cudaStream_t s) {
  fill_random(p, Elem::kF32, n, seed, false, 0.5f / 64, 2.0f / 64, s);
}

struct Result {
  std::string kernel, model, name;
  int64_t M, N, K, E = 0, top_k = 0, rows = 0, active_experts = 0;
  int variant = 0, cluster = 0;
  int64_t splits = 1;
  double seconds, flops, weight_bytes, copy_bps;
};

void print(const Result& r) {
  const double tflops = r.flops / r.seconds * 1e-12, wgbps = r.weight_bytes / r.seconds * 1e-9;
  std::printf(
      "{\"kernel\": \"%s\", \"model\": \"%s\", \"name\": \"%s\", \"M\": %ld, \"N\": %ld, \"K\": %ld, \"E\": %ld, "
      "\"top_k\": %ld, \"rows\": %ld, \"active_experts\": %ld, \"variant\": %d, \"cluster\": %d, \"splits\": %ld, "
      "\"us\": %.2f, "
      "\"tflops\": %.1f, \"weight_gbps\": %.1f, \"copy_gbps\": %.1f, \"weight_frac_of_copy\": %.3f}\n",
      r.kernel.c_str(), r.model.c_str(), r.name.c_str(), static_cast<long>(r.M), static_cast<long>(r.N),
      static_cast<long>(r.K), static_cast<long>(r.E), static_cast<long>(r.top_k), static_cast<long>(r.rows),
      static_cast<long>(r.active_experts), r.variant, r.cluster, static_cast<long>(r.splits), r.seconds * 1e6, tflops,
      wgbps, r.copy_bps * 1e-9, wgbps / (r.copy_bps * 1e-9));
  std::fflush(stdout);
}

// row_scales: per-row weight scales (block_n = 1) and fp32 output instead of the checkpoint's
// 128×128 blocks and bf16. model_form (with row_scales): those per-row scales uniform within
// 128-row blocks and the weights placed before the launch (w_scale_uniform, w_stable) — what
// CudaBackend::fp8_gemm_w8a8 runs for the model's dense linears.
Result bench_dense(const DenseShape& d, int64_t M, int variant, int cluster, bool row_scales, bool model_form,
                   int reps, double copy_bps, Workspace& ws, cudaStream_t s) {
  const int64_t n_kb = (d.K + 127) / 128, sw_rows = row_scales ? d.N : (d.N + 127) / 128;
  const int64_t w_bytes = d.N * d.K;
  const int copies = static_cast<int>(std::clamp<int64_t>((2 * l2_bytes() + w_bytes - 1) / w_bytes, 1, 64));
  Dev a(static_cast<size_t>(M * d.K)), sa(static_cast<size_t>(M * n_kb) * 4),
      w(static_cast<size_t>(w_bytes) * copies), sw(static_cast<size_t>(sw_rows * n_kb) * 4 * copies),
      c(static_cast<size_t>(M * d.N) * (row_scales ? 4 : 2));
  fill_fp8(a.p, M * d.K, 1, s);
  fill_scales(sa.p, M * n_kb, 2, s);
  fill_fp8(w.p, w_bytes * copies, 3, s);
  fill_scales(sw.p, sw_rows * n_kb * copies, 4, s);
  Fp8GemmArgs args;
  args.a = static_cast<const uint8_t*>(a.p);
  args.a_scale = static_cast<const float*>(sa.p);
  args.M = M, args.N = d.N, args.K = d.K, args.block_n = row_scales ? 1 : 128;
  args.c = c.p, args.c_elem = row_scales ? Elem::kF32 : Elem::kBF16, args.ldc = d.N;
  args.variant = variant;
  args.cluster = cluster;
  args.w_scale_uniform = row_scales && model_form;  // fill_scales' values need not be uniform: timing only
  args.w_stable = row_scales && model_form;
  const Fp8GemmPlan plan = fp8_gemm_plan(args);
  ws.reserve(plan.workspace_bytes);
  const double t = time_launches(
      [&](int i) {
        Fp8GemmArgs x = args;
        x.w = static_cast<const uint8_t*>(w.p) + static_cast<size_t>(i % copies) * static_cast<size_t>(w_bytes);
        x.w_scale = static_cast<const float*>(sw.p) + static_cast<size_t>(i % copies) * (sw_rows * n_kb);
        fp8_gemm(x, Workspace::alloc, &ws, s);
      },
      reps, s);
  Result r{row_scales ? (model_form ? "deepinfer_fp8_gemm_model_form" : "deepinfer_fp8_gemm_rowscales")
                      : "deepinfer_fp8_gemm",
           d.model, d.name, M, d.N, d.K};
  r.variant = plan.variant;
  r.cluster = cluster;
  r.splits = plan.splits;
  r.seconds = t;
  r.flops = 2.0 * static_cast<double>(M) * static_cast<double>(d.N) * static_cast<double>(d.K);
  r.weight_bytes = static_cast<double>(w_bytes);
  r.copy_bps = copy_bps;
  return r;
}

// row_scales: the model's MoE form (per-row weight scales, block_n = 1, fp32 output) instead of
// the checkpoint's 128×128 blocks and bf16.
// idle_skip: Fp8GemmArgs::idle_skip (off: the kernel name ends in "_mma_idle"); stagger:
// Fp8GemmArgs::stagger (on: "_stagger"). balanced: every expert T·top_k / E rows (the remainder
// one more each for the first experts: "_balanced") instead of random routing — at T = 4,096 on
// V2-Lite 384 rows, three whole 128-row tiles: the grouped form without partial tiles, for the
// A/B against random routing's tails. wide_tails: Fp8GemmArgs::narrow_tails off ("_wide_tails");
// n192: Fp8GemmArgs::n192, 128 × 192 tiles ("_n192"). gather: Fp8GemmArgs::a_rows ("_gather") —
// A is the T tokens' rows, each expert's slots reading its tokens' rows (token order, as the
// MoE's sort lists them) through the index, instead of the R gathered rows in slot order (what
// the MoE's gather pass writes; that pass is not timed here: the model's A/B is the figure).
Result bench_grouped(const ExpertShape& x, int64_t T, int variant, int cluster, bool row_scales, bool idle_skip,
                     bool stagger, bool balanced, bool wide_tails, bool n192, bool gather, int reps, double copy_bps,
                     cudaStream_t s) {
  // Uniform random routing: each token picks top_k distinct experts.
  std::mt19937 rng(42);
  std::vector<int32_t> counts(static_cast<size_t>(x.E), 0);
  std::vector<int32_t> perm(static_cast<size_t>(x.E));
  std::vector<std::vector<int32_t>> slots(static_cast<size_t>(x.E));  // each expert's entries t·top_k + j
  for (int64_t e = 0; balanced && e < x.E; ++e) {
    counts[static_cast<size_t>(e)] = static_cast<int32_t>(T * x.top_k / x.E + (e < T * x.top_k % x.E ? 1 : 0));
    for (int32_t i = 0; i < counts[static_cast<size_t>(e)]; ++i)  // spread over the tokens
      slots[static_cast<size_t>(e)].push_back(static_cast<int32_t>((e + i * x.E) % (T * x.top_k)));
  }
  for (int64_t t = 0; !balanced && t < T; ++t) {
    for (int64_t e = 0; e < x.E; ++e) perm[static_cast<size_t>(e)] = static_cast<int32_t>(e);
    for (int64_t j = 0; j < x.top_k; ++j) {
      std::uniform_int_distribution<int64_t> pick(j, x.E - 1);
      std::swap(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(pick(rng))]);
      ++counts[static_cast<size_t>(perm[static_cast<size_t>(j)])];
      slots[static_cast<size_t>(perm[static_cast<size_t>(j)])].push_back(static_cast<int32_t>(t * x.top_k + j));
    }
  }
  std::vector<int32_t> a_rows;
  for (const auto& list : slots) a_rows.insert(a_rows.end(), list.begin(), list.end());
  std::vector<int32_t> offsets(static_cast<size_t>(x.E + 1), 0);
  int64_t active = 0;
  for (int64_t e = 0; e < x.E; ++e) {
    offsets[static_cast<size_t>(e + 1)] = offsets[static_cast<size_t>(e)] + counts[static_cast<size_t>(e)];
    active += counts[static_cast<size_t>(e)] > 0;
  }
  const int64_t R = T * x.top_k, n_kb = (x.K + 127) / 128, sw_rows = row_scales ? x.N : (x.N + 127) / 128;
  Dev a(static_cast<size_t>(R * x.K)), sa(static_cast<size_t>(R * n_kb) * 4),
      w(static_cast<size_t>(x.E * x.N * x.K)), sw(static_cast<size_t>(x.E * sw_rows * n_kb) * 4),
      c(static_cast<size_t>(R * x.N) * (row_scales ? 4 : 2)), off(offsets.size() * 4), rows(a_rows.size() * 4 + 4);
  fill_fp8(a.p, R * x.K, 5, s);
  fill_scales(sa.p, R * n_kb, 6, s);
  fill_fp8(w.p, x.E * x.N * x.K, 7, s);
  fill_scales(sw.p, x.E * sw_rows * n_kb, 8, s);
  DI_CUDA_CHECK(cudaMemcpyAsync(off.p, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice, s));
  DI_CUDA_CHECK(cudaMemcpyAsync(rows.p, a_rows.data(), a_rows.size() * 4, cudaMemcpyHostToDevice, s));
  Fp8GemmArgs args;
  args.a = static_cast<const uint8_t*>(a.p);
  args.a_scale = static_cast<const float*>(sa.p);
  args.w = static_cast<const uint8_t*>(w.p);
  args.w_scale = static_cast<const float*>(sw.p);
  args.M = R, args.N = x.N, args.K = x.K, args.block_n = row_scales ? 1 : 128;
  args.c = c.p, args.c_elem = row_scales ? Elem::kF32 : Elem::kBF16, args.ldc = x.N;
  args.offsets = static_cast<const int32_t*>(off.p), args.E = x.E;
  args.variant = variant;
  args.cluster = cluster;
  args.idle_skip = idle_skip;
  args.stagger = stagger;
  args.narrow_tails = !wide_tails;
  args.n192 = n192;
  if (gather) {  // A: the first T rows of `a` (the tokens'), through the slots' entries
    args.a_rows = static_cast<const int32_t*>(rows.p), args.a_row_div = static_cast<int32_t>(x.top_k);
    args.a_src_rows = T;
    if (!fp8_wgmma_gather_ok(args) || fp8_grouped_gemm_variant(args) != 3) {
      std::fprintf(stderr, "fp8_gemm_bench: --gather needs the wgmma form, bf16 block scales, cluster <= 1\n");
      std::exit(2);
    }
  }
  const double t = time_launches([&](int) { fp8_grouped_gemm(args, s); }, reps, s);
  static const std::string names[2][2] = {
      {"deepinfer_fp8_grouped_gemm_mma_idle", "deepinfer_fp8_grouped_gemm"},
      {"deepinfer_fp8_grouped_gemm_rowscales_mma_idle", "deepinfer_fp8_grouped_gemm_rowscales"}};
  Result r{names[row_scales][idle_skip] + (stagger ? "_stagger" : "") + (balanced ? "_balanced" : "") +
               (wide_tails ? "_wide_tails" : "") + (n192 ? "_n192" : "") + (gather ? "_gather" : ""), x.model, x.name, T, x.N, x.K, x.E, x.top_k, R,
           active};
  r.variant = fp8_grouped_gemm_variant(args);
  r.cluster = cluster;
  r.seconds = t;
  r.flops = 2.0 * static_cast<double>(R) * static_cast<double>(x.N) * static_cast<double>(x.K);
  r.weight_bytes = static_cast<double>(active) * static_cast<double>(x.N * x.K);
  r.copy_bps = copy_bps;
  return r;
}

// Whether shape `name` is in the comma-separated list `names` (empty: every shape).
bool selected(const std::string& names, const std::string& name) {
  if (names.empty()) return true;
  return ("," + names + ",").find("," + name + ",") != std::string::npos;
}

// A forced variant is timed where it is meant to run: wgmma (3) only from 64 rows, on sm_90.
bool usable(int64_t variant, int64_t M) { return variant != 3 || (M >= 64 && fp8_wgmma_available()); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"FP8 block-scaled GEMM benchmark (DeepSeek shapes)"};
  std::string model = "all", names, ms = "1,16,64,256,1024,4096,16384", variants = "-1", clusters = "0";
  int reps = 9;
  bool grouped_only = false, dense_only = false, row_scales = false, mma_idle = false, stagger = false, balanced = false, wide_tails = false, n192 = false, gather = false,
       model_form = false;
  app.add_option("--model", model, "v2lite | v3 | all");
  app.add_option("--m", ms, "token counts, comma-separated");
  app.add_option("--names", names, "only these shapes (names, comma-separated; default: all)");
  app.add_option("--variants", variants, "tile variants, comma-separated (-1: by size; 3: wgmma)");
  app.add_option("--clusters", clusters, "wgmma form: blocks per A-sharing cluster, comma-separated (0: default)");
  app.add_option("--reps", reps, "timed batches (median)");
  app.add_flag("--grouped-only", grouped_only);
  app.add_flag("--dense-only", dense_only);
  app.add_flag("--row-scales", row_scales,
               "per-row weight scales and fp32 output (the model's W8A8 forms: MoE, dense linears)");
  app.add_flag("--model-form", model_form,
               "dense, with --row-scales: those scales uniform within 128-row blocks, weights placed early "
               "(CudaBackend::fp8_gemm_w8a8's form)");
  app.add_flag("--mma-idle", mma_idle,
               "grouped: the idle warpgroups' MMAs issued (Fp8GemmArgs::idle_skip off), for the A/B");
  app.add_flag("--stagger", stagger, "grouped: the second math warpgroup one K block behind (Fp8GemmArgs::stagger)");
  app.add_flag("--balanced", balanced, "grouped: every expert the same row count instead of random routing");
  app.add_flag("--wide-tails", wide_tails, "grouped: tiles of <= 64 rows on one warpgroup (narrow_tails off)");
  app.add_flag("--n192", n192, "grouped: 128 x 192 tiles (Fp8GemmArgs::n192; bf16 out, block scales)");
  app.add_flag("--gather", gather,
               "grouped: A rows read from the tokens' rows through the slots' index (Fp8GemmArgs::a_rows; bf16 "
               "block scales, variant 3)");
  CLI11_PARSE(app, argc, argv);
  if (model_form && !row_scales) {
    std::fprintf(stderr, "fp8_gemm_bench: --model-form needs --row-scales (it is the per-row-scale dense form)\n");
    return 2;
  }
  const std::vector<int64_t> Ms = parse_list(ms), Vs = parse_list(variants), Cs = parse_list(clusters);

  cudaStream_t s;
  DI_CUDA_CHECK(cudaStreamCreate(&s));
  const double copy_bps = copy_rate(s);
  std::printf("{\"kernel\": \"d2d_copy\", \"copy_gbps\": %.1f}\n", copy_bps * 1e-9);
  Workspace ws;
  if (!grouped_only)
    for (const DenseShape& d : kDense) {
      if ((model != "all" && model != d.model) || !selected(names, d.name)) continue;
      for (int64_t M : Ms)
        for (int64_t v : Vs)
          for (int64_t cl : Cs)
            if (usable(v, M) && (cl == Cs[0] || v == 3))
              print(bench_dense(d, M, static_cast<int>(v), static_cast<int>(cl), row_scales, model_form, reps, copy_bps,
                               ws, s));
    }
  if (!dense_only)
    for (const ExpertShape& x : kExperts) {
      if ((model != "all" && model != x.model) || !selected(names, x.name)) continue;
      for (int64_t M : Ms)
        for (int64_t v : Vs)
          for (int64_t cl : Cs)
            if (usable(v, M) && (cl == Cs[0] || v == 3))
              print(bench_grouped(x, M, static_cast<int>(v), static_cast<int>(cl), row_scales, !mma_idle, stagger,
                                  balanced, wide_tails, n192, gather, reps, copy_bps, s));
    }
  ws.buf.reset();
  DI_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
