// The fp32 router GEMM on split bf16 operands (router_split.h, cuda_router_gemm.cu).
// On the host (CI): the split's exactness (x = hi + mid + lo for normal x: each difference and
// the last part are exact), the K permutation, and the whole data flow of the kernel emulated from
// the PTX definitions it relies on — each thread's float4 loads assigned to the register A
// fragment of mma.m16n8k16 / wgmma, the weight image read through a K-major 128-byte-swizzle
// descriptor (the address formed as the descriptor defines it, then bits [4, 7) xor-ed with bits
// [7, 10)) — against a plain fp64 dot product: a wrong fragment, permutation or swizzle sends
// terms to other outputs and misses by O(Σ|x·w|). On the GPU (skipped without one): the kernel and
// the backend's dispatch against fp64 on awkward sizes.
// Tolerance: |c − Σ x·w| ≤ 1e-6 · Σ|x·w|. The split is exact (above) and the image's parts too
// where W holds bf16 values; three parts of an fp32 W drop terms ≤ 2^-24·|x·w| each (≤ 2e-7).
// Products of two bf16 are exact in fp32. What remains is the tensor cores' accumulation, which
// truncates (session 29 measured 3.6–6.7e-7 over a whole K of 2,048 on mma.sync), here over four
// k16 steps per chunk at most (≤ 4 · 2^-23 of a chunk's Σ|x·w|: 5e-7 in the worst case), and the
// chunks' fp32 sum, rounding to nearest (a random walk of ≤ 112 additions: ~6e-7 of Σ|x·w| at V3's
// K in the worst case, ~1e-7 typically). The same per-chunk arithmetic measured 3–4e-8 in s29-3,
// level with cuBLAS's SGEMM (2–4e-8); 1e-6 leaves 25× of room and is far below the O(1) of a
// misplaced term. The host emulation sums in fp64: 1e-12 (one part), 4e-7 (three: the dropped
// products).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/router_split.h"
#include "core/dtype.h"
#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "support/cuda_buffer.h"
#endif
#include "support/cuda_available.h"

