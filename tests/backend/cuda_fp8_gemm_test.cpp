// The FP8 block-scaled GEMM lab (cuda_fp8_gemm.cu) against CPU references of the same quantized
// operands and scales.
//  - quantize_fp8_rows: bit-exact — the scale is the same IEEE division max(amax, 1e-4)/448 (ue8m0:
//    rounded up to a power of two), each element e4m3_rn_satfinite(x / s) with the core
//    f32_to_e4m3 (round to nearest even, saturating), which the hardware cvt must match.
//  - fp8_gemm / fp8_grouped_gemm: against an fp64 evaluation of Σ_kb sa·sw·Σ_{k∈kb} a·w, per element
//    |gpu − ref| ≤ 2^-14 · Σ_kb |sa·sw| · Σ_{k∈kb} |a·w| (+ 2^-8 |ref| for bf16 output). Products
//    of e4m3 values are exact in fp32; the error is the tensor cores' fp32 accumulation of 128
//    products per block and the fp32 promotion, a few fp32 ulps of the |·|-sum (measured on H200:
//    ≤ 6e-8 ≈ 2^-24 of it, fp32 output); 2^-14 leaves ~1000× and still fails any indexing or
//    scale bug by orders of magnitude. The wgmma form (variant 3) gets 2^-10: Hopper's FP8 wgmma
//    adds the products of each k32 step into its accumulator with only ~13–14 significant bits
//    (aligned to the largest term; DeepSeek-V3 report §3.3.2 — the reason for the per-128
//    promotion), and 4 steps per K block gave up to 2.2e-4 ≈ 2^-12.2 of the |·|-sum on the H200
//    (run s5-1, fp32 output): 2^-10 is 4.5× that, still ~1000× below an indexing error.
//  - every mma.sync tile shape computes the same per-element arithmetic: with one K split the
//    three variants, and the grouped form on an expert's rows, must agree bitwise; repeated runs
//    too. The wgmma form (variant 3, sm_90; block_n 128 and 1) sums each K block in another order:
//    it is checked against the reference (bound below) and for bitwise repeatability, not
//    against 0–2.
// Skipped without a GPU (CI); run on the GPU machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/dtype.h"
#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_common.h"
#endif
#include "support/cuda_available.h"
#ifdef DEEPINFER_HAVE_CUDA
#include "support/cuda_buffer.h"
#endif

namespace deepinfer {
namespace {

#ifdef DEEPINFER_HAVE_CUDA
using cuda::Elem;
using cuda::Fp8GemmArgs;

using testing::DevBuf;
using testing::download;
using testing::upload;

// Split-K workspace from cudaMalloc, freed with the arena.
struct Arena {
  std::vector<void*> bufs;
  ~Arena() {
    for (void* p : bufs) cudaFree(p);
  }
  static void* alloc(void* ctx, size_t bytes) {
    void* p = nullptr;
    DI_CUDA_CHECK(cudaMalloc(&p, bytes));
    static_cast<Arena*>(ctx)->bufs.push_back(p);
    return p;
  }
};

// Random finite e4m3 codes: N(0, 1) values quantized with unit scale.
std::vector<uint8_t> random_e4m3(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.5f);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = f32_to_e4m3(d(rng));
  return v;
}
std::vector<float> random_scales(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(0.25f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng) / 64.0f;
  return v;
}

// Host operands of one (dense or per-expert) GEMM problem.
struct Operands {
  int64_t M = 0, N = 0, K = 0, block_n = 128, n_kb = 0;
  std::vector<uint8_t> a, w;   // [M, K], [N, K] e4m3
  std::vector<float> sa, sw;   // [M, n_kb], [ceil(N / block_n), n_kb]
};

// A grouped (or dense) problem's operands uploaded — A, W (16 bytes of slack each), their scales,
// the expert offsets — and the wgmma form's args over them (block_n 1, variant 3; the caller
// sets the shape, output and offsets' use).
struct DevOperands {
  DevBuf a, w, sa, sw, off;
  DevOperands(const std::vector<uint8_t>& ha, const std::vector<uint8_t>& hw, const std::vector<float>& hsa,
              const std::vector<float>& hsw, const std::vector<int32_t>& offsets)
      : a(ha.size() + 16), w(hw.size() + 16), sa(hsa.size() * 4 + 4), sw(hsw.size() * 4), off(offsets.size() * 4) {
    upload(a, ha);
    upload(w, hw);
    upload(sa, hsa);
    upload(sw, hsw);
    upload(off, offsets);
  }
  Fp8GemmArgs args() const {
    Fp8GemmArgs g;
    g.a = a.as<uint8_t>(), g.a_scale = sa.as<float>();
    g.w = w.as<uint8_t>(), g.w_scale = sw.as<float>();
    g.block_n = 1;
    g.variant = 3;
    return g;
  }
};

// ref[m, n] and its error bound (see the file header), fp64, for rows [r0, r0 + rows) of a and
// weight rows [w0, w0 + N), scale rows from sw0.
void reference(const std::vector<uint8_t>& a, const std::vector<float>& sa, const std::vector<uint8_t>& w,
               const std::vector<float>& sw, int64_t r0, int64_t rows, int64_t w0, int64_t sw0, int64_t N, int64_t K,
               int64_t block_n, std::vector<double>& ref, std::vector<double>& bound) {
  static const std::vector<double> lut = [] {
    std::vector<double> t(256);
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  const int64_t n_kb = (K + 127) / 128;
  ref.assign(static_cast<size_t>(rows * N), 0.0);
  bound.assign(static_cast<size_t>(rows * N), 0.0);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* ar = a.data() + (r0 + m) * K;
      const uint8_t* wr = w.data() + (w0 + n) * K;
      double acc = 0, bnd = 0;
      for (int64_t kb = 0; kb < n_kb; ++kb) {
        double s = 0, sabs = 0;
        for (int64_t k = kb * 128; k < std::min(K, kb * 128 + 128); ++k) {
          const double p = lut[ar[k]] * lut[wr[k]];
          s += p;
          sabs += std::fabs(p);
        }
        const double sc = static_cast<double>(sa[static_cast<size_t>((r0 + m) * n_kb + kb)]) *
                          static_cast<double>(sw[static_cast<size_t>((sw0 + n / block_n) * n_kb + kb)]);
        acc += s * sc;
        bnd += sabs * std::fabs(sc);
      }
      ref[static_cast<size_t>(m * N + n)] = acc;
      bound[static_cast<size_t>(m * N + n)] = bnd;
    }
}

// C read back as doubles [rows, N] from a [*, ldc] fp32 | bf16 buffer starting at row r0.
std::vector<double> read_c(const DevBuf& c, Elem elem, int64_t total_rows, int64_t ldc, int64_t r0, int64_t rows,
                           int64_t N) {
  std::vector<double> out(static_cast<size_t>(rows * N));
  if (elem == Elem::kF32) {
    const auto h = download<float>(c, static_cast<size_t>(total_rows * ldc));
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t n = 0; n < N; ++n) out[static_cast<size_t>(m * N + n)] = h[static_cast<size_t>((r0 + m) * ldc + n)];
  } else {
    const auto h = download<uint16_t>(c, static_cast<size_t>(total_rows * ldc));
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t n = 0; n < N; ++n)
        out[static_cast<size_t>(m * N + n)] = bf16_to_f32(h[static_cast<size_t>((r0 + m) * ldc + n)]);
  }
  return out;
}

