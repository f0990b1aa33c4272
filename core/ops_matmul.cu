// cuBLAS launcher for matmul (row-major via the column-major identity Cᵀ = op(B)ᵀ·op(A)ᵀ).
// Used by core/ops_matmul.cpp's dispatch.
#include "core/cuda_runtime.h"
#include "core/ops_cuda.h"

namespace lh::cuda {

void matmul(void* stream, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  cublasHandle_t h = cublas_handle();
  LH_CUBLAS_CHECK_FATAL(cublasSetStream(h, static_cast<cudaStream_t>(stream)));
  // Row-major C (M×N) is column-major Cᵀ (N×M) = op(B)ᵀ (N×K) · op(A)ᵀ (K×M).
  LH_CUBLAS_CHECK_FATAL(cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M,
                                    K, &alpha, B, ldb, A, lda, &beta, C, ldc));
}

}  // namespace lh::cuda
