// The MLA prefill kernels through CudaBackend::mla_attention's naive form, against the reference
// backend: DeepSeek's head dims (dn 128, dr 64, dv 128, r 512) at H = 16 (V2-Lite) and 128 (V3) on
// both kernels that take them (the wgmma one, cuda_mla_prefill_wgmma.cu, the default on sm_90;
// the mma.sync one, cuda_mla_prefill.cu, by set_mla_prefill_wgmma(false)), at H = 6 (the wgmma
// raster's last head group short), the tiny test models' dims (the <64, 64> instance), dims
// padded inside the <192, 128> instance, and a shape the kernel does not take (the TF32 fallback). Sequences of
// 1, 5, 64, 65 and 300 query rows over contexts from q_len up to 2000 keys (with and without a
// cached prefix), pages of 16 and 64 tokens shuffled over the pool, a sequence left out (its rows
// must keep a sentinel), and more sequences than one launch takes.
//
// Oracle: the reference's naive form where it is cheap; for DeepSeek's dims its absorbed form
// (the same math in double: scores q_nope·(W_UK c) = (W_UKᵀ q_nope)·c; its naive form decompresses
// K per (row, head, key) and would take hours at these sizes).
//
// Tolerance: 1e-2 relative L2 per row (all heads). One bf16 rounding has an rms relative error
// ε ≈ 2^-8/√3 · 0.74 ≈ 1.7e-3 (half an ulp of 2^-7, uniform, over values spread across a binade).
// A score s = scale · Σ_c q_c k_c has q and k_nope rounded (k_pe is exact: the cache is bf16), an
// absolute error ≈ √2 ε σ_s ≈ 2.4e-3 for these unit-variance scores, i.e. that relative error on
// each key's weight; rounding p adds ε. A weighted mean Σ w_k v_k / Σ w_k with independent relative
// weight errors ε_w has relative error ≈ ε_w whether the weights are flat or peaked (error and mean
// both shrink as 1/√N_eff), and rounding V adds ε the same way: ≈ √(2.9e-3² + 1.7e-3²) ≈ 3.4e-3,
// about 3× under the bound. A wrong head, page or tile is O(1); one key too many or too few
// (an off-by-one causal limit) moves a row by ≈ 1/√N_keys ≥ 2.2e-2 at N_keys ≤ 2000, so the
// bound catches that too. The TF32 fallback stays within the same bound. The wgmma kernel rounds
// p against per-128-key-tile maxima (mma.sync: 32), the same error model.
// Skipped without a GPU (CI); run on the GPU machine by scripts/device/gpu_check.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <random>

#include "backend/reference/reference_backend.h"
#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"  // set_mla_prefill_wgmma, set_mla_q_rope
#include "backend/cuda/cuda_common.h"   // kMlaPrefillMaxSeqs, mla_prefill_supported, mla_prefill_wgmma_ok
#endif
#include "support/cuda_available.h"
#include "support/logits_compare.h"
#include "support/random_linear.h"

namespace deepinfer {
namespace {

class CudaMlaPrefill : public ::testing::Test {
 public:
  struct Shape {
    int64_t H, dn, dr, dv, r;
  };
  struct Seq {
    int32_t q_len, kv_len;
    bool selected = true;
  };

 protected:
  static constexpr float kSentinel = 12345.0f;
  // One page layout of the batch: the host cache (fp32 values, bf16-exact) and its device copy,
  // the index arrays on both sides and the AttentionBatch over them.
  struct Paged {
    int64_t bs = 0;
    Tensor cache, d_cache;  // [n_blocks, bs, r + dr] fp32 host / bf16 device
    std::vector<int32_t> kv_len, block_indptr{0}, block_ids;
    std::vector<uint8_t> mask;
    Tensor d_q_indptr, d_kv_len, d_block_indptr, d_block_ids, d_mask;
    AttentionBatch ab;
  };

  void SetUp() override {
    gpu_ = testing::try_cuda_backend();
    DI_REQUIRE_GPU(gpu_);
  }

  int64_t width() const { return shape_.r + shape_.dr; }
  int64_t dqk() const { return shape_.dn + shape_.dr; }
  int64_t T() const { return q_indptr_.back(); }
  int64_t n_seqs() const { return static_cast<int64_t>(seqs_.size()); }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(dqk())); }

