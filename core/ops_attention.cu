// CUDA launcher for causal multi-head attention: per batch element one cuBLAS strided-batched GEMM
// over the heads for QKᵀ and att·V, and the masked softmax (and its backward) one warp per row from
// core/kernels.h. Used by core/ops_attention.cpp's dispatch.
#include <cmath>

#include "core/kernels_cuda.h"
#include "core/ops_cuda.h"

namespace lh::cuda {

// Heads of one batch element sit hs apart inside a row of qkv (row stride 3C), and their T×T
// attention blocks sit T·T apart, so each batch element is one strided batch over its NH heads.
void attention_forward(void* stream, float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t TT = int64_t(T) * T;
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + int64_t(b) * T * C3;
    matmul_strided_batched(stream, false, true, T, T, hs, scale, q, C3, hs, q + C, C3, hs, 0.0f,
                           att + int64_t(b) * NH * TT, T, TT, NH);
  }
  kern::gpu_rows(stream, int64_t(B) * NH * T, kern::CausalSoftmaxRows{att, T});
  for (int b = 0; b < B; ++b) {
    const float* v = qkv + int64_t(b) * T * C3 + 2 * C;
    matmul_strided_batched(stream, false, false, T, hs, T, 1.0f, att + int64_t(b) * NH * TT, T, TT, v, C3, hs, 0.0f,
                           out + int64_t(b) * T * C, C, hs, NH);
  }
}

void attention_backward(void* stream, float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T,
                        int C, int NH, void* workspace) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t TT = int64_t(T) * T;
  float* datt = static_cast<float*>(workspace);
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + int64_t(b) * T * C3;
    const float* dy = dout + int64_t(b) * T * C;
    float* dq = dqkv + int64_t(b) * T * C3;
    // datt = dy · vᵀ ; dv += attᵀ · dy
    matmul_strided_batched(stream, false, true, T, T, hs, 1.0f, dy, C, hs, q + 2 * C, C3, hs, 0.0f,
                           datt + int64_t(b) * NH * TT, T, TT, NH);
    matmul_strided_batched(stream, true, false, T, hs, T, 1.0f, att + int64_t(b) * NH * TT, T, TT, dy, C, hs, 1.0f,
                           dq + 2 * C, C3, hs, NH);
  }
  kern::gpu_rows(stream, int64_t(B) * NH * T, kern::CausalSoftmaxBackwardRows{datt, att, T, scale});
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + int64_t(b) * T * C3;
    float* dq = dqkv + int64_t(b) * T * C3;
    const float* dpre = datt + int64_t(b) * NH * TT;
    // dq += dpre · k ; dk += dpreᵀ · q
    matmul_strided_batched(stream, false, false, T, hs, T, 1.0f, dpre, T, TT, q + C, C3, hs, 1.0f, dq, C3, hs, NH);
    matmul_strided_batched(stream, true, false, T, hs, T, 1.0f, dpre, T, TT, q, C3, hs, 1.0f, dq + C, C3, hs, NH);
  }
}

}  // namespace lh::cuda
