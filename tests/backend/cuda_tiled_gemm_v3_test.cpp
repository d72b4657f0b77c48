// Version 3 of the tiled grouped GEMM (cuda_moe.cu: mma.sync, 64×256 tiles, cp.async pipeline)
// against version 2 and small_m_gemm — and the fp32 router GEMM against its one-launch form
// (gemm_f32_ordered_fused) — bit for bit: all of them fold each output element's K in
// the same 16-wide chunks, in the same order, from zero (and, batch-invariant, in the same
// 512-wide splits), so any difference is a bug (a lost, doubled or misplaced chunk, a wrong
// fragment mapping, a widened FP8 weight rounded differently). Dense rows through
// tiled_gemm_for_test; sizes cover partial row tiles (M 1, 63, 65, 300, 1000), partial column
// tiles (N 200, 576), K not a multiple of the 32-wide step or of 16 (136: FP8 rows only 8-byte
// aligned) and several K splits (2048). A rough v2 / v3 timing is printed, not asserted
// (benchmarks live in bench/). Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#endif
#include "support/cuda_available.h"
#ifdef DEEPINFER_HAVE_CUDA
#include "support/cuda_buffer.h"
#endif

namespace deepinfer {
namespace {

#ifdef DEEPINFER_HAVE_CUDA
using cuda::bf16;

using testing::DevBuf;
using testing::upload;
// The first n floats of d.
std::vector<float> download(const DevBuf& d, size_t n) { return testing::download<float>(d, n); }

// One weight matrix on the device: [N, K] bf16, or e4m3 codes with one fp32 scale per
// (row, block_k columns) — the layout the tiled kernels read.
struct DevWeight {
  int64_t N = 0, K = 0, block_k = 0;
  bool fp8 = false;
  std::vector<float> host;  // [N, K] the weights' values (bf16-rounded | code · scale)
  DevBuf w, scale;
  DevWeight(int64_t n, int64_t k, bool f8, int64_t bk, std::mt19937& rng)
      : N(n), K(k), block_k(bk), fp8(f8), w(static_cast<size_t>(n * k) * (f8 ? 1 : sizeof(uint16_t))),
        scale(f8 ? sizeof(float) * static_cast<size_t>(n * ((k + bk - 1) / bk)) : 0) {
    std::normal_distribution<float> d(0.0f, 1.0f / std::sqrt(static_cast<float>(k)));
    host.resize(static_cast<size_t>(n * k));
    if (!fp8) {
      std::vector<uint16_t> bits(static_cast<size_t>(n * k));
      for (size_t i = 0; i < bits.size(); ++i) {
        bits[i] = f32_to_bf16(d(rng));
        host[i] = bf16_to_f32(bits[i]);
      }
      upload(w, bits);
      return;
    }
    const int64_t n_kb = (k + bk - 1) / bk;
    std::uniform_real_distribution<float> sd(0.5f, 2.0f);
    std::vector<float> sc(static_cast<size_t>(n * n_kb));
    for (auto& x : sc) x = sd(rng) / (64.0f * std::sqrt(static_cast<float>(k)));
    std::normal_distribution<float> q(0.0f, 48.0f);
    std::vector<uint8_t> codes(static_cast<size_t>(n * k));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const size_t i = static_cast<size_t>(r * k + c);
        codes[i] = f32_to_e4m3(q(rng));
        host[i] = e4m3_to_f32(codes[i]) * sc[static_cast<size_t>(r * n_kb + c / bk)];
      }
    upload(w, codes);
    upload(scale, sc);
  }
};

class CudaTiledGemmV3 : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu_ = testing::try_cuda_backend();
    DI_REQUIRE_GPU(gpu_);
    stream_ = static_cast<cudaStream_t>(static_cast<CudaBackend*>(gpu_.get())->stream());
  }
  // A [M, K] bf16 of N(0, 1) values, on the device; `host` gets the values.
  void random_a(const DevBuf& a, int64_t M, int64_t K, std::vector<float>* host = nullptr) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<uint16_t> bits(static_cast<size_t>(M * K));
    for (auto& b : bits) b = f32_to_bf16(d(rng_));
    upload(a, bits);
    if (host) {
      host->resize(bits.size());
      for (size_t i = 0; i < bits.size(); ++i) (*host)[i] = bf16_to_f32(bits[i]);
    }
  }
  // C [M, ldc] of `version` (poisoned first: the columns past N must stay untouched).
  std::vector<float> run(int version, const DevBuf& a, int64_t M, const DevWeight& w, int64_t ldc, bool invariant) {
    DevBuf c(sizeof(float) * static_cast<size_t>(M * ldc));
    DI_CUDA_CHECK(cudaMemsetAsync(c.as<void>(), 0xff, sizeof(float) * static_cast<size_t>(M * ldc), stream_));
    cuda::tiled_gemm_for_test(version, a.as<bf16>(), M, w.K, w.w.as<void>(), w.fp8 ? w.scale.as<float>() : nullptr,
                              w.fp8, w.block_k, w.N, c.as<float>(), ldc, invariant, stream_);
    DI_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return download(c, static_cast<size_t>(M * ldc));
  }

  std::unique_ptr<Backend> gpu_;
  cudaStream_t stream_ = nullptr;
  std::mt19937 rng_{2024};
};

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), sizeof(float) * x.size()) == 0;
}