  static float bf16_exact(float x) { return bf16_to_f32(f32_to_bf16(x)); }
  Tensor randn(std::vector<int64_t> shape) {
    Tensor t = Tensor::empty_host(DType::kF32, shape);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng_);
    return t;
  }
  Tensor up_i32(const std::vector<int32_t>& v) {
    Tensor h = Tensor::empty_host(DType::kI32, {std::max<int64_t>(1, static_cast<int64_t>(v.size()))});
    std::copy(v.begin(), v.end(), h.data<int32_t>());
    return gpu_->upload(h);
  }

  // Random bf16-exact kv_b (so the reference and the GPU multiply the same weights), per-sequence
  // latent rows (bf16-exact: the cache is bf16) and q for `shape` and `seqs`.
  void build(const Shape& shape, const std::vector<Seq>& seqs) {
    shape_ = shape;
    seqs_ = seqs;
    kvb_ = testing::random_linear(rng_, shape.H * (shape.dn + shape.dv), shape.r, DType::kF32);
    for (int64_t i = 0; i < kvb_.weight.numel(); ++i)
      kvb_.weight.data<float>()[i] = bf16_exact(kvb_.weight.data<float>()[i]);
    d_kvb_ = gpu_->place_linear({&kvb_});
    q_indptr_ = {0};
    latents_.clear();
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (const Seq& s : seqs) {
      q_indptr_.push_back(q_indptr_.back() + s.q_len);
      std::vector<float> lat(static_cast<size_t>(s.kv_len * width()));
      for (float& x : lat) x = bf16_exact(d(rng_));
      latents_.push_back(std::move(lat));
    }
    q_ = randn({T(), shape.H, dqk()});
    d_q_ = gpu_->upload(q_);
  }

  // The batch's latents in pages of `bs` tokens, the pages shuffled over the pool.
  Paged layout(int64_t bs) {
    Paged pg;
    pg.bs = bs;
    int64_t n_blocks = 0;
    for (const Seq& s : seqs_) n_blocks += (s.kv_len + bs - 1) / bs;
    std::vector<int32_t> pages(static_cast<size_t>(n_blocks));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng_);
    pg.cache = Tensor::empty_host(DType::kF32, {n_blocks, bs, width()});
    std::fill_n(pg.cache.data<float>(), pg.cache.numel(), 0.0f);
    size_t next = 0;
    for (size_t b = 0; b < seqs_.size(); ++b) {
      const Seq& s = seqs_[b];
      pg.kv_len.push_back(s.kv_len);
      pg.mask.push_back(s.selected ? 1 : 0);
      for (int64_t i = 0; i < (s.kv_len + bs - 1) / bs; ++i) pg.block_ids.push_back(pages[next++]);
      pg.block_indptr.push_back(static_cast<int32_t>(pg.block_ids.size()));
      for (int64_t pos = 0; pos < s.kv_len; ++pos) {
        const int64_t page = pg.block_ids[static_cast<size_t>(pg.block_indptr[b] + pos / bs)];
        std::copy_n(latents_[b].data() + pos * width(), width(),
                    pg.cache.data<float>() + (page * bs + pos % bs) * width());
      }
    }
    Tensor hb = Tensor::empty_host(DType::kBF16, pg.cache.shape());
    for (int64_t i = 0; i < pg.cache.numel(); ++i) hb.data<uint16_t>()[i] = f32_to_bf16(pg.cache.data<float>()[i]);
    pg.d_cache = gpu_->allocate(DType::kBF16, pg.cache.shape());
    gpu_->copy_from_host(hb.raw_data(), pg.d_cache);
    pg.d_q_indptr = up_i32(q_indptr_);
    pg.d_kv_len = up_i32(pg.kv_len);
    pg.d_block_indptr = up_i32(pg.block_indptr);
    pg.d_block_ids = up_i32(pg.block_ids);
    std::vector<int32_t> words((pg.mask.size() + 3) / 4 + 1, 0);
    std::memcpy(words.data(), pg.mask.data(), pg.mask.size());
    pg.d_mask = up_i32(words);
    AttentionBatch& ab = pg.ab;
    ab.q_indptr = q_indptr_.data();
    ab.kv_len = pg.kv_len.data();
    ab.block_indptr = pg.block_indptr.data();
    ab.block_ids = pg.block_ids.data();
    ab.seq_mask = pg.mask.data();
    ab.n_seqs = n_seqs();
    ab.block_size = bs;
    ab.n_rows = T();
    ab.dev = {pg.d_q_indptr.data<int32_t>(), pg.d_kv_len.data<int32_t>(), pg.d_block_indptr.data<int32_t>(),
              pg.d_block_ids.data<int32_t>(), reinterpret_cast<const uint8_t*>(pg.d_mask.data<int32_t>())};
    return pg;
  }

  MlaParams params(const LinearWeight* kvb) const {
    MlaParams p;
    p.n_heads = shape_.H;
    p.qk_nope_head_dim = shape_.dn;
    p.qk_rope_head_dim = shape_.dr;
    p.v_head_dim = shape_.dv;
    p.kv_lora_rank = shape_.r;
    p.softmax_scale = scale();
    p.kv_b_proj = kvb;
    p.kv_b_proj_fp8 = kvb_fp8_;
    return p;
  }
  // The reference over the selected sequences: [T, H, dv] (rows not selected: unspecified). Its
  // naive form where decompressing per (row, key) is cheap, else its absorbed form.
  Tensor reference(const Paged& pg) {
    Tensor o = Tensor::empty_host(DType::kF32, {T(), shape_.H, shape_.dv});
    const MlaForm form = shape_.dn * shape_.r <= 4096 ? MlaForm::kNaive : MlaForm::kAbsorbed;
    ref_.mla_attention(params(&kvb_), form, q_, pg.cache, pg.ab, o);
    return o;
  }
  // The CUDA naive form over `pg` into an output filled with kSentinel: [T, H, dv] on the host;
  // on the wgmma kernel where it takes the dims (`wgmma`), else on the mma.sync kernel.
  Tensor run(const Paged& pg, bool wgmma = true) {
#ifdef DEEPINFER_HAVE_CUDA
    auto* cuda_backend = dynamic_cast<CudaBackend*>(gpu_.get());
    if (cuda_backend == nullptr) ADD_FAILURE() << "the GPU backend is not a CudaBackend";
    else cuda_backend->set_mla_prefill_wgmma(wgmma);
#else
    (void)wgmma;
#endif
    Tensor filled = Tensor::empty_host(DType::kF32, {T(), shape_.H, shape_.dv});
    std::fill_n(filled.data<float>(), filled.numel(), kSentinel);
    Tensor d_o = gpu_->allocate(DType::kF32, filled.shape());
    gpu_->copy_from_host(filled.raw_data(), d_o);
    gpu_->mla_attention(params(&d_kvb_), MlaForm::kNaive, d_q_, pg.d_cache, pg.ab, d_o);
    return gpu_->to_host(d_o);
  }
  // Every selected row of `got` within `tol` (relative L2 over its H·dv values) of `ref`; the
  // rows of sequences not selected still hold kSentinel.
  void expect_rows(const Tensor& got, const Tensor& ref, double tol) {
    const int64_t row_n = shape_.H * shape_.dv;
    for (int64_t b = 0; b < n_seqs(); ++b)
      for (int64_t row = q_indptr_[b]; row < q_indptr_[b + 1]; ++row) {
        const float* g = got.data<float>() + row * row_n;
        if (!seqs_[static_cast<size_t>(b)].selected) {
          for (int64_t j = 0; j < row_n; ++j) ASSERT_EQ(g[j], kSentinel) << "row " << row << " was written";
          continue;
        }
        EXPECT_LT(testing::row_rel_err(g, ref.data<float>() + row * row_n, row_n), tol) << "sequence " << b << " row " << row - q_indptr_[b] << " of "
                                             << q_indptr_[b + 1] - q_indptr_[b] << " (kv_len "
                                             << seqs_[static_cast<size_t>(b)].kv_len << ")";
      }
  }
  // build, then for pages of 16 and 64 and each kernel of `kernels` (true: wgmma): the op against
  // the reference (computed once: it does not depend on the layout).
  void check(const Shape& shape, const std::vector<Seq>& seqs, std::initializer_list<bool> kernels = {true}) {
    build(shape, seqs);
    Tensor ref;
    for (int64_t bs : {16, 64}) {
      const Paged pg = layout(bs);
      if (bs == 16) ref = reference(pg);
      for (bool wgmma : kernels) {
        SCOPED_TRACE(::testing::Message() << "H " << shape.H << " dn " << shape.dn << " dr " << shape.dr << " dv "
                                          << shape.dv << " r " << shape.r << " block_size " << bs
                                          << (wgmma ? " wgmma" : " mma.sync"));
        expect_rows(run(pg, wgmma), ref, 1e-2);
      }
    }
  }

  void chunk_invariance(bool wgmma);  // DeterministicAndChunkInvariant on one kernel
