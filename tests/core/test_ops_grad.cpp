// Backward checks of every op in core/ops.h against central finite differences (label core).
// Each test takes L = Σ w·y over the op's output y (fp32 forward, loss summed in double), runs the
// backward with dout = w into gradients pre-filled with kBase (backward must ADD), and compares the
// added amount with (L(x+h) − L(x−h)) / 2h for every input element.
//
// Bound: |g_fd - g|_2 / |g|_2 < 2e-3. With h = 1e-2 the truncation error O(h^2 L''') and the fp32
// roundoff in L (about 1e-7 sum|w y| / h) stay below 3e-5 on these shapes (measured), so the bound has
// a wide margin, while a wrong or missing term in a backward gives errors of 1e-1 and more.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/ops.h"
#include "tests/core/test_ops_util.h"

namespace lh {
namespace {

using testing::finite_diff;
using testing::minus;
using testing::rand_tokens;
using testing::randn;
using testing::rel_error;
using testing::weighted_sum;

const Exec cpu = Exec::cpu();
constexpr double kRelBound = 2e-3;
constexpr float kBase = 0.25f;

std::vector<float> filled(size_t n) {
  return std::vector<float>(n, kBase);
}

TEST(OpsGrad, Linear) {
  const int BT = 3, C = 4, OC = 5;
  auto inp = randn(BT * C, 1), w = randn(OC * C, 2), b = randn(OC, 3), wy = randn(BT * OC, 4);
  std::vector<float> out(BT * OC);
  auto loss = [&] {
    linear_forward(cpu, out.data(), inp.data(), w.data(), b.data(), BT, C, OC);
    return weighted_sum(out, wy);
  };
  auto dinp = filled(inp.size()), dw = filled(w.size()), db = filled(b.size());
  linear_backward(cpu, dinp.data(), dw.data(), db.data(), wy.data(), inp.data(), w.data(), BT, C, OC);
  EXPECT_LT(rel_error(minus(dinp, kBase), finite_diff(inp, loss)), kRelBound);
  EXPECT_LT(rel_error(minus(dw, kBase), finite_diff(w, loss)), kRelBound);
  EXPECT_LT(rel_error(minus(db, kBase), finite_diff(b, loss)), kRelBound);
  // Null gradient pointers are skipped.
  auto dinp2 = filled(inp.size());
  linear_backward(cpu, dinp2.data(), nullptr, nullptr, wy.data(), inp.data(), w.data(), BT, C, OC);
  EXPECT_EQ(dinp2, dinp);
}

TEST(OpsGrad, Layernorm) {
  const int N = 3, C = 8;
  auto x = randn(N * C, 5, 2.0f), w = randn(C, 6), b = randn(C, 7), wy = randn(N * C, 8);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(cpu, out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return weighted_sum(out, wy);
  };
  loss();  // mean/rstd of the unperturbed input
  auto dx = filled(x.size()), dw = filled(C), db = filled(C);
  layernorm_backward(cpu, dx.data(), dw.data(), db.data(), wy.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                     C);
  EXPECT_LT(rel_error(minus(dx, kBase), finite_diff(x, loss)), kRelBound);
  EXPECT_LT(rel_error(minus(dw, kBase), finite_diff(w, loss)), kRelBound);
  EXPECT_LT(rel_error(minus(db, kBase), finite_diff(b, loss)), kRelBound);
}

TEST(OpsGrad, Gelu) {
  const int n = 64;
  auto x = randn(n, 9, 2.0f), wy = randn(n, 10);
  std::vector<float> out(n);
  auto loss = [&] {
    gelu_forward(cpu, out.data(), x.data(), n);
    return weighted_sum(out, wy);
  };
  auto dx = filled(n);
  gelu_backward(cpu, dx.data(), x.data(), wy.data(), n);
  EXPECT_LT(rel_error(minus(dx, kBase), finite_diff(x, loss)), kRelBound);
}

TEST(OpsGrad, Softmax) {
  const int rows = 3, cols = 7;
  auto x = randn(rows * cols, 11, 2.0f), wy = randn(rows * cols, 12);
  std::vector<float> out(rows * cols);
  auto loss = [&] {
    softmax_forward(cpu, out.data(), x.data(), rows, cols);
    return weighted_sum(out, wy);
  };
  loss();
  auto dx = filled(x.size());
  softmax_backward(cpu, dx.data(), out.data(), wy.data(), rows, cols);
  EXPECT_LT(rel_error(minus(dx, kBase), finite_diff(x, loss)), kRelBound);
}

TEST(OpsGrad, CausalAttention) {
  const int B = 2, T = 5, NH = 2, hs = 3, C = NH * hs;
  auto qkv = randn(size_t(B) * T * 3 * C, 13), wy = randn(size_t(B) * T * C, 14);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    attention_forward(cpu, out.data(), att.data(), qkv.data(), B, T, C, NH);
    return weighted_sum(out, wy);
  };
  loss();
  std::vector<float> ws(attention_backward_workspace(B, T, C, NH) / sizeof(float), NAN);  // must not be read first
  auto dqkv = filled(qkv.size());
  attention_backward(cpu, dqkv.data(), wy.data(), qkv.data(), att.data(), B, T, C, NH, ws.data());
  auto fd = finite_diff(qkv, loss);
  EXPECT_LT(rel_error(minus(dqkv, kBase), fd), kRelBound);
  // Causality: when only position 0's output matters, keys and values of later positions get
  // exactly no gradient.
  std::vector<float> w0(wy.size(), 0.f), d0(qkv.size(), 0.f);
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c) w0[size_t(b) * T * C + c] = 1.f;
  attention_backward(cpu, d0.data(), w0.data(), qkv.data(), att.data(), B, T, C, NH, ws.data());
  for (int b = 0; b < B; ++b)
    for (int t = 1; t < T; ++t)
      for (int c = C; c < 3 * C; ++c) ASSERT_EQ(d0[(size_t(b) * T + t) * 3 * C + c], 0.f) << b << "," << t << "," << c;
}