namespace deepinfer {
namespace {

using cuda::kRouterBlockElems;
using cuda::kRouterChunkK;
using cuda::kRouterTileN;

TEST(RouterSplit, PermutationGivesEachThreadOneFloat4PerStep) {
  std::vector<int> seen(64, 0);
  for (int L = 0; L < 64; ++L) ++seen[static_cast<size_t>(cuda::router_phys_k(L))];
  for (int p = 0; p < 64; ++p) EXPECT_EQ(seen[static_cast<size_t>(p)], 1) << p;
  // Thread t's A-fragment columns of step s (mma.m16n8k16: 2t, 2t + 1, 2t + 8, 2t + 9) are the
  // float4 at 16t + 4s, in register order.
  for (int s = 0; s < 4; ++s)
    for (int t = 0; t < 4; ++t) {
      const int cols[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};
      for (int j = 0; j < 4; ++j) EXPECT_EQ(cuda::router_phys_k(16 * s + cols[j]), 16 * t + 4 * s + j);
    }
}

TEST(RouterSplit, ThreePartsSumExactlyToNormalValues) {
  std::mt19937_64 rng(7);
  std::vector<float> xs = {1.0f, -1.0f, 0.1f, 3.14159265f, 65504.0f, 1e-30f, -7.5e-12f, 3.0e38f, 1.17549435e-38f};
  for (int i = 0; i < 200000; ++i) {
    // Every exponent of the normal range and a random significand, both signs.
    const uint32_t e = 1 + static_cast<uint32_t>(rng() % 253), m = static_cast<uint32_t>(rng()) & 0x7fffffu;
    xs.push_back(std::bit_cast<float>((static_cast<uint32_t>(rng() & 1) << 31) | (e << 23) | m));
  }
  for (const float x : xs) {
    uint16_t p[3];
    cuda::router_split(x, p);
    const double sum = static_cast<double>(bf16_to_f32(p[0])) + bf16_to_f32(p[1]) + bf16_to_f32(p[2]);
    // Below ~2^-100 the last parts fall into bf16 subnormals (not exact there; such values add nothing).
    if (std::fabs(x) >= 0x1p-100f) ASSERT_EQ(sum, static_cast<double>(x)) << x;
    else ASSERT_LE(std::fabs(sum - x), 0x1p-24 * std::fabs(x) + 0x1p-132) << x;  // bf16 subnormals: 2^-133 apart
    // hi is x to nearest bf16; mid and lo each within half an ulp (8 bits) of what is left.
    ASSERT_EQ(p[0], f32_to_bf16(x));
    ASSERT_LE(std::fabs(bf16_to_f32(p[1])), 0x1p-8 * std::fabs(x) * 1.0000001 + 0x1p-140);
  }
  uint16_t z[3];
  cuda::router_split(0.0f, z);
  EXPECT_EQ(z[0] | z[1] | z[2], 0);
}

TEST(RouterSplit, ImagePartsFollowTheWeightsValues) {
  std::vector<float> w = {1.0f, -0.5f, bf16_to_f32(0x3e4d), 0.0f};
  EXPECT_EQ(cuda::router_image_parts(w.data(), static_cast<int64_t>(w.size())), 1);
  w.push_back(0.1f);  // not a bf16 value
  EXPECT_EQ(cuda::router_image_parts(w.data(), static_cast<int64_t>(w.size())), 3);
  w.back() = std::nanf("");
  EXPECT_EQ(cuda::router_image_parts(w.data(), static_cast<int64_t>(w.size())), 3);
  EXPECT_EQ(cuda::router_image_elems(64, 2048, 1), 32 * kRouterBlockElems);
  EXPECT_EQ(cuda::router_image_elems(160, 7168, 3), 3 * 112 * 3 * kRouterBlockElems);
}

// Random X [M, K] fp32 over ±2^±8 and W [N, K], bf16 values (one part) or fp32 (three parts).
struct Problem {
  int64_t M, N, K;
  std::vector<float> x, w;
  Problem(int64_t m, int64_t n, int64_t k, bool bf16_weights, uint64_t seed) : M(m), N(n), K(k) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::uniform_int_distribution<int> sc(-8, 8);
    x.resize(static_cast<size_t>(M * K));
    w.resize(static_cast<size_t>(N * K));
    for (auto& v : x) v = std::ldexp(d(rng), sc(rng));
    for (auto& v : w) {
      v = d(rng) / std::sqrt(static_cast<float>(K));
      if (bf16_weights) v = bf16_to_f32(f32_to_bf16(v));
    }
  }
  double dot(int64_t m, int64_t n, bool abs) const {
    double s = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double p = static_cast<double>(x[static_cast<size_t>(m * K + k)]) * w[static_cast<size_t>(n * K + k)];
      s += abs ? std::fabs(p) : p;
    }
    return s;
  }
};