// First differing element, for the failure message.
std::string first_diff(const std::vector<float>& x, const std::vector<float>& y, int64_t ldc) {
  for (size_t i = 0; i < x.size() && i < y.size(); ++i)
    if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0)
      return "row " + std::to_string(static_cast<int64_t>(i) / ldc) + " col " +
             std::to_string(static_cast<int64_t>(i) % ldc) + ": " + std::to_string(x[i]) + " vs " +
             std::to_string(y[i]);
  return "sizes differ";
}

// Version 3 against a host fp64 sum of the same bf16 operands (a sanity bound: both versions
// could share a bug the bitwise tests below cannot see). |err| ≤ 4e-3 · Σ|a·w| + 1e-6: FP8
// weights are widened to bf16 (2^-9 relative each), fp32 sums add ~1e-6; a misplaced or lost
// chunk is off by O(|ref|).
TEST_F(CudaTiledGemmV3, MatchesHostReference) {
  for (bool fp8 : {false, true}) {
    const int64_t M = 65, N = 300, K = 176;
    DevWeight w(N, K, fp8, 128, rng_);
    DevBuf a(sizeof(uint16_t) * static_cast<size_t>(M * K));
    std::vector<float> ha;
    random_a(a, M, K, &ha);
    const std::vector<float> c = run(3, a, M, w, N, false);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p =
              static_cast<double>(ha[static_cast<size_t>(m * K + k)]) * w.host[static_cast<size_t>(n * K + k)];
          ref += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(c[static_cast<size_t>(m * N + n)], ref, 4e-3 * mag + 1e-6)
            << "fp8 " << fp8 << " m " << m << " n " << n;
      }
  }
}

// Version 3 == version 2, bit for bit, bf16 and FP8 weights, batch-invariant K structure on and
// off. ldc > N on some shapes (odd: the scalar epilogue path), the gap must stay untouched.
TEST_F(CudaTiledGemmV3, BitwiseEqualToVersion2) {
  struct Shape {
    int64_t N, K, block_k;
  };
  const std::vector<Shape> shapes = {{200, 136, 128}, {576, 176, 128}, {3072, 2048, 128},
                                     {200, 2048, 128}, {576, 136, 128}, {3072, 176, 128},
                                     {576, 2048, 24},  {200, 176, 8}};
  const int64_t max_m = 1000;
  for (const Shape& s : shapes)
    for (bool fp8 : {false, true}) {
      if (!fp8 && s.block_k != 128) continue;  // block_k only matters to FP8
      DevWeight w(s.N, s.K, fp8, s.block_k, rng_);
      DevBuf a(sizeof(uint16_t) * static_cast<size_t>(max_m * s.K));
      random_a(a, max_m, s.K);
      for (int64_t M : {1, 63, 64, 65, 300, 1000})
        for (bool invariant : {false, true}) {
          const int64_t ldc = M == 65 ? s.N + 5 : M == 300 ? s.N + 8 : s.N;
          const std::vector<float> v2 = run(2, a, M, w, ldc, invariant);
          const std::vector<float> v3 = run(3, a, M, w, ldc, invariant);
          EXPECT_TRUE(same_bits(v2, v3)) << "M=" << M << " N=" << s.N << " K=" << s.K << " fp8 " << fp8
                                         << " block_k " << s.block_k << " invariant " << invariant << ": "
                                         << first_diff(v2, v3, ldc);
        }
    }
}

