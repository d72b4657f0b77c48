#include "backend/cuda/cuda_limits.h"

#include <algorithm>
#include <vector>

#include <cublasLt.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "core/check.h"

namespace deepinfer {
namespace {

constexpr int kWarmup = 3;
constexpr int kReps = 20;
constexpr int64_t kCopyBytes = int64_t{2} << 30;  // 2 GiB
constexpr int64_t kGemmN = 8192;

// Median time in ms of kReps runs of `op` (which enqueues work on `stream`) after kWarmup
// untimed ones; each rep between its own pair of events, read once all have finished.
// (The median of an even count is the mean of the middle two, as Python's statistics.median.)
template <typename Op>
double median_ms(cudaStream_t stream, Op op) {
  for (int i = 0; i < kWarmup; ++i) op();
  std::vector<cudaEvent_t> start(kReps), stop(kReps);
  for (int i = 0; i < kReps; ++i) {
    DI_CUDA_CHECK(cudaEventCreate(&start[i]));
    DI_CUDA_CHECK(cudaEventCreate(&stop[i]));
  }
  for (int i = 0; i < kReps; ++i) {
    DI_CUDA_CHECK(cudaEventRecord(start[i], stream));
    op();
    DI_CUDA_CHECK(cudaEventRecord(stop[i], stream));
  }
  DI_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ms(kReps);
  for (int i = 0; i < kReps; ++i) {
    float t = 0.0f;
    DI_CUDA_CHECK(cudaEventElapsedTime(&t, start[i], stop[i]));
    ms[i] = t;
    DI_CUDA_CHECK(cudaEventDestroy(start[i]));
    DI_CUDA_CHECK(cudaEventDestroy(stop[i]));
  }
  std::sort(ms.begin(), ms.end());
  return (ms[(kReps - 1) / 2] + ms[kReps / 2]) / 2.0;
}

}  // namespace

DeviceLimits measure_device_limits(Backend& cuda_backend) {
  auto* backend = dynamic_cast<CudaBackend*>(&cuda_backend);
  DI_CHECK(backend != nullptr && "measure_device_limits needs the CUDA backend");
  auto stream = static_cast<cudaStream_t>(backend->stream());
  DeviceLimits limits;

  cudaDeviceProp prop{};
  DI_CUDA_CHECK(cudaGetDeviceProperties(&prop, backend->device().index));
  limits.gpu_name = prop.name;

  {  // Copy bandwidth. Buffers are Tensors: freed (cudaFree) when the scope ends.
    Tensor src = backend->allocate(DType::kBF16, {kCopyBytes / 2});  // [2^30] bf16
    Tensor dst = backend->allocate(DType::kBF16, {kCopyBytes / 2});  // [2^30] bf16
    backend->fill_random(src, 1, true, 1.0f, 0.0f);
    const double ms = median_ms(stream, [&] {
      DI_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), static_cast<size_t>(kCopyBytes),
                                    cudaMemcpyDeviceToDevice, stream));
    });
    limits.copy_bytes_per_s = 2.0 * static_cast<double>(kCopyBytes) / (ms / 1e3);
  }

  {  // bf16 GEMM rate: C = A·B, all [8192, 8192] bf16, N(0, 1) inputs (non-zero: no sparsity shortcuts).
    Tensor a = backend->allocate(DType::kBF16, {kGemmN, kGemmN});
    Tensor b = backend->allocate(DType::kBF16, {kGemmN, kGemmN});
    Tensor c = backend->allocate(DType::kBF16, {kGemmN, kGemmN});
    backend->fill_random(a, 2, true, 1.0f, 0.0f);
    backend->fill_random(b, 3, true, 1.0f, 0.0f);
    cublasHandle_t blas = nullptr;
    DI_CUBLAS_CHECK(cublasCreate(&blas));
    DI_CUBLAS_CHECK(cublasSetStream(blas, stream));
    const float alpha = 1.0f, beta = 0.0f;
    const int n = static_cast<int>(kGemmN);
    const double ms = median_ms(stream, [&] {
      DI_CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.raw_data(), CUDA_R_16BF, n,
                                   b.raw_data(), CUDA_R_16BF, n, &beta, c.raw_data(), CUDA_R_16BF, n,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    DI_CUDA_CHECK(cudaStreamSynchronize(stream));
    DI_CUBLAS_CHECK(cublasDestroy(blas));
    const double nn = static_cast<double>(kGemmN);
    limits.bf16_flops_per_s = 2.0 * nn * nn * nn / (ms / 1e3);
  }

  {  // FP8 GEMM rate: D [8192, 8192] bf16 = Aᵀ·B, A and B [8192, 8192] e4m3 (column-major, "TN"), fp32
     // accumulation, unit scales; N(0, 1) inputs rounded to e4m3; the heuristic's first algorithm.
    Tensor a = backend->allocate(DType::kF8E4M3, {kGemmN, kGemmN});
    Tensor b = backend->allocate(DType::kF8E4M3, {kGemmN, kGemmN});
    Tensor d = backend->allocate(DType::kBF16, {kGemmN, kGemmN});
    constexpr size_t kWorkspace = size_t{32} << 20;
    Tensor ws = backend->allocate(DType::kU8, {static_cast<int64_t>(kWorkspace)});
    backend->fill_random(a, 4, true, 1.0f, 0.0f);
    backend->fill_random(b, 5, true, 1.0f, 0.0f);
    cublasLtHandle_t lt = nullptr;
    DI_CUBLAS_CHECK(cublasLtCreate(&lt));
    cublasLtMatmulDesc_t op = nullptr;
    DI_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    const uint64_t n = static_cast<uint64_t>(kGemmN);
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n, n, static_cast<int64_t>(n)));
    DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n, n, static_cast<int64_t>(n)));
    DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, n, static_cast<int64_t>(n)));
    cublasLtMatmulPreference_t pref = nullptr;
    DI_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    DI_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace,
                                                        sizeof(kWorkspace)));
    cublasLtMatmulHeuristicResult_t algo{};
    int found = 0;
    const cublasStatus_t h = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &algo, &found);
    if (h == CUBLAS_STATUS_SUCCESS && found > 0) {
      const float alpha = 1.0f, beta = 0.0f;
      const double ms = median_ms(stream, [&] {
        DI_CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, a.raw_data(), la, b.raw_data(), lb, &beta, d.raw_data(), ld,
                                       d.raw_data(), ld, &algo.algo, ws.raw_data(), kWorkspace, stream));
      });
      const double nn = static_cast<double>(kGemmN);
      limits.fp8_flops_per_s = 2.0 * nn * nn * nn / (ms / 1e3);
    }
    DI_CUDA_CHECK(cudaStreamSynchronize(stream));
    DI_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    DI_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    DI_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    DI_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
    DI_CUBLAS_CHECK(cublasLtMatmulDescDestroy(op));
    DI_CUBLAS_CHECK(cublasLtDestroy(lt));
  }
  backend->synchronize();
  return limits;
}

}  // namespace deepinfer
