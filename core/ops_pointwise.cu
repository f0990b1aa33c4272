// CUDA launchers for the elementwise ops (GELU, residual/add/scale, sums, embedding, AdamW): Thrust on
// the caller's stream over the functors of core/kernels.h. Used by core/ops_pointwise.cpp's dispatch.
#include <thrust/functional.h>
#include <thrust/transform_reduce.h>

#include "core/kernels_cuda.h"
#include "core/ops_cuda.h"

namespace lh::cuda {

void gelu_forward(void* stream, float* out, const float* inp, int64_t n) {
  kern::gpu_for_each(stream, n, kern::GeluForward{out, inp});
}

void gelu_backward(void* stream, float* dinp, const float* inp, const float* dout, int64_t n) {
  kern::gpu_for_each(stream, n, kern::GeluBackward{dinp, inp, dout});
}

void residual_forward(void* stream, float* out, const float* a, const float* b, int64_t n) {
  kern::gpu_for_each(stream, n, kern::Add{out, a, b});
}

void add_inplace(void* stream, float* y, const float* x, int64_t n) {
  kern::gpu_for_each(stream, n, kern::AddInplace{y, x});
}

void scale_inplace(void* stream, float* y, float s, int64_t n) {
  kern::gpu_for_each(stream, n, kern::ScaleInplace{y, s});
}

// The result goes to the host, so these synchronise the stream (thrust::cuda::par waits for it).
float sum(void* stream, const float* x, int64_t n) {
  if (n <= 0) return 0.f;
  return static_cast<float>(thrust::transform_reduce(thrust::cuda::par.on(kern::as_stream(stream)), x, x + n,
                                                     kern::ToDouble{}, 0.0, thrust::plus<double>()));
}

float sum_squares(void* stream, const float* x, int64_t n) {
  if (n <= 0) return 0.f;
  return static_cast<float>(thrust::transform_reduce(thrust::cuda::par.on(kern::as_stream(stream)), x, x + n,
                                                     kern::Square{}, 0.0, thrust::plus<double>()));
}

void embedding_forward(void* stream, float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) {
  kern::gpu_for_each(stream, int64_t(B) * T * C, kern::EmbeddingForward{out, tokens, wte, wpe, T, C});
}

void embedding_backward(void* stream, float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                        int C) {
  if (dwte) kern::gpu_for_each(stream, int64_t(B) * T * C, kern::EmbeddingTokenGradAtomic{dwte, dout, tokens, C});
  if (dwpe) kern::gpu_for_each(stream, int64_t(T) * C, kern::EmbeddingPositionGrad{dwpe, dout, B, T, C});
}

void adamw_update(void* stream, float* param, const float* grad, float* m, float* v, int64_t n, const AdamWConfig& cfg,
                  int t, float weight_decay) {
  kern::gpu_for_each(stream, n,
                     kern::make_adamw_step(param, grad, m, v, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, weight_decay, t));
}

}  // namespace lh::cuda
