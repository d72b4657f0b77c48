// Sampling on the GPU with the host sampler's semantics (sample/sampler.h), so a request draws
// the same token on either side:
//   process:     rows with logits processors are copied and processed (masks, penalties with
//                the host's rounding: logits_processors.h), tokens of steps in flight included;
//   row_stats:   one block per row: finite check and log-sum-exp (double) of the raw row, greedy
//                argmax (lowest id on ties) of the processed row for greedy rows;
//   sort:        sampled rows' logits sorted descending with ids (cub segmented radix sort,
//                stable, so ties keep the lower id first — the host's order);
//   sample_rows: one block per sampled row: temperature → top-k → top-p → min-p over the sorted
//                candidates, then the inverse-CDF walk with the host's Philox uniform u;
//   top:         one block per row wanting top-n log-probabilities: n rounds of a block argmax
//                over the raw row, each below the previous in (value desc, id asc) order.
// The host sums probabilities sequentially; here sums are tree/scan ordered in double, which
// can differ only in the last bits of a double, far below a float probability's resolution.
#include "backend/cuda/cuda_common.h"
#include "sample/penalized_logit.h"

#include <cfloat>
#include <cub/cub.cuh>
#include <cuda/functional>

namespace deepinfer::cuda {
namespace {

constexpr int kThreads = 1024;

// One block per processor row, on the row's copy in `work` [R, V]: masked ids → −inf, then each
// seen token once (count: known output count + matching in-flight tokens), then in-flight tokens
// not seen before, once each (thread 0; at most a few per row). Seen tokens are unique, so the
// threads' writes never collide.
__global__ void process_rows_kernel(float* work, int64_t V, const ProcRowArgs* procs, const int32_t* data,
                                    const int32_t* pending_tokens) {
  const ProcRowArgs a = procs[blockIdx.x];
  float* x = work + static_cast<int64_t>(a.row) * V;
  for (int32_t i = a.mask_begin + threadIdx.x; i < a.mask_end; i += blockDim.x) x[data[i]] = -INFINITY;
  __syncthreads();
  const bool penalizes = a.rep != 1.0f || a.freq != 0.0f || a.pres != 0.0f;
  if (!penalizes) return;
  auto pending_count = [&](int32_t t) {
    int32_t c = 0;
    for (int32_t j = a.pend_begin; j < a.pend_end; ++j) c += pending_tokens[data[j]] == t;
    return c;
  };
  const int32_t* seen = data + a.seen_begin;
  const int32_t n_seen = a.seen_end - a.seen_begin;
  for (int32_t i = threadIdx.x; i < n_seen; i += blockDim.x) {
    const int32_t t = seen[i];
    x[t] = penalized_logit(x[t], a.rep, a.freq, a.pres, seen[n_seen + i] + pending_count(t));
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int32_t j = a.pend_begin; j < a.pend_end; ++j) {
    const int32_t t = pending_tokens[data[j]];
    if (t < 0 || t >= V) continue;
    int32_t lo = 0, hi = n_seen;  // binary search among the sorted seen tokens
    while (lo < hi) {
      const int32_t mid = (lo + hi) / 2;
      if (seen[mid] < t) lo = mid + 1; else hi = mid;
    }
    if (lo < n_seen && seen[lo] == t) continue;
    bool first = true;
    for (int32_t i = a.pend_begin; i < j; ++i) first &= pending_tokens[data[i]] != t;
    if (first) x[t] = penalized_logit(x[t], a.rep, a.freq, a.pres, pending_count(t));
  }
}

// raw: the logits as the model produced them (finiteness, log-sum-exp); work: the processed rows
// (== raw where no row has processors), whose argmax greedy rows take.
__global__ void row_stats_kernel(const float* raw, const float* work, int64_t V, const SampleRowArgs* rows,
                                 int32_t* tokens, double* row_lse) {
  const int64_t i = blockIdx.x;
  const float* x = raw + i * V;
  const float* w = work + i * V;
  using Reduce = cub::BlockReduce<float, kThreads>;
  using ReduceD = cub::BlockReduce<double, kThreads>;
  using ReduceI = cub::BlockReduce<int, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage f;
    typename ReduceD::TempStorage d;
    typename ReduceI::TempStorage n;
  } tmp;
  __shared__ float s_max;
  __shared__ int s_bad;
  float mx = -FLT_MAX;
  int bad = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float a = x[v];
    bad |= !isfinite(a);
    mx = fmaxf(mx, a);
  }
  const float bmax = Reduce(tmp.f).Reduce(mx, ::cuda::maximum<>{});
  __syncthreads();
  const int bbad = ReduceI(tmp.n).Reduce(bad, ::cuda::maximum<>{});
  if (threadIdx.x == 0) {
    s_max = bmax;
    s_bad = bbad;
  }
  __syncthreads();
  if (s_bad) {
    if (threadIdx.x == 0) tokens[i] = -1;
    return;
  }
  double sum = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += exp(static_cast<double>(x[v]) - s_max);
  const double bsum = ReduceD(tmp.d).Sum(sum);
  if (threadIdx.x == 0) row_lse[i] = static_cast<double>(s_max) + log(bsum);
  if (!rows[i].greedy) return;
  float wmax = s_max;
  if (w != x) {  // a processed row: its own maximum (−inf only if every id is masked)
    float m = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, w[v]);
    __syncthreads();
    const float b = Reduce(tmp.f).Reduce(m, ::cuda::maximum<>{});
    __syncthreads();
    if (threadIdx.x == 0) s_max = b;
    __syncthreads();
    wmax = s_max;
  }
  // argmax, lowest id on ties: the first index holding the maximum.
  int first = INT_MAX;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    if (w[v] == wmax) first = min(first, static_cast<int>(v));
  __syncthreads();
  const int bfirst = ReduceI(tmp.n).Reduce(first, ::cuda::minimum<>{});
  if (threadIdx.x == 0) tokens[i] = bfirst == INT_MAX ? 0 : bfirst;
}