// The kernel's data flow on the host, in fp64: per (row tile, column tile, chunk), every thread's
// two rows of float4 loads become its A fragments (registers a[0..3] = (row g, cols 2t, 2t + 1),
// (g + 8, ...), (g, 2t + 8, 2t + 9), (g + 8, ...) of each k16 step), the x parts are split, and B
// (n, k) of step q is read from the image block as the descriptor addresses it: start + 32q,
// row n at (n % 8)·128 + (n / 8)·1024 (stride offset), k at 2k bytes; then the 128-byte swizzle.
std::vector<double> emulate(const Problem& pr, int parts, const std::vector<uint16_t>& image) {
  const int64_t n_tiles = (pr.N + kRouterTileN - 1) / kRouterTileN, n_chunks = pr.K / kRouterChunkK;
  const int64_t m_tiles = (pr.M + 63) / 64;
  std::vector<double> c(static_cast<size_t>(pr.M * pr.N), 0.0);
  // The products the kernel forms: (x part, W part) of order ≤ 2.
  std::vector<std::pair<int, int>> products;
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < parts; ++b)
      if (a + b <= 2) products.emplace_back(a, b);
  for (int64_t mt = 0; mt < m_tiles; ++mt)
    for (int64_t nt = 0; nt < n_tiles; ++nt)
      for (int64_t ch = 0; ch < n_chunks; ++ch) {
        // A[part][row][L]: logical k L of the chunk as the fragments hold it.
        std::vector<double> A(static_cast<size_t>(3 * 64 * 64), 0.0);
        for (int tid = 0; tid < 128; ++tid) {
          const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
          for (int q = 0; q < 4; ++q)
            for (int h = 0; h < 2; ++h) {
              const int64_t row = mt * 64 + 16 * warp + g + 8 * h;
              float f4[4] = {0, 0, 0, 0};
              if (row < pr.M)
                for (int j = 0; j < 4; ++j) f4[j] = pr.x[static_cast<size_t>(row * pr.K + ch * 64 + 16 * t + 4 * q + j)];
              // a[h] holds (f4[0], f4[1]) at cols 2t, 2t + 1; a[2 + h] (f4[2], f4[3]) at 2t + 8, 2t + 9.
              const int cols[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};
              for (int j = 0; j < 4; ++j) {
                uint16_t p[3];
                cuda::router_split(f4[j], p);
                for (int a = 0; a < 3; ++a)
                  A[static_cast<size_t>((a * 64 + 16 * warp + g + 8 * h) * 64 + 16 * q + cols[j])] = bf16_to_f32(p[a]);
              }
            }
        }
        const uint16_t* blocks = image.data() + (nt * n_chunks + ch) * parts * kRouterBlockElems;
        for (int r = 0; r < 64; ++r)
          for (int n = 0; n < 64; ++n) {
            const int64_t row = mt * 64 + r, col = nt * 64 + n;
            if (row >= pr.M || col >= pr.N) continue;
            double acc = 0;
            for (const auto& [a, b] : products)
              for (int q = 0; q < 4; ++q)
                for (int k = 0; k < 16; ++k) {
                  const uint32_t addr = 32u * q + (n % 8) * 128u + (n / 8) * 1024u + 2u * k;
                  const uint32_t phys = addr ^ (((addr >> 7) & 7u) << 4);
                  const double wv = bf16_to_f32(blocks[b * kRouterBlockElems + phys / 2]);
                  acc += A[static_cast<size_t>((a * 64 + r) * 64 + 16 * q + k)] * wv;
                }
            c[static_cast<size_t>(row * pr.N + col)] += acc;
          }
      }
  return c;
}

void expect_close(const Problem& pr, const std::vector<double>& c, double tol, const char* what) {
  double worst = 0;
  for (int64_t m = 0; m < pr.M; ++m)
    for (int64_t n = 0; n < pr.N; ++n) {
      const double err = std::fabs(c[static_cast<size_t>(m * pr.N + n)] - pr.dot(m, n, false)) / pr.dot(m, n, true);
      worst = std::max(worst, err);
      ASSERT_LE(err, tol) << what << " at (" << m << ", " << n << ")";
    }
  std::printf("[ %s ] M %lld N %lld K %lld: worst |err| / Σ|x·w| = %.3g\n", what, static_cast<long long>(pr.M),
              static_cast<long long>(pr.N), static_cast<long long>(pr.K), worst);
}

TEST(RouterSplit, EmulatedKernelEqualsTheDotProduct) {
  struct Case {
    int64_t M, N, K;
    bool bf16_weights;
  };
  for (const Case& cs : {Case{70, 80, 192, true}, Case{1, 64, 64, true}, Case{65, 130, 128, false}}) {
    const Problem pr(cs.M, cs.N, cs.K, cs.bf16_weights, static_cast<uint64_t>(cs.M * 31 + cs.N));
    const int parts = cuda::router_image_parts(pr.w.data(), cs.N * cs.K);
    ASSERT_EQ(parts, cs.bf16_weights ? 1 : 3);
    std::vector<uint16_t> image(static_cast<size_t>(cuda::router_image_elems(cs.N, cs.K, parts)), 0xffff);
    cuda::build_router_image(pr.w.data(), cs.N, cs.K, parts, image.data());
    // One part: x's parts are exact and so are the products — fp64's rounding only. Three: the
    // dropped products of order 3 (≤ 3 · 2^-24 of |x·w|).
    expect_close(pr, emulate(pr, parts, image), parts == 1 ? 1e-12 : 4e-7, parts == 1 ? "emulated, 1 part" : "emulated, 3 parts");
  }
}

