// defines: the kernel math of core/ops.h, written once as __host__ __device__ functors: per-element
// functors (i → one output) and per-row functors run by a group of "lanes". Used by ops_*.cpp and ops_*.cu.
//
// A row functor is called as f(lanes, row). On the CPU, SerialLanes makes one thread do the whole row;
// on the GPU, WarpLanes (kernels_launch.h) splits the row across the 32 threads of a warp and its sum/max
// are warp shuffles. The arithmetic is the same code on both device systems.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace lh::kern {

constexpr float kLayerNormEps = 1e-5f;

// Row loops that reduce (sum, max) are vectorised on the CPU by letting the compiler reassociate them
// (OpenMP simd); device code and builds without OpenMP get nothing.
#define LH_PRAGMA(x) _Pragma(#x)
#if defined(_OPENMP) && !defined(__CUDA_ARCH__)
#define LH_SIMD_REDUCE(op, ...) LH_PRAGMA(omp simd reduction(op : __VA_ARGS__))
#else
#define LH_SIMD_REDUCE(op, ...)
#endif

// One thread holds the whole row: reductions are the identity.
struct SerialLanes {
  LH_HD LH_INLINE int lane() const { return 0; }
  LH_HD LH_INLINE int count() const { return 1; }
  LH_HD LH_INLINE float sum(float x) const { return x; }
  LH_HD LH_INLINE float max(float x) const { return x; }
};

// ---------------------------------------------------------------- GELU (tanh approximation, GPT-2)
// tanh through one expf: glibc's tanhf is about 3x slower on the CPU, and this form is within 2e-7
// (absolute) of tanh; exp overflow to inf gives exactly ±1 at the tails.
LH_HD LH_INLINE float tanh_via_exp(float u) {
  return 1.0f - 2.0f / (1.0f + expf(2.0f * u));
}
LH_HD LH_INLINE float gelu(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanh_via_exp(k * (x + cube)));
}
LH_HD LH_INLINE float gelu_grad(float x) {
  const float k = 0.7978845608028654f;
  float cube = 0.044715f * x * x * x;
  float th = tanh_via_exp(k * (x + cube));
  float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * k * (1.0f + 3.0f * 0.044715f * x * x);
}

struct GeluForward {
  float* out;
  const float* inp;
  LH_HD void operator()(int64_t i) const { out[i] = gelu(inp[i]); }
};
struct GeluBackward {
  float* dinp;
  const float* inp;
  const float* dout;
  LH_HD void operator()(int64_t i) const { dinp[i] += gelu_grad(inp[i]) * dout[i]; }
};

// ---------------------------------------------------------------- elementwise arithmetic
struct Add {
  float* out;
  const float* a;
  const float* b;
  LH_HD void operator()(int64_t i) const { out[i] = a[i] + b[i]; }
};
struct AddInplace {
  float* y;
  const float* x;
  LH_HD void operator()(int64_t i) const { y[i] += x[i]; }
};
struct ScaleInplace {
  float* y;
  float s;
  LH_HD void operator()(int64_t i) const { y[i] *= s; }
};
// Row-broadcast of a bias: out[r, c] = bias[c] (the GEMM then adds with beta = 1).
struct BroadcastRows {
  float* out;
  const float* bias;
  int cols;
  LH_HD void operator()(int64_t i) const { out[i] = bias[i % cols]; }
};
struct Square {
  LH_HD double operator()(float x) const { return double(x) * double(x); }
};
struct ToDouble {
  LH_HD double operator()(float x) const { return double(x); }
};

// ---------------------------------------------------------------- embedding
struct EmbeddingForward {
  float* out;
  const int32_t* tokens;
  const float* wte;
  const float* wpe;
  int T, C;
  LH_HD void operator()(int64_t i) const {
    int64_t bt = i / C;
    int c = static_cast<int>(i % C);
    int t = static_cast<int>(bt % T);
    out[i] = wte[int64_t(tokens[bt]) * C + c] + wpe[int64_t(t) * C + c];
  }
};
// dwpe[t, c] += Σ_b dout[b, t, c]: one output per (t, c), so no two threads write the same place.
struct EmbeddingPositionGrad {
  float* dwpe;
  const float* dout;
  int B, T, C;
  LH_HD void operator()(int64_t i) const {
    float acc = 0.f;
    for (int b = 0; b < B; ++b) acc += dout[int64_t(b) * T * C + i];
    dwpe[i] += acc;
  }
};