constexpr int kWgmmaTolLog2 = -10;  // the wgmma form's bound (see the header)

// Number of elements outside the tolerance (and the worst error / bound ratio, for the log).
int64_t count_bad(const std::vector<double>& got, const std::vector<double>& ref, const std::vector<double>& bound,
                  bool bf16_out, double* worst, int tol_log2 = -14) {
  int64_t bad = 0;
  *worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double tol = std::ldexp(bound[i], tol_log2) + (bf16_out ? std::ldexp(std::fabs(ref[i]), -8) : 0.0) + 1e-30;
    const double err = std::fabs(got[i] - ref[i]);
    if (!(err <= tol)) ++bad;
    if (bound[i] > 0) *worst = std::max(*worst, err / bound[i]);
  }
  return bad;
}

class CudaFp8Gemm : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA GPU here (runs on the GPU machine)";
    cudaDeviceProp prop{};
    DI_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major < 9) GTEST_SKIP() << "the FP8 GEMM is built for sm_90a / sm_100a";
  }
  std::mt19937 rng_{20261130};
};

TEST_F(CudaFp8Gemm, QuantizeRowsBitExact) {
  struct Case {
    int64_t M, K;
    Elem elem;
    bool ue8m0;
  };
  for (const Case& c : {Case{5, 384, Elem::kF32, false}, Case{3, 208, Elem::kBF16, false}, Case{4, 256, Elem::kF32, true},
                        Case{1, 16, Elem::kBF16, true}, Case{0, 128, Elem::kF32, false}}) {
    const int64_t n_kb = (c.K + 127) / 128;
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> x(static_cast<size_t>(c.M * c.K));
    for (auto& v : x) v = d(rng_);
    if (c.M > 1) {
      for (int64_t k = 0; k < std::min<int64_t>(128, c.K); ++k) x[static_cast<size_t>(c.K + k)] = 0.0f;  // a zero group
      x[0] = 1000.0f;                                                                                    // an outlier
    }
    std::vector<uint16_t> xb(x.size());
    if (c.elem == Elem::kBF16) {
      for (size_t i = 0; i < x.size(); ++i) {
        xb[i] = f32_to_bf16(x[i]);
        x[i] = bf16_to_f32(xb[i]);  // the reference sees what the GPU reads
      }
    }
    DevBuf dx(x.size() * 4), dq(x.size()), ds(static_cast<size_t>(c.M * n_kb) * 4);
    if (c.elem == Elem::kF32) upload(dx, x);
    else upload(dx, xb);
    cuda::quantize_fp8_rows(dx.as<void>(), c.elem, c.M, c.K, dq.as<uint8_t>(), ds.as<float>(), c.ue8m0, nullptr);
    DI_CUDA_CHECK(cudaDeviceSynchronize());
    const auto q = download<uint8_t>(dq, x.size());
    const auto s = download<float>(ds, static_cast<size_t>(c.M * n_kb));
    int64_t bad_q = 0, bad_s = 0;
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t g = 0; g < n_kb; ++g) {
        float amax = 0;
        for (int64_t k = g * 128; k < std::min(c.K, g * 128 + 128); ++k)
          amax = std::max(amax, std::fabs(x[static_cast<size_t>(m * c.K + k)]));
        float sc = std::max(amax, 1e-4f) / 448.0f;
        if (c.ue8m0) sc = std::exp2(std::ceil(std::log2(sc)));
        const float got_s = s[static_cast<size_t>(m * n_kb + g)];
        if (std::memcmp(&got_s, &sc, 4) != 0) ++bad_s;
        for (int64_t k = g * 128; k < std::min(c.K, g * 128 + 128); ++k) {
          const size_t i = static_cast<size_t>(m * c.K + k);
          if (q[i] != f32_to_e4m3(x[i] / sc)) ++bad_q;
        }
        if (m == 1 && g == 0) {
          for (int64_t k = 0; k < std::min<int64_t>(128, c.K); ++k)
            EXPECT_EQ(e4m3_to_f32(q[static_cast<size_t>(c.K + k)]) * got_s, 0.0f) << "zero group dequantizes to 0";
        }
      }
    EXPECT_EQ(bad_q, 0) << "M=" << c.M << " K=" << c.K;
    EXPECT_EQ(bad_s, 0) << "M=" << c.M << " K=" << c.K;
  }
}

// The host rule of quantize_fp8_rows for one row x [K]: codes into q, scales into s (the bits).
void quantize_row_ref(const float* x, int64_t K, uint8_t* q, float* s) {
  for (int64_t g = 0; g * 128 < K; ++g) {
    float amax = 0;
    for (int64_t k = g * 128; k < std::min(K, g * 128 + 128); ++k) amax = std::max(amax, std::fabs(x[k]));
    const float sc = std::max(amax, 1e-4f) / 448.0f;
    s[g] = sc;
    for (int64_t k = g * 128; k < std::min(K, g * 128 + 128); ++k) q[k] = f32_to_e4m3(x[k] / sc);
  }
}

