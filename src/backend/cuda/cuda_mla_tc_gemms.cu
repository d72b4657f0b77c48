// The tensor-core split kernels' companions in the absorbed MLA decode: q̃ = W_UKᵀ q_nope
// (absorb), the split merges (default rule, batch-invariant running rule) and out = W_UV · o_lat,
// as per-head bf16 mma.sync GEMMs.
#include "backend/cuda/cuda_mla_decode.cuh"

namespace deepinfer::cuda::mla {

// The split kernels round q̃ to bf16 and FlashMLA's recipe keeps o_lat in bf16 before W_UV, so
// these two small per-head GEMMs run on bf16 mma.sync with fp32 accumulation (each output's chain
// in channel order: a row's result does not depend on the rows around it). The fp32 CUDA-core
// versions (cuda_mla_split.cu) stay for the fp32 split kernel (kernel 0) and other shapes.

// q̃[i, h, n0..n0+127] = Σ_j bf16(q_nope[row(i), h, j]) · W_UK_h[j, n] for the 64 selected rows of
// the block's tile. Block (128-channel tile, head h, 64-row tile), 128 threads. Shared: q_nope tile
// [64][dn + 8] bf16 (zero past the rows), W_UK_h[:, n0..n0+127] [dn][136] bf16 by cp.async; warp w
// owns rows 16w..16w+15 (skipped when past the tile's rows): acc [16 n8 tiles][4], per k16 step
// an ldmatrix A fragment and ldmatrix.trans B pairs. Preconditions: r = 512, dn % 16 == 0,
// dn ≤ 192, (dn + dr) % 4 == 0.
__global__ void __launch_bounds__(kGemmThreads) mla_absorb_tc_kernel(DecodePlan pl) {
  extern __shared__ __align__(16) unsigned char gemm_smem[];
  const MlaDecodeArgs& a = pl.a;
  const int dn = static_cast<int>(a.dn), sa = dn + 8, sb = kAbsorbTileN + 8;
  bf16* s_a = reinterpret_cast<bf16*>(gemm_smem);  // [kGemmTileM][sa]
  bf16* s_b = s_a + kGemmTileM * sa;                // [dn][sb]
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kAbsorbTileN, h = blockIdx.y;
  const int64_t i0 = static_cast<int64_t>(blockIdx.z) * kGemmTileM;
  const int rows = static_cast<int>(std::min<int64_t>(kGemmTileM, a.n_rows - i0));
  const bf16* w_uk = a.kv_b + h * (a.dn + a.dv) * kTcRank;  // [dn, r]
  // A placed kv_b (a.kv_b_stable) is never written by a kernel: its tile's copies go out before
  // the wait for the previous kernel (cuda_launch.cuh), overlapping its tail.
  auto load_w = [&] {
    for (int e = t; e < dn * (kAbsorbTileN / 8); e += kGemmThreads) {
      const int j = e / (kAbsorbTileN / 8), c8 = e % (kAbsorbTileN / 8);
      cp_async16(smem_u32(s_b + j * sb + 8 * c8), w_uk + j * kTcRank + n0 + 8 * c8, true);
    }
  };
  if (a.kv_b_stable) load_w();
  pdl_wait();
  pdl_trigger();
  if (!a.kv_b_stable) load_w();
  cp_async_commit();
  const int64_t dqk = a.dn + a.dr;
  for (int e = t; e < kGemmTileM * (dn / 4); e += kGemmThreads) {
    const int ii = e / (dn / 4), c = 4 * (e % (dn / 4));
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (ii < rows) v = *reinterpret_cast<const float4*>(a.q + (selected_row(pl, i0 + ii) * a.H + h) * dqk + c);
    *reinterpret_cast<uint2*>(s_a + ii * sa + c) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
  }
  cp_async_wait<0>();
  __syncthreads();
  if (16 * warp >= rows) return;
  float acc[kAbsorbTileN / 8][4] = {};
  for (int ks = 0; ks < dn / 16; ++ks) {
    uint32_t af[4];
    ldmatrix_x4(af, smem_u32(s_a + (16 * warp + lane % 16) * sa + 16 * ks + 8 * (lane / 16)));
#pragma unroll
    for (int np = 0; np < kAbsorbTileN / 16; ++np) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, smem_u32(s_b + (16 * ks + lane % 8 + 8 * ((lane / 8) % 2)) * sb + 16 * np + 8 * (lane / 16)));
      mma_bf16_16816(acc[2 * np], af, bf[0], bf[1]);
      mma_bf16_16816(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
#pragma unroll
  for (int j = 0; j < kAbsorbTileN / 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int ii = 16 * warp + lane / 4 + 8 * half;
      if (ii < rows)
        *reinterpret_cast<float2*>(pl.q_lat + ((i0 + ii) * a.H + h) * kTcRank + n0 + 8 * j + 2 * (lane % 4)) =
            make_float2(acc[j][2 * half], acc[j][2 * half + 1]);
    }
}

// The merged o_lat of 4 channels: Σ over split lanes L = 0..15 in order of (Σ over the splits
// s ≡ L mod 16 in increasing order of w_s · acc_s, an fmaf chain from 0), splits with w_s = 0
// skipped (never read). Both merge paths (mla_merge_kernel's lanes, apply's inline loop over
// ≤ kMergeInline splits: one split per lane) compute exactly this, so a row's bits do not depend
// on which path its launch took.
__device__ __forceinline__ float4 fma4(float w, float4 x, float4 acc) {
  return make_float4(fmaf(w, x.x, acc.x), fmaf(w, x.y, acc.y), fmaf(w, x.z, acc.z), fmaf(w, x.w, acc.w));
}
__device__ __forceinline__ float4 add4(float4 x, float4 y) {
  return make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
}

// o_lat[i, h, c0..c0+63] in bf16 for many splits (> kMergeInline: few rows). Block (selected row
// i, head h, 64-channel tile), 256 threads: thread t = 16·L + q owns channel quad q and split lane
// L, issues all its ≤ 8 float4 loads at once (one L2 round trip), then the 16 lanes' partials are
// added in lane order through shared memory.
__global__ void __launch_bounds__(kThreads) mla_merge_kernel(DecodePlan pl, bf16* o_lat) {
  pdl_wait();
  pdl_trigger();
  constexpr int kQuads = kThreads / kMergeLanes, kPer = kMaxSplits / kMergeLanes;
  __shared__ float sw[kMaxSplits];
  __shared__ float4 spart[kMergeLanes][kQuads];
  const MlaDecodeArgs& a = pl.a;
  const int t = threadIdx.x, lane = t % 32;
  const int64_t i = blockIdx.x, h = blockIdx.y, c = static_cast<int64_t>(blockIdx.z) * 4 * kQuads + 4 * (t % kQuads);
  const int L = t / kQuads;
  if (t < 32) merge_weights(pl, i, h, lane, sw);
  __syncthreads();
  const float* src = pl.part_acc + (i * a.H + h) * kTcRank + c;
  const int64_t stride = a.n_rows * a.H * kTcRank;
  float4 x[kPer];
  float w[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int s = L + kMergeLanes * j;
    w[j] = s < pl.n_splits ? sw[s] : 0.0f;
    x[j] = w[j] != 0.0f ? *reinterpret_cast<const float4*>(src + s * stride) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float4 p = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (w[j] != 0.0f) p = fma4(w[j], x[j], p);
  spart[L][t % kQuads] = p;
  __syncthreads();
  if (t < kQuads) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // from +0, as the inline merge (never −0)
#pragma unroll
    for (int l = 0; l < kMergeLanes; ++l) v = add4(v, spart[l][t]);
    *reinterpret_cast<uint2*>(o_lat + (i * a.H + h) * kTcRank + c) =
        make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
  }
}

// o_lat[i, h, :] in bf16 under the batch-invariant rule (> kMergeInline splits): merge_coefs /
// merge_step over the splits in order. Block (selected row i, head h), 128 threads: warp 0 gives
// each split its (α, β) — the running max before lane l's splits 4l..4l+3 by a warp scan of the
// lanes' maxima (a max is exact in any order), then those splits in order — and each thread runs
// the chains of its 4 channels and of L over the splits (eight splits' loads issued together).

__global__ void __launch_bounds__(kMergeRunThreads) mla_merge_running_kernel(DecodePlan pl, bf16* o_lat) {
  pdl_wait();
  pdl_trigger();
  constexpr int kPer = kMaxSplits / 32;
  __shared__ float2 sab[kMaxSplits];
  __shared__ float sls[kMaxSplits];  // l_s, 0 for an empty split
  const MlaDecodeArgs& a = pl.a;
  const int t = threadIdx.x, n_splits = pl.n_splits;
  const int64_t i = blockIdx.x, h = blockIdx.y;
  if (t < 32) {
    float2 ml[kPer];
    float mx = -INFINITY;
#pragma unroll
    for (int x = 0; x < kPer; ++x) {
      const int s = kPer * t + x;
      ml[x] = s < n_splits ? pl.part_ml[(static_cast<int64_t>(s) * a.n_rows + i) * a.H + h]
                           : make_float2(-INFINITY, 0.0f);
      if (ml[x].y > 0.0f) mx = fmaxf(mx, ml[x].x);
    }
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, mx, o);
      if (t >= o) mx = fmaxf(mx, y);
    }
    float m_all = __shfl_up_sync(0xffffffffu, mx, 1);
    if (t == 0) m_all = -INFINITY;
#pragma unroll
    for (int x = 0; x < kPer; ++x) {
      const int s = kPer * t + x;
      if (s >= n_splits) break;
      const bool live = ml[x].y > 0.0f;
      sab[s] = live ? merge_coefs(m_all, ml[x].x) : make_float2(0.0f, 0.0f);
      sls[s] = live ? ml[x].y : 0.0f;
    }
  }
  __syncthreads();
  const float* src = pl.part_acc + (i * a.H + h) * kTcRank + 4 * t;
  const int64_t stride = a.n_rows * a.H * kTcRank;
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float l = 0.0f;
  for (int s0 = 0; s0 < n_splits; s0 += 8) {
    float4 x[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int s = s0 + j;
      x[j] = s < n_splits && sls[s] > 0.0f ? *reinterpret_cast<const float4*>(src + s * stride)
                                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int s = s0 + j;
      if (s >= n_splits || sls[s] == 0.0f) continue;
      const float2 ab = sab[s];
      l = merge_step(sls[s], ab, l);
      o = make_float4(merge_step(x[j].x, ab, o.x), merge_step(x[j].y, ab, o.y), merge_step(x[j].z, ab, o.z),
                      merge_step(x[j].w, ab, o.w));
    }
  }
  *reinterpret_cast<uint2*>(o_lat + (i * a.H + h) * kTcRank + 4 * t) =
      make_uint2(pack_bf16(__fdiv_rn(o.x, l), __fdiv_rn(o.y, l)), pack_bf16(__fdiv_rn(o.z, l), __fdiv_rn(o.w, l)));
}

