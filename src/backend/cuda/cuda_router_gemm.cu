// The fp32 router GEMM on the bf16 tensor cores (sm_90a): C[m, e] = Σ_k X[m, k] · W[e, k] with
// fp32 X and W, each value split into bf16 parts whose products the tensor cores form exactly
// (router_split.h: the split, its error bound, the weight image). Owns the kernel and its launch.
// Does not own: the batch-invariant mode's router (gemm_f32_ordered: its sums must not depend on
// the batch, and the K splits here do), one-token steps (the GEMV, add_rms_norm_route), or the
// image (built once at placement, CudaBackend::place_linear_fp32).
// Session 29 ran the same split on mma.sync (docs/perf.md, version 26): 51–54 µs a V2-Lite layer at
// 4,096 rows against cuBLAS's 39 — one 8-warp block per SM, X and W split in shared memory every
// K step behind a barrier, six dependent MMA chains per warp. Here W is split once (the image),
// X's parts go straight from a thread's float4 to its wgmma A registers, and the K splits fill the
// SMs: 64 blocks of rows at 4K become 256, two per SM.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <mutex>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_ptx.cuh"
#include "backend/cuda/cuda_sm90.cuh"
#include "backend/cuda/router_split.h"

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 128;  // one warpgroup: kRouterTileM rows of X
constexpr int kStages = 4;
constexpr int kABytes = static_cast<int>(kRouterTileM * kRouterChunkK * 4);  // a stage's X: 16 KB fp32
constexpr int kPartBytes = static_cast<int>(kRouterBlockElems * 2);          // one image block: 8 KB
constexpr int kMaxSplits = 8;                                                 // the portable cluster size
template <int kParts>
struct Shape {
  static constexpr int kWBytes = kParts * kPartBytes;
  static constexpr int kStageBytes = kWBytes + kABytes;  // a multiple of 1024: every W block swizzle-aligned
  static constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kStageBytes + 1024;
  // Blocks per SM the shared memory allows (227 KB a block, 228 KB an SM).
  static constexpr int kBlocksPerSm = kSmemBytes * 2 <= 228 * 1024 ? 2 : 1;
};
static_assert(Shape<1>::kStageBytes % 1024 == 0 && Shape<3>::kStageBytes % 1024 == 0);

