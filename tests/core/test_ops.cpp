// Forward checks of every op in core/ops.h against plain reference loops written here (double
// accumulation), plus AdamW against a hand-computed step and global-norm clipping (label core).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/ops.h"
#include "tests/core/test_ops_util.h"

namespace lh {
namespace {

using testing::max_abs_diff;
using testing::rand_tokens;
using testing::randn;

const Exec cpu = Exec::cpu();

// fp32 ops vs double references: |err| ≤ atol + rtol·|ref| is checked as a max-abs bound on O(1) data.
constexpr double kTol = 1e-4;

TEST(Ops, MatmulAllTransposesStridesAndBeta) {
  const int M = 7, N = 5, K = 9, pad = 3;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      // A is stored M×K (or K×M when transposed) with a padded row stride; same for B.
      int a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
      int lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
      auto A = randn(size_t(a_rows) * lda, 1), B = randn(size_t(b_rows) * ldb, 2), C = randn(size_t(M) * ldc, 3);
      std::vector<double> ref(C.begin(), C.end());
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          double s = 0;
          for (int k = 0; k < K; ++k)
            s += double(ta ? A[k * lda + i] : A[i * lda + k]) * double(tb ? B[j * ldb + k] : B[k * ldb + j]);
          ref[i * ldc + j] = 0.5 * s + 2.0 * C[i * ldc + j];
        }
      matmul(cpu, ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.0f, C.data(), ldc);
      EXPECT_LT(max_abs_diff(C, ref), kTol) << "trans_a=" << ta << " trans_b=" << tb;
    }
}

TEST(Ops, LinearForwardWithAndWithoutBias) {
  const int BT = 6, C = 8, OC = 5;
  auto inp = randn(BT * C, 1), w = randn(OC * C, 2), b = randn(OC, 3);
  for (bool with_bias : {true, false}) {
    std::vector<float> out(BT * OC, 123.f);  // overwritten, not accumulated
    linear_forward(cpu, out.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, BT, C, OC);
    std::vector<double> ref(BT * OC);
    for (int r = 0; r < BT; ++r)
      for (int o = 0; o < OC; ++o) {
        double s = with_bias ? b[o] : 0.0;
        for (int c = 0; c < C; ++c) s += double(inp[r * C + c]) * w[o * C + c];
        ref[r * OC + o] = s;
      }
    EXPECT_LT(max_abs_diff(out, ref), kTol) << "bias=" << with_bias;
  }
}

TEST(Ops, LayernormForward) {
  const int N = 5, C = 16;
  auto x = randn(N * C, 1, 3.0f), w = randn(C, 2), b = randn(C, 3);
  for (int i = 0; i < C; ++i) x[i] += 10.f;  // a row with a large mean
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(cpu, out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  std::vector<double> ref(N * C), ref_mean(N), ref_rstd(N);
  for (int r = 0; r < N; ++r) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[r * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[r * C + c] - m) * (x[r * C + c] - m);
    v /= C;
    double rs = 1.0 / std::sqrt(v + 1e-5);
    ref_mean[r] = m;
    ref_rstd[r] = rs;
    for (int c = 0; c < C; ++c) ref[r * C + c] = (x[r * C + c] - m) * rs * w[c] + b[c];
  }
  EXPECT_LT(max_abs_diff(out, ref), kTol);
  EXPECT_LT(max_abs_diff(mean, ref_mean), kTol);
  EXPECT_LT(max_abs_diff(rstd, ref_rstd), kTol);
}

