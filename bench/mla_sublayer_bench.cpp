// The fused one-token MLA attention sublayer (cuda::mla_sublayer, cuda_mla_sublayer.cu) at
// DeepSeek-V2-Lite's attention shape (D 2048, H 16, r 512, dr 64, dn 128, dv 128), one JSON line
// per context on stdout. Figure: bytes the sublayer must read — q_proj | kv_a_proj (3,648 × D),
// kv_b (H × 256 × 512), o_proj (D × 2,048), all bf16, and the context's latents (× 1,152 bytes)
// — per second, against a device-to-device copy rate measured in the same run. The weights are
// rotated through enough copies that every call reads them from HBM (as a model's layers do),
// each context's latents too. Timing as bench/mla_decode_bench (cuda_timing.h): CUDA graph
// replays of back-to-back launches (PDL lets each one's weight copies start under the previous
// one), the median of --reps. Then one eager launch with the kernel's timeline (trace): per mark,
// the median and latest block's time since the earliest block entered, in µs.
// --invariant: the kernel's invariant form (the batch-invariant mode's: 64-key splits, at most
// 32, the dense linears' K structure). --fp8: the FP8 form (q_proj | kv_a_proj and o_proj as e4m3
// codes with a scale per row and 128-column block, counted at a byte per weight plus the
// scales); with --invariant, the invariant form's FP8 linears on wgmma (the W8A8 GEMM's bits).
// Does not check results (CudaMlaSublayer tests do).
// Usage: mla_sublayer_bench [--contexts 512,4096,32768] [--reps 9] [--invariant] [--fp8]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
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
using deepinfer::bench::upload;
using deepinfer::bench::timeline_json;

