// defines: the CUDA launchers behind core/ops.h (implemented in core/ops_*.cu, only with LH_USE_CUDA),
// each the CUDA twin of the CPU function of the same name, with the stream first. Used by the
// CPU/CUDA dispatch in core/ops_*.cpp; nothing else includes it.
#pragma once

#include "core/ops.h"
#include "core/status.h"

#if defined(LH_USE_CUDA)
namespace lh::cuda {
void matmul(void* stream, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc);
// Row-major strided-batched GEMM: batch i uses A + i·stride_a, B + i·stride_b, C + i·stride_c (attention).
void matmul_strided_batched(void* stream, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                            int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b, float beta, float* C,
                            int ldc, int64_t stride_c, int batch);
void linear_forward(void* stream, float* out, const float* inp, const float* weight, const float* bias, int BT, int C,
                    int OC);
void linear_backward(void* stream, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int BT, int C, int OC);
void layernorm_forward(void* stream, float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(void* stream, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);
void gelu_forward(void* stream, float* out, const float* inp, int64_t n);
void gelu_backward(void* stream, float* dinp, const float* inp, const float* dout, int64_t n);
void softmax_forward(void* stream, float* out, const float* inp, int rows, int cols);
void softmax_backward(void* stream, float* dinp, const float* out, const float* dout, int rows, int cols);
void attention_forward(void* stream, float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(void* stream, float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T,
                        int C, int NH, void* workspace);
void embedding_forward(void* stream, float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C);
void embedding_backward(void* stream, float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                        int C);
void crossentropy_forward(void* stream, float* losses, float* probs, const float* logits, const int32_t* targets, int N,
                          int V);
void crossentropy_backward(void* stream, float* dlogits, const float* probs, const int32_t* targets, float dloss_scale,
                           int N, int V);
void residual_forward(void* stream, float* out, const float* a, const float* b, int64_t n);
void add_inplace(void* stream, float* y, const float* x, int64_t n);
void scale_inplace(void* stream, float* y, float s, int64_t n);
float sum(void* stream, const float* x, int64_t n);
float sum_squares(void* stream, const float* x, int64_t n);
void adamw_update(void* stream, float* param, const float* grad, float* m, float* v, int64_t n, const AdamWConfig& cfg,
                  int t, float weight_decay);
}  // namespace lh::cuda
#define LH_CUDA_DISPATCH(ex, call)           \
  do {                                       \
    if ((ex).device == ::lh::Device::cuda) { \
      ::lh::cuda::call;                      \
      return;                                \
    }                                        \
  } while (0)
// For ops that return a value (sum, sum_squares).
#define LH_CUDA_DISPATCH_RETURN(ex, call)                           \
  do {                                                              \
    if ((ex).device == ::lh::Device::cuda) return ::lh::cuda::call; \
  } while (0)
#else
#define LH_CUDA_DISPATCH(ex, call) LH_ASSERT((ex).device == ::lh::Device::cpu, "CUDA op in a build without CUDA")
#define LH_CUDA_DISPATCH_RETURN(ex, call) LH_CUDA_DISPATCH(ex, call)
#endif