TEST(Ops, GeluForwardTanhApproximation) {
  const int n = 5000;  // above the size where the Thrust/OpenMP path takes over
  auto x = randn(n, 4, 3.0f);
  std::vector<float> out(n);
  gelu_forward(cpu, out.data(), x.data(), n);
  std::vector<double> ref(n);
  for (int i = 0; i < n; ++i) {
    double v = x[i];
    ref[i] = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  EXPECT_LT(max_abs_diff(out, ref), kTol);
}

TEST(Ops, SoftmaxForwardRows) {
  const int rows = 4, cols = 11;
  auto x = randn(rows * cols, 5, 4.0f);
  x[3] = 80.f;  // overflows exp() unless the row max is subtracted
  std::vector<float> out(rows * cols);
  softmax_forward(cpu, out.data(), x.data(), rows, cols);
  std::vector<double> ref(rows * cols);
  for (int r = 0; r < rows; ++r) {
    double mx = -1e300, s = 0;
    for (int c = 0; c < cols; ++c) mx = std::max(mx, double(x[r * cols + c]));
    for (int c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - mx);
    for (int c = 0; c < cols; ++c) ref[r * cols + c] = std::exp(x[r * cols + c] - mx) / s;
  }
  EXPECT_LT(max_abs_diff(out, ref), 1e-6);
}

TEST(Ops, CausalAttentionForward) {
  const int B = 2, T = 5, NH = 3, hs = 4, C = NH * hs;
  auto qkv = randn(size_t(B) * T * 3 * C, 6);
  std::vector<float> out(B * T * C), att(B * NH * T * T, 7.f);
  attention_forward(cpu, out.data(), att.data(), qkv.data(), B, T, C, NH);
  std::vector<double> ref_out(B * T * C), ref_att(B * NH * T * T, 0.0);
  const double scale = 1.0 / std::sqrt(double(hs));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* q = &qkv[(b * T + t) * 3 * C + h * hs];
        std::vector<double> s(t + 1);
        double mx = -1e300, z = 0;
        for (int j = 0; j <= t; ++j) {
          const float* k = &qkv[(b * T + j) * 3 * C + C + h * hs];
          double d = 0;
          for (int i = 0; i < hs; ++i) d += double(q[i]) * k[i];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        for (int j = 0; j <= t; ++j) z += std::exp(s[j] - mx);
        for (int i = 0; i < hs; ++i) ref_out[(b * T + t) * C + h * hs + i] = 0;
        for (int j = 0; j <= t; ++j) {
          double p = std::exp(s[j] - mx) / z;
          ref_att[((b * NH + h) * T + t) * T + j] = p;
          const float* v = &qkv[(b * T + j) * 3 * C + 2 * C + h * hs];
          for (int i = 0; i < hs; ++i) ref_out[(b * T + t) * C + h * hs + i] += p * v[i];
        }
      }
  EXPECT_LT(max_abs_diff(out, ref_out), kTol);
  EXPECT_LT(max_abs_diff(att, ref_att), 1e-6);  // includes the exact zeros above the diagonal
}

TEST(Ops, EmbeddingForward) {
  const int B = 2, T = 3, C = 4, V = 7;
  auto tok = rand_tokens(B * T, V, 8);
  auto wte = randn(V * C, 9), wpe = randn(T * C, 10);
  std::vector<float> out(B * T * C);
  embedding_forward(cpu, out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  std::vector<double> ref(B * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        ref[(b * T + t) * C + c] = wte[tok[b * T + t] * C + c] + wpe[t * C + c];  // one fp32 add
  EXPECT_EQ(max_abs_diff(out, ref), 0.0);
}

TEST(Ops, CrossEntropyForwardLossesAndProbs) {
  const int N = 4, V = 9;
  auto logits = randn(N * V, 11, 5.0f);
  logits[2] = 100.f;  // stable only with the max subtracted
  auto targets = rand_tokens(N, V, 12);
  std::vector<float> losses(N), probs(N * V);
  crossentropy_forward(cpu, losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  std::vector<double> ref_l(N), ref_p(N * V);
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, z = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, double(logits[n * V + v]));
    for (int v = 0; v < V; ++v) z += std::exp(logits[n * V + v] - mx);
    for (int v = 0; v < V; ++v) ref_p[n * V + v] = std::exp(logits[n * V + v] - mx) / z;
    ref_l[n] = std::log(z) + mx - logits[n * V + targets[n]];
  }
  EXPECT_LT(max_abs_diff(losses, ref_l), kTol);
  EXPECT_LT(max_abs_diff(probs, ref_p), 1e-6);
  // probs may be null: the losses alone.
  std::vector<float> losses2(N);
  crossentropy_forward(cpu, losses2.data(), nullptr, logits.data(), targets.data(), N, V);
  EXPECT_EQ(losses2, losses);
}

TEST(Ops, ResidualAddScaleSums) {
  const int64_t n = 10000;
  auto a = randn(n, 13), b = randn(n, 14);
  std::vector<float> out(n);
  residual_forward(cpu, out.data(), a.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]);
  std::vector<float> y = a;
  add_inplace(cpu, y.data(), b.data(), n);
  EXPECT_EQ(y, out);
  scale_inplace(cpu, y.data(), -0.5f, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], out[i] * -0.5f);
  double s = 0, ss = 0;
  for (float v : a) s += v, ss += double(v) * v;
  EXPECT_NEAR(sum(cpu, a.data(), n), s, 1e-3);
  EXPECT_NEAR(sum_squares(cpu, a.data(), n), ss, 1e-6 * ss);
  EXPECT_EQ(sum(cpu, a.data(), 0), 0.f);
  // Double accumulation keeps small terms after a large one (fp32 would drop all of them).
  std::vector<float> big(1 << 20, 1.0f);
  big[0] = 1e8f;
  EXPECT_EQ(sum(cpu, big.data(), int64_t(big.size())), 1e8f + float((1 << 20) - 1));
}

