// The fp32 router on the norm's two-part bf16 rows (CudaBackend::set_router_parts): the FFN input
// norm also writes x's rows as [RN(x) | RN(x − RN(x))] (cuda::add_rms_norm_parts) and the logits
// are one bf16 GEMM of those parts against [W | W] (LinearWeight::derived2) with fp32 accumulation.
// On the host (CI): the two parts' bound. On the GPU (skipped without one): the norm's outputs the
// same bits as the norm without parts, the parts exactly RN(x) and RN(x − RN(x)), the logits
// against fp64, and the backend's op (placement, dispatch, routing) against the op without it.
// Tolerance on the logits: |c − Σ x·w| ≤ 2e-5 · Σ|x·w|. x − RN(x) is exact in fp32 (a value minus
// its rounding to a coarser grid) and ≤ 2^-8·|x|; rounding it to bf16 leaves ≤ half an ulp of its
// own binade, ≤ 2^-17·|x| (bf16 keeps 8 significant bits): the parts miss x by ≤ 2^-17·|x|, so
// the logits by ≤ 7.6e-6 of Σ|x·w| at worst (errors of random sign: ~1e-7 typically). W's values
// are bf16 values and products of two bf16 are exact in fp32; what remains is the tensor cores'
// fp32 accumulation over K = 2·D terms (3.6–6.7e-7 of Σ|x·w| measured over 2,048 terms on
// mma.sync, run s29-2): ≤ ~9e-6 in all at worst, and 2e-5 leaves 2× of room; a misplaced part or
// a wrong half of [W | W] misses by O(Σ|x·w|). Against cuBLAS's SGEMM (~3e-8) this is more error,
// and ~500× below a router on bf16 rows (2^-8): routing moves only where two logits are within
// ~2e-5 · Σ|x·w| — which the op test allows, and reports.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "support/cuda_buffer.h"
#endif
#include "support/cuda_available.h"

namespace deepinfer {
namespace {

float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

TEST(RouterParts, TwoBf16PartsMissXBy2ToMinus17) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200000; ++i) {
    // Exponents from 2^-100 to 2^100 (below, the second part meets bf16's subnormals), both signs.
    const uint32_t e = 27 + static_cast<uint32_t>(rng() % 200), m = static_cast<uint32_t>(rng()) & 0x7fffffu;
    const float x = std::bit_cast<float>((static_cast<uint32_t>(rng() & 1) << 31) | (e << 23) | m);
    const float hi = bf16_round(x), rest = x - hi, mid = bf16_round(rest);
    ASSERT_EQ(static_cast<double>(rest), static_cast<double>(x) - static_cast<double>(hi)) << x;  // exact
    ASSERT_LE(std::fabs(static_cast<double>(x) - hi - mid), 0x1p-17 * std::fabs(x)) << x;
  }
}

#ifdef DEEPINFER_HAVE_CUDA
// residual, delta [T, D] ~ N(0, 1), a norm weight around 1 (fp32), router W [E, D] with bf16
// values ~ N(0, 1/D).
struct NormRouteProblem {
  int64_t T, D, E;
  std::vector<float> res, delta, norm, w;
  NormRouteProblem(int64_t t, int64_t d, int64_t e, uint32_t seed) : T(t), D(d), E(e) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    res.resize(static_cast<size_t>(T * D));
    delta.resize(res.size());
    norm.resize(static_cast<size_t>(D));
    w.resize(static_cast<size_t>(E * D));
    for (auto& v : res) v = n01(rng);
    for (auto& v : delta) v = n01(rng);
    for (auto& v : norm) v = 1.0f + 0.1f * n01(rng);
    for (auto& v : w) v = bf16_round(n01(rng) / std::sqrt(static_cast<float>(D)));
  }
  // Σ_k x[t, k]·w[e, k] (abs: Σ|·|) in fp64 for the norm's output x [T, D].
  double dot(const std::vector<float>& x, int64_t t, int64_t e, bool abs) const {
    double s = 0;
    for (int64_t k = 0; k < D; ++k) {
      const double p = static_cast<double>(x[static_cast<size_t>(t * D + k)]) * w[static_cast<size_t>(e * D + k)];
      s += abs ? std::fabs(p) : p;
    }
    return s;
  }
};