// ---------------------------------------------------------------- cross-entropy backward
struct CrossEntropyBackward {
  float* dlogits;
  const float* probs;
  const int32_t* targets;
  float scale;
  int V;
  LH_HD void operator()(int64_t i) const {
    int64_t n = i / V;
    int v = static_cast<int>(i % V);
    float indicator = (v == targets[n]) ? 1.0f : 0.0f;
    dlogits[i] += scale * (probs[i] - indicator);
  }
};

// ---------------------------------------------------------------- AdamW (decoupled weight decay)
struct AdamWStep {
  float* param;
  const float* grad;
  float* m;
  float* v;
  float lr, beta1, beta2, eps, weight_decay;
  float bias_corr1, bias_corr2;  // 1 - beta^t
  LH_HD void operator()(int64_t i) const {
    float g = grad[i];
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bias_corr1;
    float vhat = vi / bias_corr2;
    param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * param[i]);
  }
};

// The step functor for 1-based step t (host side: the bias corrections are computed once per call).
inline AdamWStep make_adamw_step(float* param, const float* grad, float* m, float* v, float lr, float beta1,
                                 float beta2, float eps, float weight_decay, int t) {
  float c1 = 1.0f - static_cast<float>(std::pow(double(beta1), t));
  float c2 = 1.0f - static_cast<float>(std::pow(double(beta2), t));
  return AdamWStep{param, grad, m, v, lr, beta1, beta2, eps, weight_decay, c1, c2};
}

// ---------------------------------------------------------------- column-sum values
// Column reductions (bias and layernorm weight gradients) sum value(r, c) over rows r.
struct ColumnValue {
  const float* x;
  int C;
  LH_HD float operator()(int64_t r, int c) const { return x[r * C + c]; }
};
struct LayerNormWeightGradValue {
  const float* dout;
  const float* inp;
  const float* mean;
  const float* rstd;
  int C;
  LH_HD float operator()(int64_t r, int c) const { return dout[r * C + c] * (inp[r * C + c] - mean[r]) * rstd[r]; }
};

// ---------------------------------------------------------------- row functions
// Softmax of in[0, len) into out[0, len); out[len, cols) = 0 (the causal mask). out may equal in.
template <class L>
LH_HD void softmax_row(const L& lanes, float* out, const float* in, int len, int cols) {
  float mx = -INFINITY;
  LH_SIMD_REDUCE(max, mx)
  for (int i = lanes.lane(); i < len; i += lanes.count()) mx = in[i] > mx ? in[i] : mx;
  mx = lanes.max(mx);
  float s = 0.f;
  LH_SIMD_REDUCE(+, s)
  for (int i = lanes.lane(); i < len; i += lanes.count()) {
    float e = expf(in[i] - mx);
    out[i] = e;
    s += e;
  }
  s = lanes.sum(s);
  float inv = 1.0f / s;
  for (int i = lanes.lane(); i < len; i += lanes.count()) out[i] *= inv;
  for (int i = len + lanes.lane(); i < cols; i += lanes.count()) out[i] = 0.f;
}

// dinp = scale · out ⊙ (dout − ⟨out, dout⟩) over [0, len), zero beyond; += when accumulate.
// dinp may equal dout (each lane reads its element before writing it).
template <class L>
LH_HD void softmax_row_backward(const L& lanes, float* dinp, const float* out, const float* dout, int len, int cols,
                                float scale, bool accumulate) {
  float dot = 0.f;
  LH_SIMD_REDUCE(+, dot)
  for (int i = lanes.lane(); i < len; i += lanes.count()) dot += out[i] * dout[i];
  dot = lanes.sum(dot);
  for (int i = lanes.lane(); i < len; i += lanes.count()) {
    float g = scale * out[i] * (dout[i] - dot);
    dinp[i] = accumulate ? dinp[i] + g : g;
  }
  if (!accumulate)
    for (int i = len + lanes.lane(); i < cols; i += lanes.count()) dinp[i] = 0.f;
}

struct SoftmaxForwardRows {
  float* out;
  const float* inp;
  int cols;
  template <class L>
  LH_HD void operator()(const L& lanes, int64_t r) const {
    softmax_row(lanes, out + r * cols, inp + r * cols, cols, cols);
  }
};
struct SoftmaxBackwardRows {
  float* dinp;
  const float* out;
  const float* dout;
  int cols;
  template <class L>
  LH_HD void operator()(const L& lanes, int64_t r) const {
    softmax_row_backward(lanes, dinp + r * cols, out + r * cols, dout + r * cols, cols, cols, 1.0f, true);
  }
};