// Batch-invariant version 3 == small_m_gemm (dense, K splits through partials) for M ≤ 64, the
// rows small_m_gemm serves in the batch-invariant mode — FP8 weights at M ≤ kSmallMFewRows
// through the persistent kernel (cuda_small_m_fp8.cu), the rest through the block kernel.
TEST_F(CudaTiledGemmV3, InvariantBitwiseEqualToSmallM) {
  struct Shape {
    int64_t N, K;
  };
  for (const Shape& s : {Shape{200, 136}, Shape{576, 176}, Shape{3072, 2048}, Shape{200, 2048}, Shape{40, 1408}})
    for (bool fp8 : {false, true}) {
      if (!cuda::small_m_gemm_ok(s.K, fp8, 128)) continue;  // FP8 K = 136: not small_m_gemm's
      DevWeight w(s.N, s.K, fp8, 128, rng_);
      DevBuf a(sizeof(uint16_t) * static_cast<size_t>(64 * s.K));
      random_a(a, 64, s.K);
      for (int64_t M : {1, 2, 4, 5, 17, 63, 64}) {
        const std::vector<float> v3 = run(3, a, M, w, s.N, true);
        const int64_t n_splits = cuda::invariant_k_splits(s.K);
        DevBuf part(n_splits > 1 ? sizeof(float) * static_cast<size_t>(n_splits * M * s.N) : 0);
        DevBuf c(sizeof(float) * static_cast<size_t>(M * s.N));
        cuda::small_m_gemm(a.as<bf16>(), s.K, w.w.as<void>(), fp8 ? w.scale.as<float>() : nullptr, fp8, 128, s.N,
                           nullptr, nullptr, 1, M, M, c.as<float>(), s.N, n_splits > 1 ? part.as<float>() : nullptr,
                           stream_);
        DI_CUDA_CHECK(cudaStreamSynchronize(stream_));
        const std::vector<float> sm = download(c, static_cast<size_t>(M * s.N));
        EXPECT_TRUE(same_bits(sm, v3)) << "M=" << M << " N=" << s.N << " K=" << s.K << " fp8 " << fp8
                                       << ": " << first_diff(sm, v3, s.N);
      }
    }
}

// gemm_f32_ordered_fused (a warp per K chunk, the chunk sums added in the block) == the partials
// form (a block per chunk, then sum_splits) and the sequential form, bit for bit: the router's
// 2,048 (8 chunks) and V3's 7,168 (28), one chunk (256), K not a multiple of 4 (1,001: scalar
// loads, a short last chunk); rows 1 … 16 (partial 4-row tiles), N 64 and 70 (a partial
// 4-column tile).
TEST_F(CudaTiledGemmV3, FusedRouterGemmBitwiseEqualToPartials) {
  struct Shape {
    int64_t N, K;
  };
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (const Shape& s : {Shape{64, 2048}, Shape{70, 7168}, Shape{64, 256}, Shape{70, 1001}}) {
    ASSERT_TRUE(cuda::gemm_f32_ordered_fused_ok(s.K));
    const int64_t M_max = 16, chunks = cuda::gemm_f32_ordered_chunks(s.K);
    std::vector<float> x(static_cast<size_t>(M_max * s.K)), wt(static_cast<size_t>(s.N * s.K));
    for (auto& v : x) v = d(rng_);
    for (auto& v : wt) v = d(rng_) / std::sqrt(static_cast<float>(s.K));
    DevBuf xd(sizeof(float) * x.size()), wd(sizeof(float) * wt.size());
    upload(xd, x);
    upload(wd, wt);
    for (int64_t M : {1, 3, 4, 16}) {
      const size_t n = static_cast<size_t>(M * s.N);
      DevBuf part(sizeof(float) * static_cast<size_t>(chunks) * n), c_part(sizeof(float) * n),
          c_seq(sizeof(float) * n), c(sizeof(float) * n);
      cuda::gemm_f32_ordered(xd.as<float>(), s.K, wd.as<float>(), M, s.N, s.K, c_part.as<float>(), s.N,
                             chunks > 1 ? part.as<float>() : nullptr, stream_);
      cuda::gemm_f32_ordered(xd.as<float>(), s.K, wd.as<float>(), M, s.N, s.K, c_seq.as<float>(), s.N, nullptr,
                             stream_);
      cuda::gemm_f32_ordered_fused(xd.as<float>(), s.K, wd.as<float>(), M, s.N, s.K, c.as<float>(), s.N, stream_);
      DI_CUDA_CHECK(cudaStreamSynchronize(stream_));
      const std::vector<float> ref = download(c_part, n), seq = download(c_seq, n), got = download(c, n);
      EXPECT_TRUE(same_bits(got, ref)) << "M=" << M << " N=" << s.N << " K=" << s.K << ": " << first_diff(got, ref, s.N);
      EXPECT_TRUE(same_bits(seq, ref)) << "M=" << M << " N=" << s.N << " K=" << s.K << ": " << first_diff(seq, ref, s.N);
      // And against fp64: a lost or doubled chunk is off by O(|ref|); fp32 sums of K products ~1e-5.
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < s.N; ++j) {
          double r = 0, mag = 0;
          for (int64_t k = 0; k < s.K; ++k) {
            const double p = static_cast<double>(x[static_cast<size_t>(m * s.K + k)]) * wt[static_cast<size_t>(j * s.K + k)];
            r += p;
            mag += std::fabs(p);
          }
          ASSERT_NEAR(got[static_cast<size_t>(m * s.N + j)], r, 1e-5 * mag + 1e-6) << "m " << m << " n " << j;
        }
    }
  }
}