#ifdef DEEPINFER_HAVE_CUDA
  // The CUDA backend for a test of the wgmma kernel at V2-Lite's dims over `seqs` (built); null
  // (the test to skip) where the GPU has no such kernel.
  // The caller's tests take pages of 16 tokens (pg).
  CudaBackend* v2_lite_wgmma(const std::vector<Seq>& seqs, Paged* pg) {
    auto* cuda_backend = dynamic_cast<CudaBackend*>(gpu_.get());
    EXPECT_NE(cuda_backend, nullptr);
    if (cuda_backend == nullptr || !cuda::mla_prefill_wgmma_ok(128, 64, 128, 512)) return nullptr;
    build({16, 128, 64, 128, 512}, seqs);
    *pg = layout(16);
    return cuda_backend;
  }
#endif

  std::unique_ptr<Backend> gpu_;
  ReferenceBackend ref_;
  std::mt19937 rng_{4321};
  Shape shape_{};
  std::vector<Seq> seqs_;
  std::vector<int32_t> q_indptr_{0};
  std::vector<std::vector<float>> latents_;  // per sequence [kv_len, r + dr]
  LinearWeight kvb_, d_kvb_;
  const LinearWeight* kvb_fp8_ = nullptr;  // MlaParams::kv_b_proj_fp8 of run()'s calls
  Tensor q_, d_q_;
};