struct Params {
  const float* x;         // [M, ldx] fp32, 16-byte aligned, ldx % 4 == 0
  int64_t ldx;
  const uint16_t* image;  // router_split.h's image of W [N, K]: [n_tiles][n_chunks][parts][64 × 64] bf16
  int64_t M, N, n_chunks, n_tiles;
  int splits;             // K splits: the cluster's blocks, 1, 2, 4 or 8
  float* c;               // [M, ldc] fp32
  int64_t ldc;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// d[64×64] fp32 (+)= A[64×16] · B[64×16]ᵀ, A bf16 from registers (mma.m16n8k16's A fragment per
// warp, as wgmma_m64n128k16_bf16_rs), B bf16 K-major in shared memory (128-byte swizzle, no
// transpose); accumulate = 0 overwrites d. d[4j + v]: row 16w + l/4 + 8·(v/2), column 8j +
// 2·(l%4) + v%2 (warp w of the warpgroup, lane l), j < 8.
__device__ __forceinline__ void wgmma_m64n64k16_bf16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                        int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
               "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
               : DI_WGMMA_ACC8(d, 0), DI_WGMMA_ACC8(d, 8), DI_WGMMA_ACC8(d, 16), DI_WGMMA_ACC8(d, 24)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// Two adjacent columns' (a: the lower) bf16 parts, as A-fragment registers: router_split.h's
// split, the differences exact.
struct Split2 {
  uint32_t hi, mid, lo;
};
__device__ __forceinline__ Split2 split2(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float ra = __fsub_rn(a, __low2float(h)), rb = __fsub_rn(b, __high2float(h));
  const __nv_bfloat162 m = __floats2bfloat162_rn(ra, rb);
  const __nv_bfloat162 l =
      __floats2bfloat162_rn(__fsub_rn(ra, __low2float(m)), __fsub_rn(rb, __high2float(m)));
  return {bf16x2_bits(h), bf16x2_bits(m), bf16x2_bits(l)};
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// One block per (64-row tile of X, 64-column tile of C, K split); the splits of a tile form a
// cluster (ranks = blockIdx.x % splits) and add their partial tiles in rank order through
// distributed shared memory — the same sums whatever the timing. 128 threads (one warpgroup);
// warp w, lane l (g = l / 4, t = l % 4) owns X rows 16w + g and 16w + g + 8 of the tile.
// Per 64-wide K chunk (stage s = i % kStages of a kStages ring, filled kStages − 1 chunks ahead by
// cp.async from every thread — no producer warp, no mbarriers):
//   W: the chunk's kParts image blocks, one contiguous copy (tile nt's chunk ch at image +
//      (nt·n_chunks + ch)·kParts blocks), already in the swizzled form the descriptors read;
//   X: the thread's 8 float4 (row h ∈ {0, 8}, step q < 4: columns 16t + 4q .. + 3 of the chunk,
//      which router_phys_k makes the fragment's logical columns 2t, 2t + 1, 2t + 8, 2t + 9 of k16
//      step q) at piece (h·4 + q)·128 + tid of the stage's A area — a warp's reads of a piece are
//      512 contiguous bytes, free of bank conflicts. Rows past M are zero-filled.
// Then each float4 pair is split into hi / mid / lo A fragments and, per k16 step, big = xh·W
// (the step's first wgmma of the chunk overwrites) and small = xm·W + xl·W (kParts = 3: big =
// xh·Wh, small = xh·Wm + xm·Wh + xh·Wl + xl·Wh + xm·Wm); the chunk's group drained, sum +=
// big + small in fp32 (round to nearest). The tensor cores' own additions (which need not round
// to nearest) thus span four k16 steps of the big products at most; across chunks the sum rounds
// to nearest as a serial fp32 sum would.
// Shared memory: kStages × (W kParts × 8 KB | A 16 KB), 1024-aligned: 97 KB (kParts 1, two blocks
// an SM) or 161 KB (kParts 3); the ring's first 16 KB take the partial tile at the end.
// Before its PDL wait a block loads only the image (weights). Preconditions: sm_90a, K % 64 == 0,
// x 16-byte aligned, ldx % 4 == 0 (router_gemm_ok).
template <int kParts>
__global__ void __launch_bounds__(kThreads, Shape<kParts>::kBlocksPerSm) router_gemm_kernel(const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = Shape<kParts>;
  extern __shared__ uint8_t rg_smem_raw[];
  uint8_t* smem = rg_smem_raw + ((1024 - smem_u32(rg_smem_raw) % 1024) % 1024);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int splits = p.splits, rank = static_cast<int>(blockIdx.x % splits);
  const int64_t tile = blockIdx.x / splits;
  const int64_t nt = tile % p.n_tiles, mt = tile / p.n_tiles;  // a row tile's column tiles side by side
  const int64_t per_split = (p.n_chunks + splits - 1) / splits;
  const int64_t ch0 = rank * per_split, n = std::max<int64_t>(0, std::min(ch0 + per_split, p.n_chunks) - ch0);

  const int64_t row0 = mt * kRouterTileM + 16 * warp + g;  // this thread's rows row0 and row0 + 8
  const bool valid0 = row0 < p.M, valid1 = row0 + 8 < p.M;
  const float* x0 = p.x + (valid0 ? row0 : 0) * p.ldx + 16 * t + ch0 * kRouterChunkK;
  const float* x1 = p.x + (valid1 ? row0 + 8 : 0) * p.ldx + 16 * t + ch0 * kRouterChunkK;
  const uint8_t* img = reinterpret_cast<const uint8_t*>(p.image) + (nt * p.n_chunks + ch0) * S::kWBytes;
  auto stage_w = [&](int s) { return smem + s * S::kStageBytes; };
  auto stage_a = [&](int s) { return smem + s * S::kStageBytes + S::kWBytes; };
  auto load_w = [&](int64_t i, int s) {  // local chunk i's image blocks
#pragma unroll
    for (int u = 0; u < S::kWBytes / 16 / kThreads; ++u) {
      const int off = (tid + kThreads * u) * 16;
      cp_async16(smem_u32(stage_w(s) + off), img + i * S::kWBytes + off, true);
    }
  };
  auto load_a = [&](int64_t i, int s) {  // local chunk i's X pieces
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        cp_async16(smem_u32(stage_a(s) + ((h * 4 + q) * kThreads + tid) * 16),
                   (h == 0 ? x0 : x1) + i * kRouterChunkK + 4 * q, h == 0 ? valid0 : valid1);
  };

  // The ring's first kStages − 1 chunks: the image before the PDL wait, X after it (one commit
  // group per chunk; the first also holds the image copies).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < n) load_w(s, s);
  pdl_wait();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n) load_a(s, s);
    cp_async_commit();
  }

