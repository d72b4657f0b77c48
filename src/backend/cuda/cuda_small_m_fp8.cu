// small_m_gemm's FP8 kernel for steps whose experts have at most kSmallMFewRows rows each (decode
// at one to a few tokens): the batch-invariant K structure of cuda_invariant_gemm.cu's block
// kernel — the same bits, bf16(fp8 · scale) weights and bf16 activations on the tensor cores,
// each 512-wide K split folded in 16-wide chunks from zero — in a form shaped for its cost. The
// block kernel's FP8 path is bound by its instructions (the widening, with 16 rows of A staged
// for one real row), with a pipeline fill and a wave tail per 64 columns. Here:
//  - persistent: a grid of warps, each with a contiguous equal share of (16 columns, K split)
//    items, streamed through its own 6-stage cp.async pipeline that runs across items;
//  - 4 rows of A staged instead of 16; load addresses set once per item;
//  - ldmatrix and two m16n8k16 MMAs per 16-wide chunk (WMMA m16n16k16's arithmetic).
// Measured (run s9-6, lab µs, V2-Lite shapes at one row, against the block kernel): q_proj 8.7
// vs 10.1, kv_a 6.8 vs 8.2, experts gate|up 30.0 vs 33.2; at 4 rows experts gate|up 76.6 vs
// 87.8. bf16 weights gain nothing from it (the same lab: within ±5 % at one row, up to 15 %
// slower at four), so they keep the block kernel.
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_fp8_widen.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ptx.cuh"

#include <algorithm>
#include <array>