// (q_len, kv_len): one key; a decode-like row over a long prefix; prefills without a prefix
// (early rows see a handful of keys) and over one (prefix + rows crossing key tiles and pages);
// q_len 64 and 65 (one full row tile, one row into the next); 300 rows over 2000 keys (row tiles
// of very different lengths, the heaviest first); a sequence left out.
const std::vector<CudaMlaPrefill::Seq> kDeepSeekSeqs = {
    {1, 1}, {1, 777}, {5, 5}, {5, 300}, {64, 64}, {64, 1000}, {40, 500, false}, {65, 65}, {65, 1500},
    {17, 129}, {300, 300}, {300, 2000}};

TEST_F(CudaMlaPrefill, DeepSeekV2LiteHeads) {
#ifdef DEEPINFER_HAVE_CUDA
  ASSERT_TRUE(cuda::mla_prefill_supported(128, 64, 128, 512));
  ASSERT_TRUE(cuda::mla_prefill_wgmma_ok(128, 64, 128, 512)) << "the GPU machine is an H200: sm_90";
#endif
  check({16, 128, 64, 128, 512}, kDeepSeekSeqs, {true, false});
}

TEST_F(CudaMlaPrefill, DeepSeekV3Heads) {
  check({128, 128, 64, 128, 512}, {{65, 200}, {1, 50}, {3, 3}, {9, 40, false}}, {true, false});
}

// A head count that is not a multiple of the wgmma kernel's raster group of 4 (block_coords):
// its last group has 2 heads.
TEST_F(CudaMlaPrefill, DeepSeekDimsSixHeads) {
  check({6, 128, 64, 128, 512}, {{300, 700}, {65, 65}, {1, 129}}, {true, false});
}

// More sequences than one launch takes, at DeepSeek's dims: 70 short ones (a page or a few, some
// left out), then a long one; the launches' key buffers hold many sequences back to back, so a
// key tile reaching past a sequence's keys reads the next one's (masked).
TEST_F(CudaMlaPrefill, DeepSeekManySequences) {
  std::vector<Seq> seqs;
  for (int i = 0; i < 70; ++i) seqs.push_back({1 + i % 5, 3 + 5 * i, i % 9 != 4});
  seqs.push_back({130, 400});
  check({16, 128, 64, 128, 512}, seqs, {true, false});
}