// The launcher directly, for each form of x's rows (none, e4m3 codes, bf16 rows): residual, x and
// the rows the same bits as the norm without parts; the parts RN(x) and RN(x − RN(x)) bitwise;
// the GEMM of the parts against [W | W] within 2e-5 of Σ|x·w| of fp64.
TEST(RouterPartsCuda, NormPartsAndGemmMatchFp64) {
  auto gpu = testing::try_cuda_backend();
  DI_REQUIRE_GPU(gpu);
  const NormRouteProblem pr(700, 2048, 64, 5);
  const int64_t T = pr.T, D = pr.D, E = pr.E;
  std::vector<uint16_t> pair(static_cast<size_t>(E * 2 * D));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t k = 0; k < D; ++k)
      pair[static_cast<size_t>(e * 2 * D + k)] = pair[static_cast<size_t>(e * 2 * D + D + k)] =
          f32_to_bf16(pr.w[static_cast<size_t>(e * D + k)]);
  testing::DevBuf d_norm(static_cast<size_t>(D) * 4), d_pair(pair.size() * 2), d_c(static_cast<size_t>(T * E) * 4);
  testing::upload(d_norm, pr.norm);
  testing::upload(d_pair, pair);
  cublasHandle_t blas = nullptr;
  DI_CUBLAS_CHECK(cublasCreate(&blas));
  for (int q_kind = 0; q_kind <= 2; ++q_kind) {
    SCOPED_TRACE(q_kind == 0 ? "no rows" : q_kind == 1 ? "e4m3 codes" : "bf16 rows");
    const size_t n = static_cast<size_t>(T * D), q_bytes = q_kind == 1 ? n : 2 * n;
    // [0]: the norm as the op path runs it; [1]: with parts.
    testing::DevBuf r0(n * 4), r1(n * 4), dl(n * 4), x0(n * 4), x1(n * 4), q0(q_bytes), q1(q_bytes);
    testing::DevBuf s0(n / 128 * 4), s1(n / 128 * 4), parts(2 * n * 2);
    testing::upload(r0, pr.res);
    testing::upload(r1, pr.res);
    testing::upload(dl, pr.delta);
    bool ok = true;
    if (q_kind == 0)
      cuda::add_rms_norm(r0.as<float>(), dl.as<const float>(), d_norm.as<void>(), cuda::Elem::kF32, D, 1e-6f,
                         x0.as<float>(), T, nullptr);
    else if (q_kind == 1)
      ok = cuda::add_rms_norm_quantized(r0.as<float>(), dl.as<const float>(), d_norm.as<void>(), cuda::Elem::kF32, D,
                                        1e-6f, x0.as<float>(), q0.as<uint8_t>(), s0.as<float>(), T, nullptr);
    else
      ok = cuda::add_rms_norm_bf16(r0.as<float>(), dl.as<const float>(), d_norm.as<void>(), cuda::Elem::kF32, D,
                                   1e-6f, x0.as<float>(), q0.as<cuda::bf16>(), T, nullptr);
    ASSERT_TRUE(ok);
    ASSERT_TRUE(cuda::add_rms_norm_parts(r1.as<float>(), dl.as<const float>(), d_norm.as<void>(), cuda::Elem::kF32, D,
                                         1e-6f, x1.as<float>(), q_kind, q_kind == 0 ? nullptr : q1.as<void>(),
                                         q_kind == 1 ? s1.as<float>() : nullptr, parts.as<cuda::bf16>(), T, nullptr));
    cuda::gemm(blas, T, E, 2 * D, parts.as<const cuda::bf16>(), 2 * D, 0, d_pair.as<const cuda::bf16>(), 2 * D, 0, true,
               d_c.as<void>(), cuda::Elem::kF32, E, 0, 1, 0.0f);
    DI_CUDA_CHECK(cudaDeviceSynchronize());
    auto same = [](const testing::DevBuf& a, const testing::DevBuf& b, size_t bytes) {
      const auto ha = testing::download<uint8_t>(a, bytes), hb = testing::download<uint8_t>(b, bytes);
      return std::memcmp(ha.data(), hb.data(), bytes) == 0;
    };
    EXPECT_TRUE(same(r0, r1, n * 4)) << "residual";
    EXPECT_TRUE(same(x0, x1, n * 4)) << "x";
    if (q_kind != 0) {
      EXPECT_TRUE(same(q0, q1, q_bytes)) << "x's rows";
    }
    if (q_kind == 1) {
      EXPECT_TRUE(same(s0, s1, n / 128 * 4)) << "x's scales";
    }
    const std::vector<float> x = testing::download<float>(x1, n);
    const std::vector<uint16_t> p = testing::download<uint16_t>(parts, 2 * n);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < D; ++k) {
        const float v = x[static_cast<size_t>(t * D + k)];
        const uint16_t hi = p[static_cast<size_t>(t * 2 * D + k)], mid = p[static_cast<size_t>(t * 2 * D + D + k)];
        ASSERT_EQ(hi, f32_to_bf16(v)) << "row " << t << " column " << k;
        ASSERT_EQ(mid, f32_to_bf16(v - bf16_to_f32(hi))) << "row " << t << " column " << k;
      }
    const std::vector<float> c = testing::download<float>(d_c, static_cast<size_t>(T * E));
    double worst = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) {
        const double got = c[static_cast<size_t>(t * E + e)];
        const double err = std::fabs(got - pr.dot(x, t, e, false)) / pr.dot(x, t, e, true);
        worst = std::max(worst, err);
        ASSERT_LE(err, 2e-5) << "logit (" << t << ", " << e << ")";
      }
    std::printf("[ router parts ] T %lld D %lld E %lld: worst |err| / Σ|x·w| = %.3g\n", static_cast<long long>(T),
                static_cast<long long>(D), static_cast<long long>(E), worst);
  }
  DI_CUBLAS_CHECK(cublasDestroy(blas));
}