namespace deepinfer::cuda {
namespace {

constexpr int kMmaRows = 16;  // token rows of one MMA tile (rows past an item's are not stored)
constexpr int kRows = static_cast<int>(kSmallMFewRows);  // token rows staged (an item's at most)
constexpr int kCols = 16;     // output columns per item (two 8-column MMA tiles)
constexpr int kStepK = 64;    // K per pipeline stage: 4 chunks of 16
constexpr int kStages = 6;    // stages per warp (5 in flight)
constexpr int kMaxWarps = 4;  // warps per block
constexpr int kLd = kStepK + 8;  // staged bf16 row (8 of padding: bank spread, 16-byte aligned rows)
constexpr int kRowBytes = static_cast<int>(sizeof(bf16)) * kLd;
constexpr int kWBytes = kCols * kStepK;                                   // raw FP8 W [16][64]
constexpr int kScaleBytes = static_cast<int>(sizeof(float)) * kCols * (kStepK / 16);  // scales [16][4]
constexpr int kABytes = kRows * kRowBytes;                                // A bf16 [4][72]
constexpr int kStageBytes = kWBytes + kScaleBytes + kABytes;
constexpr int kWideBytes = kCols * kRowBytes;  // the widened W, bf16 [16][72]
// One warp's shared memory: kStages stages of [W FP8 [16][64] | scales fp32 [16][4] | A bf16
// [4][72]], then the bf16 [16][72] W each raw stage is widened into. The block's last warp is
// followed by kPad bytes, so that an MMA's 16-row A load from any stage stays inside the block
// (rows ≥ 4 read whatever follows: they only feed outputs that are not stored).
constexpr int kWarpBytes = kStages * kStageBytes + kWideBytes;
constexpr int kPad = (kMmaRows - kRows) * kRowBytes;
// One A chunk per lane per stage: rows lane / 8 (4 rows of 8 chunks).
static_assert(kRows == 4 && kStageBytes % 16 == 0 && kWarpBytes % 16 == 0, "layout");

struct Args {
  const bf16* A;           // [rows, K] (row stride K)
  const uint8_t* W;        // [E·N, K] FP8 e4m3
  const float* wscale;     // [E·N, n_kb]
  const int32_t* offsets;  // grouped: [E + 1]
  const int32_t* active;   // grouped: [n_active] (the experts with rows first, then −1); null: dense
  float* out;              // C [rows, ld_out] (one K split) or the partials [n_splits, rows, N]
  int64_t K, N, ld_out, part_stride, dense_rows;  // part_stride: rows · N
  int32_t n_kb, block_k, block_k_shift, n_ct, n_splits, n_active;  // shift: log2(block_k), or −1
};

// A warp's place in its stream: (item, 64-wide K step); item = (slot · n_ct + column tile) ·
// n_splits + split; valid == false past the warp's share. With the lane's load addresses at the
// item's first K (set once per item: the steps only add offsets). An item's rows (≤ kRows, the
// caller's max_rows) are staged in one pass.
struct Pos {
  const bf16* ap;     // the lane's A chunk: row lane / 8, column (lane % 8) · 8
  const uint8_t* wp;  // the lane's W chunk 0: row lane / 4, column (lane % 4) · 16
  const float* sp;    // the block scales of that W row
  int64_t r0, n0;
  int32_t item, end, rows, step, n_steps, z;  // rows: min(the slot's rows, kRows)
  int32_t k_left_a, k_left_w, kw0;  // K left after the lane's A / W column at step 0; its W column
  uint32_t wmask;                   // bit j: the lane's W chunk j (row lane / 4 + 8j) is a row < N
  bool valid;
};

// The first position of item i, or of a later item of the share whose slot has rows.
__device__ __forceinline__ void seek(const Args& g, Pos& p, int32_t i, int lane) {
  const int32_t per_slot = g.n_ct * g.n_splits;
  for (;;) {
    if (i >= p.end) {
      p.valid = false;
      return;
    }
    const int32_t slot = i / per_slot;
    const int e = g.active != nullptr ? g.active[slot] : 0;
    const int64_t r0 = g.active != nullptr ? g.offsets[e < 0 ? 0 : e] : 0;
    const int64_t rows = g.active != nullptr ? (e < 0 ? 0 : g.offsets[e + 1] - r0) : g.dense_rows;
    if (rows <= 0) {  // an idle slot: the share's next slot
      i = (slot + 1) * per_slot;
      continue;
    }
    const int32_t rem = i - slot * per_slot, ct = rem / g.n_splits;
    p.item = i;
    p.r0 = r0;
    p.rows = static_cast<int32_t>(min(rows, int64_t{kRows}));
    p.n0 = static_cast<int64_t>(ct) * kCols;
    p.z = rem - ct * g.n_splits;
    const int64_t k_begin = static_cast<int64_t>(p.z) * kInvariantSplitK;
    const int64_t k_end = g.n_splits > 1 ? min(g.K, k_begin + kInvariantSplitK) : g.K;
    p.n_steps = static_cast<int32_t>((k_end - k_begin + kStepK - 1) / kStepK);
    p.step = 0;
    const int ca = (lane % 8) * 8, cw = (lane % 4) * 16;
    p.k_left_a = static_cast<int32_t>(k_end - k_begin - ca);
    p.k_left_w = static_cast<int32_t>(k_end - k_begin - cw);
    p.kw0 = static_cast<int32_t>(k_begin + cw);
    p.ap = g.A + (r0 + lane / 8) * g.K + k_begin + ca;
    const int64_t w_row = static_cast<int64_t>(e) * g.N + p.n0 + lane / 4;
    p.wp = g.W + w_row * g.K + k_begin + cw;
    p.sp = g.wscale + w_row * g.n_kb;
    p.wmask = (p.n0 + lane / 4 < g.N ? 1u : 0u) | (p.n0 + lane / 4 + 8 < g.N ? 2u : 0u);
    p.valid = true;
    return;
  }
}

__device__ __forceinline__ void advance(const Args& g, Pos& p, int lane) {
  if (++p.step < p.n_steps) return;
  seek(g, p, p.item + 1, lane);
}

// out = A · Wᵀ per expert slot (or dense), FP8 W widened to bf16(code · scale), in the
// batch-invariant K structure; see the file comment. Split z's sums go to out + z · part_stride.
// Preconditions: K, block_k % 16 == 0.
__global__ void __launch_bounds__(kMaxWarps * 32) small_m_fp8_kernel(const Args g) {
  pdl_wait();
  // No early pdl_trigger: the dependents' blocks would wait beside this GEMM (run s7-6).
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned char* base = smem + warp * kWarpBytes;
  const uint32_t base_u32 = smem_u32(base);
  bf16* w_wide = reinterpret_cast<bf16*>(base + kStages * kStageBytes);

  // The share: slots past the experts with rows (−1, at the end of active) hold no work, so the
  // items are those of the n_valid leading slots.
  int32_t n_valid = 1;
  if (g.active != nullptr) {
    n_valid = 0;
    for (int32_t j0 = 0; j0 < g.n_active; j0 += 32) {
      const int32_t j = j0 + lane;
      n_valid += __popc(__ballot_sync(0xffffffffu, j < g.n_active && g.active[j] >= 0));
    }
  }
  const int64_t n_items = static_cast<int64_t>(n_valid) * g.n_ct * g.n_splits;
  const int64_t n_warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
  Pos ld, cp;
  ld.end = static_cast<int32_t>(n_items * (gw + 1) / n_warps);
  seek(g, ld, static_cast<int32_t>(n_items * gw / n_warps), lane);
  cp = ld;

  // One stage: W 16 rows × 64 k (64 chunks of 16 bytes, lane l rows l / 4 and l / 4 + 8, with
  // their scales), then A (the item's rows × 64 k, lane l the chunk of row l / 8; the MMA's rows
  // past them are left as they are: an output row reads only its own A row, and they are not
  // stored).
  // Past K (a split's last step) A and W are zero-filled.
  const int64_t w_row8 = 8 * g.K;  // bytes between a lane's two W chunks
  const uint32_t w_dst = static_cast<uint32_t>((lane / 4) * kStepK + (lane % 4) * 16);
  const uint32_t a_dst = static_cast<uint32_t>(kWBytes + kScaleBytes + (lane / 8) * kRowBytes + (lane % 8) * 16);
  auto issue = [&](const Pos& p, int s) {
    const int32_t koff = p.step * kStepK;
    const uint32_t stage = base_u32 + static_cast<uint32_t>(s * kStageBytes);
    const bool aok = koff < p.k_left_a, wok = koff < p.k_left_w;
    if (lane / 8 < p.rows) cp_async16(stage + a_dst, aok ? p.ap + koff : g.A, aok);
    const int32_t kb = g.block_k_shift >= 0 ? (p.kw0 + koff) >> g.block_k_shift : (p.kw0 + koff) / g.block_k;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const bool ok = wok && (p.wmask >> j & 1u);
      cp_async16(stage + w_dst + j * 8 * kStepK, ok ? static_cast<const void*>(p.wp + koff + j * w_row8) : g.W, ok);
      // The scale of that row's 16-column group (zero past N or K, as the codes).
      cp_async4(stage + kWBytes + 4 * (lane + 32 * j), ok ? p.sp + j * 8 * g.n_kb + kb : g.wscale, ok);
    }
  };