// The bf16 wgmma GEMM against version 3, bit for bit: a wgmma k16 step computes what the
// mma.sync m16n8k16 step of the same operands and accumulator computes (not documented; measured
// on the H200, session 10: 0 of 131,072 elements differ at K = 16, 64, 512, 2048), so a wgmma
// kernel folding K in the same order keeps the tiled kernels' bits. Default form (one chain over
// all K) against version 3's default; the batch-invariant form (512-wide splits added in order,
// 128×128 tiles) against version 3's invariant one at K = 512 (one split), 1,088 (two and a
// 64-wide third), 1,408 and 2,048 (V2-Lite), over partial row and column tiles.
TEST_F(CudaTiledGemmV3, WgmmaBitwiseEqualToMmaSync) {
  if (!cuda::bf16_wgmma_invariant_ok(512)) GTEST_SKIP() << "the wgmma GEMM needs an sm_90 GPU";
  struct Shape {
    int64_t M, N, K;
  };
  for (const Shape& sh : {Shape{256, 512, 16}, Shape{256, 512, 64}, Shape{300, 576, 512}, Shape{129, 200, 1088},
                          Shape{1000, 384, 1408}, Shape{256, 512, 2048}})
    for (bool invariant : {false, true}) {
      if (invariant && !cuda::bf16_wgmma_invariant_ok(sh.K)) continue;
      DevWeight w(sh.N, sh.K, false, 128, rng_);
      DevBuf a(sizeof(uint16_t) * static_cast<size_t>(sh.M * sh.K));
      random_a(a, sh.M, sh.K);
      const std::vector<float> v3 = run(3, a, sh.M, w, sh.N, invariant);
      DevBuf c(sizeof(float) * static_cast<size_t>(sh.M * sh.N));
      cuda::bf16_wgmma_dense_gemm(a.as<bf16>(), sh.M, sh.K, w.w.as<bf16>(), sh.N, c.as<float>(), sh.N, stream_,
                                  invariant);
      DI_CUDA_CHECK(cudaStreamSynchronize(stream_));
      const std::vector<float> wg = download(c, static_cast<size_t>(sh.M * sh.N));
      EXPECT_TRUE(same_bits(wg, v3)) << "M=" << sh.M << " N=" << sh.N << " K=" << sh.K << " invariant " << invariant
                                     << ": " << first_diff(wg, v3, sh.N);
    }
}

// Rough timing at a prefill size (printed, not asserted): M = 4096, N = 5632, K = 2048.
TEST_F(CudaTiledGemmV3, TimingPrintout) {
  const int64_t M = 4096, N = 5632, K = 2048;
  DevBuf a(sizeof(uint16_t) * static_cast<size_t>(M * K));
  random_a(a, M, K);
  DevBuf c(sizeof(float) * static_cast<size_t>(M * N));
  cudaEvent_t t0, t1;
  DI_CUDA_CHECK(cudaEventCreate(&t0));
  DI_CUDA_CHECK(cudaEventCreate(&t1));
  for (bool fp8 : {false, true}) {
    DevWeight w(N, K, fp8, 128, rng_);
    for (bool invariant : {false, true})
      for (int version : {2, 3}) {
        auto launch = [&] {
          cuda::tiled_gemm_for_test(version, a.as<bf16>(), M, K, w.w.as<void>(), fp8 ? w.scale.as<float>() : nullptr,
                                    fp8, 128, N, c.as<float>(), N, invariant, stream_);
        };
        launch();  // warm-up (and the shared-memory attribute)
        const int reps = 10;
        DI_CUDA_CHECK(cudaEventRecord(t0, stream_));
        for (int r = 0; r < reps; ++r) launch();
        DI_CUDA_CHECK(cudaEventRecord(t1, stream_));
        DI_CUDA_CHECK(cudaEventSynchronize(t1));
        float ms = 0;
        DI_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
        const double us = 1e3 * ms / reps;
        std::printf("tiled v%d %s%s M=%lld N=%lld K=%lld: %.1f us, %.1f TFLOP/s\n", version, fp8 ? "fp8" : "bf16",
                    invariant ? " invariant" : "", static_cast<long long>(M), static_cast<long long>(N),
                    static_cast<long long>(K), us, 2.0 * M * N * K / (us * 1e-6) / 1e12);
      }
  }
  DI_CUDA_CHECK(cudaEventDestroy(t0));
  DI_CUDA_CHECK(cudaEventDestroy(t1));
}
#else
TEST(CudaTiledGemmV3, SkippedWithoutCuda) { GTEST_SKIP() << "built without the CUDA backend"; }
#endif

}  // namespace
}  // namespace deepinfer
