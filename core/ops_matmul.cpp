// matmul and linear layers: OpenBLAS on the CPU, cuBLAS on CUDA (never hand-written GEMM).
// Used by the model, PowerSGD/subspace codecs and tests.
#include <cblas.h>

#include "core/ops.h"
#include "core/ops_cuda.h"

namespace lh {

void matmul(const Exec& ex, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) {
  LH_CUDA_DISPATCH(ex, matmul(ex.stream, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha,
              A, lda, B, ldb, beta, C, ldc);
}

}  // namespace lh