// Attention probabilities, in place on att[B·NH·T, T]: row r is query t = r mod T, which sees keys 0..t.
struct CausalSoftmaxRows {
  float* att;
  int T;
  template <class L>
  LH_HD void operator()(const L& lanes, int64_t r) const {
    float* row = att + r * T;
    softmax_row(lanes, row, row, static_cast<int>(r % T) + 1, T);
  }
};
// datt (in place) → ∂L/∂(pre-softmax scores) · scale, zero above the diagonal.
struct CausalSoftmaxBackwardRows {
  float* datt;
  const float* att;
  int T;
  float scale;
  template <class L>
  LH_HD void operator()(const L& lanes, int64_t r) const {
    softmax_row_backward(lanes, datt + r * T, att + r * T, datt + r * T, static_cast<int>(r % T) + 1, T, scale, false);
  }
};

struct LayerNormForwardRows {
  float* out;
  float* mean;
  float* rstd;
  const float* inp;
  const float* weight;
  const float* bias;
  int C;
  template <class L>
  LH_HD void operator()(const L& lanes, int64_t r) const {
    const float* x = inp + r * C;
    float* y = out + r * C;
    float s = 0.f;
    LH_SIMD_REDUCE(+, s)
    for (int i = lanes.lane(); i < C; i += lanes.count()) s += x[i];
    float m = lanes.sum(s) / C;
    float var = 0.f;
    LH_SIMD_REDUCE(+, var)
    for (int i = lanes.lane(); i < C; i += lanes.count()) {
      float d = x[i] - m;
      var += d * d;
    }
    float rs = 1.0f / sqrtf(lanes.sum(var) / C + kLayerNormEps);
    if (bias) {
      for (int i = lanes.lane(); i < C; i += lanes.count()) y[i] = (x[i] - m) * rs * weight[i] + bias[i];
    } else {
      for (int i = lanes.lane(); i < C; i += lanes.count()) y[i] = (x[i] - m) * rs * weight[i];
    }
    if (lanes.lane() == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
};

// dinp += rstd · (w⊙dout − mean(w⊙dout) − n · mean(w⊙dout⊙n)), n the normalized input.
struct LayerNormBackwardRows {
  float* dinp;
  const float* dout;
  const float* inp;
  const float* weight;
  const float* mean;
  const float* rstd;
  int C;
  template <class L>
  LH_HD void operator()(const L& lanes, int64_t r) const {
    const float* x = inp + r * C;
    const float* dy = dout + r * C;
    float* dx = dinp + r * C;
    float m = mean[r], rs = rstd[r];
    float a = 0.f, b = 0.f;
    LH_SIMD_REDUCE(+, a, b)
    for (int i = lanes.lane(); i < C; i += lanes.count()) {
      float wd = weight[i] * dy[i];
      a += wd;
      b += wd * (x[i] - m) * rs;
    }
    a = lanes.sum(a) / C;
    b = lanes.sum(b) / C;
    for (int i = lanes.lane(); i < C; i += lanes.count()) {
      float n = (x[i] - m) * rs;
      dx[i] += rs * (weight[i] * dy[i] - a - n * b);
    }
  }
};

// losses[r] = logsumexp(logits) − logits[target]; probs (may be null) = softmax(logits).
struct CrossEntropyForwardRows {
  float* losses;
  float* probs;
  const float* logits;
  const int32_t* targets;
  int V;
  template <class L>
  LH_HD void operator()(const L& lanes, int64_t r) const {
    const float* x = logits + r * V;
    float mx = -INFINITY;
    LH_SIMD_REDUCE(max, mx)
    for (int i = lanes.lane(); i < V; i += lanes.count()) mx = x[i] > mx ? x[i] : mx;
    mx = lanes.max(mx);
    float s = 0.f;
    LH_SIMD_REDUCE(+, s)
    for (int i = lanes.lane(); i < V; i += lanes.count()) s += expf(x[i] - mx);
    s = lanes.sum(s);
    if (probs) {
      float inv = 1.0f / s;
      float* p = probs + r * V;
      for (int i = lanes.lane(); i < V; i += lanes.count()) p[i] = expf(x[i] - mx) * inv;
    }
    if (lanes.lane() == 0) losses[r] = logf(s) + mx - x[targets[r]];
  }
};

}  // namespace lh::kern
