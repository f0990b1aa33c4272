// defines: the op set of the GPT, forward and backward, on CPU and CUDA (llm.c-style: fp32, row-major,
// raw pointers that live on ex.device). Used by the model, the codecs (matmul) and tests.
//
// Conventions, every op:
// - Pointers are device pointers of ex.device; shapes are given explicitly; all arrays are
//   contiguous row-major fp32.
// - Backward functions ACCUMULATE (+=) into every gradient they write (dinp, dweight, dbias), so
//   residual branches and microbatches add up; callers zero gradients when a step starts.
// - CPU paths use OpenMP / OpenBLAS; CUDA paths use cuBLAS and kernels built from the same
//   __host__ __device__ math. A CUDA failure inside a void op is fatal (LH_CUDA_CHECK_FATAL).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/exec.h"

namespace lh {

// C[M×N] = alpha · op(A) · op(B) + beta · C, row-major; op(A) is M×K, op(B) is K×N.
// lda/ldb/ldc are row strides of A, B, C as stored. OpenBLAS (sgemm) on CPU, cuBLAS on CUDA.
void matmul(const Exec& ex, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc);

// out[BT×OC] = inp[BT×C] · weight[OC×C]ᵀ + bias[OC] (bias may be null).
void linear_forward(const Exec& ex, float* out, const float* inp, const float* weight, const float* bias, int BT, int C,
                    int OC);
// dinp += dout·weight, dweight += doutᵀ·inp, dbias += Σ_rows dout. Any gradient pointer may be null (skipped).
void linear_backward(const Exec& ex, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int BT, int C, int OC);

// Layernorm over the last dim C of N rows; saves mean[N] and rstd[N] for backward. eps = 1e-5.
void layernorm_forward(const Exec& ex, float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(const Exec& ex, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

// GELU, tanh approximation (as GPT-2).
void gelu_forward(const Exec& ex, float* out, const float* inp, int64_t n);
void gelu_backward(const Exec& ex, float* dinp, const float* inp, const float* dout, int64_t n);

// Row softmax over the last dim.
void softmax_forward(const Exec& ex, float* out, const float* inp, int rows, int cols);
void softmax_backward(const Exec& ex, float* dinp, const float* out, const float* dout, int rows, int cols);

// Causal multi-head self-attention. qkv[B,T,3C] holds q, k, v (each C = NH·hs, heads contiguous);
// out[B,T,C]; att[B,NH,T,T] receives the softmax probabilities (saved for backward); scale 1/sqrt(hs).
void attention_forward(const Exec& ex, float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// dqkv += ∂L/∂qkv. `workspace` holds attention_backward_workspace(B,T,C,NH) bytes on ex.device.
size_t attention_backward_workspace(int B, int T, int C, int NH);
void attention_backward(const Exec& ex, float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH, void* workspace);

// out[B,T,C] = wte[tok] + wpe[t]. tokens are int32 in [0, V) (callers validate them).
void embedding_forward(const Exec& ex, float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C);
// dwte[tok] += dout, dwpe[t] += dout (either may be null).
void embedding_backward(const Exec& ex, float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C);

// Softmax cross-entropy over V classes for N rows: losses[N] = -log softmax(logits)[target].
// probs[N×V] receives the softmax (may alias nothing); returns nothing — sum losses on the caller's side.
void crossentropy_forward(const Exec& ex, float* losses, float* probs, const float* logits, const int32_t* targets,
                          int N, int V);
// dlogits += dloss_scale · (probs − onehot(target)); dloss_scale is typically 1/N.
void crossentropy_backward(const Exec& ex, float* dlogits, const float* probs, const int32_t* targets,
                           float dloss_scale, int N, int V);

// out = a + b (elementwise); residual backward is "accumulate dout into both" = add_inplace.
void residual_forward(const Exec& ex, float* out, const float* a, const float* b, int64_t n);
void add_inplace(const Exec& ex, float* y, const float* x, int64_t n);  // y += x
void scale_inplace(const Exec& ex, float* y, float s, int64_t n);      // y *= s
float sum(const Exec& ex, const float* x, int64_t n);                  // returned on the host
float sum_squares(const Exec& ex, const float* x, int64_t n);          // returned on the host

// AdamW with decoupled weight decay (Loshchilov & Hutter), bias-corrected; t is the 1-based step.
struct AdamWConfig {
  float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
};
void adamw_update(const Exec& ex, float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWConfig& cfg, int t, float weight_decay);

// Global-norm clipping over a list of gradient arrays: scales all by min(1, max_norm/‖g‖); returns ‖g‖.
float clip_grad_norm(const Exec& ex, float* const* grads, const int64_t* sizes, int count, float max_norm);

}  // namespace lh
