// The one-token MoE kernel (cuda::moe_one, cuda_moe_one.cu) at DeepSeek-V2-Lite's expert shape
// (D 2048, I 1408, 64 routed experts, top 6, 2 shared slices), one JSON line on stdout. Figure:
// the bytes it must read — (k + S) experts × (gate, up, down) × D × I weights, FP8's scales
// included — per second, against
// a device-to-device copy rate measured in the same run. Every call routes to another random
// set of experts (64 sets, drawn once), so the weights come from HBM as a model's layers read
// them (the stack, 1.1 GB, is 20× the L2). Timing as bench/mla_decode_bench (cuda_timing.h):
// CUDA graph replays of back-to-back launches, the median of --reps. Then three eager launches
// back to back, the last with the kernel's timeline (trace): per mark, the median and latest
// block's time since the earliest block entered, in µs.
// Does not check results (CudaOps.MoeOneTokenKernelAtV2LiteSizes does); "out_fnv" is an FNV-1a
// hash of the traced launch's output bits, so two builds of the kernel can be compared bit for
// bit on the same machine (the inputs are the same pseudo-random draws every run).
// --fp8: e4m3 codes with per-row scales over 128 columns (half the bytes).
// --chain: bf16 in the batch-invariant mode's arithmetic (MoeOneArgs::chain).
// --w8a8: FP8 in the W8A8 arithmetic (MoeOneArgs::w8a8, cuda::moe_one_w8a8).
// Usage: moe_one_bench [--reps 9] [--fp8 [--w8a8] | --chain]
#include <algorithm>
#include <cstdint>
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
using deepinfer::bench::time_launches;
using deepinfer::bench::timeline_json;
using deepinfer::bench::upload;