// The two fused quantizers bit-exact against the host rule: quantize_fp8_rows_bf16 (fp32 rows
// rounded to bf16, quantized — gathered through a permutation as the MoE's W8A8 input, and
// strided in place as a dense linear's) and silu_mul_quantize_fp8 (bf16(silu(g)·u) quantized,
// from fp32 and from bf16 [gate | up]). The SiLU is evaluated on the host in float as the device
// does (g / (1 + e^−g) · u): the device's __expf and __fdividef (silu_times) differ from the
// host's expf and division by a few ulps, so the check allows a code one step away where that
// flips a bf16 rounding, and counts them (expected: a handful of 10^4 at most).
TEST_F(CudaFp8Gemm, FusedQuantizersBitExact) {
  std::normal_distribution<float> d(0.0f, 3.0f);
  // (off: the codes' start 4 bytes past an 8-byte boundary — the one-warp form, 4-byte stores —
  // or aligned: the half-warp form.)
  for (const size_t off : {size_t{0}, size_t{4}})
  for (const bool gather : {true, false}) {
    // gather: M = 50 output rows from 12 source rows (row_div 3: rows[i] / 3); else 12 rows at
    // pitch 280. K = 272 (a partial last group).
    const int64_t src_rows = 12, K = 272, ldx = gather ? K : 280, div = 3, n_kb = (K + 127) / 128;
    const int64_t M = gather ? 50 : src_rows;
    std::vector<float> x(static_cast<size_t>(src_rows * ldx));
    for (auto& v : x) v = d(rng_);
    std::vector<int32_t> rows(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) rows[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % (src_rows * div));
    DevBuf dx(x.size() * 4), dr(rows.size() * 4), dq(static_cast<size_t>(M * K) + off),
        ds(static_cast<size_t>(M * n_kb) * 4);
    upload(dx, x);
    upload(dr, rows);
    cuda::quantize_fp8_rows_bf16(dx.as<float>(), ldx, gather ? dr.as<int32_t>() : nullptr, gather ? div : 1, M, K,
                                 dq.as<uint8_t>() + off, ds.as<float>(), nullptr);
    DI_CUDA_CHECK(cudaDeviceSynchronize());
    auto q = download<uint8_t>(dq, static_cast<size_t>(M * K) + off);
    q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(off));
    const auto s = download<float>(ds, static_cast<size_t>(M * n_kb));
    std::vector<float> row(static_cast<size_t>(K));
    std::vector<uint8_t> rq(static_cast<size_t>(K));
    std::vector<float> rs(static_cast<size_t>(n_kb));
    for (int64_t m = 0; m < M; ++m) {
      const int64_t src = gather ? rows[static_cast<size_t>(m)] / div : m;
      for (int64_t k = 0; k < K; ++k)
        row[static_cast<size_t>(k)] = bf16_to_f32(f32_to_bf16(x[static_cast<size_t>(src * ldx + k)]));
      quantize_row_ref(row.data(), K, rq.data(), rs.data());
      EXPECT_EQ(0, std::memcmp(rq.data(), q.data() + m * K, static_cast<size_t>(K))) << "row " << m;
      EXPECT_EQ(0, std::memcmp(rs.data(), s.data() + m * n_kb, sizeof(float) * static_cast<size_t>(n_kb)))
          << "row " << m << (gather ? " (gathered)" : " (strided)") << " off " << off;
    }
  }
  for (const size_t off : {size_t{0}, size_t{4}})
  for (const Elem elem : {Elem::kF32, Elem::kBF16}) {  // SiLU·mul: M = 37, I = 400 (a partial group)
    const int64_t M = 37, I = 400, n_kb = (I + 127) / 128;
    std::vector<float> h(static_cast<size_t>(M * 2 * I));
    std::vector<uint16_t> hb(h.size());
    for (size_t i = 0; i < h.size(); ++i) {
      h[i] = d(rng_);
      hb[i] = f32_to_bf16(h[i]);
      if (elem == Elem::kBF16) h[i] = bf16_to_f32(hb[i]);
    }
    DevBuf dh(h.size() * 4), dq(static_cast<size_t>(M * I) + off), ds(static_cast<size_t>(M * n_kb) * 4);
    if (elem == Elem::kF32) upload(dh, h);
    else upload(dh, hb);
    cuda::silu_mul_quantize_fp8(dh.as<void>(), elem, M, I, dq.as<uint8_t>() + off, ds.as<float>(), nullptr);
    DI_CUDA_CHECK(cudaDeviceSynchronize());
    auto q = download<uint8_t>(dq, static_cast<size_t>(M * I) + off);
    q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(off));
    const auto s = download<float>(ds, static_cast<size_t>(M * n_kb));
    std::vector<float> act(static_cast<size_t>(I));
    std::vector<uint8_t> rq(static_cast<size_t>(I));
    std::vector<float> rs(static_cast<size_t>(n_kb));
    int64_t near = 0, bad = 0, bad_s = 0;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t c = 0; c < I; ++c) {
        const float g = h[static_cast<size_t>(m * 2 * I + c)], u = h[static_cast<size_t>(m * 2 * I + I + c)];
        act[static_cast<size_t>(c)] = bf16_to_f32(f32_to_bf16(g / (1.0f + std::exp(-g)) * u));
      }
      quantize_row_ref(act.data(), I, rq.data(), rs.data());
      for (int64_t g = 0; g < n_kb; ++g) {
        const float got = s[static_cast<size_t>(m * n_kb + g)], want = rs[static_cast<size_t>(g)];
        bad_s += std::fabs(got - want) > 0x1p-7f * want;  // a flipped bf16 rounding of the group's max
      }
      for (int64_t c = 0; c < I; ++c) {
        const int diff = std::abs(static_cast<int>(q[static_cast<size_t>(m * I + c)] & 0x7f) -
                                  static_cast<int>(rq[static_cast<size_t>(c)] & 0x7f));
        if (diff == 1) ++near;
        else if (diff > 1 || ((q[static_cast<size_t>(m * I + c)] ^ rq[static_cast<size_t>(c)]) & 0x80) != 0) ++bad;
      }
    }
    std::printf("[silu_mul_quantize] %s, codes at +%zu: %ld of %ld codes one step off (exp / division ulps)\n",
                elem == Elem::kF32 ? "f32" : "bf16", off, static_cast<long>(near), static_cast<long>(M * I));
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(bad_s, 0);
    EXPECT_LE(near, M * I / 100);
  }
}