// keys[j, :] = logits of sampled row j (−0 → +0 so the radix order equals the host's compare).
__global__ void gather_keys_kernel(const float* logits, const int32_t* sampled, int64_t V, float* keys, int32_t* ids,
                                   int32_t* offsets) {
  const int64_t j = blockIdx.x;
  const float* x = logits + static_cast<int64_t>(sampled[j]) * V;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float a = x[v];
    keys[j * V + v] = a == 0.0f ? 0.0f : a;
    ids[j * V + v] = static_cast<int32_t>(v);
  }
  if (threadIdx.x == 0) offsets[j] = static_cast<int32_t>(j * V);
  if (threadIdx.x == 0 && j == gridDim.x - 1) offsets[j + 1] = static_cast<int32_t>((j + 1) * V);
}

// The first index k < n with cum(k) = Σ_{i ≤ k} p[i] ≥ target (inclusive prefix in double),
// or n when none. All threads return it.
__device__ int64_t first_reaching(const float* p, int64_t n, double target) {
  using Scan = cub::BlockScan<double, kThreads>;
  using ReduceI = cub::BlockReduce<long long, kThreads>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename ReduceI::TempStorage red;
  } tmp;
  __shared__ double s_carry;
  __shared__ long long s_found;
  if (threadIdx.x == 0) {
    s_carry = 0;
    s_found = n;
  }
  __syncthreads();
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t k = base + threadIdx.x;
    const double v = k < n ? static_cast<double>(p[k]) : 0.0;
    double incl, total;
    Scan(tmp.scan).InclusiveSum(v, incl, total);
    incl += s_carry;
    const long long hit = (k < n && incl >= target) ? k : LLONG_MAX;
    __syncthreads();
    const long long first = ReduceI(tmp.red).Reduce(hit, ::cuda::minimum<>{});
    if (threadIdx.x == 0) {
      if (first != LLONG_MAX && s_found == n) s_found = first;
      s_carry += total;
    }
    __syncthreads();
    if (s_found != n) break;
  }
  return s_found;
}

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(const float* keys, const int32_t* ids, int64_t V,
                                                               const int32_t* sampled, const SampleRowArgs* rows,
                                                               float* probs_all, int32_t* tokens) {
  const int64_t j = blockIdx.x, row = sampled[j];
  if (tokens[row] == -1) return;  // non-finite row (row_stats ran first)
  const SampleRowArgs a = rows[row];
  const float* key = keys + j * V;
  float* probs = probs_all + j * V;
  using ReduceD = cub::BlockReduce<double, kThreads>;
  using ReduceI = cub::BlockReduce<long long, kThreads>;
  __shared__ union {
    typename ReduceD::TempStorage d;
    typename ReduceI::TempStorage n;
  } tmp;
  __shared__ double s_sum;
  __shared__ long long s_n;
  int64_t n = a.top_k > 0 && a.top_k < V ? a.top_k : V;
  const double inv_t = 1.0 / static_cast<double>(a.temperature);
  const double top = key[0];
  double part = 0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    const double diff = static_cast<double>(key[k]) - top;
    const float p = diff == 0.0 ? 1.0f : static_cast<float>(exp(diff * inv_t));
    probs[k] = p;
    part += p;
  }
  const double sum = ReduceD(tmp.d).Sum(part);
  if (threadIdx.x == 0) s_sum = sum;
  __syncthreads();
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) probs[k] = static_cast<float>(probs[k] / s_sum);
  __syncthreads();
  if (a.top_p < 1.0f) {  // the shortest prefix whose mass reaches top_p
    const int64_t k = first_reaching(probs, n, static_cast<double>(a.top_p));
    n = k < n ? k + 1 : n;
  }
  if (a.min_p > 0.0f) {  // probabilities are non-increasing: cut at the first one below the floor
    const float floor = a.min_p * probs[0];
    long long cut = n;
    for (int64_t k = 1 + threadIdx.x; k < n; k += blockDim.x)
      if (probs[k] < floor) cut = min(cut, static_cast<long long>(k));
    __syncthreads();
    const long long c = ReduceI(tmp.n).Reduce(cut, ::cuda::minimum<>{});
    if (threadIdx.x == 0) s_n = c;
    __syncthreads();
    n = s_n;
  }
  part = 0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) part += probs[k];
  __syncthreads();
  const double mass = ReduceD(tmp.d).Sum(part);
  if (threadIdx.x == 0) s_sum = mass;
  __syncthreads();
  // The host's walk returns the first k with u < cum(k) (u = uniform · mass), else the last
  // candidate; cum > u ⟺ cum ≥ the next double above u.
  const double u = static_cast<double>(a.u) * s_sum;
  const int64_t k = first_reaching(probs, n, nextafter(u, INFINITY));
  if (threadIdx.x == 0) tokens[row] = ids[j * V + (k < n ? k : n - 1)];
}