TEST(OpsGrad, EmbeddingWithRepeatedTokens) {
  const int B = 2, T = 4, C = 5, V = 3;  // 8 positions over 3 tokens: repeats are certain
  auto tok = rand_tokens(B * T, V, 15);
  auto wte = randn(V * C, 16), wpe = randn(T * C, 17), wy = randn(B * T * C, 18);
  std::vector<float> out(B * T * C);
  auto loss = [&] {
    embedding_forward(cpu, out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    return weighted_sum(out, wy);
  };
  auto dwte = filled(wte.size()), dwpe = filled(wpe.size());
  embedding_backward(cpu, dwte.data(), dwpe.data(), wy.data(), tok.data(), B, T, C);
  EXPECT_LT(rel_error(minus(dwte, kBase), finite_diff(wte, loss)), kRelBound);
  EXPECT_LT(rel_error(minus(dwpe, kBase), finite_diff(wpe, loss)), kRelBound);
}

TEST(OpsGrad, CrossEntropy) {
  const int N = 4, V = 6;
  const float scale = 1.0f / N;
  auto logits = randn(N * V, 19, 2.0f);
  auto targets = rand_tokens(N, V, 20);
  std::vector<float> losses(N), probs(N * V);
  auto loss = [&] {
    crossentropy_forward(cpu, losses.data(), probs.data(), logits.data(), targets.data(), N, V);
    double s = 0;
    for (float l : losses) s += l;
    return s * scale;
  };
  loss();
  auto dl = filled(logits.size());
  crossentropy_backward(cpu, dl.data(), probs.data(), targets.data(), scale, N, V);
  EXPECT_LT(rel_error(minus(dl, kBase), finite_diff(logits, loss)), kRelBound);
}

TEST(OpsGrad, ResidualIsTwoAccumulations) {
  // out = a + b, so ∂L/∂a = ∂L/∂b = dout: the model's residual backward is add_inplace into both.
  const int n = 20;
  auto a = randn(n, 21), b = randn(n, 22), wy = randn(n, 23);
  std::vector<float> out(n);
  auto loss = [&] {
    residual_forward(cpu, out.data(), a.data(), b.data(), n);
    return weighted_sum(out, wy);
  };
  auto da = filled(n), db = filled(n);
  add_inplace(cpu, da.data(), wy.data(), n);
  add_inplace(cpu, db.data(), wy.data(), n);
  EXPECT_LT(rel_error(minus(da, kBase), finite_diff(a, loss)), kRelBound);
  EXPECT_LT(rel_error(minus(db, kBase), finite_diff(b, loss)), kRelBound);
}

}  // namespace
}  // namespace lh