// Per-row weight scales that are uniform over 128-row blocks (w_scale_uniform: the wgmma form
// reads one scale row per block) give the per-row form's exact bits — dense (N = 320, a partial
// last block) and grouped (N = 256) — and the reference's values.
TEST_F(CudaFp8Gemm, UniformRowScalesMatchPerRowBitwise) {
  if (!cuda::fp8_wgmma_available()) GTEST_SKIP() << "the wgmma form needs an sm_90 GPU";
  for (const bool grouped : {false, true}) {
    const std::vector<int32_t> counts = grouped ? std::vector<int32_t>{130, 0, 7, 300} : std::vector<int32_t>{333};
    const int64_t E = static_cast<int64_t>(counts.size()), N = grouped ? 256 : 320, K = 384, n_kb = 3;
    std::vector<int32_t> offsets(static_cast<size_t>(E + 1), 0);
    for (size_t e = 0; e < counts.size(); ++e) offsets[e + 1] = offsets[e] + counts[e];
    const int64_t M = offsets.back(), nb = (N + 127) / 128;
    const auto a = random_e4m3(static_cast<size_t>(M * K), rng_);
    const auto w = random_e4m3(static_cast<size_t>(E * N * K), rng_);
    const auto sa = random_scales(static_cast<size_t>(M * n_kb), rng_);
    const auto sb = random_scales(static_cast<size_t>(E * nb * n_kb), rng_);  // the 128-row blocks' scales
    std::vector<float> sw(static_cast<size_t>(E * N * n_kb));                  // expanded to one row each
    for (int64_t e = 0; e < E; ++e)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t kb = 0; kb < n_kb; ++kb)
          sw[static_cast<size_t>((e * N + n) * n_kb + kb)] = sb[static_cast<size_t>((e * nb + n / 128) * n_kb + kb)];
    const DevOperands ops(a, w, sa, sw, offsets);
    DevBuf dc(static_cast<size_t>(M * N) * 4);
    Fp8GemmArgs args = ops.args();
    args.M = M, args.N = N, args.K = K;
    args.c = dc.as<void>(), args.c_elem = Elem::kF32, args.ldc = N;
    if (grouped) args.offsets = ops.off.as<int32_t>(), args.E = E;
    std::vector<uint8_t> bits[2];
    for (const bool uniform : {false, true}) {
      args.w_scale_uniform = uniform;
      DI_CUDA_CHECK(cudaMemset(dc.as<void>(), 0xff, static_cast<size_t>(M * N) * 4));
      if (grouped) cuda::fp8_grouped_gemm(args, nullptr);
      else cuda::fp8_gemm(args, nullptr, nullptr, nullptr);
      DI_CUDA_CHECK(cudaDeviceSynchronize());
      bits[uniform] = download<uint8_t>(dc, static_cast<size_t>(M * N) * 4);
    }
    EXPECT_EQ(bits[0], bits[1]) << (grouped ? "grouped" : "dense") << ": the block form differs from the per-row one";
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = offsets[static_cast<size_t>(e)], rows = counts[static_cast<size_t>(e)];
      if (rows == 0) continue;
      std::vector<double> ref, bound;
      reference(a, sa, w, sw, r0, rows, e * N, e * N, N, K, 1, ref, bound);
      double worst = 0;
      EXPECT_EQ(count_bad(read_c(dc, Elem::kF32, M, N, r0, rows, N), ref, bound, false, &worst, kWgmmaTolLog2), 0)
          << (grouped ? "grouped" : "dense") << " expert " << e;
    }
    // (After the checks above, which read dc's fp32 result.)
    if (grouped) {  // the MoE's form — bf16 out, uniform per-row scales — on 128 × 128 and 128 × 192 tiles
      std::vector<uint8_t> bf[2];
      for (const bool n192 : {false, true}) {
        Fp8GemmArgs b = args;
        b.w_scale_uniform = true, b.c_elem = Elem::kBF16, b.n192 = n192;
        DI_CUDA_CHECK(cudaMemset(dc.as<void>(), 0xff, static_cast<size_t>(M * N) * 2));
        cuda::fp8_grouped_gemm(b, nullptr);
        DI_CUDA_CHECK(cudaDeviceSynchronize());
        bf[n192] = download<uint8_t>(dc, static_cast<size_t>(M * N) * 2);
      }
      EXPECT_EQ(bf[0], bf[1]) << "grouped bf16: the 128 × 192 tiles differ from the 128 × 128 ones";
    }
  }
}

// One dense launch of `args` (c and ldc filled in here) into a fresh output; returns its bytes.
std::vector<uint8_t> run_dense(Fp8GemmArgs args, Elem elem, int64_t ldc, DevBuf& c) {
  const size_t bytes = static_cast<size_t>(args.M * ldc) * (elem == Elem::kF32 ? 4 : 2);
  DI_CUDA_CHECK(cudaMemset(c.as<void>(), 0xff, bytes));  // NaN / garbage where nothing is written
  args.c = c.as<void>();
  args.c_elem = elem;
  args.ldc = ldc;
  Arena arena;
  cuda::fp8_gemm(args, Arena::alloc, &arena, nullptr);
  DI_CUDA_CHECK(cudaDeviceSynchronize());
  return download<uint8_t>(c, bytes);
}