namespace {

constexpr int64_t kD = 2048, kH = 16, kR = 512, kDr = 64, kDn = 128, kDv = 128, kBlock = 64;
constexpr int64_t kWidth = kR + kDr;


// One copy of the weights: q_proj, kv_a_proj, o_proj in bf16 or (fp8) e4m3 with fp32 scales
// [rows, K / 128]; kv_b in bf16.
struct Weights {
  Dev wq, wkv, kvb, wo, sq, skv, so;
  Weights(cudaStream_t s, uint64_t seed, bool fp8)
      : wq(kH * (kDn + kDr) * kD * (fp8 ? 1 : 2)), wkv(kWidth * kD * (fp8 ? 1 : 2)), kvb(kH * (kDn + kDv) * kR * 2),
        wo(kD * kH * kDv * (fp8 ? 1 : 2)), sq(fp8 ? kH * (kDn + kDr) * (kD / 128) * 4 : 4),
        skv(fp8 ? kWidth * (kD / 128) * 4 : 4), so(fp8 ? kD * (kH * kDv / 128) * 4 : 4) {
    const Elem e = fp8 ? Elem::kF8 : Elem::kBF16;
    const float sd = fp8 ? 1.0f : 0.02f;  // FP8: codes of N(0, 1), scales ~0.02
    fill_random(wq.p, e, kH * (kDn + kDr) * kD, seed, true, sd, 0.0f, s);
    fill_random(wkv.p, e, kWidth * kD, seed + 1, true, sd, 0.0f, s);
    fill_random(kvb.p, Elem::kBF16, kH * (kDn + kDv) * kR, seed + 2, true, 0.05f, 0.0f, s);
    fill_random(wo.p, e, kD * kH * kDv, seed + 3, true, sd, 0.0f, s);
    if (fp8) {
      fill_random(sq.p, Elem::kF32, kH * (kDn + kDr) * (kD / 128), seed + 4, false, 0.01f, 0.03f, s);
      fill_random(skv.p, Elem::kF32, kWidth * (kD / 128), seed + 5, false, 0.01f, 0.03f, s);
      fill_random(so.p, Elem::kF32, kD * (kH * kDv / 128), seed + 6, false, 0.01f, 0.03f, s);
    }
  }
};

void bench_case(int64_t context, int reps, bool invariant, bool fp8, double copy_bps, cudaStream_t s) {
  const double dense = static_cast<double>((kH * (kDn + kDr) + kWidth) * kD + kD * kH * kDv);  // three linears
  const double weight_bytes = (fp8 ? dense * (1.0 + 4.0 / 128) : 2.0 * dense) + 2.0 * kH * (kDn + kDv) * kR;
  const double latent_bytes = static_cast<double>(context * kWidth * 2);
  const int copies = static_cast<int>(std::clamp<int64_t>(
      static_cast<int64_t>(2.0 * static_cast<double>(l2_bytes()) / (weight_bytes + latent_bytes)) + 1, 1, 16));
  const int64_t pages = (context + kBlock - 1) / kBlock, n_pages = pages * copies;
  std::vector<Weights> w;
  for (int c = 0; c < copies; ++c) w.emplace_back(s, 10 + 8 * static_cast<uint64_t>(c), fp8);
  Dev cache(static_cast<size_t>(n_pages * kBlock * kWidth) * 2), norm(kR * 4), x(kD * 4), out(kD * 4);
  fill_random(cache.p, Elem::kBF16, n_pages * kBlock * kWidth, 1, true, 1.0f, 0.0f, s);
  fill_random(norm.p, Elem::kF32, kR, 2, false, 0.9f, 1.1f, s);
  fill_random(x.p, Elem::kF32, kD, 3, true, 1.0f, 0.0f, s);
  std::mt19937 rng(7);
  std::vector<Dev> d_ids;
  for (int c = 0; c < copies; ++c) {
    std::vector<int32_t> ids(static_cast<size_t>(pages));
    std::iota(ids.begin(), ids.end(), static_cast<int32_t>(c * pages));
    std::shuffle(ids.begin(), ids.end(), rng);
    d_ids.push_back(upload(ids, s));
  }
  const std::vector<int32_t> kv_len = {static_cast<int32_t>(context)}, indptr = {0, static_cast<int32_t>(pages)},
                             pos = {static_cast<int32_t>(context - 1)};
  const Dev d_kv_len = upload(kv_len, s), d_indptr = upload(indptr, s), d_pos = upload(pos, s);
  std::vector<Dev> d_slots;
  for (int c = 0; c < copies; ++c) {
    std::vector<int32_t> ids(static_cast<size_t>(pages));
    DI_CUDA_CHECK(cudaMemcpy(ids.data(), d_ids[static_cast<size_t>(c)].p, ids.size() * 4, cudaMemcpyDeviceToHost));
    const int32_t slot = ids[static_cast<size_t>((context - 1) / kBlock)] * static_cast<int32_t>(kBlock) +
                         static_cast<int32_t>((context - 1) % kBlock);
    d_slots.push_back(upload(std::vector<int32_t>{slot}, s));
  }
  const int64_t splits = mla_sublayer_max_splits();
  Dev q(kH * (kDn + kDr) * 4), kv(kWidth * 4), q_lat(kH * kR * 2), q_pe(kH * kDr * 2), part_acc(splits * kH * kR * 4),
      part_ml(splits * kH * 8), o(kH * kDv * 4), counter(8);
  DI_CUDA_CHECK(cudaMemset(counter.p, 0, 8));

  MlaSublayerArgs a;
  a.x = static_cast<const float*>(x.p);
  a.D = kD;
  a.kv_norm = norm.p;
  a.kv_norm_elem = Elem::kF32;
  a.eps = 1e-6f;
  a.rope.half = static_cast<int>(kDr / 2);
  for (int i = 0; i < a.rope.half; ++i) a.rope.inv_freq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / kDr);
  a.positions = static_cast<const int32_t*>(d_pos.p);
  a.cache = static_cast<bf16*>(cache.p);
  a.block_size = kBlock;
  a.kv_len = static_cast<const int32_t*>(d_kv_len.p);
  a.block_indptr = static_cast<const int32_t*>(d_indptr.p);
  a.scale = 1.0f / std::sqrt(static_cast<float>(kDn + kDr));
  a.out = static_cast<float*>(out.p);
  a.q = static_cast<float*>(q.p);
  a.kv = static_cast<float*>(kv.p);
  a.q_lat = static_cast<bf16*>(q_lat.p);
  a.q_pe = static_cast<bf16*>(q_pe.p);
  a.part_acc = static_cast<float*>(part_acc.p);
  a.part_ml = static_cast<float2*>(part_ml.p);
  a.o = static_cast<float*>(o.p);
  a.counter = static_cast<unsigned long long*>(counter.p);
  a.fp8 = fp8;
  if (invariant) {  // the backend's rule (cuda_backend.cpp: kMlaInvariantSplitKeys, kMlaInvariantMaxSplits)
    a.split_keys = 64;
    a.max_splits = 32;
  }
  auto args = [&](int i) {
    MlaSublayerArgs c = a;
    const auto& wi = w[static_cast<size_t>(i % copies)];
    c.w_q = wi.wq.p;
    c.w_kv = wi.wkv.p;
    c.kv_b = static_cast<const bf16*>(wi.kvb.p);
    c.w_o = wi.wo.p;
    if (fp8) {
      c.s_q = static_cast<const float*>(wi.sq.p);
      c.s_kv = static_cast<const float*>(wi.skv.p);
      c.s_o = static_cast<const float*>(wi.so.p);
    }
    c.block_ids = static_cast<const int32_t*>(d_ids[static_cast<size_t>(i % copies)].p);
    c.slots = static_cast<const int32_t*>(d_slots[static_cast<size_t>(i % copies)].p);
    return c;
  };
  const double t = time_launches([&](int i) { mla_sublayer(args(i), s); }, reps, s);
  const double bytes = weight_bytes + latent_bytes;

