// MLA absorbed decode (cuda::mla_decode: absorb_q, split-KV over the paged latent cache, merge and
// W_UV) at DeepSeek's latent shape (r 512, dr 64, dn 128, dv 128), one JSON line per case on stdout.
// A case is (heads, rows, context): `rows` sequences of one query row each, every one attending to
// `context` cached positions in its own pages (shuffled over the pool, 64 tokens each). Figure:
// bytes touched per call — each row's latents (context × 576 × 2 bytes), kv_b (H × 256 × 512 × 2),
// q and out — per second, against a device-to-device copy rate measured in the same run (issue 7,
// point 1: ≥ 0.8 of it at long context); and the attention's FLOPs — per row, head and key
// 2·(576 + 512), the scores and P·V over the latents — per second, against a bf16 cuBLAS GEMM
// (8192³) of the same run: at H = 128 a key's 278.5 KFLOP outweigh its 1,152 bytes (242 FLOP/B,
// above the H200's ~185 FLOP/B ridge), so the matrix rate is that shape's ceiling. Timing as
// bench/fp8_gemm_bench (cuda_timing.h): CUDA graph replays, the median of --reps; when a case's
// latents fit twice in L2 they are rotated through copies so every call reads them from HBM. Does
// not check results (CudaMlaTc tests do).
// Usage: mla_decode_bench [--heads 16,128] [--cases 1:4096,1:32768,...] [--kernel -1|0|1|2]
//                         [--split-keys 0|256] [--reps 9]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/cuda/cuda_common.h"
#include "cuda_timing.h"

using namespace deepinfer::cuda;
using deepinfer::bench::BenchStream;
using deepinfer::bench::bf16_gemm_rate;
using deepinfer::bench::copy_rate;
using deepinfer::bench::Dev;
using deepinfer::bench::l2_bytes;
using deepinfer::bench::parse_list;
using deepinfer::bench::time_launches;
using deepinfer::bench::upload;

