// Causal multi-head self-attention on the CPU: per (batch, head) BLAS GEMMs for QKᵀ and att·V, the
// masked softmax and its backward from core/kernels.h. CUDA dispatch to core/ops_attention.cu.
// Used by the model and tests.
#include <cmath>
#include <string>

#include "core/kernels_cpu.h"
#include "core/ops.h"
#include "core/ops_cuda.h"

namespace lh {

size_t attention_backward_workspace(int B, int T, int C, int NH) {
  return sizeof(float) * size_t(B) * size_t(NH) * size_t(T) * size_t(T);
}

// GEMMs run one (batch, head) at a time so OpenBLAS can use every thread inside each; the softmax
// passes run over all B·NH·T rows at once.
void attention_forward(const Exec& ex, float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  LH_ASSERT(NH > 0 && C % NH == 0, "attention: C=" + std::to_string(C) + " not divisible by NH=" + std::to_string(NH));
  LH_CUDA_DISPATCH(ex, attention_forward(ex.stream, out, att, qkv, B, T, C, NH));
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + int64_t(b) * T * C3 + int64_t(h) * hs;
      float* a = att + (int64_t(b) * NH + h) * T * T;
      matmul(ex, false, true, T, T, hs, scale, q, C3, q + C, C3, 0.0f, a, T);
    }
  kern::cpu_rows(int64_t(B) * NH * T, kern::CausalSoftmaxRows{att, T});
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const float* v = qkv + int64_t(b) * T * C3 + 2 * C + int64_t(h) * hs;
      const float* a = att + (int64_t(b) * NH + h) * T * T;
      matmul(ex, false, false, T, hs, T, 1.0f, a, T, v, C3, 0.0f, out + int64_t(b) * T * C + int64_t(h) * hs, C);
    }
}

void attention_backward(const Exec& ex, float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH, void* workspace) {
  LH_ASSERT(NH > 0 && C % NH == 0, "attention: C=" + std::to_string(C) + " not divisible by NH=" + std::to_string(NH));
  LH_CUDA_DISPATCH(ex, attention_backward(ex.stream, dqkv, dout, qkv, att, B, T, C, NH, workspace));
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* datt = static_cast<float*>(workspace);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const int64_t qo = int64_t(b) * T * C3 + int64_t(h) * hs, ao = (int64_t(b) * NH + h) * T * T;
      const float* dy = dout + int64_t(b) * T * C + int64_t(h) * hs;
      // datt = dy · vᵀ ; dv += attᵀ · dy
      matmul(ex, false, true, T, T, hs, 1.0f, dy, C, qkv + qo + 2 * C, C3, 0.0f, datt + ao, T);
      matmul(ex, true, false, T, hs, T, 1.0f, att + ao, T, dy, C, 1.0f, dqkv + qo + 2 * C, C3);
    }
  // datt becomes scale · ∂L/∂(q·kᵀ), zero above the diagonal.
  kern::cpu_rows(int64_t(B) * NH * T, kern::CausalSoftmaxBackwardRows{datt, att, T, scale});
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const int64_t qo = int64_t(b) * T * C3 + int64_t(h) * hs, ao = (int64_t(b) * NH + h) * T * T;
      // dq += dpre · k ; dk += dpreᵀ · q
      matmul(ex, false, false, T, hs, T, 1.0f, datt + ao, T, qkv + qo + C, C3, 1.0f, dqkv + qo, C3);
      matmul(ex, true, false, T, hs, T, 1.0f, datt + ao, T, qkv + qo, C3, 1.0f, dqkv + qo + C, C3);
    }
}

}  // namespace lh