// The tiny test models' dims (dn 16, dr 8, dv 16, r 32: the <64, 64> instance with qk channels
// 24 .. 63 zero) and v3_fp8's (dn 32, dr 16, dv 32, r 144), with more sequences than one launch
// takes (kMlaPrefillMaxSeqs = 64): 70 short ones after the long ones.
TEST_F(CudaMlaPrefill, TinyModelDims) {
  std::vector<Seq> seqs = {{1, 1}, {1, 40}, {5, 5}, {5, 70}, {64, 64}, {33, 1000, false}, {65, 130}, {300, 300},
                           {300, 2000}};
  for (int i = 0; i < 70; ++i) seqs.push_back({1 + i % 3, 9 + i, i % 7 != 3});
#ifdef DEEPINFER_HAVE_CUDA
  ASSERT_GT(static_cast<int64_t>(seqs.size()), cuda::kMlaPrefillMaxSeqs);
  ASSERT_TRUE(cuda::mla_prefill_supported(16, 8, 16, 32));
  ASSERT_TRUE(cuda::mla_prefill_supported(32, 16, 32, 144));
#endif
  check({5, 16, 8, 16, 32}, seqs);
  check({4, 32, 16, 32, 144}, seqs);
}

// Dims that take the <192, 128> instance with padding (qk channels 96 .. 191 and value channels
// 64 .. 127 zero), and dims the kernel does not take (dv 12: the TF32 fallback).
TEST_F(CudaMlaPrefill, PaddedDimsAndFallback) {
  const std::vector<Seq> seqs = {{1, 1}, {5, 90}, {65, 65}, {64, 300, false}, {130, 700}};
#ifdef DEEPINFER_HAVE_CUDA
  ASSERT_TRUE(cuda::mla_prefill_supported(64, 32, 64, 64));
  ASSERT_FALSE(cuda::mla_prefill_supported(16, 8, 12, 40));
#endif
  check({3, 64, 32, 64, 64}, seqs);
  check({5, 16, 8, 12, 40}, seqs);
}

// Bitwise: the same call twice gives the same output; and a row's output does not depend on the
// chunk it is computed in (the last 100 rows of a 300-row prefill over 2000 keys, computed as a
// 100-row chunk, equal the same rows of the whole prefill): key tiles always start at key 0 and
// those past a row's causal limit add exact zeros. (The K/V decompression is the same cuBLAS
// GEMM in both calls: one sequence of 2000 keys.) On both kernels.
TEST_F(CudaMlaPrefill, DeterministicAndChunkInvariant) {
  for (bool wgmma : {true, false}) {
    SCOPED_TRACE(wgmma ? "wgmma" : "mma.sync");
    chunk_invariance(wgmma);
  }
}

void CudaMlaPrefill::chunk_invariance(bool wgmma) {
  const Shape shape{16, 128, 64, 128, 512};
  build(shape, {{300, 2000}});
  const Paged whole = layout(16);
  const Tensor o1 = run(whole, wgmma), o2 = run(whole, wgmma);
  const size_t row_bytes = static_cast<size_t>(shape.H * shape.dv) * sizeof(float);
  EXPECT_EQ(std::memcmp(o1.raw_data(), o2.raw_data(), 300 * row_bytes), 0) << "not repeatable";

  // The same sequence with q_len 100: q holds the whole prefill's last 100 rows.
  const Tensor q_all = q_;
  Paged chunk = layout(16);
  q_indptr_ = {0, 100};
  seqs_ = {{100, 2000}};
  q_ = Tensor::empty_host(DType::kF32, {100, shape.H, dqk()});
  std::copy_n(q_all.data<float>() + 200 * shape.H * dqk(), q_.numel(), q_.data<float>());
  d_q_ = gpu_->upload(q_);
  chunk.ab.q_indptr = q_indptr_.data();
  chunk.ab.n_rows = 100;
  chunk.d_q_indptr = up_i32(q_indptr_);
  chunk.ab.dev.q_indptr = chunk.d_q_indptr.data<int32_t>();
  const Tensor oc = run(chunk, wgmma);
  EXPECT_EQ(std::memcmp(oc.raw_data(), o1.data<float>() + 200 * shape.H * shape.dv, 100 * row_bytes), 0)
      << "rows computed as a chunk differ from the same rows of the whole prefill";
}