TEST_F(CudaFp8Gemm, DenseMatchesReferenceAllVariants) {
  struct Case {
    int64_t M, N, K, block_n;
    Elem elem;
    int64_t ldc_pad;
  };
  const Case cases[] = {
      {1, 256, 256, 128, Elem::kF32, 0},     {7, 200, 384, 1, Elem::kBF16, 0},   {64, 576, 512, 128, Elem::kF32, 0},
      {129, 320, 1408, 128, Elem::kBF16, 2}, {4096, 384, 128, 1, Elem::kF32, 0}, {33, 131, 208, 1, Elem::kF32, 1},
      {17, 130, 2048, 128, Elem::kBF16, 0},  {2, 64, 16, 128, Elem::kF32, 0},    {0, 128, 128, 128, Elem::kF32, 0},
      {300, 576, 2048, 128, Elem::kBF16, 0}, {256, 1024, 400, 128, Elem::kF32, 2},
      // More tiles than SMs (192, 162): blocks store a tile under the next one's first MMAs.
      {2048, 1536, 256, 128, Elem::kBF16, 0}, {1100, 2304, 384, 128, Elem::kF32, 0},
  };
  for (const Case& c : cases) {
    Operands o;
    o.M = c.M, o.N = c.N, o.K = c.K, o.block_n = c.block_n, o.n_kb = (c.K + 127) / 128;
    o.a = random_e4m3(static_cast<size_t>(c.M * c.K), rng_);
    o.w = random_e4m3(static_cast<size_t>(c.N * c.K), rng_);
    o.sa = random_scales(static_cast<size_t>(c.M * o.n_kb), rng_);
    o.sw = random_scales(static_cast<size_t>((c.N + c.block_n - 1) / c.block_n * o.n_kb), rng_);
    DevBuf da(o.a.size() + 16), dw(o.w.size() + 16), dsa(o.sa.size() * 4 + 4), dsw(o.sw.size() * 4 + 4);
    upload(da, o.a);
    upload(dw, o.w);
    upload(dsa, o.sa);
    upload(dsw, o.sw);
    const int64_t ldc = c.N + c.ldc_pad;
    DevBuf dc(static_cast<size_t>(std::max<int64_t>(1, c.M * ldc)) * 4);
    std::vector<double> ref, bound;
    reference(o.a, o.sa, o.w, o.sw, 0, c.M, 0, 0, c.N, c.K, c.block_n, ref, bound);

    Fp8GemmArgs args;
    args.a = da.as<uint8_t>();
    args.a_scale = dsa.as<float>();
    args.w = dw.as<uint8_t>();
    args.w_scale = dsw.as<float>();
    args.M = c.M, args.N = c.N, args.K = c.K, args.block_n = c.block_n;
    const bool bf = c.elem == Elem::kBF16;
    const std::string what = "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                             " block_n=" + std::to_string(c.block_n) + (bf ? " bf16" : " f32");

    // By size (split-K allowed), twice: bitwise reproducible.
    const auto first = run_dense(args, c.elem, ldc, dc);
    double worst = 0;
    EXPECT_EQ(count_bad(read_c(dc, c.elem, c.M, ldc, 0, c.M, c.N), ref, bound, bf, &worst,
                        cuda::fp8_gemm_plan(args).variant == 3 ? kWgmmaTolLog2 : -14),
              0)
        << what << " auto";
    std::printf("[fp8_gemm] %s: plan variant %d splits %ld, worst |err|/bound %.3g\n", what.c_str(),
                cuda::fp8_gemm_plan(args).variant, static_cast<long>(cuda::fp8_gemm_plan(args).splits), worst);
    EXPECT_EQ(run_dense(args, c.elem, ldc, dc), first) << what << " not reproducible";

    // Each tile shape with one split: identical bits; and forced 3-way split-K.
    std::vector<uint8_t> invariant;
    for (int variant = 0; variant < 3; ++variant) {
      Fp8GemmArgs v = args;
      v.variant = variant;
      v.batch_invariant = true;
      const auto bits = run_dense(v, c.elem, ldc, dc);
      EXPECT_EQ(count_bad(read_c(dc, c.elem, c.M, ldc, 0, c.M, c.N), ref, bound, bf, &worst), 0)
          << what << " variant " << variant;
      if (variant == 0) invariant = bits;
      else EXPECT_EQ(bits, invariant) << what << ": variant " << variant << " differs bitwise from variant 0";
      v.batch_invariant = false;
      v.splits = 3;
      run_dense(v, c.elem, ldc, dc);
      EXPECT_EQ(count_bad(read_c(dc, c.elem, c.M, ldc, 0, c.M, c.N), ref, bound, bf, &worst), 0)
          << what << " variant " << variant << " split 3";
    }
    // The wgmma form: against the reference, and bitwise repeatable.
    if (cuda::fp8_wgmma_available()) {
      Fp8GemmArgs v = args;
      v.variant = 3;
      const auto bits = run_dense(v, c.elem, ldc, dc);
      EXPECT_EQ(count_bad(read_c(dc, c.elem, c.M, ldc, 0, c.M, c.N), ref, bound, bf, &worst, kWgmmaTolLog2), 0)
          << what << " variant 3 (wgmma)";
      std::printf("[fp8_gemm] %s: wgmma worst |err|/bound %.3g\n", what.c_str(), worst);
      EXPECT_EQ(run_dense(v, c.elem, ldc, dc), bits) << what << " variant 3 not reproducible";
      // Clusters of two blocks sharing A tiles by multicast (and one block alone): the same bits.
      for (int cluster : {1, 2}) {
        v.cluster = cluster;
        EXPECT_EQ(run_dense(v, c.elem, ldc, dc), bits) << what << " variant 3, cluster " << cluster;
      }
      // Each block's first W stages fetched before its PDL wait (placed weights): the same bits.
      v.cluster = 0;
      v.w_stable = true;
      EXPECT_EQ(run_dense(v, c.elem, ldc, dc), bits) << what << " variant 3, w_stable";
      v.w_stable = false;
      // Columns from the last 128-column boundary below N into a second output (c2, as two
      // stacked linears take it), each output with its own pitch — unpadded (TMA stores where
      // the pitches allow) and with one element of padding (direct stores): each part's bytes
      // are the one-output launch's, the padding never written.
      if (c.N > 128 && c.M > 0) {
        const size_t es = bf ? 2 : 4;
        for (int pad : {0, 1})
        for (int cluster : {1, 2}) {
          const int64_t n_split = (c.N - 1) / 128 * 128, n2 = c.N - n_split, ld1 = n_split + pad, ld2 = n2 + pad;
          DevBuf d1(static_cast<size_t>(c.M * ld1) * es), d2(static_cast<size_t>(c.M * ld2) * es);
          DI_CUDA_CHECK(cudaMemset(d1.as<void>(), 0xff, static_cast<size_t>(c.M * ld1) * es));
          DI_CUDA_CHECK(cudaMemset(d2.as<void>(), 0xff, static_cast<size_t>(c.M * ld2) * es));
          Fp8GemmArgs t = v;
          t.cluster = cluster;
          t.c = d1.as<void>(), t.c_elem = c.elem, t.ldc = ld1;
          t.c2 = d2.as<void>(), t.ldc2 = ld2, t.n_split = n_split;
          cuda::fp8_gemm(t, nullptr, nullptr, nullptr);
          DI_CUDA_CHECK(cudaDeviceSynchronize());
          const auto h1 = download<uint8_t>(d1, static_cast<size_t>(c.M * ld1) * es);
          const auto h2 = download<uint8_t>(d2, static_cast<size_t>(c.M * ld2) * es);
          int64_t bad = 0;
          for (int64_t m = 0; m < c.M; ++m) {
            const uint8_t* row = bits.data() + static_cast<size_t>(m * ldc) * es;
            bad += std::memcmp(h1.data() + static_cast<size_t>(m * ld1) * es, row, static_cast<size_t>(n_split) * es) != 0;
            bad += std::memcmp(h2.data() + static_cast<size_t>(m * ld2) * es, row + static_cast<size_t>(n_split) * es,
                               static_cast<size_t>(n2) * es) != 0;
            for (size_t b = 0; pad == 1 && b < es; ++b) {
              bad += h1[static_cast<size_t>(m * ld1 + n_split) * es + b] != 0xff;
              bad += h2[static_cast<size_t>(m * ld2 + n2) * es + b] != 0xff;
            }
          }
          EXPECT_EQ(bad, 0) << what << " variant 3, two outputs split at " << n_split << ", pad " << pad
                            << ", cluster " << cluster;
        }
      }
    }
  }
}