#ifdef DEEPINFER_HAVE_CUDA
// The device kernel directly (strided X) and through CudaBackend::matmul (the placed router's
// image, set_router_split) against fp64.
TEST(RouterGemmCuda, MatchesFp64OnAwkwardSizes) {
  auto gpu = testing::try_cuda_backend();
  DI_REQUIRE_GPU(gpu);
  if (!cuda::router_gemm_ok(reinterpret_cast<const float*>(256), 2048, 2048)) GTEST_SKIP() << "needs sm_90";
  struct Case {
    int64_t M, N, K, ldx;
    bool bf16_weights;
  };
  // Partial row and column tiles, one chunk, an empty last K split (9 chunks over 4 ranks), the
  // 4K prefill's cluster of 4, V3's width, fp32 weights (three parts).
  const Case cases[] = {{1, 64, 2048, 2048, true},   {63, 64, 2048, 2052, true},  {300, 160, 2048, 2048, true},
                        {130, 64, 64, 64, true},     {200, 64, 576, 580, true},   {4096, 64, 2048, 2048, true},
                        {777, 256, 7168, 7168, true}, {300, 64, 2048, 2048, false}, {64, 96, 640, 644, false}};
  for (const Case& cs : cases) {
    const Problem pr(cs.M, cs.N, cs.K, cs.bf16_weights, static_cast<uint64_t>(cs.M + 7 * cs.K));
    const int parts = cuda::router_image_parts(pr.w.data(), cs.N * cs.K);
    std::vector<uint16_t> image(static_cast<size_t>(cuda::router_image_elems(cs.N, cs.K, parts)));
    cuda::build_router_image(pr.w.data(), cs.N, cs.K, parts, image.data());
    std::vector<float> xs(static_cast<size_t>(cs.M * cs.ldx), std::nanf(""));  // the padding never read
    for (int64_t m = 0; m < cs.M; ++m)
      std::copy_n(pr.x.begin() + m * cs.K, cs.K, xs.begin() + m * cs.ldx);
    testing::DevBuf dx(xs.size() * 4), dimg(image.size() * 2), dc(static_cast<size_t>(cs.M * cs.N) * 4);
    testing::upload(dx, xs);
    testing::upload(dimg, image);
    cuda::router_gemm(dx.as<const float>(), cs.ldx, dimg.as<const uint16_t>(), parts, cs.M, cs.N, cs.K, dc.as<float>(),
                      cs.N, nullptr);
    DI_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> c = testing::download<float>(dc, static_cast<size_t>(cs.M * cs.N));
    expect_close(pr, std::vector<double>(c.begin(), c.end()), 1e-6, "router_gemm");
  }
}

TEST(RouterGemmCuda, BackendMatmulTakesThePlacedImage) {
  auto gpu = testing::try_cuda_backend();
  DI_REQUIRE_GPU(gpu);
  if (!cuda::router_gemm_ok(reinterpret_cast<const float*>(256), 2048, 2048)) GTEST_SKIP() << "needs sm_90";
  auto& cb = dynamic_cast<CudaBackend&>(*gpu);
  const Problem pr(1000, 64, 2048, true, 99);
  LinearWeight host;
  host.weight = Tensor::empty_host(DType::kF32, {pr.N, pr.K});
  std::copy(pr.w.begin(), pr.w.end(), host.weight.data<float>());
  const LinearWeight w = gpu->place_linear_fp32(host);
  ASSERT_TRUE(w.derived.defined());
  EXPECT_EQ(w.derived.size(1), 1);  // bf16 values: one part
  Tensor x = Tensor::empty_host(DType::kF32, {pr.M, pr.K});
  std::copy(pr.x.begin(), pr.x.end(), x.data<float>());
  const Tensor dx = gpu->upload(x);
  for (const bool on : {true, false}) {  // the split kernel, then cuBLAS's SGEMM
    cb.set_router_split(on);
    Tensor out = gpu->empty(DType::kF32, {pr.M, pr.N});
    gpu->matmul(dx, 0, w, out);
    const Tensor h = gpu->to_host(out);
    expect_close(pr, std::vector<double>(h.data<float>(), h.data<float>() + pr.M * pr.N), 1e-6,
                 on ? "matmul, split" : "matmul, cuBLAS");
  }
  cb.set_router_split(false);
}
#endif

}  // namespace
}  // namespace deepinfer