// Through CudaBackend: place_linear_fp32 builds [W | W] only with the knob on and for bf16-valued
// weights; the op add_rms_norm_route with the knob (from one row) writes residual, x and x's rows
// bitwise as without it, and routes each row to the same experts with the same weights (1e-5) —
// except at a near-tie, a row whose k-th and (k+1)-th fp64 logits are within 4e-5 · Σ|x·w| (each
// may be 2e-5 off; counted, printed).
TEST(RouterPartsCuda, BackendOpRoutesAsWithout) {
  auto gpu = testing::try_cuda_backend();
  DI_REQUIRE_GPU(gpu);
  auto& cb = dynamic_cast<CudaBackend&>(*gpu);
  const NormRouteProblem pr(600, 2048, 64, 6);
  const int64_t T = pr.T, D = pr.D, E = pr.E, k = 6;
  LinearWeight host;
  host.weight = Tensor::empty_host(DType::kF32, {E, D});
  std::copy(pr.w.begin(), pr.w.end(), host.weight.data<float>());
  cb.set_router_parts(false);
  EXPECT_FALSE(gpu->place_linear_fp32(host).derived2.defined()) << "[W | W] placed with the knob off";
  cb.set_router_parts(true, 1);
  const LinearWeight router = gpu->place_linear_fp32(host);
  ASSERT_TRUE(router.derived2.defined()) << "bf16-valued weights: [W | W] placed";
  EXPECT_EQ(router.derived2.size(0), E);
  EXPECT_EQ(router.derived2.size(1), 2 * D);
  host.weight.data<float>()[3] = 0.1f;  // not a bf16 value
  EXPECT_FALSE(gpu->place_linear_fp32(host).derived2.defined());
  Tensor norm_h = Tensor::empty_host(DType::kF32, {D});
  std::copy(pr.norm.begin(), pr.norm.end(), norm_h.data<float>());
  const Tensor norm = gpu->place_tensor(norm_h);
  auto host_tensor = [](const std::vector<float>& v, int64_t rows, int64_t cols) {
    Tensor t = Tensor::empty_host(DType::kF32, {rows, cols});
    std::copy(v.begin(), v.end(), t.data<float>());
    return t;
  };
  RouterParams rp;
  rp.scoring_func = ScoringFunc::kSoftmax;
  rp.topk_method = TopkMethod::kGreedy;
  rp.top_k = k;
  for (int q_kind = 0; q_kind <= 2; ++q_kind) {
    SCOPED_TRACE(q_kind == 0 ? "no rows" : q_kind == 1 ? "e4m3 codes" : "bf16 rows");
    struct Out {
      Tensor res, x, codes, scales, ids, weights;
    } out[2];
    for (int on = 0; on < 2; ++on) {
      cb.set_router_parts(on == 1, 1);
      Tensor res = gpu->upload(host_tensor(pr.res, T, D)), delta = gpu->upload(host_tensor(pr.delta, T, D));
      Tensor x = gpu->allocate(DType::kF32, {T, D});
      QuantizedRows xq;
      if (q_kind == 1) {
        xq.codes = gpu->allocate(DType::kU8, {T, D});
        xq.scales = gpu->allocate(DType::kF32, {T, D / 128});
      } else if (q_kind == 2) {
        xq.codes = gpu->allocate(DType::kBF16, {T, D});
      }
      Tensor ids = gpu->allocate(DType::kI32, {T, k}), weights = gpu->allocate(DType::kF32, {T, k});
      gpu->add_rms_norm_route(res, delta, norm, 1e-6f, x, xq, router, rp, ids, weights);
      out[on] = {gpu->to_host(res), gpu->to_host(x), xq.defined() ? gpu->to_host(xq.codes) : Tensor{},
                 q_kind == 1 ? gpu->to_host(xq.scales) : Tensor{}, gpu->to_host(ids), gpu->to_host(weights)};
    }
    cb.set_router_parts(false);
    auto same = [](const Tensor& a, const Tensor& b) {
      return a.n_bytes() == b.n_bytes() && std::memcmp(a.raw_data(), b.raw_data(), a.n_bytes()) == 0;
    };
    EXPECT_TRUE(same(out[0].res, out[1].res)) << "residual";
    EXPECT_TRUE(same(out[0].x, out[1].x)) << "x";
    if (q_kind != 0) {
      EXPECT_TRUE(same(out[0].codes, out[1].codes)) << "x's rows";
    }
    if (q_kind == 1) {
      EXPECT_TRUE(same(out[0].scales, out[1].scales)) << "x's scales";
    }
    const std::vector<float> x(out[1].x.data<float>(), out[1].x.data<float>() + T * D);
    int64_t near_ties = 0;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<std::pair<int32_t, float>> a, b;
      for (int64_t j = 0; j < k; ++j) {
        a.emplace_back(out[0].ids.data<int32_t>()[t * k + j], out[0].weights.data<float>()[t * k + j]);
        b.emplace_back(out[1].ids.data<int32_t>()[t * k + j], out[1].weights.data<float>()[t * k + j]);
      }
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      bool equal_sets = true;
      for (size_t j = 0; j < a.size(); ++j) equal_sets = equal_sets && a[j].first == b[j].first;
      if (equal_sets) {
        for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j].second, b[j].second, 1e-5) << "row " << t;
        continue;
      }
      // Another expert set: only at a near-tie of the fp64 logits' k-th and (k+1)-th.
      std::vector<double> logit(static_cast<size_t>(E));
      double scale = 0;
      for (int64_t e = 0; e < E; ++e) {
        logit[static_cast<size_t>(e)] = pr.dot(x, t, e, false);
        scale = std::max(scale, pr.dot(x, t, e, true));
      }
      std::sort(logit.begin(), logit.end(), std::greater<>());
      EXPECT_LE(logit[static_cast<size_t>(k - 1)] - logit[static_cast<size_t>(k)], 4e-5 * scale)
          << "row " << t << " routed differently without a near-tie";
      ++near_ties;
    }
    std::printf("[ router parts ] %lld of %lld rows routed differently (near-ties)\n",
                static_cast<long long>(near_ties), static_cast<long long>(T));
  }
}
#endif

}  // namespace
}  // namespace deepinfer