// kv_b on the W8A8 form (CudaBackend::set_kvb_w8a8, MlaParams::kv_b_proj_fp8) at V2-Lite's
// dims: an FP8 checkpoint's kv_b (random e4m3 codes, 128×128 block scales), placed as the model
// places it — the FP8 weight, and its bf16 copy as kv_b_proj — against the reference's absorbed
// form over the exactly dequantized weights. Tolerance 8e-2 relative L2 per row: c_kv's e4m3
// rounding per 1×128 group (≤ 2^-4 relative, rms ≈ 2^-4/√3 · 0.74 ≈ 2.7e-2 an element) passes
// into K_nope and V about unchanged in relative terms (sums of 512 products with independent
// errors), so into the keys' weights (unit-variance scores: an absolute error ≈ 2.7e-2 · |s|)
// and into the values: ≈ √2 · 2.7e-2 ≈ 3.8e-2 beside the bf16 path's 3.4e-3 (the file header);
// 8e-2 is twice that, and a wrong head, page or weight block is still O(1). With it: the same
// rows without the knob (the bf16 copy on cuBLAS) within the suite's 1e-2 — the two not equal
// bitwise (the W8A8 path ran) —, and the W8A8 rows of the first sequence the same bits when it
// runs alone (the FP8 GEMM's rows do not depend on its M; the quantizer's are per row).
TEST_F(CudaMlaPrefill, KvbOnW8a8MatchesReference) {
#ifdef DEEPINFER_HAVE_CUDA
  auto* cuda_backend = dynamic_cast<CudaBackend*>(gpu_.get());
  ASSERT_NE(cuda_backend, nullptr);
  if (!cuda::fp8_wgmma_available()) GTEST_SKIP() << "the W8A8 form needs an sm_90 GPU";
  const Shape shape{16, 128, 64, 128, 512};
  build(shape, {{300, 2000}, {65, 65}, {5, 700}, {64, 1000}});
  const int64_t n = shape.H * (shape.dn + shape.dv), k = shape.r;
  const LinearWeight w8 = testing::random_linear(rng_, n, k, DType::kF8E4M3);
  kvb_.weight = Tensor::empty_host(DType::kF32, {n, k});
  w8.dequantize(0, n, 0, k, kvb_.weight.data<float>(), k);  // the reference's weights
  LinearWeight copy;  // the bf16 copy the placement makes (kv_b_proj_bf16)
  copy.weight = Tensor::empty_host(DType::kF32, {n, k});
  for (int64_t i = 0; i < n * k; ++i) copy.weight.data<float>()[i] = bf16_exact(kvb_.weight.data<float>()[i]);
  d_kvb_ = gpu_->place_linear({&copy});
  const LinearWeight d_w8 = gpu_->place_linear({&w8});
  ASSERT_EQ(d_w8.dtype(), DType::kF8E4M3);
  kvb_fp8_ = &d_w8;
  Paged pg = layout(16);
  const Tensor ref = reference(pg);
  const Tensor plain = run(pg);
  cuda_backend->set_kvb_w8a8(true);
  const Tensor w8a8 = run(pg);
  {
    SCOPED_TRACE("kv_b on W8A8");
    expect_rows(w8a8, ref, 8e-2);
  }
  {
    SCOPED_TRACE("kv_b's bf16 copy");
    expect_rows(plain, ref, 1e-2);
  }
  EXPECT_NE(std::memcmp(w8a8.raw_data(), plain.raw_data(), w8a8.n_bytes()), 0) << "the W8A8 path did not run";
  double worst = 0;
  const int64_t row_n = shape.H * shape.dv;
  for (int64_t row = 0; row < T(); ++row)
    worst = std::max(worst, testing::row_rel_err(w8a8.data<float>() + row * row_n, ref.data<float>() + row * row_n, row_n));
  std::printf("[mla prefill] kv_b on W8A8: worst row %.3g relative L2 to the reference\n", worst);
  // The first sequence alone: the others left out (their rows keep the sentinel).
  for (size_t b = 1; b < pg.mask.size(); ++b) pg.mask[b] = 0;
  const Tensor alone = run(pg);
  const size_t first_bytes = static_cast<size_t>(q_indptr_[1] * row_n) * sizeof(float);
  EXPECT_EQ(std::memcmp(alone.raw_data(), w8a8.raw_data(), first_bytes), 0)
      << "the first sequence's rows depend on the other sequences' keys";
  cuda_backend->set_kvb_w8a8(false);
  kvb_fp8_ = nullptr;
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// o_proj's input rows from the wgmma kernel's epilogue (CudaBackend::set_mla_oproj_rows,
// MlaParams::out_rows) against what o_proj's W8A8 and bf16 paths make of the kernel's fp32 output
// — quantize_fp8_rows_bf16 (codes and scales) and to_bf16 — bitwise, over every computed row of
// kDeepSeekSeqs at V2-Lite's dims (row tiles crossing sequences, a sequence left out). With the
// knob off, out_rows stays unfilled and `out` is written as before.
TEST_F(CudaMlaPrefill, OprojRowsEqualTheConsumersOwn) {
#ifdef DEEPINFER_HAVE_CUDA
  Paged pg;
  CudaBackend* cuda_backend = v2_lite_wgmma(kDeepSeekSeqs, &pg);
  if (cuda_backend == nullptr) GTEST_SKIP() << "the wgmma kernel needs an sm_90 GPU";
  const Shape shape = shape_;
  const int64_t D = shape.H * shape.dv;
  // The kernel's fp32 output and what the consumers make of it.
  const Tensor plain = run(pg);
  Tensor d_plain = gpu_->upload(plain);
  Tensor want_q = gpu_->allocate(DType::kU8, {T(), D}), want_s = gpu_->allocate(DType::kF32, {T(), shape.H});
  Tensor want_b = gpu_->allocate(DType::kBF16, {T(), D});
  cuda::quantize_fp8_rows_bf16(d_plain.data<float>(), D, nullptr, 1, T(), D, want_q.data<uint8_t>(),
                               want_s.data<float>(), nullptr);
  cuda::to_bf16(d_plain.data<float>(), D, T(), D, static_cast<cuda::bf16*>(want_b.raw_data()), nullptr);
  DI_CUDA_CHECK(cudaDeviceSynchronize());
  const Tensor hq = gpu_->to_host(want_q), hs = gpu_->to_host(want_s), hb = gpu_->to_host(want_b);
  auto params_with = [&](QuantizedRows* rows) {
    MlaParams p = params(&d_kvb_);
    p.out_rows = rows;
    return p;
  };
  Tensor d_o = gpu_->allocate(DType::kF32, {T(), shape.H, shape.dv});
  // Knob off (whatever DEEPINFER_CUDA_MLA_OPROJ_ROWS said when the backend was made): not filled.
  cuda_backend->set_mla_oproj_rows(false);
  QuantizedRows off;
  off.codes = gpu_->allocate(DType::kU8, {T(), D});
  off.scales = gpu_->allocate(DType::kF32, {T(), shape.H});
  gpu_->mla_attention(params_with(&off), MlaForm::kNaive, d_q_, pg.d_cache, pg.ab, d_o);
  EXPECT_FALSE(off.filled);
  cuda_backend->set_mla_oproj_rows(true);
  for (DType form : {DType::kU8, DType::kBF16}) {
    QuantizedRows rows;
    rows.codes = gpu_->allocate(form, {T(), D});
    if (form == DType::kU8) rows.scales = gpu_->allocate(DType::kF32, {T(), shape.H});
    gpu_->mla_attention(params_with(&rows), MlaForm::kNaive, d_q_, pg.d_cache, pg.ab, d_o);
    ASSERT_TRUE(rows.filled);
    const Tensor got = gpu_->to_host(rows.codes);
    const Tensor got_s = form == DType::kU8 ? gpu_->to_host(rows.scales) : Tensor{};
    const size_t row_bytes = static_cast<size_t>(D) * (form == DType::kU8 ? 1 : 2);
    const Tensor& want = form == DType::kU8 ? hq : hb;
    for (int64_t b = 0; b < n_seqs(); ++b) {
      if (!seqs_[static_cast<size_t>(b)].selected) continue;
      for (int64_t row = q_indptr_[b]; row < q_indptr_[b + 1]; ++row) {
        EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>(got.raw_data()) + row * row_bytes,
                              static_cast<const uint8_t*>(want.raw_data()) + row * row_bytes, row_bytes),
                  0)
            << (form == DType::kU8 ? "codes" : "bf16 rows") << " of row " << row;
        if (form == DType::kU8) {
          EXPECT_EQ(std::memcmp(got_s.data<float>() + row * shape.H, hs.data<float>() + row * shape.H,
                                static_cast<size_t>(shape.H) * sizeof(float)),
                    0)
              << "scales of row " << row;
        }
      }
    }
  }
  cuda_backend->set_mla_oproj_rows(false);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// q_pe's rotation in the wgmma kernel (CudaBackend::set_mla_q_rope, MlaParams::q_rope): at
