// The decode-sized GEMMs of DeepSeek V2-Lite (1–4 tokens), each kernel that can run them: the
// decode GEMV (cuda_gemv.cu; fp32 activations rounded as read, or bf16), small_m_gemm
// (tensor-core 16-row passes; K splits left as partial sums, as the MoE consumers take them),
// cuBLAS (bf16 → fp32, or fp32 for the router); the experts at one token also as the model calls
// the GEMV (gemv_f32a: fp32 A, gate|up gated). One JSON line per (shape, rows, kernel, dtype).
// Figures: µs per call, and GB/s of weight bytes read (dense N·K; grouped: the experts with
// rows), against a device-to-device copy rate measured in the same run (bytes read + written).
// Timing: time_launches (CUDA-graph replays of a batch of launches, median of --reps). Dense
// weights are rotated through enough copies to exceed 2× L2; grouped calls rotate through 16
// random routings over all experts (~0.8 GB of bf16 weights), so every call reads from HBM.
// Does not check results (tests/backend/cuda_ops_test.cpp does). Usage:
//   decode_gemm_bench [--m 1,4] [--reps 9] [--only NAME] [--ring]
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/cuda/cuda_common.h"
#include "cuda_timing.h"

using namespace deepinfer::cuda;
using namespace deepinfer::bench;  // Dev, time_launches, copy_rate, l2_bytes, parse_list

namespace {

struct DenseShape {
  const char* name;
  int64_t N, K;
  bool fp32_only;  // the router: fp32 weights
};
const DenseShape kDense[] = {
    {"q_proj", 3072, 2048, false},         {"kv_a_proj", 576, 2048, false}, {"o_proj", 2048, 2048, false},
    {"dense_gate_up", 21888, 2048, false}, {"dense_down", 2048, 10944, false}, {"router", 64, 2048, true},
};
struct ExpertShape {
  const char* name;
  int64_t N, K;
};
// 64 routed experts (top-6) and the 2 shared slices of the routed launch (every token).
constexpr int64_t kRouted = 64, kShared = 2, kTopK = 6;
constexpr int64_t kExpertI = 1408;
const ExpertShape kExperts[] = {{"experts_gate_up", 2 * kExpertI, 2048}, {"experts_down", 2048, kExpertI}};

enum class Kernel { kGemvF32A, kGemvBf16A, kSmallM, kCublas };
const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::kGemvF32A: return "gemv_f32a";
    case Kernel::kGemvBf16A: return "gemv_bf16a";
    case Kernel::kSmallM: return "small_m_gemm";
    case Kernel::kCublas: return "cublas";
  }
  return "?";
}

void print(const char* kernel, const char* name, const char* dtype, int64_t M, int64_t N, int64_t K, int64_t active,
           double seconds, double weight_bytes, double copy_bps) {
  const double gbps = weight_bytes / seconds * 1e-9;
  std::printf(
      "{\"kernel\": \"%s\", \"name\": \"%s\", \"dtype\": \"%s\", \"M\": %ld, \"N\": %ld, \"K\": %ld, "
      "\"active_experts\": %ld, \"us\": %.2f, \"weight_gbps\": %.1f, \"frac_of_copy\": %.3f}\n",
      kernel, name, dtype, static_cast<long>(M), static_cast<long>(N), static_cast<long>(K),
      static_cast<long>(active), seconds * 1e6, gbps, gbps / (copy_bps * 1e-9));
  std::fflush(stdout);
}

// The GEMV's rows per call in this lab (its dispatch takes at most kGemvMaxRows; 4 shows where it loses).
constexpr int64_t kGemvLabMaxRows = 4;

size_t elem_bytes(Elem e) { return e == Elem::kF32 ? 4 : e == Elem::kBF16 ? 2 : 1; }