  // The timeline of one launch (eager, after the timed ones).
  const int G = sm_count();
  Dev trace(static_cast<size_t>(G) * kMlaSublayerMarks * 8);
  MlaSublayerArgs ta = args(0);
  ta.trace = static_cast<unsigned long long*>(trace.p);
  mla_sublayer(ta, s);
  const std::string tl = timeline_json(trace.p, G, kMlaSublayerMarks, s);
  std::printf(
      "{\"kernel\": \"deepinfer_mla_sublayer\", \"form\": \"%s\", \"D\": %ld, \"H\": %ld, \"context\": %ld, \"us\": %.2f, "
      "\"mb\": %.2f, \"gbps\": %.1f, \"copy_gbps\": %.1f, \"frac_of_copy\": %.3f, "
      "\"marks\": \"entry, issued, waited, P1, B1, P2, B2, P3, B3, P4, B4, exit\", %s}\n",
      invariant ? (fp8 ? "invariant_fp8" : "invariant") : fp8 ? "fp8" : "default", static_cast<long>(kD),
      static_cast<long>(kH),
      static_cast<long>(context),
      t * 1e6, bytes * 1e-6, bytes / t * 1e-9, copy_bps * 1e-9, bytes / t / copy_bps, tl.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fused one-token MLA attention sublayer benchmark (DeepSeek-V2-Lite shape)"};
  std::string contexts = "512,4096,32768";
  int reps = 9;
  app.add_option("--contexts", contexts, "cached keys (the step's own included), comma-separated");
  app.add_option("--reps", reps, "timed batches (median)");
  bool invariant = false;
  app.add_flag("--invariant", invariant, "the kernel's invariant form");
  bool fp8 = false;
  app.add_flag("--fp8", fp8, "the kernel's FP8 form (FP8 q_proj | kv_a_proj and o_proj)");
  CLI11_PARSE(app, argc, argv);
  if (invariant && fp8 && !mla_sublayer_invariant_fp8_fits(kD)) {
    std::fprintf(stderr, "mla_sublayer_bench: the invariant FP8 form does not fit this GPU\n");
    return 2;
  }
  if (!mla_sublayer_fits(kD, kH, kDn, kDr, kDv, kR, kDr / 2)) {
    std::fprintf(stderr, "mla_sublayer_bench: the fused kernel does not run on this GPU (sm_90a, >= 128 SMs)\n");
    return 2;
  }
  cudaStream_t s;
  DI_CUDA_CHECK(cudaStreamCreate(&s));
  const double copy_bps = copy_rate(s);
  std::printf("{\"kernel\": \"d2d_copy\", \"copy_gbps\": %.1f}\n", copy_bps * 1e-9);
  for (int64_t c : parse_list(contexts)) bench_case(c, reps, invariant, fp8, copy_bps, s);
  DI_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