namespace {

constexpr int64_t kR = 512, kDr = 64, kDn = 128, kDv = 128, kBlock = 64;

// Bump allocator over one buffer, reset before every call (mla_decode takes its scratch from it).
struct Scratch {
  char* base = nullptr;
  size_t used = 0, cap = 0;
  static void* alloc(void* ctx, size_t n) {
    auto* s = static_cast<Scratch*>(ctx);
    const size_t at = s->used;
    s->used += (n + 255) / 256 * 256;
    DI_CUDA_REQUIRE(s->used <= s->cap);
    return s->base + at;
  }
};


void bench_case(int64_t H, int64_t rows, int64_t context, int kernel, int64_t split_keys, int reps, double copy_bps,
                double gemm_rate, cudaStream_t s) {
  const int64_t width = kR + kDr, pages_per_seq = (context + kBlock - 1) / kBlock;
  const double latent_bytes = static_cast<double>(rows * context * width * 2);
  const int copies = static_cast<int>(
      std::clamp<int64_t>(static_cast<int64_t>(2.0 * static_cast<double>(l2_bytes()) / latent_bytes) + 1, 1, 16));
  const int64_t n_pages = pages_per_seq * rows * copies;
  Dev cache(static_cast<size_t>(n_pages * kBlock * width) * 2), kvb(static_cast<size_t>(H * (kDn + kDv) * kR) * 2),
      q(static_cast<size_t>(rows * H * (kDn + kDr)) * 4), out(static_cast<size_t>(rows * H * kDv) * 4);
  fill_random(cache.p, Elem::kBF16, n_pages * kBlock * width, 1, true, 1.0f, 0.0f, s);
  fill_random(kvb.p, Elem::kBF16, H * (kDn + kDv) * kR, 2, true, 0.05f, 0.0f, s);
  fill_random(q.p, Elem::kF32, rows * H * (kDn + kDr), 3, true, 1.0f, 0.0f, s);

  // Per copy: the rows' page lists, pages shuffled over the copy's share of the pool.
  std::mt19937 rng(7);
  std::vector<int32_t> q_indptr(static_cast<size_t>(rows + 1)), kv_len(static_cast<size_t>(rows), static_cast<int32_t>(context)),
      block_indptr(static_cast<size_t>(rows + 1));
  std::iota(q_indptr.begin(), q_indptr.end(), 0);
  for (int64_t b = 0; b <= rows; ++b) block_indptr[static_cast<size_t>(b)] = static_cast<int32_t>(b * pages_per_seq);
  const Dev d_q_indptr = upload(q_indptr, s), d_kv_len = upload(kv_len, s), d_block_indptr = upload(block_indptr, s);
  std::vector<Dev> d_ids;
  for (int c = 0; c < copies; ++c) {
    std::vector<int32_t> ids(static_cast<size_t>(pages_per_seq * rows));
    std::iota(ids.begin(), ids.end(), static_cast<int32_t>(c * pages_per_seq * rows));
    std::shuffle(ids.begin(), ids.end(), rng);
    d_ids.push_back(upload(ids, s));
  }

  MlaDecodeArgs a{};
  a.q = static_cast<const float*>(q.p);
  a.kv_b = static_cast<const bf16*>(kvb.p);
  a.kv_b_stable = true;  // uploaded once, as the engine's placed weight: read before the PDL wait
  a.cache = static_cast<const bf16*>(cache.p);
  a.q_indptr = static_cast<const int32_t*>(d_q_indptr.p);
  a.kv_len = static_cast<const int32_t*>(d_kv_len.p);
  a.block_indptr = static_cast<const int32_t*>(d_block_indptr.p);
  a.n_seqs = rows, a.T = rows, a.n_rows = rows, a.H = H;
  a.r = kR, a.dr = kDr, a.dn = kDn, a.dv = kDv, a.block_size = kBlock, a.n_blocks = n_pages;
  a.scale = 1.0f / std::sqrt(static_cast<float>(kDn + kDr));
  a.out = static_cast<float*>(out.p);
  a.split_keys = split_keys;
  a.max_splits = split_keys > 0 ? 32 : 0;
  a.kernel = kernel;
  const size_t scratch_bytes =
      static_cast<size_t>(rows * H * (4 * kR * (1 + kMlaMaxSplits) + 2 * kR + 8 * kMlaMaxSplits) + 8 * rows) + 8192;
  Dev scratch_buf(scratch_bytes);
  Scratch scratch{static_cast<char*>(scratch_buf.p), 0, scratch_bytes};
  const double t = time_launches(
      [&](int i) {
        MlaDecodeArgs x = a;
        x.block_ids = static_cast<const int32_t*>(d_ids[static_cast<size_t>(i % copies)].p);
        scratch.used = 0;
        mla_decode(x, Scratch::alloc, &scratch, s);
      },
      reps, s);
  const double other_bytes = static_cast<double>(H * (kDn + kDv) * kR * 2 + rows * H * (kDn + kDr + kDv) * 4);
  const double gbps = (latent_bytes + other_bytes) / t * 1e-9;
  const double flops = 2.0 * static_cast<double>(rows * context * H * (width + kR));
  std::printf(
      "{\"kernel\": \"deepinfer_mla_decode\", \"variant\": %d, \"split_keys\": %ld, \"H\": %ld, \"rows\": %ld, "
      "\"context\": %ld, \"us\": %.2f, \"latent_mb\": %.1f, \"gbps\": %.1f, \"copy_gbps\": %.1f, "
      "\"frac_of_copy\": %.3f, \"tflops\": %.1f, \"gemm_tflops\": %.1f, \"frac_of_gemm\": %.3f}\n",
      kernel, static_cast<long>(split_keys), static_cast<long>(H), static_cast<long>(rows), static_cast<long>(context),
      t * 1e6, latent_bytes * 1e-6, gbps, copy_bps * 1e-9, gbps / (copy_bps * 1e-9), flops / t * 1e-12,
      gemm_rate * 1e-12, flops / t / gemm_rate);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"MLA absorbed decode benchmark (DeepSeek latent shape)"};
  std::string heads = "16,128", cases = "1:4096,1:32768,1:131072,8:32768,32:16384,128:4096,128:16384";
  int kernel = -1, reps = 9;
  int64_t split_keys = 0;
  app.add_option("--heads", heads, "query heads, comma-separated");
  app.add_option("--cases", cases, "rows:context pairs, comma-separated");
  app.add_option("--kernel", kernel,
                 "split kernel: -1 automatic, 0 fp32, 1 tensor cores (the TMA kernels where they apply: "
                 "warp-specialized at H < 64, wgmma at H >= 64), 2 one-row mma.sync");
  app.add_option("--split-keys", split_keys, "0: split count by launch size; 256: the batch-invariant rule");
  app.add_option("--reps", reps, "timed batches (median)");
  CLI11_PARSE(app, argc, argv);

  const BenchStream bs;
  cudaStream_t s = bs.s;
  const double copy_bps = copy_rate(s);
  std::printf("{\"kernel\": \"d2d_copy\", \"copy_gbps\": %.1f}\n", copy_bps * 1e-9);
  const double gemm_rate = bf16_gemm_rate(bs.blas, s);
  std::printf("{\"kernel\": \"cublas_bf16_gemm_8192\", \"tflops\": %.1f}\n", gemm_rate * 1e-12);
  std::stringstream ss(cases);
  std::string c;
  std::vector<std::pair<int64_t, int64_t>> pairs;
  while (std::getline(ss, c, ',')) {
    const std::vector<int64_t> rc = parse_list(c, ':');
    if (rc.size() != 2 || rc[0] < 1 || rc[1] < 1) {
      std::fprintf(stderr, "mla_decode_bench: bad case '%s' (want rows:context)\n", c.c_str());
      return 2;
    }
    pairs.emplace_back(rc[0], rc[1]);
  }
  for (int64_t H : parse_list(heads))
    for (const auto& [rows, context] : pairs)
      bench_case(H, rows, context, kernel, split_keys, reps, copy_bps, gemm_rate, s);
  return 0;
}