TEST(Ops, AdamWHandComputedSteps) {
  AdamWConfig cfg;
  cfg.lr = 0.1f;
  cfg.beta1 = 0.9f;
  cfg.beta2 = 0.95f;
  cfg.eps = 1e-8f;
  cfg.weight_decay = 0.5f;  // ignored: the weight_decay argument wins (callers pass 0 for biases)
  float p = 1.0f, g = 0.5f, m = 0.f, v = 0.f;
  // t=1: m=0.05, v=0.0125, m̂=0.5, v̂=0.25, m̂/√v̂=1 → p = 1 − 0.1·(1 + 0.1·1) = 0.89.
  adamw_update(cpu, &p, &g, &m, &v, 1, cfg, 1, 0.1f);
  EXPECT_NEAR(m, 0.05f, 1e-7);
  EXPECT_NEAR(v, 0.0125f, 1e-8);
  EXPECT_NEAR(p, 0.89f, 1e-6);
  // t=2, g=−0.5: m=−0.005, v=0.024375, m̂=−0.005/0.19, v̂=0.024375/0.0975=0.25
  //   → p = 0.89 − 0.1·(−0.0263158/0.5 + 0.1·0.89) = 0.8863632.
  g = -0.5f;
  adamw_update(cpu, &p, &g, &m, &v, 1, cfg, 2, 0.1f);
  EXPECT_NEAR(p, 0.8863632f, 1e-6);
  // No decay when the argument says 0, whatever cfg.weight_decay is.
  float q = 2.0f, gq = 0.0f, mq = 0.f, vq = 0.f;
  adamw_update(cpu, &q, &gq, &mq, &vq, 1, cfg, 1, 0.0f);
  EXPECT_EQ(q, 2.0f);
  // The vector path (Thrust/OpenMP) agrees with the same formula element by element.
  const int n = 6000;
  auto P = randn(n, 15), G = randn(n, 16), Mv = randn(n, 17, 0.1f), Vv = randn(n, 18, 0.1f);
  for (auto& x : Vv) x = x * x;
  auto P0 = P, M0 = Mv, V0 = Vv;
  adamw_update(cpu, P.data(), G.data(), Mv.data(), Vv.data(), n, cfg, 3, 0.1f);
  for (int i = 0; i < n; ++i) {
    double mi = 0.9 * M0[i] + 0.1 * G[i], vi = 0.95 * V0[i] + 0.05 * double(G[i]) * G[i];
    double mh = mi / (1 - std::pow(0.9, 3)), vh = vi / (1 - std::pow(0.95, 3));
    double ref = P0[i] - 0.1 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * P0[i]);
    ASSERT_NEAR(P[i], ref, 1e-5 + 1e-5 * std::fabs(ref)) << i;
  }
}

TEST(Ops, ClipGradNormScalesOnlyAboveTheLimit) {
  std::vector<float> a = {3.f, 0.f}, b = {4.f};
  float* grads[] = {a.data(), b.data()};
  int64_t sizes[] = {2, 1};
  EXPECT_FLOAT_EQ(clip_grad_norm(cpu, grads, sizes, 2, 10.f), 5.f);
  EXPECT_EQ(a[0], 3.f);
  EXPECT_EQ(b[0], 4.f);
  EXPECT_FLOAT_EQ(clip_grad_norm(cpu, grads, sizes, 2, 1.f), 5.f);
  EXPECT_FLOAT_EQ(a[0], 0.6f);
  EXPECT_FLOAT_EQ(b[0], 0.8f);
  EXPECT_NEAR(clip_grad_norm(cpu, grads, sizes, 2, 1.f), 1.f, 1e-6);
  // A non-finite norm is reported and nothing is scaled (the caller skips the step).
  std::vector<float> c = {NAN, 1.f};
  float* g2[] = {c.data()};
  int64_t s2[] = {2};
  EXPECT_TRUE(std::isnan(clip_grad_norm(cpu, g2, s2, 1, 1.f)));
  EXPECT_EQ(c[1], 1.f);
}

TEST(OpsDeathTest, BrokenInvariantsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float x = 0;
  AdamWConfig cfg;
  EXPECT_DEATH(adamw_update(cpu, &x, &x, &x, &x, 1, cfg, 0, 0.f), "1-based");
  EXPECT_DEATH(attention_forward(cpu, &x, &x, &x, 1, 1, 10, 3), "not divisible");
}

}  // namespace
}  // namespace lh
