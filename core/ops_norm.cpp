// Row-wise ops on the CPU (layernorm, softmax, softmax cross-entropy) with their CUDA dispatch; the
// math is core/kernels.h. Used by the model and tests.
#include "core/kernels_cpu.h"
#include "core/ops.h"
#include "core/ops_cuda.h"

namespace lh {

void layernorm_forward(const Exec& ex, float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  LH_CUDA_DISPATCH(ex, layernorm_forward(ex.stream, out, mean, rstd, inp, weight, bias, N, C));
  kern::cpu_rows(N, kern::LayerNormForwardRows{out, mean, rstd, inp, weight, bias, C});
}

void layernorm_backward(const Exec& ex, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  LH_CUDA_DISPATCH(ex, layernorm_backward(ex.stream, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C));
  if (dinp) kern::cpu_rows(N, kern::LayerNormBackwardRows{dinp, dout, inp, weight, mean, rstd, C});
  if (dweight) kern::cpu_column_sum(dweight, N, C, kern::LayerNormWeightGradValue{dout, inp, mean, rstd, C});
  if (dbias) kern::cpu_column_sum(dbias, N, C, kern::ColumnValue{dout, C});
}

void softmax_forward(const Exec& ex, float* out, const float* inp, int rows, int cols) {
  LH_CUDA_DISPATCH(ex, softmax_forward(ex.stream, out, inp, rows, cols));
  kern::cpu_rows(rows, kern::SoftmaxForwardRows{out, inp, cols});
}

void softmax_backward(const Exec& ex, float* dinp, const float* out, const float* dout, int rows, int cols) {
  LH_CUDA_DISPATCH(ex, softmax_backward(ex.stream, dinp, out, dout, rows, cols));
  kern::cpu_rows(rows, kern::SoftmaxBackwardRows{dinp, out, dout, cols});
}

void crossentropy_forward(const Exec& ex, float* losses, float* probs, const float* logits, const int32_t* targets,
                          int N, int V) {
  LH_CUDA_DISPATCH(ex, crossentropy_forward(ex.stream, losses, probs, logits, targets, N, V));
  kern::cpu_rows(N, kern::CrossEntropyForwardRows{losses, probs, logits, targets, V});
}

void crossentropy_backward(const Exec& ex, float* dlogits, const float* probs, const int32_t* targets,
                           float dloss_scale, int N, int V) {
  LH_CUDA_DISPATCH(ex, crossentropy_backward(ex.stream, dlogits, probs, targets, dloss_scale, N, V));
  kern::cpu_for_each(int64_t(N) * V, kern::CrossEntropyBackward{dlogits, probs, targets, dloss_scale, V});
}

}  // namespace lh
