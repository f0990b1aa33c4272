// cuBLAS launchers for matmul, strided-batched matmul and the linear layer (row-major via the
// column-major identity Cᵀ = op(B)ᵀ·op(A)ᵀ). Used by core/ops_matmul.cpp's dispatch and attention.
#include "core/cuda_runtime.h"
#include "core/kernels_cuda.h"
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

void matmul_strided_batched(void* stream, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                            int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b, float beta, float* C,
                            int ldc, int64_t stride_c, int batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  cublasHandle_t h = cublas_handle();
  LH_CUBLAS_CHECK_FATAL(cublasSetStream(h, static_cast<cudaStream_t>(stream)));
  LH_CUBLAS_CHECK_FATAL(cublasSgemmStridedBatched(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb,
                                                  stride_b, A, lda, stride_a, &beta, C, ldc, stride_c, batch));
}

void linear_forward(void* stream, float* out, const float* inp, const float* weight, const float* bias, int BT, int C,
                    int OC) {
  if (bias) kern::gpu_for_each(stream, int64_t(BT) * OC, kern::BroadcastRows{out, bias, OC});
  matmul(stream, false, true, BT, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f, out, OC);
}

void linear_backward(void* stream, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int BT, int C, int OC) {
  if (dinp) matmul(stream, false, false, BT, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
  if (dweight) matmul(stream, true, false, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias) kern::gpu_column_sum(stream, dbias, BT, OC, kern::ColumnValue{dout, OC});
}

}  // namespace lh::cuda
