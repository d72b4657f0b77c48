#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/reference/reference_backend.h"
#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace deepinfer {

void Backend::copy_from_host(const void* src, Tensor& dst) {
  DI_CHECK(on_host());
  std::memcpy(dst.raw_data(), src, dst.n_bytes());
}

LinearWeight Backend::place_linear(const std::vector<const LinearWeight*>& parts) {
  DI_CHECK(on_host() && parts.size() == 1);
  return *parts[0];
}

LinearWeight Backend::allocate_linear(int64_t n_out, int64_t n_in, DType dtype) {
  LinearWeight w;
  w.weight = allocate(dtype, {n_out, n_in});
  if (dtype == DType::kF8E4M3) {
    w.block_n = 128;
    w.block_k = 128;
    w.scale_inv = allocate(DType::kF32, {(n_out + 127) / 128, (n_in + 127) / 128});
  }
  return w;
}

void Backend::fill_random(Tensor& t, uint64_t seed, bool normal, float a, float b) {
  DI_CHECK(on_host());
  uint64_t state = seed;
  auto next = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint64_t r = next();
    float v;
    if (normal) {  // Irwin-Hall of four 16-bit uniforms, unit variance
      const float s = static_cast<float>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
      v = (s / 65536.0f - 2.0f) * 1.7320508f * a;
    } else {
      v = a + (b - a) * static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
    }
    switch (t.dtype()) {
      case DType::kF32: t.data<float>()[i] = v; break;
      case DType::kBF16: t.data<uint16_t>()[i] = f32_to_bf16(v); break;
      case DType::kF16: t.data<uint16_t>()[i] = f32_to_f16(v); break;
      case DType::kF8E4M3: t.data<uint8_t>()[i] = f32_to_e4m3(v); break;
      default: DI_CHECK(false && "fill_random: float dtype expected");
    }
  }
}

void Backend::copy_to_host_async(const Tensor& src, Tensor& host_dst) {
  DI_CHECK(on_host());
  DI_CHECK_EQ(src.n_bytes(), host_dst.n_bytes());
  std::memcpy(host_dst.raw_data(), src.raw_data(), src.n_bytes());
}

void Backend::mla_kv_write(Tensor& kv, const Tensor& norm, float eps, const Tensor& positions, const RopeParams& rope,
                           const Tensor& slots, Tensor& cache) {
  const int64_t T = kv.size(0), width = kv.size(1);
  rms_norm(kv, width, norm, eps, kv);
  Tensor kv3 = kv.reshape({T, 1, width});  // k_pe is one head shared by all query heads
  this->rope(kv3, norm.numel(), positions, rope);
  kv_write(kv, slots, cache);
}

void Backend::mla_rope_kv_write(Tensor& q, int64_t q_offset, Tensor& kv, const Tensor& norm, float eps,
                                const Tensor& positions, const RopeParams& rope, const Tensor& slots, Tensor& cache,
                                MlaParams* reader) {
  (void)reader;  // q rotated here
  this->rope(q, q_offset, positions, rope);
  mla_kv_write(kv, norm, eps, positions, rope, slots, cache);
}

void Backend::mla_decode_sublayer(const MlaSublayerWeights& w, const Tensor& x, const QuantizedRows* xq,
                                  const Tensor& positions, const Tensor& slots, const AttentionBatch& decode,
                                  Tensor& cache, Tensor& out) {
  const MlaParams& p = w.mla;
  const int64_t T = x.size(0), H = p.n_heads, dqk = p.qk_nope_head_dim + p.qk_rope_head_dim;
  Tensor q = empty(DType::kF32, {T, H * dqk});                                    // [T, H · (dn + dr)]
  Tensor kv = empty(DType::kF32, {T, p.kv_lora_rank + p.qk_rope_head_dim});     // [T, r + dr]
  matmul_parts(x, {w.q_proj, w.kv_a_proj}, {&q, &kv}, xq);
  Tensor q3 = q.reshape({T, H, dqk});
  mla_rope_kv_write(q3, p.qk_nope_head_dim, kv, *w.kv_a_layernorm, w.eps, positions, *w.rope, slots, cache, nullptr);
  Tensor o = empty(DType::kF32, {T, H, p.v_head_dim});  // [T, H, dv]
  mla_attention(p, MlaForm::kAbsorbed, q3, cache, decode, o);
  matmul(o.reshape({T, H * p.v_head_dim}), 0, *w.o_proj, out);
}

void Backend::add_rms_norm_mla_decode_sublayer(Tensor& residual, const Tensor& delta, const Tensor& norm, float eps,
                                               Tensor& x, QuantizedRows& xq, const MlaSublayerWeights& w,
                                               const Tensor& positions, const Tensor& slots,
                                               const AttentionBatch& decode, Tensor& cache, Tensor& out) {
  add_rms_norm_quantized(residual, delta, norm, eps, x, xq);
  mla_decode_sublayer(w, x, &xq, positions, slots, decode, cache, out);
}

void Backend::add_rms_norm_quantized(Tensor& residual, const Tensor& delta, const Tensor& weight, float eps,
                                     Tensor& out, QuantizedRows& xq) {
  DI_CHECK(!xq.defined() && "this backend makes no quantized rows (quantized_rows)");
  add_rms_norm(residual, delta, weight, eps, out);
}