namespace {

constexpr int64_t kD = 2048, kI = 1408, kE = 64, kK = 6, kS = 2, kSets = 64, kBlockK = 128;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"One-token MoE kernel benchmark (DeepSeek-V2-Lite experts)"};
  int reps = 9;
  bool fp8 = false, chain = false, w8a8 = false;
  app.add_option("--reps", reps, "timed batches (median)");
  auto* f8 = app.add_flag("--fp8", fp8, "FP8 weights (e4m3, per-row scales over 128 columns)");
  auto* ch = app.add_flag("--chain", chain, "bf16 weights, the batch-invariant mode's one-chain arithmetic")->excludes(f8);
  app.add_flag("--w8a8", w8a8, "FP8 weights in the W8A8 arithmetic (moe_one_w8a8)")->excludes(ch);
  CLI11_PARSE(app, argc, argv);
  fp8 = fp8 || w8a8;
  if (w8a8 ? !moe_one_w8a8_fits(kD, kI, kK, kS, kBlockK) : !moe_one_fits(kD, kI, kK, kS, fp8, kBlockK, chain)) {
    std::fprintf(stderr, "moe_one_bench: the kernel does not run on this GPU (sm_90a)\n");
    return 2;
  }
  cudaStream_t s;
  DI_CUDA_CHECK(cudaStreamCreate(&s));
  const double copy_bps = copy_rate(s);
  std::printf("{\"kernel\": \"d2d_copy\", \"copy_gbps\": %.1f}\n", copy_bps * 1e-9);

  const int64_t n13 = (kE + kS) * 2 * kI * kD, n2 = (kE + kS) * kD * kI;
  const int64_t esz = fp8 ? 1 : 2, nk13 = (kD + kBlockK - 1) / kBlockK, nk2 = (kI + kBlockK - 1) / kBlockK;
  const int64_t n13s = (kE + kS) * 2 * kI * nk13, n2s = (kE + kS) * kD * nk2;
  Dev w13(static_cast<size_t>(n13 * esz)), w2(static_cast<size_t>(n2 * esz)), x(kD * 4), out(kD * 4),
      h((kK + kS) * kI * 4), counter(8), weights(kSets * kK * 4), s13(n13s * 4), s2(n2s * 4);
  const Elem we = fp8 ? Elem::kF8 : Elem::kBF16;
  fill_random(w13.p, we, n13, 1, true, fp8 ? 1.0f : 0.02f, 0.0f, s);
  fill_random(w2.p, we, n2, 2, true, fp8 ? 1.0f : 0.02f, 0.0f, s);
  fill_random(s13.p, Elem::kF32, n13s, 5, false, 0.01f, 0.02f, s);
  fill_random(s2.p, Elem::kF32, n2s, 6, false, 0.01f, 0.02f, s);
  fill_random(x.p, Elem::kF32, kD, 3, true, 1.0f, 0.0f, s);
  fill_random(weights.p, Elem::kF32, kSets * kK, 4, false, 0.0f, 0.3f, s);
  DI_CUDA_CHECK(cudaMemset(counter.p, 0, 8));
  std::mt19937 rng(7);
  std::vector<int32_t> all(kE), sets;
  std::iota(all.begin(), all.end(), 0);
  for (int64_t i = 0; i < kSets; ++i) {
    std::shuffle(all.begin(), all.end(), rng);
    sets.insert(sets.end(), all.begin(), all.begin() + kK);
  }
  const Dev ids = upload(sets, s);

  MoeOneArgs a;
  a.x = static_cast<const float*>(x.p);
  a.D = kD, a.I = kI, a.k = kK, a.E = kE, a.n_shared = kS;
  a.w13 = w13.p;
  a.w2 = w2.p;
  if (fp8) {
    a.fp8 = true;
    a.w13_scale = static_cast<const float*>(s13.p);
    a.w2_scale = static_cast<const float*>(s2.p);
    a.block_k = kBlockK;
  }
  a.chain = chain;
  a.w8a8 = w8a8;
  a.out = static_cast<float*>(out.p);
  a.h = static_cast<float*>(h.p);
  a.counter = static_cast<unsigned long long*>(counter.p);
  auto args = [&](int i) {
    MoeOneArgs c = a;
    c.ids = static_cast<const int32_t*>(ids.p) + (i % kSets) * kK;
    c.weights = static_cast<const float*>(weights.p) + (i % kSets) * kK;
    return c;
  };
  auto launch = [&](const MoeOneArgs& c) { w8a8 ? moe_one_w8a8(c, s) : moe_one(c, s); };
  const double t = time_launches([&](int i) { launch(args(i)); }, reps, s);
  // The weights, and FP8's scales (until run s27-1 counted for bf16 too: +1.6 %).
  const double bytes = static_cast<double>((kK + kS) * (3 * kD * kI * esz + (fp8 ? (2 * kI * nk13 + kD * nk2) * 4 : 0)));

  const int G = sm_count();
  const int n_marks = w8a8 ? kMoeOneW8a8Marks : kMoeOneMarks;
  Dev trace(static_cast<size_t>(G) * n_marks * 8);
  launch(args(1));
  launch(args(2));
  MoeOneArgs ta = args(3);
  ta.trace = static_cast<unsigned long long*>(trace.p);
  launch(ta);
  const std::string tl = timeline_json(trace.p, G, n_marks, s);
  std::vector<uint32_t> out_bits(static_cast<size_t>(kD));
  DI_CUDA_CHECK(cudaMemcpyAsync(out_bits.data(), out.p, out_bits.size() * 4, cudaMemcpyDeviceToHost, s));
  DI_CUDA_CHECK(cudaStreamSynchronize(s));
  uint64_t fnv = 1469598103934665603ull;
  for (const uint32_t v : out_bits) {
    for (int byte = 0; byte < 4; ++byte) fnv = (fnv ^ ((v >> (8 * byte)) & 0xffu)) * 1099511628211ull;
  }
  std::printf(
      "{\"kernel\": \"deepinfer_moe_one\", \"weights\": \"%s\", \"D\": %ld, \"I\": %ld, \"slots\": %ld, \"us\": %.2f, \"mb\": %.2f, "
      "\"gbps\": %.1f, \"copy_gbps\": %.1f, \"frac_of_copy\": %.3f, \"out_fnv\": \"%016llx\", \"marks\": \"entry, issued, waited, "
      "last A issued, last issued, x staged, first full, A done, barrier, exit%s\",%s %s}\n",
      w8a8 ? "fp8 w8a8" : fp8 ? "fp8" : chain ? "bf16 chain" : "bf16", static_cast<long>(kD), static_cast<long>(kI), static_cast<long>(kK + kS), t * 1e6, bytes * 1e-6,
      bytes / t * 1e-9, copy_bps * 1e-9, bytes / t / copy_bps, static_cast<unsigned long long>(fnv), w8a8 ? ", h quantized, first B stage" : "",
      w8a8 ? (moe_one_w8a8_boxes_3d() ? " \"w2_boxes\": \"3-D\"," : " \"w2_boxes\": \"2-D\",") : "", tl.c_str());
  DI_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
