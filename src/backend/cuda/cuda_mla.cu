// MLA attention of the CUDA backend: mla_decode chooses and launches the absorbed form's kernels
// (in cuda_mla_split.cu, cuda_mla_split_tc.cu, cuda_mla_split_ws.cu, cuda_mla_rows.cu and
// cuda_mla_tc_gemms.cu; shared pieces in cuda_mla_decode.cuh); the naive form's helpers are here.
//  - mla_decode: the absorbed form over the paged latent cache; generic shapes in fp32 on CUDA
//    cores (only the cache and kv_b are bf16; q̃, scores, probabilities and o_lat stay fp32). Three
//    kernels over the n_rows selected query rows (plus a one-block row map when some rows are not
//    selected):
//      absorb_q:  q̃ = W_UKᵀ q_nope for every selected row and head → scratch [n_rows, H, r];
//      split:     split-KV attention. A block owns one row, 16 heads and one of n_splits key
//                 ranges; each 32-key latent tile is widened to fp32 in shared memory once and
//                 used by all 16 heads, so a row's latents are read once per head group (once
//                 for H ≤ 16), not once per head. Writes per split the unnormalized o_lat and
//                 the softmax state (max, sum);
//      apply_uv:  merges the splits in split order (exact online-softmax merge) and writes
//                 out = W_UV · o_lat to the selected rows only.
//    For r = 512, dr = 64 (DeepSeek) the split step is by default a tensor-core kernel instead:
//    the same outputs from bf16 mma.sync tiles (bf16 q̃, q_pe and P; fp32 scores, state and
//    o_lat) — mla_split_ws_kernel (default split rule, H < 64, sm_90a: a TMA producer warp and
//    two consumer warp groups over a 5-deep ring of swizzled 32-key tiles),
//    mla_split_wgmma_kernel (default split rule, H ≥ 64, sm_90a: 64 heads per block on wgmma,
//    two warpgroups sharing each 64-key tile) or mla_split_tc_kernel (16 or 64 heads per block,
//    a cp.async latent pipeline); with them,
//    absorb and W_UV are per-head bf16 mma.sync GEMMs (mla_absorb_tc_kernel, mla_apply_tc_kernel)
//    and more than 4 splits are merged by mla_merge_kernel first (MlaDecodeArgs::kernel forces
//    a family).
//    Graph-safe: grids, n_splits and scratch sizes depend only on (n_rows, H, r, dn, dv, SM
//    count), fixed per batch size of decode-only steps; each split's key range is computed on the
//    device from kv_len. Deterministic: no atomics, every reduction in a fixed order; a row's
//    result depends on the rest of the batch only through n_splits.
//  - batch-invariant rule (split_keys > 0): split boundaries at multiples of mla_split_span(n_keys),
//    shared by consecutive rows of a sequence, and the splits merged in split order in one pass
//    (merge_coefs / merge_step: mla_merge_running_kernel, or apply's inline merge). Steps with a
//    multi-row sequence (prefill chunks, MTP verification; H < 64) run mla_rows_merged_kernel
//    instead of the one-row TC kernel and the merge: 2 rows × 16 heads per block, each latent
//    tile loaded once for the 2 rows, the row's splits computed one after the other and merged in
//    registers, each row's o_lat bitwise what the one-row kernel and the merge give it (same MMA
//    chains, same softmax function, same merge; see the kernel). A one-block kernel maps the rows
//    to 2-row tiles.
//  - the naive (prefill) form: gather_latent here, attention in cuda_mla_prefill.cu (flash
//    kernel); causal_softmax serves its TF32 cuBLAS fallback for other head dims.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mla_decode.cuh"
#include "backend/cuda/cuda_sm90.cuh"

#include <algorithm>
#include <cfloat>
#include <map>
#include <tuple>

