// Timing helpers of the CUDA micro-benchmarks (bench/*_bench.cpp): a stream with its cuBLAS
// handle, device buffers and uploads, the median of CUDA-graph replays of a batch of launches,
// the bf16 GEMM and device-to-device copy rates they are compared against, the L2 size (to
// rotate operands that would otherwise stay cached), the persistent kernels' timelines, and
// their list-valued command-line options.
#pragma once

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_common.h"

namespace deepinfer::bench {

// A bench's stream and a cuBLAS handle bound to it, both released at scope exit.
struct BenchStream {
  cudaStream_t s = nullptr;
  cublasHandle_t blas = nullptr;
  BenchStream() {
    DI_CUDA_CHECK(cudaStreamCreate(&s));
    DI_CUBLAS_CHECK(cublasCreate(&blas));
    DI_CUBLAS_CHECK(cublasSetStream(blas, s));
  }
  ~BenchStream() {
    cublasDestroy(blas);
    cudaStreamDestroy(s);
  }
  BenchStream(const BenchStream&) = delete;
  BenchStream& operator=(const BenchStream&) = delete;
};

// A device allocation freed at scope exit.
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { DI_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256))); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  Dev(Dev&& o) noexcept : p(std::exchange(o.p, nullptr)) {}
  Dev& operator=(Dev&&) = delete;
};

// v copied to a new device allocation (synchronously: v may go out of scope).
template <typename T>
Dev upload(const std::vector<T>& v, cudaStream_t s) {
  Dev d(v.size() * sizeof(T));
  DI_CUDA_CHECK(cudaMemcpyAsync(d.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  DI_CUDA_CHECK(cudaStreamSynchronize(s));
  return d;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of `launch(i)` (i: the call's index, for rotating buffers).
template <typename F>
double time_launches(F&& launch, int reps, cudaStream_t s) {
  cudaEvent_t e0, e1;
  DI_CUDA_CHECK(cudaEventCreate(&e0));
  DI_CUDA_CHECK(cudaEventCreate(&e1));
  int idx = 0;
  for (int i = 0; i < 3; ++i) launch(idx++);  // warm-up
  DI_CUDA_CHECK(cudaEventRecord(e0, s));
  launch(idx++);
  DI_CUDA_CHECK(cudaEventRecord(e1, s));
  DI_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  DI_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  const int batch = std::clamp(static_cast<int>(1.0 / std::max(ms, 1e-3f)), 1, 200);  // ≥ ~1 ms per batch
  // The batch is captured once as a CUDA graph and replayed: host launch cost (several µs per
  // launch on the GPU machine) would otherwise be what small-M figures measure.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  DI_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int b = 0; b < batch; ++b) launch(idx++);
  DI_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  DI_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  DI_CUDA_CHECK(cudaGraphLaunch(exec, s));  // upload + warm
  std::vector<double> per_call;
  for (int r = 0; r < reps; ++r) {
    DI_CUDA_CHECK(cudaEventRecord(e0, s));
    DI_CUDA_CHECK(cudaGraphLaunch(exec, s));
    DI_CUDA_CHECK(cudaEventRecord(e1, s));
    DI_CUDA_CHECK(cudaEventSynchronize(e1));
    DI_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    per_call.push_back(ms * 1e-3 / batch);
  }
  DI_CUDA_CHECK(cudaGraphExecDestroy(exec));
  DI_CUDA_CHECK(cudaGraphDestroy(graph));
  DI_CUDA_CHECK(cudaEventDestroy(e0));
  DI_CUDA_CHECK(cudaEventDestroy(e1));
  return median(per_call);
}

// bf16 cuBLAS GEMM rate (FLOP/s) at 8192³ on random operands: the matrix-rate ceiling compute-bound
// kernels are compared to.
inline double bf16_gemm_rate(cublasHandle_t blas, cudaStream_t s) {
  const int64_t n = 8192;
  Dev a(static_cast<size_t>(n * n) * 2), b(static_cast<size_t>(n * n) * 2), c(static_cast<size_t>(n * n) * 2);
  cuda::fill_random(a.p, cuda::Elem::kBF16, n * n, 11, true, 1.0f, 0.0f, s);
  cuda::fill_random(b.p, cuda::Elem::kBF16, n * n, 12, true, 1.0f, 0.0f, s);
  const double t = time_launches(
      [&](int) {
        cuda::gemm(blas, n, n, n, static_cast<const cuda::bf16*>(a.p), n, 0, static_cast<const cuda::bf16*>(b.p), n, 0,
                   true, c.p, cuda::Elem::kBF16, n, 0, 1);
      },
      9, s);
  return 2.0 * static_cast<double>(n * n * n) / t;
}

// Device-to-device copy rate, bytes read + written per second (1 GiB, median of 10), timed
// eagerly: a memcpy node inside a CUDA graph runs on a copy engine at ~2/3 of the rate an eager
// cudaMemcpyAsync (an SM copy kernel) reaches, and the eager rate is the ceiling kernels compare to.
inline double copy_rate(cudaStream_t s) {
  const size_t n = size_t{1} << 30;
  Dev a(n), b(n);
  DI_CUDA_CHECK(cudaMemsetAsync(a.p, 1, n, s));
  cudaEvent_t e0, e1;
  DI_CUDA_CHECK(cudaEventCreate(&e0));
  DI_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int r = 0; r < 13; ++r) {
    DI_CUDA_CHECK(cudaEventRecord(e0, s));
    DI_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, n, cudaMemcpyDeviceToDevice, s));
    DI_CUDA_CHECK(cudaEventRecord(e1, s));
    DI_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    DI_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 3) t.push_back(ms * 1e-3);
  }
  DI_CUDA_CHECK(cudaEventDestroy(e0));
  DI_CUDA_CHECK(cudaEventDestroy(e1));
  return 2.0 * static_cast<double>(n) / median(t);
}