TEST_F(CudaFp8Gemm, GroupedMatchesReferenceWithEmptyExperts) {
  struct Case {
    std::vector<int32_t> counts;  // rows per expert
    int64_t N, K, block_n;
    Elem elem;
  };
  std::vector<int32_t> many(64);
  for (size_t e = 0; e < many.size(); ++e) many[e] = e % 5 == 0 ? 0 : static_cast<int32_t>((e * 37) % 23);
  std::vector<int32_t> wide(16);  // more tiles than SMs: blocks store a tile under the next one's MMAs
  for (size_t e = 0; e < wide.size(); ++e) wide[e] = 200 + static_cast<int32_t>((e * 37) % 200);
  std::vector<int32_t> v3_decode(256, 0);  // decode-like: 8 single-row experts out of 256
  for (int e : {3, 17, 64, 65, 128, 200, 254, 255}) v3_decode[static_cast<size_t>(e)] = 1;
  const Case cases[] = {
      {{0, 5, 0, 130, 17, 0, 64, 1}, 192, 256, 128, Elem::kF32},
      {{0, 300, 129, 1, 0, 128, 700}, 320, 640, 128, Elem::kBF16},
      {many, 136, 384, 1, Elem::kBF16},
      {v3_decode, 256, 512, 128, Elem::kF32},
      {{0, 0, 0}, 128, 128, 128, Elem::kF32},
      {wide, 1024, 256, 128, Elem::kBF16},
  };
  for (const Case& c : cases) {
    const int64_t E = static_cast<int64_t>(c.counts.size());
    std::vector<int32_t> offsets(static_cast<size_t>(E + 1), 0);
    for (int64_t e = 0; e < E; ++e) offsets[static_cast<size_t>(e + 1)] = offsets[static_cast<size_t>(e)] + c.counts[static_cast<size_t>(e)];
    const int64_t M = offsets.back(), n_kb = (c.K + 127) / 128, sw_rows = (c.N + c.block_n - 1) / c.block_n;
    const auto a = random_e4m3(static_cast<size_t>(M * c.K), rng_);
    const auto w = random_e4m3(static_cast<size_t>(E * c.N * c.K), rng_);
    const auto sa = random_scales(static_cast<size_t>(M * n_kb), rng_);
    const auto sw = random_scales(static_cast<size_t>(E * sw_rows * n_kb), rng_);
    DevBuf da(a.size() + 16), dw(w.size() + 16), dsa(sa.size() * 4 + 4), dsw(sw.size() * 4 + 4),
        doff(offsets.size() * 4), dc(static_cast<size_t>(std::max<int64_t>(1, M * c.N)) * 4),
        dd(static_cast<size_t>(std::max<int64_t>(1, M * c.N)) * 4);
    upload(da, a);
    upload(dw, w);
    upload(dsa, sa);
    upload(dsw, sw);
    upload(doff, offsets);
    const bool bf = c.elem == Elem::kBF16;
    const size_t c_bytes = static_cast<size_t>(M * c.N) * (bf ? 2 : 4);

    Fp8GemmArgs args;
    args.a = da.as<uint8_t>();
    args.a_scale = dsa.as<float>();
    args.w = dw.as<uint8_t>();
    args.w_scale = dsw.as<float>();
    args.M = M, args.N = c.N, args.K = c.K, args.block_n = c.block_n;
    args.c = dc.as<void>(), args.c_elem = c.elem, args.ldc = c.N;
    args.offsets = doff.as<int32_t>(), args.E = E;
    // The mma.sync variants (and the size-based choice when it is one of them) agree bitwise;
    // variant 0's result stays in dc for the checks below.
    std::vector<uint8_t> first;
    const bool auto_mma = cuda::fp8_grouped_gemm_variant(args) < 3;
    for (int variant : {-1, 2, 1, 0}) {
      if (variant == -1 && !auto_mma) continue;
      Fp8GemmArgs v = args;
      v.variant = variant;
      if (c_bytes > 0) DI_CUDA_CHECK(cudaMemset(dc.as<void>(), 0xff, c_bytes));
      cuda::fp8_grouped_gemm(v, nullptr);
      DI_CUDA_CHECK(cudaDeviceSynchronize());
      const auto bits = download<uint8_t>(dc, c_bytes);
      if (first.empty() && (variant == -1 || !auto_mma)) first = bits;
      else EXPECT_EQ(bits, first) << "E=" << E << " variant " << variant << " differs bitwise";
    }
    // Against the reference expert by expert, and bitwise against a dense launch on its rows.
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = offsets[static_cast<size_t>(e)], rows = c.counts[static_cast<size_t>(e)];
      if (rows == 0) continue;
      std::vector<double> ref, bound;
      reference(a, sa, w, sw, r0, rows, e * c.N, e * sw_rows, c.N, c.K, c.block_n, ref, bound);
      double worst = 0;
      EXPECT_EQ(count_bad(read_c(dc, c.elem, M, c.N, r0, rows, c.N), ref, bound, bf, &worst), 0)
          << "E=" << E << " expert " << e << " rows " << rows;
      Fp8GemmArgs d;
      d.a = da.as<uint8_t>() + r0 * c.K;
      d.a_scale = dsa.as<float>() + r0 * n_kb;
      d.w = dw.as<uint8_t>() + e * c.N * c.K;
      d.w_scale = dsw.as<float>() + e * sw_rows * n_kb;
      d.M = rows, d.N = c.N, d.K = c.K, d.block_n = c.block_n;
      d.batch_invariant = true;
      d.c = dd.as<void>(), d.c_elem = c.elem, d.ldc = c.N;
      cuda::fp8_gemm(d, nullptr, nullptr, nullptr);
      DI_CUDA_CHECK(cudaDeviceSynchronize());
      const size_t row_bytes = static_cast<size_t>(c.N) * (bf ? 2 : 4);
      const auto dense = download<uint8_t>(dd, static_cast<size_t>(rows) * row_bytes);
      EXPECT_EQ(0, std::memcmp(dense.data(), first.data() + static_cast<size_t>(r0) * row_bytes, dense.size()))
          << "E=" << E << " expert " << e << ": grouped differs bitwise from dense";
    }
    // The wgmma form, expert by expert against the reference (its bits differ from variants 0–2).
    if (!cuda::fp8_wgmma_available()) continue;
    Fp8GemmArgs v = args;
    v.variant = 3;
    if (c_bytes > 0) DI_CUDA_CHECK(cudaMemset(dc.as<void>(), 0xff, c_bytes));
    cuda::fp8_grouped_gemm(v, nullptr);
    DI_CUDA_CHECK(cudaDeviceSynchronize());
    double worst_all = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = offsets[static_cast<size_t>(e)], rows = c.counts[static_cast<size_t>(e)];
      if (rows == 0) continue;
      std::vector<double> ref, bound;
      reference(a, sa, w, sw, r0, rows, e * c.N, e * sw_rows, c.N, c.K, c.block_n, ref, bound);
      double worst = 0;
      EXPECT_EQ(count_bad(read_c(dc, c.elem, M, c.N, r0, rows, c.N), ref, bound, bf, &worst, kWgmmaTolLog2), 0)
          << "E=" << E << " expert " << e << " rows " << rows << " variant 3 (wgmma)";
      worst_all = std::max(worst_all, worst);
    }
    std::printf("[fp8_gemm] grouped E=%ld: wgmma worst |err|/bound %.3g\n", static_cast<long>(E), worst_all);
    // Clusters of two blocks sharing A tiles by multicast (and one block alone), the idle
    // warpgroups' MMAs issued (idle_skip off; the cases' partial tiles have them), the second
    // warpgroup one K block behind (stagger; the cases of 3-5 K blocks take it), and the tiles of
    // ≤ 64 rows on one warpgroup's 128 columns instead of both warpgroups' 64 (narrow_tails off;
    // block-form scales only: the block_n = 1 case keeps the wide path either way — N = 192's
    // second column tile gives warpgroup 1 columns past N): the same bits.
    const auto wgmma_bits = download<uint8_t>(dc, c_bytes);
    for (int cluster : {1, 2})
      for (bool skip : {true, false})
        for (bool stagger : {false, true})
          for (bool narrow : {true, false}) {
            v.cluster = cluster;
            v.idle_skip = skip;
            v.stagger = stagger;
            v.narrow_tails = narrow;
            if (c_bytes > 0) DI_CUDA_CHECK(cudaMemset(dc.as<void>(), 0xff, c_bytes));
            cuda::fp8_grouped_gemm(v, nullptr);
            DI_CUDA_CHECK(cudaDeviceSynchronize());
            EXPECT_EQ(download<uint8_t>(dc, c_bytes), wgmma_bits)
                << "E=" << E << " variant 3, cluster " << cluster << ", idle_skip " << skip << ", stagger " << stagger
                << ", narrow_tails " << narrow;
          }
    // The 128 × 192 tiles (n192; bf16 out with block-form scales — the bf16 cases of block_n 128
    // here: N = 320 ends in a tile of 128 valid columns whose 192 span two scale blocks, N = 1,024
    // in one of 64 — the others keep the 128-wide kernel): the same bits.
    v.cluster = 1, v.idle_skip = true, v.stagger = false, v.narrow_tails = true, v.n192 = true;
    if (c_bytes > 0) DI_CUDA_CHECK(cudaMemset(dc.as<void>(), 0xff, c_bytes));
    cuda::fp8_grouped_gemm(v, nullptr);
    DI_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(download<uint8_t>(dc, c_bytes), wgmma_bits) << "E=" << E << " variant 3, n192";
  }
}