__global__ void logprob_kernel(const float* logits, int64_t V, const int32_t* tokens, const double* row_lse,
                               float* logprobs, int64_t R) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= R) return;
  const int32_t t = tokens[i];
  logprobs[i] = t < 0 ? 0.0f : static_cast<float>(static_cast<double>(logits[i * V + t]) - row_lse[i]);
}

struct Ranked {
  float v;
  int32_t id;  // INT_MAX: none
};
struct BetterRanked {
  __device__ Ranked operator()(const Ranked& a, const Ranked& b) const {
    if (a.id == INT_MAX) return b;
    if (b.id == INT_MAX) return a;
    return (a.v > b.v || (a.v == b.v && a.id < b.id)) ? a : b;
  }
};

// One block per row: row i's n_top best raw logits in (value desc, id asc) order — the host's
// partial_sort order — as n rounds of a block argmax restricted to entries ranked below the
// previous pick. Rows of failed samples (token −1) and slots past a row's n keep id −1.
__global__ void __launch_bounds__(kThreads) top_logprobs_kernel(const float* logits, int64_t V,
                                                                const SampleRowArgs* rows, const int32_t* tokens,
                                                                const double* row_lse, int32_t* top_ids,
                                                                float* top_lps, int64_t n_top) {
  const int64_t i = blockIdx.x;
  const float* x = logits + i * V;
  for (int64_t j = threadIdx.x; j < n_top; j += blockDim.x) {
    top_ids[i * n_top + j] = -1;
    top_lps[i * n_top + j] = 0.0f;
  }
  const int64_t n = min(static_cast<int64_t>(rows[i].n_top), V);
  if (tokens[i] < 0 || n <= 0) return;
  using Reduce = cub::BlockReduce<Ranked, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ Ranked s_prev;
  if (threadIdx.x == 0) s_prev = {INFINITY, -1};
  __syncthreads();
  for (int64_t j = 0; j < n; ++j) {
    const Ranked prev = s_prev;
    Ranked best{0.0f, INT_MAX};
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float a = x[v];
      const bool below = j == 0 || a < prev.v || (a == prev.v && v > prev.id);
      if (below) best = BetterRanked{}(best, Ranked{a, static_cast<int32_t>(v)});
    }
    const Ranked b = Reduce(tmp).Reduce(best, BetterRanked{});
    if (threadIdx.x == 0) {
      s_prev = b;
      top_ids[i * n_top + j] = b.id;
      top_lps[i * n_top + j] = static_cast<float>(static_cast<double>(b.v) - row_lse[i]);
    }
    __syncthreads();
  }
}

}  // namespace