namespace deepinfer::cuda {

using namespace mla;  // the decode kernels and their constants (cuda_mla_decode.cuh)

namespace {

// ---- Naive form helpers -------------------------------------------------------------------------

template <typename Out>
__global__ void gather_latent_kernel(const bf16* cache, const int32_t* block_ids, int64_t bs, int64_t width, Out* lat) {
  const int64_t i = blockIdx.x;
  const bf16* src = cache + (static_cast<int64_t>(block_ids[i / bs]) * bs + i % bs) * width;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    if constexpr (sizeof(Out) == 4) lat[i * width + j] = __bfloat162float(src[j]);
    else lat[i * width + j] = src[j];
  }
}

// One block per (head, row): max, sum, then normalized bf16 probabilities.
__global__ void causal_softmax_kernel(const float* scores, int64_t rows, int64_t S, int64_t first_pos, float scale,
                                      float* P) {
  const int64_t hr = blockIdx.x;  // h * rows + i
  const int64_t i = hr % rows;
  const int64_t limit = first_pos + i;  // last visible key
  const float* sr = scores + hr * S;
  float* pr = P + hr * S;
  __shared__ float red[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  float mx = -FLT_MAX;
  for (int64_t j = threadIdx.x; j <= limit; j += blockDim.x) mx = fmaxf(mx, sr[j] * scale);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = -FLT_MAX;
  for (int w = 0; w < nw; ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();
  float sum = 0;
  for (int64_t j = threadIdx.x; j <= limit; j += blockDim.x) sum += expf(sr[j] * scale - mx);
  sum = warp_sum(sum);
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  sum = 0;
  for (int w = 0; w < nw; ++w) sum += red[w];
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < S; j += blockDim.x)
    pr[j] = j <= limit ? expf(sr[j] * scale - mx) * inv : 0.0f;
}

}  // namespace

namespace {
// Splits for `blocks` split blocks per split, one block per SM. With s splits they take
// ceil(blocks·s / SMs) waves of 1/s of a row's keys each: time ∝ waves(s) / s. The fewest splits
// within 10% of the best, since every split also costs a q̃ tile load and a partial state to merge.
int least_waves_splits(int64_t blocks, int max_splits = kMaxSplits) {
  const int n_sm = sm_count();
  blocks = std::max<int64_t>(1, blocks);
  auto cost = [&](int64_t s) { return static_cast<double>((blocks * s + n_sm - 1) / n_sm) / static_cast<double>(s); };
  double best = cost(1);
  for (int64_t s = 2; s <= max_splits; ++s) best = std::min(best, cost(s));
  int splits = 1;
  while (cost(splits) > 1.1 * best) ++splits;
  return splits;
}

// The one-row mma.sync kernels' split cap (their launch shapes predate kMlaMaxSplits = 128).
constexpr int kTcMaxSplits = 64;

// The tensor-core kernels' launch: m-tiles per block, head groups, splits, cluster size, and
// whether the warp-specialized kernel runs.
//  - H < 64, default rule, sm_90a, kernel ≠ 2, n_blocks known, block_size % 16 == 0:
//    mla_split_ws_kernel, 16 heads per block, mla_decode_splits' split count (B = 1: 117
//    splits, one block per SM).
//  - H < 64 otherwise: the one-row kernel at 16 heads per block, least_waves_splits capped at 64;
//    when that count is above 32 (a few rows: the splits alone cannot fill the SMs), each split
//    is shared by a cluster of 2 CTAs. The cluster size is a function of the split count alone,
//    so a row's result still depends on the launch only through the split count (B = 1,
//    H = 16: 59 splits × 2 = 118 CTAs).
//  - H ≥ 64: 64 heads per block (latents read once per 64 heads), splits by least_waves_splits
//    over its own head groups, no cluster. Under the default rule on sm_90a (kernel ≠ 2,
//    n_blocks known, block_size % 16 == 0, dn % 4 == 0, q 16-byte aligned, ≤ 2^31 cache rows)
//    the wgmma kernel mla_split_wgmma_kernel, up to kMaxSplits splits (B = 1: H = 128 2 head
//    groups × 60 splits, H = 64 117 splits), else mla_split_tc_kernel<4>, capped at 64 splits
//    (B = 1, H = 128: 2 × 59 = 118 CTAs).
//  - batch-invariant rule (split_keys > 0): the launch's max_splits slots, no cluster, never
//    the warp-specialized kernel (the multi-row kernel is bitwise the one-row kernel).
struct TcLaunch {
  int mt, n_hg, n_splits, cluster;
  bool ws, wg;  // mla_split_ws_kernel; mla_split_wgmma_kernel
};
TcLaunch tc_launch(const MlaDecodeArgs& a) {
  static const bool clusters = [] {
    int dev = 0, ok = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&ok, cudaDevAttrClusterLaunch, dev));
    return ok != 0;
  }();
  TcLaunch l{};
  l.mt = a.H >= 64 ? 4 : 1;
  l.n_hg = static_cast<int>((a.H + 16 * l.mt - 1) / (16 * l.mt));
  l.cluster = 1;
  const bool tma = a.split_keys == 0 && a.kernel != 2 && a.n_blocks > 0 && a.block_size % 16 == 0 && sm90a_device();
  l.ws = l.mt == 1 && tma;
  l.wg = l.mt == 4 && tma && a.dn % 4 == 0 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0 &&
         a.n_blocks * a.block_size <= INT32_MAX;
  if (a.split_keys > 0) {
    l.n_splits = static_cast<int>(a.max_splits);
  } else if (l.ws) {
    l.n_splits = mla_decode_splits(a.n_rows, a.H);
  } else if (l.wg) {
    l.n_splits = least_waves_splits(a.n_rows * l.n_hg);  // up to kMaxSplits (B = 1, H = 128: 60 × 2 CTAs)
  } else {
    l.n_splits = least_waves_splits(a.n_rows * l.n_hg, kTcMaxSplits);
    if (l.mt == 1 && clusters && l.n_splits > kTcMaxSplits / 2) l.cluster = kTcMaxCluster;
  }
  return l;
}