// out[row(i), h, n0..n0+31] = Σ_c o_lat[i, h, c] · W_UV_h[n, c] for the block's 64 selected rows.
// Block (32-output tile, head h, 64-row tile), 128 threads; a grid of gridDim.x < ceil(dv / 32)
// output tiles walks tiles x, x + gridDim.x, … in one block with the same o_lat tile, so a large
// launch merges each (row tile, head) once, not once per output tile (the same arithmetic per
// output either way). Shared: the o_lat tile [64][520] bf16
// — copied from o_lat when non-null (mla_merge_kernel's, mla_merge_running_kernel's or
// mla_rows_merged_kernel's), else merged here from ≤ kMergeInline splits (the merge kernel's
// arithmetic: one split per lane; batch-invariant rule: merge_coefs / merge_step in split order,
// one thread per row computing (α, β) and L) — and W_UV_h[n0..n0+31, :] [32][520] bf16 by
// cp.async. Warp w owns rows 16w..16w+15 (skipped past the rows): 4 n8 tiles over 32 k16 steps
// (ldmatrix A fragments; B = W_UV rows, channel-contiguous, by ldmatrix). Preconditions: r = 512,
// dv % 8 == 0.
__global__ void __launch_bounds__(kGemmThreads) mla_apply_tc_kernel(DecodePlan pl, const bf16* o_lat) {
  extern __shared__ __align__(16) unsigned char gemm_smem[];
  __shared__ float sw[kGemmTileM][kMergeInline];    // merge weights; batch-invariant rule: l_s
  __shared__ float2 sab[kGemmTileM][kMergeInline];  // batch-invariant rule: (α, β) per split
  __shared__ float sl[kGemmTileM];                  // batch-invariant rule: L
  const MlaDecodeArgs& a = pl.a;
  const bool running = a.split_keys > 0;  // merge_coefs / merge_step (every invariant path's merge)
  bf16* s_a = reinterpret_cast<bf16*>(gemm_smem);  // [kGemmTileM][kApplyStride]
  bf16* s_b = s_a + kGemmTileM * kApplyStride;      // [kApplyTileN][kApplyStride]
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int n_tiles = static_cast<int>((a.dv + kApplyTileN - 1) / kApplyTileN);
  int64_t n0 = static_cast<int64_t>(blockIdx.x) * kApplyTileN;
  const int64_t h = blockIdx.y;
  const int64_t i0 = static_cast<int64_t>(blockIdx.z) * kGemmTileM;
  const int rows = static_cast<int>(std::min<int64_t>(kGemmTileM, a.n_rows - i0));
  const bf16* w_uv = a.kv_b + (h * (a.dn + a.dv) + a.dn) * kTcRank;  // [dv, r]
  auto load_w = [&] {  // before the wait when kv_b is a placed weight (as in mla_absorb_tc_kernel)
    for (int e = t; e < kApplyTileN * (kTcRank / 8); e += kGemmThreads) {
      const int n = e / (kTcRank / 8), c8 = e % (kTcRank / 8);
      const bool ok = n0 + n < a.dv;
      cp_async16(smem_u32(s_b + n * kApplyStride + 8 * c8), ok ? w_uv + (n0 + n) * kTcRank + 8 * c8 : w_uv, ok);
    }
  };
  if (a.kv_b_stable) load_w();
  pdl_wait();
  pdl_trigger();
  if (!a.kv_b_stable) load_w();
  if (o_lat != nullptr) {
    for (int e = t; e < kGemmTileM * (kTcRank / 8); e += kGemmThreads) {
      const int ii = e / (kTcRank / 8), c8 = e % (kTcRank / 8);
      const bf16* src = ii < rows ? o_lat + ((i0 + ii) * a.H + h) * kTcRank + 8 * c8 : o_lat;
      cp_async16(smem_u32(s_a + ii * kApplyStride + 8 * c8), src, ii < rows);
    }
  }
  cp_async_commit();
  if (o_lat == nullptr && running) {
    if (t < rows) {  // row t's (α, β) per split (l_s in sw; 0: empty) and L, in split order
      float m_all = -INFINITY, l = 0.0f;
#pragma unroll
      for (int s = 0; s < kMergeInline; ++s) {
        const float2 ml = s < pl.n_splits ? pl.part_ml[(static_cast<int64_t>(s) * a.n_rows + i0 + t) * a.H + h]
                                          : make_float2(-INFINITY, 0.0f);
        sw[t][s] = ml.y > 0.0f ? ml.y : 0.0f;
        sab[t][s] = ml.y > 0.0f ? merge_coefs(m_all, ml.x) : make_float2(0.0f, 0.0f);
        if (ml.y > 0.0f) l = merge_step(ml.y, sab[t][s], l);
      }
      sl[t] = l;
    }
    __syncthreads();
    const int64_t stride = a.n_rows * a.H * kTcRank;
    for (int e = t; e < kGemmTileM * (kTcRank / 4); e += kGemmThreads) {
      const int ii = e / (kTcRank / 4), c = 4 * (e % (kTcRank / 4));
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (ii < rows) {
        const float* src = pl.part_acc + ((i0 + ii) * a.H + h) * kTcRank + c;
        float4 x[kMergeInline];
#pragma unroll
        for (int s = 0; s < kMergeInline; ++s)
          x[s] = sw[ii][s] > 0.0f ? *reinterpret_cast<const float4*>(src + s * stride)
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int s = 0; s < kMergeInline; ++s) {
          if (sw[ii][s] == 0.0f) continue;
          const float2 ab = sab[ii][s];
          v = make_float4(merge_step(x[s].x, ab, v.x), merge_step(x[s].y, ab, v.y), merge_step(x[s].z, ab, v.z),
                          merge_step(x[s].w, ab, v.w));
        }
        const float l = sl[ii];
        v = make_float4(__fdiv_rn(v.x, l), __fdiv_rn(v.y, l), __fdiv_rn(v.z, l), __fdiv_rn(v.w, l));
      }
      *reinterpret_cast<uint2*>(s_a + ii * kApplyStride + c) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    }
  } else if (o_lat == nullptr) {
    for (int ii = warp; ii < rows; ii += kGemmThreads / 32) merge_weights(pl, i0 + ii, h, lane, sw[ii]);
    __syncthreads();
    const int64_t stride = a.n_rows * a.H * kTcRank;
    for (int e = t; e < kGemmTileM * (kTcRank / 4); e += kGemmThreads) {
      const int ii = e / (kTcRank / 4), c = 4 * (e % (kTcRank / 4));
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (ii < rows) {
        const float* src = pl.part_acc + ((i0 + ii) * a.H + h) * kTcRank + c;
        float4 x[kMergeInline];
        float w[kMergeInline];
#pragma unroll
        for (int s = 0; s < kMergeInline; ++s) {
          w[s] = s < pl.n_splits ? sw[ii][s] : 0.0f;
          x[s] = w[s] != 0.0f ? *reinterpret_cast<const float4*>(src + s * stride) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        // One split per lane: lane s's partial is fmaf(w_s, x_s, 0); the lanes add in order.
#pragma unroll
        for (int s = 0; s < kMergeInline; ++s)
          if (w[s] != 0.0f) v = add4(v, fma4(w[s], x[s], make_float4(0.0f, 0.0f, 0.0f, 0.0f)));
      }
      *reinterpret_cast<uint2*>(s_a + ii * kApplyStride + c) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
    }
  }
  for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    if (tile != static_cast<int>(blockIdx.x)) {  // the next output tile's W_UV rows
      n0 = static_cast<int64_t>(tile) * kApplyTileN;
      __syncthreads();  // every warp is done reading the previous tile
      load_w();
      cp_async_commit();
    }
    cp_async_wait<0>();
    __syncthreads();
    if (16 * warp >= rows) continue;
    float acc[kApplyTileN / 8][4] = {};
    const uint32_t a_addr = smem_u32(s_a + (16 * warp + lane % 16) * kApplyStride + 8 * (lane / 16));
#pragma unroll 4
    for (int kc = 0; kc < kTcRank; kc += 32) {
      uint32_t af[4], ag[4];
      ldmatrix_x4(af, a_addr + 2 * kc);
      ldmatrix_x4(ag, a_addr + 2 * (kc + 16));
#pragma unroll
      for (int nt = 0; nt < kApplyTileN / 8; ++nt) {
        uint32_t bf[4];  // b0, b1 of k-steps kc and kc + 16
        ldmatrix_x4(bf, smem_u32(s_b + (8 * nt + lane % 8) * kApplyStride + kc + 8 * (lane / 8)));
        mma_bf16_16816(acc[nt], af, bf[0], bf[1]);
        mma_bf16_16816(acc[nt], ag, bf[2], bf[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < kApplyTileN / 8; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int ii = 16 * warp + lane / 4 + 8 * half;
        const int64_t n = n0 + 8 * nt + 2 * (lane % 4);
        if (ii < rows && n < a.dv)
          *reinterpret_cast<float2*>(a.out + (selected_row(pl, i0 + ii) * a.H + h) * a.dv + n) =
              make_float2(acc[nt][2 * half], acc[nt][2 * half + 1]);
      }
  }
}

}  // namespace deepinfer::cuda::mla