// The gathered-A form (Fp8GemmArgs::a_rows: the GEMM's row i is row a_rows[i] / a_row_div of a
// [T, K] and of its scales, which the loader warpgroup copies into the stages by cp.async)
// against the same GEMM on those rows gathered on the host first — bitwise, bf16 out (the MoE's
// gate|up). Cases: experts with no rows, single rows (every tile narrow), partial tiles and tiles
// straddling experts, more tiles than SMs, a source row taken by several slots; K = 2,048 (the
// ring wrapped many times) and 320 (the last K block half past K: zeros); both block forms of the
// weight scales (checkpoint 128-row blocks; per-row scales uniform within 128-row blocks, at
// V2-Lite's gate|up width 2,816); the 128 × 128 and 128 × 192 kernels, narrow tails, idle_skip
// and stagger on and off. A protocol error (the full barrier's 129 arrivals) would hang: the
// device scripts run this test first, under a timeout.
TEST_F(CudaFp8Gemm, GatheredRowsEqualGatheringFirst) {
  if (!cuda::fp8_wgmma_available()) GTEST_SKIP() << "the wgmma form needs an sm_90 GPU";
  struct Case {
    std::vector<int32_t> counts;  // rows per expert
    int64_t N, K, block_n;        // block_n 1: per-row scales, uniform within 128-row blocks
    int64_t T, k;                 // source rows, slots per source row (a_row_div)
  };
  std::vector<int32_t> many(64);
  for (size_t e = 0; e < many.size(); ++e) many[e] = e % 5 == 0 ? 0 : static_cast<int32_t>((e * 37) % 41);
  std::vector<int32_t> wide(16);
  for (size_t e = 0; e < wide.size(); ++e) wide[e] = 200 + static_cast<int32_t>((e * 37) % 200);
  std::vector<int32_t> decode(64, 0);
  for (int e : {3, 17, 20, 33, 40, 63}) decode[static_cast<size_t>(e)] = 1;
  const Case cases[] = {
      {{0, 5, 0, 130, 17, 0, 64, 1}, 256, 320, 128, 100, 6},
      {many, 2816, 2048, 1, 300, 6},
      {decode, 2816, 2048, 1, 1, 6},
      {wide, 1024, 256, 128, 1000, 4},
  };
  for (const Case& c : cases) {
    const int64_t E = static_cast<int64_t>(c.counts.size()), n_kb = (c.K + 127) / 128;
    std::vector<int32_t> offsets(static_cast<size_t>(E + 1), 0);
    for (int64_t e = 0; e < E; ++e)
      offsets[static_cast<size_t>(e + 1)] = offsets[static_cast<size_t>(e)] + c.counts[static_cast<size_t>(e)];
    const int64_t M = offsets.back();
    const auto src = random_e4m3(static_cast<size_t>(c.T * c.K), rng_);
    const auto src_scales = random_scales(static_cast<size_t>(c.T * n_kb), rng_);
    std::vector<int32_t> rows(static_cast<size_t>(M));
    for (auto& r : rows) r = static_cast<int32_t>(rng_() % static_cast<uint32_t>(c.T * c.k));
    std::vector<uint8_t> a(static_cast<size_t>(M * c.K));  // the rows gathered on the host
    std::vector<float> sa(static_cast<size_t>(M * n_kb));
    for (int64_t i = 0; i < M; ++i) {
      const int64_t r = rows[static_cast<size_t>(i)] / c.k;
      std::memcpy(a.data() + i * c.K, src.data() + r * c.K, static_cast<size_t>(c.K));
      std::memcpy(sa.data() + i * n_kb, src_scales.data() + r * n_kb, static_cast<size_t>(n_kb) * 4);
    }
    const auto w = random_e4m3(static_cast<size_t>(E * c.N * c.K), rng_);
    const int64_t blocks = E * ((c.N + 127) / 128);
    const auto block_scales = random_scales(static_cast<size_t>(blocks * n_kb), rng_);
    std::vector<float> sw = block_scales;  // block_n 128: [E·ceil(N/128), n_kb]
    if (c.block_n == 1) {                  // [E·N, n_kb], row n of expert e: its 128-row block's
      sw.assign(static_cast<size_t>(E * c.N * n_kb), 0.0f);
      for (int64_t row = 0; row < E * c.N; ++row) {
        const int64_t b = row / c.N * ((c.N + 127) / 128) + row % c.N / 128;
        std::memcpy(sw.data() + row * n_kb, block_scales.data() + b * n_kb, static_cast<size_t>(n_kb) * 4);
      }
    }
    DevOperands gathered(a, w, sa, sw, offsets);
    DevBuf dsrc(src.size() + 16), dss(src_scales.size() * 4), drows(rows.size() * 4 + 4),
        dc(static_cast<size_t>(M * c.N) * 2);
    upload(dsrc, src);
    upload(dss, src_scales);
    upload(drows, rows);
    Fp8GemmArgs base = gathered.args();
    base.M = M, base.N = c.N, base.K = c.K, base.block_n = c.block_n, base.w_scale_uniform = c.block_n == 1;
    base.c = dc.as<void>(), base.c_elem = Elem::kBF16, base.ldc = c.N;
    base.offsets = gathered.off.as<int32_t>(), base.E = E;
    const size_t c_bytes = static_cast<size_t>(M * c.N) * 2;
    DI_CUDA_CHECK(cudaMemset(dc.as<void>(), 0xff, c_bytes));
    cuda::fp8_grouped_gemm(base, nullptr);
    DI_CUDA_CHECK(cudaDeviceSynchronize());
    const auto want = download<uint8_t>(dc, c_bytes);
    for (bool n192 : {false, true})
      for (bool narrow : {true, false})
        for (bool skip : {true, false})
          for (bool stagger : {false, true}) {
            if (n192 && (!narrow || stagger)) continue;  // the 128 × 192 kernel takes neither
            Fp8GemmArgs g = base;
            g.a = dsrc.as<uint8_t>(), g.a_scale = dss.as<float>();
            g.a_rows = drows.as<int32_t>(), g.a_row_div = static_cast<int32_t>(c.k), g.a_src_rows = c.T;
            g.n192 = n192, g.narrow_tails = narrow, g.idle_skip = skip, g.stagger = stagger;
            ASSERT_TRUE(cuda::fp8_wgmma_gather_ok(g));
            DI_CUDA_CHECK(cudaMemset(dc.as<void>(), 0xff, c_bytes));
            cuda::fp8_grouped_gemm(g, nullptr);
            DI_CUDA_CHECK(cudaDeviceSynchronize());
            EXPECT_EQ(download<uint8_t>(dc, c_bytes), want)
                << "E=" << E << " K=" << c.K << " block_n " << c.block_n << ": gathered A, n192 " << n192
                << ", narrow_tails " << narrow << ", idle_skip " << skip << ", stagger " << stagger;
          }
  }
}