// Dynamic shared memory above 48 KB for every split kernel, set on the first mla_decode (eager,
// never inside a graph capture: a model's first decode step runs before any capture).
void set_split_smem() {
  static const bool done = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(split_smem_bytes(tile_stride(kMaxWidth)))));
    set_split_tc_smem();
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_rows_merged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kRowsSmemBytes)));
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_split_ws_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kWsSmemBytes)));
    set_split_wgmma_smem();
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_absorb_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(absorb_tc_smem_bytes(kAbsorbTcMaxDn))));
    DI_CUDA_CHECK(cudaFuncSetAttribute(mla_apply_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kApplyTcSmemBytes)));
    return true;
  }();
  (void)done;
}

// The latent cache as a [n_blocks·block_size, 576] bf16 TMA map of [box_rows × 64] boxes with the
// 128-byte swizzle (mla_split_ws_kernel, mla_split_wgmma_kernel), encoded once per (cache, rows,
// box_rows): each layer's cache keeps its map, so eager steps make no driver call per layer
// (graph replays carry theirs).
CUtensorMap cache_map(const MlaDecodeArgs& a, int box_rows) {
  using Key = std::tuple<const void*, int64_t, int>;
  static thread_local std::map<Key, CUtensorMap> maps;
  const int64_t rows = a.n_blocks * a.block_size;
  const Key key{a.cache, rows, box_rows};
  auto it = maps.find(key);
  if (it == maps.end())
    it = maps.emplace(key, tensor_map_2d(a.cache, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rows, kTcWidth, kWsBoxCols,
                                         box_rows)).first;
  return it->second;
}

}  // namespace

int mla_decode_splits(int64_t n_rows, int64_t H) { return least_waves_splits(n_rows * ((H + kHeads - 1) / kHeads)); }