void Backend::matmul_parts(const Tensor& x, const std::vector<const LinearWeight*>& w,
                           const std::vector<Tensor*>& out, const QuantizedRows* xq) {
  (void)xq;  // the backend's own rows, never made here
  DI_CHECK_EQ(w.size(), out.size());
  for (size_t i = 0; i < w.size(); ++i) matmul(x, 0, *w[i], *out[i]);
}

void Backend::add_rms_norm_route(Tensor& residual, const Tensor& delta, const Tensor& norm, float eps, Tensor& out,
                                 QuantizedRows& xq, const LinearWeight& router, const RouterParams& p, Tensor& ids,
                                 Tensor& weights) {
  add_rms_norm_quantized(residual, delta, norm, eps, out, xq);
  Tensor logits = empty(DType::kF32, {out.size(0), router.n_out()});  // [T, E] fp32, like the references
  matmul(out, 0, router, logits);
  moe_route(logits, p, ids, weights);
}

void Backend::moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const std::vector<MlpWeights>& experts,
                      const SharedExperts& shared, Tensor& out, const QuantizedRows* xq) {
  (void)xq;
  moe_experts(x, ids, weights, experts, out);
  if (shared.mlp == nullptr) return;
  Tensor s = empty(DType::kF32, {x.size(0), out.size(1)});  // [T, D]
  mlp(x, *shared.mlp, s);
  add(out, s);
}

bool Backend::moe_ffn_norm(const Tensor& x, const Tensor& ids, const Tensor& weights,
                           const std::vector<MlpWeights>& experts, const SharedExperts& shared, Tensor& out,
                           const QuantizedRows* xq, const NextNorm& next) {
  (void)next;
  moe_ffn(x, ids, weights, experts, shared, out, xq);
  return false;
}

void Backend::resolve_tokens(Tensor& ids, const Tensor& pending) {
  DI_CHECK(on_host());
  int32_t* id = ids.data<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    if (id[i] < 0) id[i] = std::max(0, pending.data<int32_t>()[-id[i] - 1]);
}

void Backend::sample(const Tensor& logits, const std::vector<SampleRow>& rows, Tensor& tokens, Tensor& logprobs,
                     SampleExtras* extras) {
  DI_CHECK(on_host());
  const int64_t R = logits.size(0), V = logits.size(1);
  DI_CHECK_EQ(static_cast<int64_t>(rows.size()), R);
  const int64_t n_top = extras != nullptr && extras->top_ids.defined() ? extras->top_ids.size(1) : 0;
  std::vector<float> scratch, work;
  std::vector<int32_t> pending_values, ids;
  for (int64_t i = 0; i < R; ++i) {
    const float* x = logits.data<float>() + i * V;
    for (int64_t j = 0; j < n_top; ++j) {
      extras->top_ids.data<int32_t>()[i * n_top + j] = -1;
      extras->top_logprobs.data<float>()[i * n_top + j] = 0.0f;
    }
    bool finite = true;
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      finite &= std::isfinite(x[v]);
      mx = std::max(mx, static_cast<double>(x[v]));
    }
    if (!finite) {
      tokens.data<int32_t>()[i] = -1;
      logprobs.data<float>()[i] = 0.0f;
      continue;
    }
    const SampleRow& r = rows[static_cast<size_t>(i)];
    const float* row = x;
    if (r.processors != nullptr && r.processors->active()) {
      pending_values.clear();
      for (int32_t k : r.processors->pending) {
        DI_CHECK(extras != nullptr && k >= 0 && k < extras->pending_tokens.numel());
        pending_values.push_back(extras->pending_tokens.data<int32_t>()[k]);
      }
      work.assign(x, x + V);
      apply_logits_processors(work.data(), V, *r.processors, pending_values.data());
      row = work.data();
    }
    const int32_t t = sample_token(row, V, r.params, r.seed, r.position, &scratch);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(x[v]) - mx);
    const double lse = mx + std::log(sum);
    tokens.data<int32_t>()[i] = t;
    logprobs.data<float>()[i] = static_cast<float>(static_cast<double>(x[t]) - lse);
    const int64_t n = std::min<int64_t>(r.n_top_logprobs, V);
    DI_CHECK_LE(n, n_top);
    if (n <= 0) continue;
    ids.resize(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) ids[static_cast<size_t>(v)] = static_cast<int32_t>(v);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                      [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    for (int64_t j = 0; j < n; ++j) {
      const int32_t id = ids[static_cast<size_t>(j)];
      extras->top_ids.data<int32_t>()[i * n_top + j] = id;
      extras->top_logprobs.data<float>()[i * n_top + j] = static_cast<float>(static_cast<double>(x[id]) - lse);
    }
  }
}

bool cuda_backend_built() {
#ifdef DEEPINFER_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Expected<std::unique_ptr<Backend>> make_backend(const std::string& name, int n_threads) {
  if (name == "reference") return std::unique_ptr<Backend>(std::make_unique<ReferenceBackend>());
  if (name == "cpu") return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(n_threads));
  if (name == "cuda") {
#ifdef DEEPINFER_HAVE_CUDA
    return make_cuda_backend(0);
#else
    return make_error(StatusCode::kUnsupported,
                      "device 'cuda' is not available: this build has no CUDA backend (configure with -DDEEPINFER_CUDA=ON)");
#endif
  }
  return make_error(StatusCode::kInvalidArgument, "unknown device '{}' (expected cpu, cuda or reference)", name);
}

}  // namespace deepinfer