// The MoE gate|up GEMM with SiLU·mul and the down GEMM's quantizer in its epilogue
// (fp8_wgmma_glu_quantize) against what it replaces — the wgmma GEMM writing gate|up in bf16,
// then silu_mul_quantize_fp8 — bitwise, codes and scales: experts with no rows, 1, a few,
// tiles straddling experts and several row tiles; I = 128 (one activation column tile), 384
// (three) and 1,408 (V2-Lite's, eleven); K = 256 and 2,048 (V2-Lite's D: sixteen K blocks, the
// ring wrapped many times); the weights' per-row scales uniform within 128-row blocks (the
// checkpoint placement the form needs); and the dense form (offsets null: one gate|up stack over
// rows [0, M), against fp8_gemm), M = 300 and 3. Rows of the output past M are never written.
TEST_F(CudaFp8Gemm, GluQuantizeEqualsGemmThenSiluMulQuantize) {
  if (!cuda::fp8_wgmma_available()) GTEST_SKIP() << "the wgmma form needs an sm_90 GPU";
  struct Case {
    std::vector<int32_t> counts;  // rows per expert
    int64_t I, K;
    bool dense = false;           // one "expert" (counts[0] rows), offsets null
  };
  std::vector<int32_t> many(64);
  for (size_t e = 0; e < many.size(); ++e) many[e] = e % 7 == 0 ? 0 : static_cast<int32_t>((e * 53) % 41);
  const Case cases[] = {
      {{0, 5, 0, 130, 17, 0, 64, 1}, 128, 256},
      {{300, 0, 129, 1, 257}, 384, 256},
      {many, 1408, 2048},
      {{1, 1, 0, 1}, 1408, 2048},
      {{300}, 256, 384, true},
      {{3}, 2816, 2048, true},
  };
  for (const Case& c : cases) {
    const int64_t E = static_cast<int64_t>(c.counts.size()), N = 2 * c.I, n_kb = (c.K + 127) / 128;
    ASSERT_TRUE(cuda::fp8_wgmma_glu_ok(c.I, true));
    std::vector<int32_t> offsets(static_cast<size_t>(E + 1), 0);
    for (int64_t e = 0; e < E; ++e)
      offsets[static_cast<size_t>(e + 1)] = offsets[static_cast<size_t>(e)] + c.counts[static_cast<size_t>(e)];
    const int64_t M = offsets.back(), nb = N / 128, qb = c.I / 128;
    const auto a = random_e4m3(static_cast<size_t>(M * c.K), rng_);
    const auto w = random_e4m3(static_cast<size_t>(E * N * c.K), rng_);
    const auto sa = random_scales(static_cast<size_t>(M * n_kb), rng_);
    const auto sb = random_scales(static_cast<size_t>(E * nb * n_kb), rng_);  // per 128-row block
    std::vector<float> sw(static_cast<size_t>(E * N * n_kb));                  // one row each, uniform in blocks
    for (int64_t r = 0; r < E * N; ++r)
      for (int64_t kb = 0; kb < n_kb; ++kb)
        sw[static_cast<size_t>(r * n_kb + kb)] = sb[static_cast<size_t>((r / 128) * n_kb + kb)];
    const DevOperands ops(a, w, sa, sw, offsets);
    DevBuf dh(static_cast<size_t>(M * N) * 2 + 16), dq(static_cast<size_t>(M * c.I) + 16),
        dsq(static_cast<size_t>(M * qb) * 4 + 4), dq2(static_cast<size_t>(M * c.I) + 16),
        dsq2(static_cast<size_t>(M * qb) * 4 + 4);
    Fp8GemmArgs args = ops.args();
    args.M = M, args.N = N, args.K = c.K, args.w_scale_uniform = true;
    if (!c.dense) args.offsets = ops.off.as<int32_t>(), args.E = E;
    // The separate kernels.
    Fp8GemmArgs plain = args;
    plain.c = dh.as<void>(), plain.c_elem = Elem::kBF16, plain.ldc = N;
    if (c.dense) cuda::fp8_gemm(plain, nullptr, nullptr, nullptr);
    else cuda::fp8_grouped_gemm(plain, nullptr);
    cuda::silu_mul_quantize_fp8(dh.as<void>(), Elem::kBF16, M, c.I, dq.as<uint8_t>(), dsq.as<float>(), nullptr);
    // The fused form, into buffers pre-filled with a pattern the codes never all take.
    // (Its idle warpgroups' MMAs skipped, the default, and issued.)
    for (bool skip : {true, false}) {
      DI_CUDA_CHECK(cudaMemset(dq2.as<void>(), 0x7f, static_cast<size_t>(M * c.I) + 16));
      DI_CUDA_CHECK(cudaMemset(dsq2.as<void>(), 0xff, static_cast<size_t>(M * qb) * 4 + 4));
      Fp8GemmArgs fused = args;
      fused.idle_skip = skip;
      cuda::fp8_wgmma_glu_quantize(fused, dq2.as<uint8_t>(), dsq2.as<float>(), nullptr);
      DI_CUDA_CHECK(cudaDeviceSynchronize());
      const std::string tag =
          fmt::format("E={} M={} I={} K={}{} idle_skip {}", E, M, c.I, c.K, c.dense ? " dense" : "", skip);
      EXPECT_EQ(download<uint8_t>(dq2, static_cast<size_t>(M * c.I)),
                download<uint8_t>(dq, static_cast<size_t>(M * c.I)))
          << tag << ": codes";
      EXPECT_EQ(download<float>(dsq2, static_cast<size_t>(M * qb)), download<float>(dsq, static_cast<size_t>(M * qb)))
          << tag << ": scales";
      const auto past = download<uint8_t>(dq2, static_cast<size_t>(M * c.I) + 16);
      EXPECT_TRUE(std::all_of(past.end() - 16, past.end(), [](uint8_t b) { return b == 0x7f; })) << tag << ": past M";
    }
  }
}

TEST_F(CudaFp8Gemm, PreconditionsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // this process holds a CUDA context
  Fp8GemmArgs args;
  args.M = 1, args.N = 8, args.K = 24, args.ldc = 8;  // K % 16 != 0
  EXPECT_DEATH(cuda::fp8_gemm(args, nullptr, nullptr, nullptr), "multiple of 16");
  args.K = 128, args.N = 256, args.ldc = 128;  // a second output on a variant without it
  int dummy = 0;
  args.c2 = &dummy, args.ldc2 = 128, args.n_split = 128, args.variant = 0;
  EXPECT_DEATH(cuda::fp8_gemm(args, nullptr, nullptr, nullptr), "needs variant 3");
}
#else
TEST(CudaFp8Gemm, NeedsCudaBuild) { GTEST_SKIP() << "built without the CUDA backend"; }
#endif

}  // namespace
}  // namespace deepinfer