void mla_decode(const MlaDecodeArgs& a, void* (*alloc)(void* ctx, size_t bytes), void* ctx, cudaStream_t s) {
  if (a.T == 0 || a.n_seqs == 0 || a.n_rows == 0) return;
  DI_CUDA_REQUIRE_MSG(a.r >= 1 && a.r <= kMaxRank, "mla_decode supports kv_lora_rank 1..512");
  DI_CUDA_REQUIRE_MSG(a.dr >= 0 && a.r + a.dr <= kMaxWidth,
                      "mla_decode supports kv_lora_rank + qk_rope_head_dim <= 576");
  DI_CUDA_REQUIRE_MSG(a.dn >= 1 && a.dn <= kMaxDn, "mla_decode supports qk_nope_head_dim 1..512");
  DI_CUDA_REQUIRE_MSG(a.dv >= 1 && a.H >= 1 && a.H <= 65535, "mla_decode needs v_head_dim >= 1 and 1..65535 heads");
  DI_CUDA_REQUIRE_MSG(a.block_size >= 1, "mla_decode needs a positive KV block size");
  DI_CUDA_REQUIRE_MSG(a.n_rows <= a.T, "mla_decode: more selected rows than query rows");
  const int64_t n_hg = (a.H + kHeads - 1) / kHeads, row_tiles = (a.n_rows + kGemmRows - 1) / kGemmRows;
  DI_CUDA_REQUIRE_MSG(a.n_rows * n_hg <= INT32_MAX && row_tiles <= 65535, "mla_decode: too many decode rows");
  DI_CUDA_REQUIRE_MSG(a.kernel >= -1 && a.kernel <= 2, "mla_decode: kernel is -1 (automatic), 0, 1 or 2");
  DI_CUDA_REQUIRE_MSG(a.max_q_len >= 0, "mla_decode: max_q_len is a row count");
  const bool tc_shape = a.r == kTcRank && a.r + a.dr == kTcWidth;
  DI_CUDA_REQUIRE_MSG(a.kernel < 1 || tc_shape, "mla_decode: the tensor-core kernels need r = 512 and dr = 64");
  const bool use_tc = a.kernel >= 1 || (a.kernel == -1 && tc_shape);
  DecodePlan pl{};
  pl.a = a;
  if (a.split_keys > 0) {
    DI_CUDA_REQUIRE_MSG(a.max_splits >= 1 && a.max_splits <= kMlaMaxSplits, "mla_decode: max_splits out of range");
    pl.n_splits = static_cast<int>(a.max_splits);
  } else {
    pl.n_splits = mla_decode_splits(a.n_rows, a.H);
  }
  pl.n_hg = static_cast<int>(n_hg);
  pl.wq = tile_stride(a.r + a.dr);
  pl.cluster = 1;
  int tc_mt = 0;
  bool ws = false, wg = false;
  if (use_tc) {
    const TcLaunch tl = tc_launch(a);
    tc_mt = tl.mt;
    ws = tl.ws;
    wg = tl.wg;
    pl.n_hg = tl.n_hg;
    pl.n_splits = tl.n_splits;
    pl.cluster = tl.cluster;
  }
  // With the tensor-core split kernels, q̃ and W_UV on tensor cores too (bf16 operands, fp32
  // accumulation) where the head dims allow; the fp32 CUDA-core kernels otherwise.
  const bool tc_gemms = use_tc && a.dn % 16 == 0 && a.dn <= kAbsorbTcMaxDn && (a.dn + a.dr) % 4 == 0 && a.dv % 8 == 0;
  // Several rows of a sequence per block, every split of theirs merged in the kernel (bitwise each
  // row's one-row result and merge): batch-invariant steps at 16-head groups (H ≥ 64 keeps the
  // 64-head one-row kernel) with the tensor-core W_UV (which reads the merged o_lat), when a
  // sequence has several rows, or when one row per block already fills the SMs (decode-shaped
  // steps of ≥ 3/8 of a block per SM: no partials and no merge launch; fewer rows keep the
  // one-row kernel, whose splits spread a row over several SMs). Measured on V2-Lite's
  // invariant decode (runs s10-7, s10-8; one-row → multi-row, ms per step): B = 32 12.63 →
  // 12.96, 48 14.36 → 14.36, 64 15.80 → 15.49, 128 20.20 → 18.48, 256 24.99 → 21.10. The rows'
  // bits are the same either way; kernel 2 forces the one-row kernel.
  const bool multi_row = tc_mt == 1 && a.split_keys > 0 && tc_gemms && a.kernel != 2 &&
                         (a.max_q_len > 1 || 8 * a.n_rows * pl.n_hg >= 3 * sm_count());
  auto get = [&](size_t bytes) { return alloc(ctx, bytes == 0 ? 16 : bytes); };
  const int64_t lat = a.n_rows * a.H * a.r;  // elements of one [n_rows, H, r] slab
  pl.q_lat = static_cast<float*>(get(sizeof(float) * lat));
  if (!multi_row) {  // the split partials (the multi-row kernel keeps them in registers)
    pl.part_acc = static_cast<float*>(get(sizeof(float) * lat * pl.n_splits));
    pl.part_ml = static_cast<float2*>(get(sizeof(float2) * a.n_rows * a.H * pl.n_splits));
  }
  if (a.n_rows < a.T) {  // some rows belong to sequences that are not selected
    auto* row_map = static_cast<int2*>(get(sizeof(int2) * a.n_rows));
    mla_row_map_kernel<<<1, kThreads, 0, s>>>(a.q_indptr, a.seq_mask, a.n_seqs, row_map);
    DI_CUDA_LAUNCHED();
    pl.row_map = row_map;
  }
  set_split_smem();
  const unsigned tiles = static_cast<unsigned>(row_tiles), heads = static_cast<unsigned>(a.H);
  const unsigned gemm_tiles = static_cast<unsigned>((a.n_rows + kGemmTileM - 1) / kGemmTileM);
  if (tc_gemms) {
    launch_pdl(mla_absorb_tc_kernel, dim3(static_cast<unsigned>(kTcRank / kAbsorbTileN), heads, gemm_tiles),
               kGemmThreads, absorb_tc_smem_bytes(a.dn), s, pl);
  } else {
    mla_absorb_q_kernel<<<dim3(static_cast<unsigned>((a.r + kAbsorbCols - 1) / kAbsorbCols), heads, tiles), kThreads, 0,
                          s>>>(pl);
  }
  DI_CUDA_LAUNCHED();
  if (multi_row) {
    // Tiles ≤ Σ_seq (q_len / R + classes), classes ≤ q_len / period + 2 (mla_row_tiles_kernel),
    // and ≤ n_rows: a bound from sizes alone; the surplus slots exit at once.
    const int64_t period = a.split_keys * pl.n_splits;
    const int64_t n_bound = std::min(a.n_rows, (a.n_rows + kRowsPerTile - 1) / kRowsPerTile +
                                                   (a.n_rows + period - 1) / period + 2 * std::min(a.n_seqs, a.n_rows));
    auto* tiles = static_cast<int4*>(get(sizeof(int4) * n_bound));
    mla_row_tiles_kernel<<<1, kThreads, 0, s>>>(pl, n_bound, tiles);
    DI_CUDA_LAUNCHED();
    DI_CUDA_REQUIRE_MSG(n_bound * pl.n_hg <= INT32_MAX, "mla_decode: too many row tiles");
    bf16* o_lat = static_cast<bf16*>(get(sizeof(bf16) * lat));
    mla_rows_merged_kernel<<<static_cast<unsigned>(n_bound * pl.n_hg), kThreads, kRowsSmemBytes, s>>>(pl, tiles, o_lat);
    DI_CUDA_LAUNCHED();
    launch_pdl(mla_apply_tc_kernel,
               dim3(static_cast<unsigned>((a.dv + kApplyTileN - 1) / kApplyTileN), heads, gemm_tiles), kGemmThreads,
               kApplyTcSmemBytes, s, pl, static_cast<const bf16*>(o_lat));
    DI_CUDA_LAUNCHED();
    return;
  } else if (ws) {
    const int box_rows = a.block_size % 32 == 0 ? 32 : 16;
    launch_pdl(mla_split_ws_kernel, dim3(static_cast<unsigned>(a.n_rows * pl.n_hg), static_cast<unsigned>(pl.n_splits)),
               kWsThreads, kWsSmemBytes, s, cache_map(a, box_rows), box_rows, pl);
    DI_CUDA_LAUNCHED();
  } else if (wg) {
    const int box_rows = a.block_size % 64 == 0 ? 64 : a.block_size % 32 == 0 ? 32 : 16;
    launch_split_wgmma(pl, cache_map(a, box_rows), box_rows, s);
    DI_CUDA_LAUNCHED();
  } else if (tc_mt == 1) {
    launch_split_tc(pl, 1, s);
  } else if (tc_mt == 4) {
    launch_split_tc(pl, 4, s);
  } else {
    mla_split_kernel<<<dim3(static_cast<unsigned>(a.n_rows * n_hg), static_cast<unsigned>(pl.n_splits)), kThreads,
                       split_smem_bytes(pl.wq), s>>>(pl);
    DI_CUDA_LAUNCHED();
  }
  if (tc_gemms) {
    bf16* o_lat = nullptr;  // merged by its own kernel beyond kMergeInline splits
    if (pl.n_splits > kMergeInline) {
      o_lat = static_cast<bf16*>(get(sizeof(bf16) * lat));
      if (a.split_keys > 0) {
        launch_pdl(mla_merge_running_kernel, dim3(static_cast<unsigned>(a.n_rows), heads), kMergeRunThreads, 0, s, pl,
                   o_lat);
      } else {
        const unsigned chunks = static_cast<unsigned>(kTcRank / (4 * (kThreads / kMergeLanes)));
        launch_pdl(mla_merge_kernel, dim3(static_cast<unsigned>(a.n_rows), heads, chunks), kThreads, 0, s, pl, o_lat);
      }
      DI_CUDA_LAUNCHED();
    }
    // The output tiles of a (row tile, head) in one block when the launch has a block per SM
    // without them (H ≥ 64: V3's shapes): the inline merge then runs once per (row tile, head),
    // not once per output tile — at H = 128 × 128 rows the tiled grid spent ~200 µs (run s24-2)
    // in four merges of each tile, mostly merge_weights' dependent loads. H < 64 keeps its grid.
    const unsigned out_tiles = static_cast<unsigned>((a.dv + kApplyTileN - 1) / kApplyTileN);
    const bool walk = a.H >= 64 && static_cast<int64_t>(gemm_tiles) * a.H >= sm_count();
    launch_pdl(mla_apply_tc_kernel, dim3(walk ? 1u : out_tiles, heads, gemm_tiles), kGemmThreads, kApplyTcSmemBytes, s,
               pl, o_lat);
    DI_CUDA_LAUNCHED();
    return;
  }
  // Wide channel tiles (each (row tile, head) merged once) when that still gives two blocks per SM.
  const int n_tile = row_tiles * a.H >= 2 * sm_count() ? kUvTileLarge : kUvTileSmall;
  mla_apply_uv_kernel<<<dim3(static_cast<unsigned>((a.dv + n_tile - 1) / n_tile), heads, tiles), kThreads, 0, s>>>(
      pl, n_tile);
  DI_CUDA_LAUNCHED();
}

void gather_latent(const bf16* cache, const int32_t* block_ids, int64_t block_size, int64_t width, int64_t S, void* lat,
                   Elem lat_elem, cudaStream_t s) {
  if (S == 0) return;
  if (lat_elem == Elem::kF32)
    gather_latent_kernel<<<static_cast<unsigned>(S), 128, 0, s>>>(cache, block_ids, block_size, width,
                                                                  static_cast<float*>(lat));
  else
    gather_latent_kernel<<<static_cast<unsigned>(S), 128, 0, s>>>(cache, block_ids, block_size, width,
                                                                  static_cast<bf16*>(lat));
  DI_CUDA_LAUNCHED();
}

void causal_softmax(const float* scores, int64_t H, int64_t rows, int64_t S, int64_t first_pos, float scale, float* P,
                    cudaStream_t s) {
  if (H * rows == 0) return;
  causal_softmax_kernel<<<static_cast<unsigned>(H * rows), 256, 0, s>>>(scores, rows, S, first_pos, scale, P);
  DI_CUDA_LAUNCHED();
}


}  // namespace deepinfer::cuda