void bench_dense(const DenseShape& d, int64_t M, Elem w_elem, bool ring, int reps, double copy_bps, cublasHandle_t blas,
                 cudaStream_t s) {
  const int64_t n_kb = (d.K + 127) / 128;
  const int64_t w_bytes = d.N * d.K * static_cast<int64_t>(elem_bytes(w_elem));
  const int copies = static_cast<int>(std::clamp<int64_t>((2 * l2_bytes() + w_bytes - 1) / w_bytes, 1, 64));
  Dev a32(static_cast<size_t>(M * d.K) * 4), a16(static_cast<size_t>(M * d.K) * 2),
      w(static_cast<size_t>(w_bytes) * copies), sw(static_cast<size_t>(d.N * n_kb) * 4 * copies),
      c(static_cast<size_t>(M * d.N) * 4), part(static_cast<size_t>(M * d.N * ((d.K + 511) / 512)) * 4);
  fill_random(a32.p, Elem::kF32, M * d.K, 1, true, 1.0f, 0, s);
  fill_random(a16.p, Elem::kBF16, M * d.K, 2, true, 1.0f, 0, s);
  fill_random(w.p, w_elem, w_bytes / static_cast<int64_t>(elem_bytes(w_elem)) * copies, 3, true, 0.05f, 0, s);
  fill_random(sw.p, Elem::kF32, d.N * n_kb * copies, 4, false, 0.5f / 64, 2.0f / 64, s);
  auto wp = [&](int i) { return static_cast<const char*>(w.p) + static_cast<size_t>(i % copies) * w_bytes; };
  auto sp = [&](int i) { return static_cast<const float*>(sw.p) + static_cast<size_t>(i % copies) * d.N * n_kb; };
  const char* dt = w_elem == Elem::kF32 ? "f32" : w_elem == Elem::kBF16 ? "bf16" : "fp8";
  for (Kernel k : {Kernel::kGemvF32A, Kernel::kGemvBf16A, Kernel::kSmallM, Kernel::kCublas}) {
    if (w_elem == Elem::kF32 && k != Kernel::kGemvF32A && k != Kernel::kCublas) continue;
    if (w_elem == Elem::kF8 && k == Kernel::kCublas) continue;  // FP8 decode never dequantizes per call
    if ((k == Kernel::kGemvF32A || k == Kernel::kGemvBf16A) && M > kGemvLabMaxRows) continue;
    const double t = time_launches(
        [&](int i) {
          if (k == Kernel::kGemvF32A || k == Kernel::kGemvBf16A) {
            GemvArgs g;
            g.a = k == Kernel::kGemvF32A ? a32.p : a16.p;
            g.a_elem = k == Kernel::kGemvF32A ? Elem::kF32 : Elem::kBF16;
            g.lda = d.K;
            g.w = wp(i), g.w_elem = w_elem;
            if (w_elem == Elem::kF8) g.w_scale = sp(i), g.block_k = 128;
            g.N = d.N, g.K = d.K, g.rows = M, g.max_rows = M;
            g.c = static_cast<float*>(c.p), g.ldc = d.N;
            g.ring = ring;
            gemv(g, s);
          } else if (k == Kernel::kSmallM) {
            small_m_gemm(static_cast<const bf16*>(a16.p), d.K, wp(i), sp(i), w_elem == Elem::kF8, 128, d.N, nullptr,
                         nullptr, 1, M, M, static_cast<float*>(c.p), d.N, static_cast<float*>(part.p), s);
          } else if (w_elem == Elem::kF32) {
            gemm_f32(blas, M, d.N, d.K, static_cast<const float*>(a32.p), d.K, reinterpret_cast<const float*>(wp(i)),
                     d.K, static_cast<float*>(c.p), d.N);
          } else {
            gemm(blas, M, d.N, d.K, static_cast<const bf16*>(a16.p), d.K, 0, reinterpret_cast<const bf16*>(wp(i)), d.K,
                 0, true, c.p, Elem::kF32, d.N, 0, 1);
          }
        },
        reps, s);
    print(kernel_name(k), d.name, dt, M, d.N, d.K, 1, t, static_cast<double>(w_bytes), copy_bps);
  }
}

