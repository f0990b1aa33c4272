// Elementwise ops on the CPU (GELU, residual/add/scale, sums, token+position embedding, AdamW,
// global-norm clipping) with their CUDA dispatch; the math is core/kernels.h. Used by the model,
// the trainer and tests.
#include <thrust/transform_reduce.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/kernels_cpu.h"
#include "core/ops.h"
#include "core/ops_cuda.h"

namespace lh {

void gelu_forward(const Exec& ex, float* out, const float* inp, int64_t n) {
  LH_CUDA_DISPATCH(ex, gelu_forward(ex.stream, out, inp, n));
  kern::cpu_for_each(n, kern::GeluForward{out, inp});
}

void gelu_backward(const Exec& ex, float* dinp, const float* inp, const float* dout, int64_t n) {
  LH_CUDA_DISPATCH(ex, gelu_backward(ex.stream, dinp, inp, dout, n));
  kern::cpu_for_each(n, kern::GeluBackward{dinp, inp, dout});
}

void residual_forward(const Exec& ex, float* out, const float* a, const float* b, int64_t n) {
  LH_CUDA_DISPATCH(ex, residual_forward(ex.stream, out, a, b, n));
  kern::cpu_for_each(n, kern::Add{out, a, b});
}

void add_inplace(const Exec& ex, float* y, const float* x, int64_t n) {
  LH_CUDA_DISPATCH(ex, add_inplace(ex.stream, y, x, n));
  kern::cpu_for_each(n, kern::AddInplace{y, x});
}

void scale_inplace(const Exec& ex, float* y, float s, int64_t n) {
  LH_CUDA_DISPATCH(ex, scale_inplace(ex.stream, y, s, n));
  kern::cpu_for_each(n, kern::ScaleInplace{y, s});
}

// Sums accumulate in double on both device systems so that long vectors do not lose small terms.
float sum(const Exec& ex, const float* x, int64_t n) {
  LH_CUDA_DISPATCH_RETURN(ex, sum(ex.stream, x, n));
  if (n <= 0) return 0.f;
  return static_cast<float>(
      thrust::transform_reduce(thrust::omp::par, x, x + n, kern::ToDouble{}, 0.0, thrust::plus<double>()));
}

float sum_squares(const Exec& ex, const float* x, int64_t n) {
  LH_CUDA_DISPATCH_RETURN(ex, sum_squares(ex.stream, x, n));
  if (n <= 0) return 0.f;
  return static_cast<float>(
      thrust::transform_reduce(thrust::omp::par, x, x + n, kern::Square{}, 0.0, thrust::plus<double>()));
}

void embedding_forward(const Exec& ex, float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) {
  LH_CUDA_DISPATCH(ex, embedding_forward(ex.stream, out, tokens, wte, wpe, B, T, C));
  kern::cpu_for_each(int64_t(B) * T * C, kern::EmbeddingForward{out, tokens, wte, wpe, T, C});
}

void embedding_backward(const Exec& ex, float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) {
  LH_CUDA_DISPATCH(ex, embedding_backward(ex.stream, dwte, dwpe, dout, tokens, B, T, C));
  if (dwte) {
    // Repeated tokens hit the same row of dwte: threads own disjoint column blocks instead of rows, so
    // there are no write races and the order of additions is fixed.
    constexpr int kBlock = 64;
    const int blocks = (C + kBlock - 1) / kBlock;
    const int64_t BT = int64_t(B) * T;
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (int blk = 0; blk < blocks; ++blk) {
      const int c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
      for (int64_t bt = 0; bt < BT; ++bt) {
        float* row = dwte + int64_t(tokens[bt]) * C;
        const float* g = dout + bt * C;
        for (int c = c0; c < c1; ++c) row[c] += g[c];
      }
    }
  }
  if (dwpe) kern::cpu_for_each(int64_t(T) * C, kern::EmbeddingPositionGrad{dwpe, dout, B, T, C});
}

void adamw_update(const Exec& ex, float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWConfig& cfg, int t, float weight_decay) {
  LH_ASSERT(t >= 1, "AdamW step t is 1-based, got " + std::to_string(t));
  LH_CUDA_DISPATCH(ex, adamw_update(ex.stream, param, grad, m, v, n, cfg, t, weight_decay));
  kern::cpu_for_each(n,
                     kern::make_adamw_step(param, grad, m, v, cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, weight_decay, t));
}

float clip_grad_norm(const Exec& ex, float* const* grads, const int64_t* sizes, int count, float max_norm) {
  // grads is a host array of pointers on ex.device; sum_squares / scale_inplace dispatch per device.
  double total = 0.0;
  for (int i = 0; i < count; ++i) total += sum_squares(ex, grads[i], sizes[i]);
  float norm = static_cast<float>(std::sqrt(total));
  // A non-finite norm is returned untouched so the caller can skip the step instead of zeroing grads.
  if (max_norm > 0.f && std::isfinite(norm) && norm > max_norm) {
    float s = max_norm / norm;
    for (int i = 0; i < count; ++i) scale_inplace(ex, grads[i], s, sizes[i]);
  }
  return norm;
}

}  // namespace lh