  int s_ld = 0;
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (ld.valid) {
      issue(ld, s_ld++);
      advance(g, ld, lane);
    }
    cp_async_commit();  // empty groups keep the wait count uniform
  }
  s_ld = kStages - 1;
  // ldmatrix row addresses: A's 16 × 16 chunk (matrices: rows 0–7 / 8–15 × k 0–7 / 8–15, within
  // the stage), the widened W's 16 columns × 16 k (matrices: columns 0–7 × k 0–7, 0–7 × 8–15,
  // 8–15 × 0–7, 8–15 × 8–15: the B fragments of the two 8-column MMAs).
  const uint32_t a_off = static_cast<uint32_t>(kWBytes + kScaleBytes + (lane % 16) * kRowBytes + (lane / 16) * 16);
  const uint32_t w_addr =
      smem_u32(w_wide) + static_cast<uint32_t>(((lane / 16) * 8 + lane % 8) * kRowBytes + ((lane / 8) % 2) * 16);
  float acc[2][4];
  for (int s = 0; cp.valid; s = s + 1 == kStages ? 0 : s + 1) {
    cp_async_wait<kStages - 2>();
    __syncwarp();  // stage s visible to the warp; the buffer refilled below is free
    if (ld.valid) {
      issue(ld, s_ld);
      advance(g, ld, lane);
    }
    cp_async_commit();
    s_ld = s_ld + 1 == kStages ? 0 : s_ld + 1;
    // Widen the raw stage into w_wide: bf16(fp8 · scale), the block kernel's rounding. Lane l:
    // row l / 2, 32 columns from (l % 2) · 32, in two 16-column groups (one scale each:
    // block_k % 16 == 0).
    const unsigned char* raw = base + s * kStageBytes;
    const float* scales = reinterpret_cast<const float*>(raw + kWBytes);
    {
      const int r = lane / 2, c0 = (lane % 2) * 32;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = c0 + 16 * h;
        widen_fp8x16(*reinterpret_cast<const uint4*>(raw + r * kStepK + c), scales[r * 4 + c / 16],
                     w_wide + r * kLd + c);
      }
    }
    __syncwarp();
    if (cp.step == 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[0][i] = acc[1][i] = 0.0f;
    }
    const uint32_t a_addr = base_u32 + static_cast<uint32_t>(s * kStageBytes) + a_off;
#pragma unroll
    for (int kk = 0; kk < kStepK / 16; ++kk) {
      uint32_t fa[4], fb[4];
      ldmatrix_x4(fa, a_addr + kk * 32);
      ldmatrix_x4<true>(fb, w_addr + kk * 32);  // ordered: w_wide was written by plain stores
      mma_bf16_16816(acc[0], fa, fb[0], fb[1]);
      mma_bf16_16816(acc[1], fa, fb[2], fb[3]);
    }
    if (cp.step == cp.n_steps - 1) {
      // The item's sums (lane l: rows l / 4 and l / 4 + 8 — only those < 4 exist —, columns
      // 2 (l % 4) + {0, 1} of each 8-column half): split z's partials, or C when K is one split.
      float* out = g.out + static_cast<int64_t>(cp.z) * g.part_stride;
      const int r = lane / 4;
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int64_t n = cp.n0 + 8 * h + 2 * (lane % 4) + i;
          if (r < cp.rows && n < g.N) out[(cp.r0 + r) * g.ld_out + n] = acc[h][i];
        }
    }
    advance(g, cp, lane);
  }
  cp_async_wait<0>();
}