// 16 random routings of T tokens (top-6 of 64 plus the 2 shared slots each): offsets [E + 1]
// and the active list (experts with rows, then −1 up to min(E, R) slots), as the MoE sort builds.
struct Routing {
  std::vector<int32_t> offsets, active;
  int64_t n_active = 0, with_rows = 0;
};
Routing route(int64_t T, std::mt19937& rng) {
  const int64_t E = kRouted + kShared, R = T * (kTopK + kShared);
  std::vector<int32_t> counts(static_cast<size_t>(E), 0), perm(static_cast<size_t>(kRouted));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < kRouted; ++e) perm[static_cast<size_t>(e)] = static_cast<int32_t>(e);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < kTopK; ++j) ++counts[static_cast<size_t>(perm[static_cast<size_t>(j)])];
    for (int64_t j = 0; j < kShared; ++j) ++counts[static_cast<size_t>(kRouted + j)];
  }
  Routing r;
  r.offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) {
    r.offsets[static_cast<size_t>(e + 1)] = r.offsets[static_cast<size_t>(e)] + counts[static_cast<size_t>(e)];
    if (counts[static_cast<size_t>(e)] > 0) r.active.push_back(static_cast<int32_t>(e));
  }
  r.with_rows = static_cast<int64_t>(r.active.size());
  r.n_active = std::min(E, R);
  r.active.resize(static_cast<size_t>(r.n_active), -1);
  return r;
}

