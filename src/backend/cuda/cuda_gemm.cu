// Dense GEMMs through cuBLAS: bf16 operands, fp32 accumulation (CUBLAS_COMPUTE_32F), row-major
// views mapped onto cuBLAS's column-major convention (C_rm = A·op(B) ⇔ C_cmᵀ = op(B)ᵀ·Aᵀ).
#include "backend/cuda/cuda_common.h"

namespace deepinfer::cuda {

void gemm(cublasHandle_t h, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda, int64_t stride_a,
          const bf16* B, int64_t ldb, int64_t stride_b, bool b_nt, void* C, Elem c_elem, int64_t ldc,
          int64_t stride_c, int64_t batch, float beta) {
  if (M == 0 || N == 0 || batch == 0) return;
  const cudaDataType ct = c_elem == Elem::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  const float alpha = 1.0f;
  DI_CUDA_REQUIRE(K > 0);  // model dimensions are positive
  // Column-major: C' (N×M, ldc) = op(B') (N×K) · A' (K×M, lda), with B' the column-major view of B.
  const cublasOperation_t opb = b_nt ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1) {
    DI_CUBLAS_CHECK(cublasGemmEx(h, opb, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                                 &alpha, B, CUDA_R_16BF, static_cast<int>(ldb), A, CUDA_R_16BF, static_cast<int>(lda),
                                 &beta, C, ct, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  } else {
    DI_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, opb, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B, CUDA_R_16BF,
        static_cast<int>(ldb), stride_b, A, CUDA_R_16BF, static_cast<int>(lda), stride_a, &beta, C, ct,
        static_cast<int>(ldc), stride_c, static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

void gemm_tf32(cublasHandle_t h, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, int64_t stride_a,
               const float* B, int64_t ldb, int64_t stride_b, bool b_nt, float* C, int64_t ldc, int64_t stride_c,
               int64_t batch, float beta) {
  if (M == 0 || N == 0 || batch == 0) return;
  DI_CUDA_REQUIRE(K > 0);
  const float alpha = 1.0f;
  const cublasOperation_t opb = b_nt ? CUBLAS_OP_T : CUBLAS_OP_N;
  DI_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, opb, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B, CUDA_R_32F,
      static_cast<int>(ldb), stride_b, A, CUDA_R_32F, static_cast<int>(lda), stride_a, &beta, C, CUDA_R_32F,
      static_cast<int>(ldc), stride_c, static_cast<int>(batch), CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
}

void gemm_f32(cublasHandle_t h, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
              int64_t ldb, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  DI_CUDA_REQUIRE(K > 0);
  const float alpha = 1.0f, beta = 0.0f;
  DI_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                               &alpha, B, CUDA_R_32F, static_cast<int>(ldb), A, CUDA_R_32F, static_cast<int>(lda), &beta,
                               C, CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
}

}  // namespace deepinfer::cuda