size_t smem_bytes(int warps) { return static_cast<size_t>(warps) * kWarpBytes + kPad; }

// Blocks of `warps` warps resident per SM (shared memory bounds it).
int blocks_per_sm(int warps) {
  static const auto per = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(small_m_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem_bytes(kMaxWarps))));
    std::array<int, kMaxWarps + 1> v{};
    for (int w = 1; w <= kMaxWarps; ++w) {
      int& n = v[static_cast<size_t>(w)];
      DI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, small_m_fp8_kernel, w * 32, smem_bytes(w)));
      n = std::max(n, 1);
    }
    return v;
  }();
  return per[static_cast<size_t>(warps)];
}

}  // namespace

void small_m_fp8_few_rows(const bf16* A, int64_t K, const uint8_t* W, const float* scale, int64_t block_k, int64_t N,
                          const int32_t* offsets, const int32_t* active, int64_t n_active, int64_t rows,
                          int64_t max_rows, float* out, int64_t ld_out, cudaStream_t s) {
  DI_CUDA_REQUIRE(K % 16 == 0 && block_k % 16 == 0 && K <= INT32_MAX && block_k <= INT32_MAX);
  DI_CUDA_REQUIRE(n_active >= 1 && n_active <= 65535 && (active != nullptr || n_active == 1));
  DI_CUDA_REQUIRE(rows <= INT32_MAX && max_rows <= kSmallMFewRows && (active != nullptr || rows <= max_rows));
  if (rows == 0 || N == 0) return;
  Args g{};
  g.A = A, g.W = W, g.wscale = scale, g.offsets = offsets, g.active = active, g.out = out;
  g.K = K, g.N = N, g.ld_out = ld_out, g.part_stride = rows * N;
  g.dense_rows = active == nullptr ? rows : 0;
  g.n_kb = static_cast<int32_t>((K + block_k - 1) / block_k);
  g.block_k = static_cast<int32_t>(block_k);
  g.block_k_shift = (block_k & (block_k - 1)) == 0 ? __builtin_ctzll(static_cast<unsigned long long>(block_k)) : -1;
  g.n_ct = static_cast<int32_t>((N + kCols - 1) / kCols);
  g.n_splits = static_cast<int32_t>(invariant_k_splits(K));
  g.n_active = static_cast<int32_t>(n_active);
  const int64_t n_items = n_active * g.n_ct * g.n_splits;
  DI_CUDA_REQUIRE(n_items <= INT32_MAX);
  // Blocks of fewer warps when the items are few (a small matrix: one warp per SM still spreads
  // its items over every SM); the grid at most what is resident at once.
  const int warps = static_cast<int>(std::clamp<int64_t>(n_items / sm_count(), 1, kMaxWarps));
  const int64_t blocks = std::min<int64_t>((n_items + warps - 1) / warps, int64_t{blocks_per_sm(warps)} * sm_count());
  launch_pdl(small_m_fp8_kernel, static_cast<unsigned>(blocks), static_cast<unsigned>(warps * 32), smem_bytes(warps),
             s, g);
  DI_CUDA_LAUNCHED();
}

}  // namespace deepinfer::cuda