void bench_grouped(const ExpertShape& x, int64_t T, Elem w_elem, bool ring, int reps, double copy_bps,
                   cudaStream_t s) {
  const int64_t E = kRouted + kShared, R = T * (kTopK + kShared), n_kb = (x.K + 127) / 128;
  constexpr int kRoutings = 16;
  std::mt19937 rng(42);
  std::vector<Routing> routings;
  for (int i = 0; i < kRoutings; ++i) routings.push_back(route(T, rng));
  const int64_t n_active = routings[0].n_active;
  Dev a(static_cast<size_t>(R * x.K) * 2), w(static_cast<size_t>(E * x.N * x.K) * elem_bytes(w_elem)),
      sw(static_cast<size_t>(E * x.N * n_kb) * 4), c(static_cast<size_t>(R * x.N * ((x.K + 511) / 512)) * 4),
      off(static_cast<size_t>(kRoutings * (E + 1)) * 4), act(static_cast<size_t>(kRoutings * n_active) * 4);
  fill_random(a.p, Elem::kBF16, R * x.K, 5, true, 1.0f, 0, s);
  fill_random(w.p, w_elem, E * x.N * x.K, 6, true, 0.05f, 0, s);
  fill_random(sw.p, Elem::kF32, E * x.N * n_kb, 7, false, 0.5f / 64, 2.0f / 64, s);
  double with_rows = 0;
  for (int i = 0; i < kRoutings; ++i) {
    DI_CUDA_CHECK(cudaMemcpyAsync(static_cast<int32_t*>(off.p) + i * (E + 1), routings[i].offsets.data(),
                                  sizeof(int32_t) * (E + 1), cudaMemcpyHostToDevice, s));
    DI_CUDA_CHECK(cudaMemcpyAsync(static_cast<int32_t*>(act.p) + i * n_active, routings[i].active.data(),
                                  sizeof(int32_t) * n_active, cudaMemcpyHostToDevice, s));
    with_rows += static_cast<double>(routings[i].with_rows) / kRoutings;
  }
  DI_CUDA_CHECK(cudaStreamSynchronize(s));
  const char* dt = w_elem == Elem::kBF16 ? "bf16" : "fp8";
  // gemv_f32a: the model's call at one token — fp32 A (the normed hidden, h), the gate|up
  // shape gated (W holds the gate rows, then the up rows: SiLU·mul in the epilogue).
  Dev a32(static_cast<size_t>(R * x.K) * 4);
  fill_random(a32.p, Elem::kF32, R * x.K, 8, true, 1.0f, 0, s);
  const bool gated_shape = x.N == 2 * kExpertI;
  for (Kernel k : {Kernel::kGemvF32A, Kernel::kGemvBf16A, Kernel::kSmallM}) {
    if (k != Kernel::kSmallM && T > kGemvLabMaxRows) continue;
    if (k == Kernel::kGemvF32A && T != 1) continue;
    const double t = time_launches(
        [&](int i) {
          const auto* offsets = static_cast<const int32_t*>(off.p) + (i % kRoutings) * (E + 1);
          const auto* active = static_cast<const int32_t*>(act.p) + (i % kRoutings) * n_active;
          if (k != Kernel::kSmallM) {
            const bool model_form = k == Kernel::kGemvF32A;
            GemvArgs g;
            g.a = model_form ? a32.p : a.p, g.a_elem = model_form ? Elem::kF32 : Elem::kBF16, g.lda = x.K;
            g.w = w.p, g.w_elem = w_elem;
            if (w_elem == Elem::kF8) g.w_scale = static_cast<const float*>(sw.p), g.block_k = 128;
            g.glu = model_form && gated_shape;
            g.N = g.glu ? x.N / 2 : x.N, g.K = x.K;
            g.offsets = offsets, g.active = active, g.n_active = n_active;
            g.max_rows = std::min<int64_t>(T, 4);
            g.c = static_cast<float*>(c.p), g.ldc = g.N;
            g.ring = ring;
            gemv(g, s);
          } else {  // the MoE path's call: K splits left as partials for the consumer
            const bool split = invariant_k_splits(x.K) > 1;
            small_m_gemm(static_cast<const bf16*>(a.p), x.K, w.p, static_cast<const float*>(sw.p),
                         w_elem == Elem::kF8, 128, x.N, offsets, active, n_active, R, T,
                         split ? nullptr : static_cast<float*>(c.p), x.N, static_cast<float*>(c.p), s);
          }
        },
        reps, s);
    print(kernel_name(k), x.name, dt, T, x.N, x.K, static_cast<int64_t>(with_rows + 0.5), t,
          with_rows * static_cast<double>(x.N * x.K * static_cast<int64_t>(elem_bytes(w_elem))), copy_bps);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Decode-sized GEMMs of DeepSeek V2-Lite: GEMV, small_m_gemm, cuBLAS"};
  std::string ms = "1,4";
  int reps = 9;
  app.add_option("--m", ms, "token counts, comma-separated (the GEMV at most 4; small_m_gemm any)");
  app.add_option("--reps", reps, "timed batches (median)");
  std::string only;
  app.add_option("--only", only, "only the shapes whose name contains this");
  bool ring = false;
  app.add_flag("--ring", ring, "FP8 GEMVs at one row on the ring-fed form where it applies (GemvArgs::ring)");
  CLI11_PARSE(app, argc, argv);
  const BenchStream bs;
  cudaStream_t s = bs.s;
  cublasHandle_t blas = bs.blas;
  const double copy_bps = copy_rate(s);
  std::printf("{\"kernel\": \"d2d_copy\", \"copy_gbps\": %.1f}\n", copy_bps * 1e-9);
  for (int64_t M : parse_list(ms)) {
    for (const DenseShape& d : kDense) {
      if (std::string(d.name).find(only) == std::string::npos) continue;
      for (Elem w : {Elem::kBF16, Elem::kF8, Elem::kF32})
        if ((w == Elem::kF32) == d.fp32_only) bench_dense(d, M, w, ring, reps, copy_bps, blas, s);
    }
    for (const ExpertShape& x : kExperts) {
      if (std::string(x.name).find(only) == std::string::npos) continue;
      for (Elem w : {Elem::kBF16, Elem::kF8}) bench_grouped(x, M, w, ring, reps, copy_bps, s);
    }
  }
  return 0;
}