inline int64_t l2_bytes() {
  int dev = 0, v = 0;
  DI_CUDA_CHECK(cudaGetDevice(&dev));
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, dev));
  return v;
}

// A persistent kernel's lab timeline, read back from its trace buffer ([G][marks] global-timer ns
// per block, cuda::MlaSublayerArgs::trace and the like) after one launch: per mark, the median
// and the latest block's µs since the earliest block's mark 0, as the JSON fields
// `"median_us": [...], "latest_us": [...]`.
inline std::string timeline_json(const void* trace, int G, int marks, cudaStream_t s) {
  std::vector<unsigned long long> tr(static_cast<size_t>(G) * marks);
  DI_CUDA_CHECK(cudaMemcpyAsync(tr.data(), trace, tr.size() * 8, cudaMemcpyDeviceToHost, s));
  DI_CUDA_CHECK(cudaStreamSynchronize(s));
  unsigned long long t0 = ~0ull;
  for (int b = 0; b < G; ++b) t0 = std::min(t0, tr[static_cast<size_t>(b) * marks]);
  std::string med = "\"median_us\": [", late = "\"latest_us\": [";
  for (int m = 0; m < marks; ++m) {
    std::vector<double> v;
    for (int b = 0; b < G; ++b) v.push_back(static_cast<double>(tr[static_cast<size_t>(b) * marks + m] - t0) * 1e-3);
    std::sort(v.begin(), v.end());
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%.2f", m ? ", " : "", v[v.size() / 2]);
    med += buf;
    std::snprintf(buf, sizeof buf, "%s%.2f", m ? ", " : "", v.back());
    late += buf;
  }
  return med + "], " + late + "]";
}

// "1,16,64" → {1, 16, 64} (sep-separated integers).
inline std::vector<int64_t> parse_list(const std::string& s, char sep = ',') {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) v.push_back(std::stoll(item));
  return v;
}

}  // namespace deepinfer::bench
