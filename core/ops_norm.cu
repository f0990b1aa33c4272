// CUDA launchers for the row-wise ops (layernorm, softmax, softmax cross-entropy): one warp per row
// running the row functors of core/kernels.h. Used by core/ops_norm.cpp's dispatch.
#include "core/kernels_cuda.h"
#include "core/ops_cuda.h"

namespace lh::cuda {

void layernorm_forward(void* stream, float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
  kern::gpu_rows(stream, N, kern::LayerNormForwardRows{out, mean, rstd, inp, weight, bias, C});
}

void layernorm_backward(void* stream, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  if (dinp) kern::gpu_rows(stream, N, kern::LayerNormBackwardRows{dinp, dout, inp, weight, mean, rstd, C});
  if (dweight) kern::gpu_column_sum(stream, dweight, N, C, kern::LayerNormWeightGradValue{dout, inp, mean, rstd, C});
  if (dbias) kern::gpu_column_sum(stream, dbias, N, C, kern::ColumnValue{dout, C});
}

void softmax_forward(void* stream, float* out, const float* inp, int rows, int cols) {
  kern::gpu_rows(stream, rows, kern::SoftmaxForwardRows{out, inp, cols});
}

void softmax_backward(void* stream, float* dinp, const float* out, const float* dout, int rows, int cols) {
  kern::gpu_rows(stream, rows, kern::SoftmaxBackwardRows{dinp, out, dout, cols});
}

void crossentropy_forward(void* stream, float* losses, float* probs, const float* logits, const int32_t* targets, int N,
                          int V) {
  kern::gpu_rows(stream, N, kern::CrossEntropyForwardRows{losses, probs, logits, targets, V});
}

void crossentropy_backward(void* stream, float* dlogits, const float* probs, const int32_t* targets, float dloss_scale,
                           int N, int V) {
  kern::gpu_for_each(stream, int64_t(N) * V, kern::CrossEntropyBackward{dlogits, probs, targets, dloss_scale, V});
}

}  // namespace lh::cuda