  float sum[32], big[32], small[32];
#pragma unroll
  for (int e = 0; e < 32; ++e) sum[e] = big[e] = small[e] = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const int s = static_cast<int>(i % kStages);
    cp_async_wait<kStages - 2>();  // chunk i's copies (this thread's) have landed
    fence_proxy_async();           // ... and are visible to the wgmma's (async-proxy) reads
    __syncthreads();               // everyone's have; everyone is past chunk i − 1 (its stage is free)
    if (i + kStages - 1 < n) {
      const int refill = static_cast<int>((i + kStages - 1) % kStages);
      load_w(i + kStages - 1, refill);
      load_a(i + kStages - 1, refill);
    }
    cp_async_commit();  // (empty groups at the end keep the wait's count uniform)

    const float4* a = reinterpret_cast<const float4*>(stage_a(s));
    uint32_t xh[4][4], xm[4][4], xl[4][4];  // [k16 step][A fragment register]
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 r0 = a[q * kThreads + tid], r1 = a[(4 + q) * kThreads + tid];
      const Split2 f0 = split2(r0.x, r0.y), f1 = split2(r1.x, r1.y), f2 = split2(r0.z, r0.w), f3 = split2(r1.z, r1.w);
      xh[q][0] = f0.hi, xm[q][0] = f0.mid, xl[q][0] = f0.lo;
      xh[q][1] = f1.hi, xm[q][1] = f1.mid, xl[q][1] = f1.lo;
      xh[q][2] = f2.hi, xm[q][2] = f2.mid, xl[q][2] = f2.lo;
      xh[q][3] = f3.hi, xm[q][3] = f3.mid, xl[q][3] = f3.lo;
    }
    const uint64_t dh = sw128_desc(stage_w(s));  // part b at + b · 8 KB (512 units of 16 bytes)
#pragma unroll
    for (int e = 0; e < 32; ++e) fence_operand(big[e]), fence_operand(small[e]);
    wgmma_fence();
#pragma unroll
    for (int q = 0; q < 4; ++q) wgmma_m64n64k16_bf16_rs(big, xh[q], desc_advance(dh, 2 * q), q > 0);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint64_t wh = desc_advance(dh, 2 * q);
      if constexpr (kParts == 1) {
        wgmma_m64n64k16_bf16_rs(small, xm[q], wh, q > 0);
        wgmma_m64n64k16_bf16_rs(small, xl[q], wh, 1);
      } else {
        const uint64_t wm = desc_advance(dh, 512 + 2 * q), wl = desc_advance(dh, 1024 + 2 * q);
        wgmma_m64n64k16_bf16_rs(small, xh[q], wm, q > 0);
        wgmma_m64n64k16_bf16_rs(small, xm[q], wh, 1);
        wgmma_m64n64k16_bf16_rs(small, xh[q], wl, 1);
        wgmma_m64n64k16_bf16_rs(small, xl[q], wh, 1);
        wgmma_m64n64k16_bf16_rs(small, xm[q], wm, 1);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      fence_operand(big[e]), fence_operand(small[e]);
      sum[e] = __fadd_rn(sum[e], __fadd_rn(big[e], small[e]));
    }
  }

  // sum[4j + v]: row row0 + 8·(v/2), column 64·nt + 8j + 2t + v%2.
  auto store = [&](int e, float v) {
    const int64_t row = row0 + 8 * ((e % 4) / 2), col = nt * kRouterTileN + 8 * (e / 4) + 2 * t + e % 2;
    if (row < p.M && col < p.N) p.c[row * p.ldc + col] = v;
  };
  if (splits == 1) {
#pragma unroll
    for (int e = 0; e < 32; ++e) store(e, sum[e]);
    return;
  }
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cp_async_wait<0>();
  __syncthreads();  // every thread is past its last stage: the ring's first 16 KB take the partial
  float* part = reinterpret_cast<float*>(smem);  // [32][kThreads]: element e of thread tid
