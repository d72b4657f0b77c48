// The default mode's fp32 router GEMM on the TF32 tensor cores in three passes
// (cuda::gemm_f32_3xtf32) against an fp64 host reference: random rows at the model's shapes
// (V2-Lite 64 × 2,048, V3 256 × 7,168) and at partial tiles (M 1, 31, 33; N 70; K 516, not a
// multiple of the 32-wide step), and values whose low bits only the split keeps (a single TF32
// pass drops them: off by 0.5 where the 3xTF32 sums are exact). Output columns beyond N in the
// row pitch stay untouched. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

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
using testing::DevBuf;
using testing::download;
using testing::upload;

class CudaRouterGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu_ = testing::try_cuda_backend();
    DI_REQUIRE_GPU(gpu_);
    stream_ = static_cast<cudaStream_t>(static_cast<CudaBackend*>(gpu_.get())->stream());
  }
  // C [M, ldc] fp32 from the kernel, its pad columns [N, ldc) preset to a sentinel.
  std::vector<float> run(const std::vector<float>& x, const std::vector<float>& w, int64_t M, int64_t N, int64_t K,
                         int64_t ldc) {
    DevBuf xd(sizeof(float) * x.size()), wd(sizeof(float) * w.size()), cd(sizeof(float) * static_cast<size_t>(M * ldc));
    upload(xd, x);
    upload(wd, w);
    upload(cd, std::vector<float>(static_cast<size_t>(M * ldc), kSentinel));
    EXPECT_TRUE(cuda::gemm_f32_3xtf32_ok(K, K, xd.as<float>(), wd.as<float>()));
    cuda::gemm_f32_3xtf32(xd.as<float>(), K, wd.as<float>(), M, N, K, cd.as<float>(), ldc, stream_);
    DI_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return download<float>(cd, static_cast<size_t>(M * ldc));
  }
  static constexpr float kSentinel = -12345.5f;
  std::unique_ptr<Backend> gpu_;
  cudaStream_t stream_ = nullptr;
  std::mt19937 rng_{20261202};
};

// Random N(0, 1) rows and N(0, 1/K) weights. Tolerance: 1e-5 · Σ_k |x_k·w_k| per element — what
// the invariant router's fp32 test allows, ~100× the fp32 rounding of a K-term sum of these
// sizes (≲ 1e-7 · Σ|x·w| at random signs) and far above the 3xTF32 terms' own error (~2⁻²¹ of
// each product); a wrong fragment mapping, a lost K step or a stray tile is off by O(|c|).
TEST_F(CudaRouterGemm, MatchesFp64Reference) {
  struct Shape {
    int64_t M, N, K;
  };
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (const Shape& s : {Shape{1, 64, 2048}, Shape{31, 64, 2048}, Shape{33, 70, 516}, Shape{2048, 64, 2048},
                         Shape{300, 256, 7168}}) {
    std::vector<float> x(static_cast<size_t>(s.M * s.K)), w(static_cast<size_t>(s.N * s.K));
    for (auto& v : x) v = d(rng_);
    for (auto& v : w) v = d(rng_) / std::sqrt(static_cast<float>(s.K));
    const int64_t ldc = s.N + 3;
    const std::vector<float> got = run(x, w, s.M, s.N, s.K, ldc);
    double worst = 0;  // the largest |error| / Σ|x·w|
    for (int64_t m = 0; m < s.M; ++m) {
      for (int64_t n = 0; n < s.N; ++n) {
        double r = 0, mag = 0;
        for (int64_t k = 0; k < s.K; ++k) {
          const double p = static_cast<double>(x[static_cast<size_t>(m * s.K + k)]) * w[static_cast<size_t>(n * s.K + k)];
          r += p;
          mag += std::fabs(p);
        }
        const double err = std::fabs(got[static_cast<size_t>(m * ldc + n)] - r);
        worst = std::max(worst, err / mag);
        ASSERT_LE(err, 1e-5 * mag) << "M " << s.M << " N " << s.N << " K " << s.K << ": m " << m << " n " << n;
      }
      for (int64_t n = s.N; n < ldc; ++n)
        ASSERT_EQ(got[static_cast<size_t>(m * ldc + n)], kSentinel) << "pad column " << n << " of row " << m;
    }
    std::printf("3xTF32 router GEMM %lld x %lld x %lld: worst |error| / sum|x*w| %.2e\n", static_cast<long long>(s.M),
                static_cast<long long>(s.N), static_cast<long long>(s.K), worst);
  }
}

// 1 + 2⁻¹² needs 12 mantissa bits; TF32 keeps 10, so one TF32 pass rounds it to 1. With x or w
// (or both) equal to it and the other 1, each element of K = 2,048 terms is 2,048 · (1 + 2⁻¹²) =
// 2,048.5 — every partial sum a multiple of 2⁻¹² below 4,096, so exact in fp32 — where one pass
// gives 2,048. Both at 1 + 2⁻¹²: 2,049 + 2⁻¹³ exactly; the split drops only the 2⁻²⁴ · K term.
TEST_F(CudaRouterGemm, SplitKeepsTheLowBits) {
  const int64_t M = 40, N = 70, K = 2048;
  const float one = 1.0f, fine = 1.0f + std::ldexp(1.0f, -12);
  struct Case {
    float x, w;
    double want;
  };
  for (const Case& c : {Case{fine, one, 2048.5}, Case{one, fine, 2048.5},
                        Case{fine, fine, 2048.0 * (1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -24))}}) {
    const std::vector<float> got = run(std::vector<float>(static_cast<size_t>(M * K), c.x),
                                       std::vector<float>(static_cast<size_t>(N * K), c.w), M, N, K, N);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], c.want, 1e-3) << "x " << c.x << " w " << c.w << " element " << i;
  }
}

// Rows whose pitch leaves them 16-byte aligned only when K and ldx are multiples of 4.
TEST_F(CudaRouterGemm, OkNeedsAlignedRows) {
  DevBuf b(sizeof(float) * 64);
  const float* p = b.as<float>();
  EXPECT_TRUE(cuda::gemm_f32_3xtf32_ok(2048, 2048, p, p));
  EXPECT_FALSE(cuda::gemm_f32_3xtf32_ok(2046, 2046, p, p));
  EXPECT_FALSE(cuda::gemm_f32_3xtf32_ok(2048, 2050, p, p));
  EXPECT_FALSE(cuda::gemm_f32_3xtf32_ok(2048, 2048, p + 1, p));
  EXPECT_FALSE(cuda::gemm_f32_3xtf32_ok(0, 0, p, p));
}

#else
TEST(CudaRouterGemm, SkippedWithoutCuda) { GTEST_SKIP() << "built without the CUDA backend"; }
#endif

}  // namespace
}  // namespace deepinfer
