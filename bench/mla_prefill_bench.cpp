// MLA prefill attention (cuda::mla_prefill: the naive form's causal attention over decompressed
// K/V) at DeepSeek's head dims (dn 128, dr 64, dv 128, latents r 512 + dr 64), one JSON line per
// (case, kernel) on stdout. A case is (heads, sequences, q_len, kv_len): `seqs` sequences whose
// q_len query rows are the last of kv_len positions (kv_len > q_len: a cached prefix), their keys
// back to back in one buffer, as the backend's groups lay them out. Figure: the causal FLOPs —
// per head and row, 2·(dn + dr + dv) per visible key — per second, against a bf16 cuBLAS GEMM
// (8192³) measured in the same run (issue 7, point 4: prefill against the matrix-rate floor).
// Kernels: 0 the mma.sync one (cuda_mla_prefill.cu), 1 the wgmma one (cuda_mla_prefill_wgmma.cu).
// Timing as bench/fp8_gemm_bench (cuda_timing.h): CUDA graph replays, the median of --reps.
// Does not check results (the CudaMlaPrefill tests do).
// Usage: mla_prefill_bench [--heads 16,128] [--cases 1:4096:4096,1:16384:16384,...] [--kernels 0,1]
//                          [--reps 9]
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/cuda/cuda_common.h"
#include "cuda_timing.h"

using namespace deepinfer::cuda;
using deepinfer::bench::BenchStream;
using deepinfer::bench::bf16_gemm_rate;
using deepinfer::bench::Dev;
using deepinfer::bench::parse_list;
using deepinfer::bench::time_launches;

namespace {

constexpr int64_t kR = 512, kDr = 64, kDn = 128, kDv = 128;

void bench_case(int64_t H, int64_t seqs, int64_t q_len, int64_t kv_len, const std::vector<int64_t>& kernels, int reps,
                double gemm_rate, cudaStream_t s) {
  const int64_t T = seqs * q_len, n_keys = seqs * kv_len, width = kR + kDr;
  Dev q(static_cast<size_t>(T * H * (kDn + kDr)) * 4), kv(static_cast<size_t>(n_keys * H * (kDn + kDv)) * 2),
      lat(static_cast<size_t>(n_keys * width) * 2), out(static_cast<size_t>(T * H * kDv) * 4);
  fill_random(q.p, Elem::kF32, T * H * (kDn + kDr), 1, true, 1.0f, 0.0f, s);
  fill_random(kv.p, Elem::kBF16, n_keys * H * (kDn + kDv), 2, true, 1.0f, 0.0f, s);
  fill_random(lat.p, Elem::kBF16, n_keys * width, 3, true, 1.0f, 0.0f, s);
  std::vector<MlaPrefillSeq> table;
  for (int64_t b = 0; b < seqs; ++b)
    table.push_back({static_cast<int32_t>(b * q_len), static_cast<int32_t>(q_len), static_cast<int32_t>(kv_len),
                     static_cast<int32_t>(b * kv_len)});
  // Visible keys, summed over a sequence's rows: row i sees kv_len − q_len + i + 1.
  const double keys = static_cast<double>(q_len) * static_cast<double>(kv_len - q_len) +
                      static_cast<double>(q_len) * static_cast<double>(q_len + 1) / 2.0;
  const double flops = 2.0 * static_cast<double>(kDn + kDr + kDv) * keys * static_cast<double>(H * seqs);
  for (int64_t kernel : kernels) {
    MlaPrefillArgs a{};
    a.q = static_cast<const float*>(q.p);
    a.kv = static_cast<const bf16*>(kv.p);
    a.lat = static_cast<const bf16*>(lat.p);
    a.ld_lat = width;
    a.H = H, a.dn = kDn, a.dr = kDr, a.dv = kDv, a.r = kR;
    a.scale = 1.0f / std::sqrt(static_cast<float>(kDn + kDr));
    a.out = static_cast<float*>(out.p);
    a.seqs = table.data();
    a.n_seqs = seqs;
    a.n_keys = n_keys;
    a.kernel = static_cast<int>(kernel);
    const double t = time_launches([&](int) { mla_prefill(a, s); }, reps, s);
    std::printf(
        "{\"kernel\": \"deepinfer_mla_prefill\", \"variant\": \"%s\", \"H\": %ld, \"seqs\": %ld, \"q_len\": %ld, "
        "\"kv_len\": %ld, \"us\": %.1f, \"tflops\": %.1f, \"gemm_tflops\": %.1f, \"frac_of_gemm\": %.3f}\n",
        kernel == 1 ? "wgmma" : "mma.sync", static_cast<long>(H), static_cast<long>(seqs), static_cast<long>(q_len),
        static_cast<long>(kv_len), t * 1e6, flops / t * 1e-12, gemm_rate * 1e-12, flops / t / gemm_rate);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"MLA prefill attention benchmark (DeepSeek head dims)"};
  std::string heads = "16,128", cases = "1:4096:4096,1:16384:16384,8:512:512,2:1024:8192", kernels = "0,1";
  int reps = 9;
  app.add_option("--heads", heads, "query heads, comma-separated");
  app.add_option("--cases", cases, "seqs:q_len:kv_len triples, comma-separated");
  app.add_option("--kernels", kernels, "0 mma.sync, 1 wgmma (sm_90), comma-separated");
  app.add_option("--reps", reps, "timed batches (median)");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::vector<int64_t>> triples;
  for (const std::string& c : [&] {
         std::vector<std::string> v;
         std::stringstream ss(cases);
         std::string item;
         while (std::getline(ss, item, ',')) v.push_back(item);
         return v;
       }()) {
    const std::vector<int64_t> t = parse_list(c, ':');
    if (t.size() != 3 || t[0] < 1 || t[0] > kMlaPrefillMaxSeqs || t[1] < 1 || t[2] < t[1]) {
      std::fprintf(stderr, "mla_prefill_bench: bad case '%s' (want seqs:q_len:kv_len, 1 ≤ seqs ≤ %d, q_len ≤ kv_len)\n",
                   c.c_str(), static_cast<int>(kMlaPrefillMaxSeqs));
      return 2;
    }
    triples.push_back(t);
  }
  const std::vector<int64_t> kernel_list = parse_list(kernels);
  for (int64_t k : kernel_list)
    if (k != 0 && k != 1) {
      std::fprintf(stderr, "mla_prefill_bench: bad kernel %ld (want 0 or 1)\n", static_cast<long>(k));
      return 2;
    }

  const BenchStream bs;
  const double rate = bf16_gemm_rate(bs.blas, bs.s);
  std::printf("{\"kernel\": \"cublas_bf16_gemm_8192\", \"tflops\": %.1f}\n", rate * 1e-12);
  for (int64_t H : parse_list(heads))
    for (const auto& t : triples) bench_case(H, t[0], t[1], t[2], kernel_list, reps, rate, bs.s);
  return 0;
}