#pragma unroll
  for (int e = 0; e < 32; ++e) part[e * kThreads + tid] = sum[e];
  cluster.sync();  // publishes every rank's partial to the cluster
  const int per_rank = 32 / splits;
  for (int e = rank * per_rank; e < (rank + 1) * per_rank; ++e) {
    float v = 0.0f;
    for (int r = 0; r < splits; ++r) v = __fadd_rn(v, cluster.map_shared_rank(part, r)[e * kThreads + tid]);
    store(e, v);
  }
  cluster.sync();  // the peers have read this block's partial: it may exit
#else
  (void)p;
  __trap();  // built for another architecture: router_gemm_ok() is false there
#endif
}

template <int kParts>
void launch(const Params& base, cudaStream_t s) {
  using S = Shape<kParts>;
  Params p = base;
  const int64_t tiles = (p.M + kRouterTileM - 1) / kRouterTileM * p.n_tiles;
  // K splits while the grid stays within one wave of resident blocks and each split keeps ≥ 2 chunks.
  const int64_t resident = static_cast<int64_t>(sm_count()) * S::kBlocksPerSm;
  p.splits = 1;
  while (p.splits < kMaxSplits && tiles * p.splits * 2 <= resident && p.n_chunks >= 4 * p.splits) p.splits *= 2;
  static std::once_flag once;
  std::call_once(once, [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(router_gemm_kernel<kParts>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(S::kSmemBytes)));
    // All of the SM's unified memory as shared memory, so two blocks fit (kBlocksPerSm).
    DI_CUDA_CHECK(cudaFuncSetAttribute(router_gemm_kernel<kParts>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
  });
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(p.splits);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;  // the image's loads before the wait
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.gridDim = dim3(static_cast<unsigned>(tiles * p.splits));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = S::kSmemBytes;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 2 : 1;
  DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, router_gemm_kernel<kParts>, p));
}

}  // namespace

bool router_gemm_ok(const float* x, int64_t ldx, int64_t K) {
  return K > 0 && K % kRouterChunkK == 0 && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         fp8_wgmma_available();
}

void router_gemm(const float* x, int64_t ldx, const uint16_t* image, int parts, int64_t M, int64_t N, int64_t K,
                 float* c, int64_t ldc, cudaStream_t s) {
  DI_CUDA_REQUIRE_MSG(router_gemm_ok(x, ldx, K),
                      "router_gemm: needs an sm_90 GPU, K % 64 == 0, x 16-byte aligned and ldx % 4 == 0");
  DI_CUDA_REQUIRE(parts == 1 || parts == 3);
  DI_CUDA_REQUIRE(ldx >= K && ldc >= N && image != nullptr);
  DI_CUDA_REQUIRE_MSG(M < (int64_t{1} << 31) / kRouterTileM, "router_gemm: too many rows");
  if (M == 0 || N == 0) return;
  Params p{};
  p.x = x, p.ldx = ldx, p.image = image;
  p.M = M, p.N = N, p.n_chunks = K / kRouterChunkK, p.n_tiles = (N + kRouterTileN - 1) / kRouterTileN;
  p.c = c, p.ldc = ldc;
  if (parts == 1) launch<1>(p, s);
  else launch<3>(p, s);
  DI_CUDA_LAUNCHED();
}

}  // namespace deepinfer::cuda