void sample(const SampleArgs& a, void* (*alloc)(void* ctx, size_t bytes), void* ctx, cudaStream_t s) {
  const int64_t R = a.R, V = a.V;
  if (R == 0) return;
  auto* row_lse = static_cast<double*>(alloc(ctx, sizeof(double) * R));
  const float* work = a.logits;
  if (a.n_procs > 0) {  // processors change a copy: log-probabilities stay those of the raw rows
    auto* w = static_cast<float*>(alloc(ctx, sizeof(float) * R * V));
    DI_CUDA_CHECK(cudaMemcpyAsync(w, a.logits, sizeof(float) * R * V, cudaMemcpyDeviceToDevice, s));
    process_rows_kernel<<<static_cast<unsigned>(a.n_procs), 256, 0, s>>>(w, V, a.procs, a.proc_data,
                                                                         a.pending_tokens);
    DI_CUDA_LAUNCHED();
    work = w;
  }
  row_stats_kernel<<<static_cast<unsigned>(R), kThreads, 0, s>>>(a.logits, work, V, a.rows, a.tokens, row_lse);
  DI_CUDA_LAUNCHED();
  if (a.n_sampled > 0) {
    const int64_t n = a.n_sampled * V;
    DI_CUDA_REQUIRE(n < (int64_t{1} << 31));  // cub's int item counts
    auto* keys = static_cast<float*>(alloc(ctx, sizeof(float) * n));
    auto* keys_sorted = static_cast<float*>(alloc(ctx, sizeof(float) * n));
    auto* ids = static_cast<int32_t*>(alloc(ctx, sizeof(int32_t) * n));
    auto* ids_sorted = static_cast<int32_t*>(alloc(ctx, sizeof(int32_t) * n));
    auto* offsets = static_cast<int32_t*>(alloc(ctx, sizeof(int32_t) * (a.n_sampled + 1)));
    gather_keys_kernel<<<static_cast<unsigned>(a.n_sampled), 256, 0, s>>>(work, a.sampled, V, keys, ids, offsets);
    DI_CUDA_LAUNCHED();
    size_t temp_bytes = 0;
    DI_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
        nullptr, temp_bytes, keys, keys_sorted, ids, ids_sorted, static_cast<int>(n), static_cast<int>(a.n_sampled),
        offsets, offsets + 1, 0, 32, s));
    void* temp = alloc(ctx, temp_bytes == 0 ? 16 : temp_bytes);
    DI_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
        temp, temp_bytes, keys, keys_sorted, ids, ids_sorted, static_cast<int>(n), static_cast<int>(a.n_sampled),
        offsets, offsets + 1, 0, 32, s));
    sample_rows_kernel<<<static_cast<unsigned>(a.n_sampled), kThreads, 0, s>>>(keys_sorted, ids_sorted, V, a.sampled,
                                                                              a.rows, keys, a.tokens);
    DI_CUDA_LAUNCHED();
  }
  logprob_kernel<<<grid_for(R, 256), 256, 0, s>>>(a.logits, V, a.tokens, row_lse, a.logprobs, R);
  DI_CUDA_LAUNCHED();
  if (a.n_top > 0) {
    top_logprobs_kernel<<<static_cast<unsigned>(R), kThreads, 0, s>>>(a.logits, V, a.rows, a.tokens, row_lse,
                                                                      a.top_ids, a.top_logprobs, a.n_top);
    DI_CUDA_LAUNCHED();
  }
}

}  // namespace deepinfer::cuda
