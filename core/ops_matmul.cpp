// matmul and linear layers: OpenBLAS on the CPU, cuBLAS on CUDA (never hand-written GEMM).
// Used by the model, PowerSGD/subspace codecs and tests.
#include <cblas.h>

#include "core/kernels_cpu.h"
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

void linear_forward(const Exec& ex, float* out, const float* inp, const float* weight, const float* bias, int BT, int C,
                    int OC) {
  LH_CUDA_DISPATCH(ex, linear_forward(ex.stream, out, inp, weight, bias, BT, C, OC));
  // The bias goes in first so one GEMM with beta = 1 finishes the job (no second pass over out).
  if (bias) kern::cpu_for_each(int64_t(BT) * OC, kern::BroadcastRows{out, bias, OC});
  matmul(ex, false, true, BT, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f, out, OC);
}

void linear_backward(const Exec& ex, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int BT, int C, int OC) {
  LH_CUDA_DISPATCH(ex, linear_backward(ex.stream, dinp, dweight, dbias, dout, inp, weight, BT, C, OC));
  if (dinp) matmul(ex, false, false, BT, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
  if (dweight) matmul(ex, true, false, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias) kern::cpu_column_sum(dbias, BT, OC, kern::ColumnValue{dout, OC});
}

}  // namespace lh