// V2-Lite's dims over kDeepSeekSeqs (row tiles crossing sequences, a sequence left out, positions
// up to 2,000, YaRN's attention factor), the latent write with the attention's parameters stores
// the tokens' tables and leaves q as it was — kv and the cache the same bits as the write that
// rotates q — and the attention over the unrotated q and the tables gives the same bits as over q
// rotated by the latent write: on the wgmma kernel (the rotation in its Q staging) and on the
// mma.sync kernel (mla_attention's rotated copy, rope_from_table), q still unrotated after both.
// With the knob off the write rotates q and sets no table.
TEST_F(CudaMlaPrefill, QRopeInTheKernelEqualsRotatedQ) {
#ifdef DEEPINFER_HAVE_CUDA
  Paged pg;
  CudaBackend* cuda_backend = v2_lite_wgmma(kDeepSeekSeqs, &pg);
  if (cuda_backend == nullptr) GTEST_SKIP() << "the wgmma kernel needs an sm_90 GPU";
  const Shape shape = shape_;
  const int64_t n = T(), w = width(), bs = 16, n_blocks = (n + bs - 1) / bs;
  RopeParams rp;
  for (int64_t i = 0; i < shape.dr / 2; ++i)
    rp.inv_freq.push_back(std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(shape.dr)));
  rp.attention_factor = 1.0707f;  // a YaRN amplitude: the table's entries carry it
  rp.interleave = true;
  std::vector<int32_t> pos, slots;
  for (int64_t b = 0; b < n_seqs(); ++b) {
    const Seq& sq = seqs_[static_cast<size_t>(b)];
    for (int32_t i = 0; i < sq.q_len; ++i) pos.push_back(sq.kv_len - sq.q_len + i);
  }
  for (int64_t t = 0; t < n; ++t) slots.push_back(static_cast<int32_t>(t));
  const Tensor kv = randn({n, w}), norm = randn({shape.r});
  const Tensor d_pos = up_i32(pos), d_slots = up_i32(slots), d_norm = gpu_->place_tensor(norm);
  struct Side {
    Tensor q, kv, cache;
    MlaParams p;
  };
  // The latent write with the attention's parameters, the knob as given.
  auto write = [&](bool knob) {
    cuda_backend->set_mla_q_rope(knob);
    Side sd{gpu_->upload(q_), gpu_->upload(kv), gpu_->allocate(DType::kBF16, {n_blocks, bs, w}), params(&d_kvb_)};
    gpu_->mla_rope_kv_write(sd.q, shape.dn, sd.kv, d_norm, 1e-6f, d_pos, rp, d_slots, sd.cache, &sd.p);
    cuda_backend->set_mla_q_rope(false);
    return sd;
  };
  auto attend = [&](const Side& sd, bool wgmma) {
    cuda_backend->set_mla_prefill_wgmma(wgmma);
    Tensor filled = Tensor::empty_host(DType::kF32, {n, shape.H, shape.dv});
    std::fill_n(filled.data<float>(), filled.numel(), kSentinel);
    Tensor d_o = gpu_->allocate(DType::kF32, filled.shape());
    gpu_->copy_from_host(filled.raw_data(), d_o);
    gpu_->mla_attention(sd.p, MlaForm::kNaive, sd.q, pg.d_cache, pg.ab, d_o);
    cuda_backend->set_mla_prefill_wgmma(true);
    return gpu_->to_host(d_o);
  };
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.n_bytes() == b.n_bytes() && std::memcmp(a.raw_data(), b.raw_data(), a.n_bytes()) == 0;
  };
  const Side rotated = write(false), later = write(true);
  ASSERT_FALSE(rotated.p.q_rope.defined()) << "the knob is off: q rotated by the latent write";
  ASSERT_TRUE(later.p.q_rope.defined()) << "the knob is on: the rotation left to the attention";
  EXPECT_FALSE(same(gpu_->to_host(rotated.q), q_)) << "the latent write did not rotate q";
  EXPECT_TRUE(same(gpu_->to_host(later.q), q_)) << "q written although its rotation was left";
  EXPECT_TRUE(same(gpu_->to_host(later.kv), gpu_->to_host(rotated.kv))) << "kv";
  EXPECT_TRUE(same(gpu_->to_host(later.cache), gpu_->to_host(rotated.cache))) << "the cache";
  for (bool wgmma : {true, false}) {
    SCOPED_TRACE(wgmma ? "wgmma kernel (rotation in the Q staging)" : "mma.sync kernel (a rotated copy)");
    const Tensor want = attend(rotated, wgmma), got = attend(later, wgmma);
    EXPECT_TRUE(same(got, want)) << "the attention over the tables differs from the attention over rotated q";
    EXPECT_TRUE(same(gpu_->to_host(later.q), q_)) << "the attention wrote q";
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

}  // namespace
}  // namespace deepinfer
