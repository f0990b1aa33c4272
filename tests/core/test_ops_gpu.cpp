// CUDA vs CPU for every op of core/ops.h, forward and backward, on random inputs (labels core, gpu).
// Skips when no CUDA device is usable. Backward gradients start from random values so the CUDA path
// must accumulate exactly like the CPU path.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/core/test_ops_util.h"

#if defined(LH_USE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace lh {
namespace {

using testing::rand_tokens;
using testing::randn;

// A device copy of a host vector, and back.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : n_(host.size()) {
    DType dt = sizeof(T) == 4 && std::is_floating_point<T>::value ? DType::f32 : DType::i32;
    auto t = Tensor::create({static_cast<int64_t>(n_)}, dt, Device::cuda);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    t_ = std::move(t).value();
    Status s = copy_bytes(t_.raw_data(), Device::cuda, host.data(), Device::cpu, n_ * sizeof(T));
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  T* get() const { return static_cast<T*>(t_.raw_data()); }
  std::vector<T> host() const {
    std::vector<T> v(n_);
    Status s = copy_bytes(v.data(), Device::cpu, t_.raw_data(), Device::cuda, n_ * sizeof(T));
    EXPECT_TRUE(s.ok()) << s.to_string();
    return v;
  }

 private:
  size_t n_;
  Tensor t_;
};
using DevF = DeviceArray<float>;
using DevI = DeviceArray<int32_t>;

// |gpu − cpu| ≤ atol + rtol·|cpu| elementwise (summation order differs between the two paths).
void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu_ref, const std::string& what,
                  double atol = 1e-4, double rtol = 1e-4) {
  ASSERT_EQ(gpu.size(), cpu_ref.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < gpu.size(); ++i)
    if (!(std::fabs(double(gpu[i]) - cpu_ref[i]) <= atol + rtol * std::fabs(double(cpu_ref[i])))) {
      if (bad++ == 0) first = i;
    }
  EXPECT_EQ(bad, 0u) << what << ": first mismatch at " << first << " gpu=" << gpu[first] << " cpu=" << cpu_ref[first];
}

class OpsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_device_summary();
  }
  const Exec cpu = Exec::cpu();
  const Exec gpu = Exec::cuda();
};

TEST_F(OpsGpu, MatmulTransposes) {
  const int M = 45, N = 37, K = 29;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      auto A = randn(M * K, 1), B = randn(K * N, 2), C = randn(M * N, 3);
      DevF dA(A), dB(B), dC(C);
      matmul(cpu, ta, tb, M, N, K, 0.5f, A.data(), ta ? M : K, B.data(), tb ? K : N, 1.5f, C.data(), N);
      matmul(gpu, ta, tb, M, N, K, 0.5f, dA.get(), ta ? M : K, dB.get(), tb ? K : N, 1.5f, dC.get(), N);
      expect_close(dC.host(), C, "matmul ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    }
}

TEST_F(OpsGpu, LinearForwardBackward) {
  const int BT = 1100, C = 70, OC = 45;  // > 512 rows: the column sum takes its multi-chunk path
  auto inp = randn(BT * C, 4), w = randn(OC * C, 5), b = randn(OC, 6), dout = randn(BT * OC, 7);
  auto dinp = randn(BT * C, 8), dw = randn(OC * C, 9), db = randn(OC, 10);
  std::vector<float> out(BT * OC);
  DevF d_inp(inp), d_w(w), d_b(b), d_out(out), d_dout(dout), d_dinp(dinp), d_dw(dw), d_db(db);
  linear_forward(cpu, out.data(), inp.data(), w.data(), b.data(), BT, C, OC);
  linear_forward(gpu, d_out.get(), d_inp.get(), d_w.get(), d_b.get(), BT, C, OC);
  expect_close(d_out.host(), out, "linear out");
  linear_backward(cpu, dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), BT, C, OC);
  linear_backward(gpu, d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(), BT, C, OC);
  expect_close(d_dinp.host(), dinp, "linear dinp");
  expect_close(d_dw.host(), dw, "linear dweight", 1e-3, 1e-4);  // sums over 1100 rows
  expect_close(d_db.host(), db, "linear dbias", 1e-3, 1e-4);
}

TEST_F(OpsGpu, LayernormForwardBackwardOnAStream) {
  const int N = 1030, C = 100;
  auto x = randn(N * C, 11, 2.0f), w = randn(C, 12), b = randn(C, 13), dout = randn(N * C, 14);
  auto dx = randn(N * C, 15), dw = randn(C, 16), db = randn(C, 17);
  std::vector<float> out(N * C), mean(N), rstd(N);
  DevF d_x(x), d_w(w), d_b(b), d_out(out), d_mean(mean), d_rstd(rstd), d_dout(dout), d_dx(dx), d_dw(dw), d_db(db);
  Exec on_stream = gpu;
#if defined(LH_USE_CUDA)
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  on_stream.stream = stream;
#endif
  layernorm_forward(cpu, out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_forward(on_stream, d_out.get(), d_mean.get(), d_rstd.get(), d_x.get(), d_w.get(), d_b.get(), N, C);
  layernorm_backward(cpu, dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                     C);
  layernorm_backward(on_stream, d_dx.get(), d_dw.get(), d_db.get(), d_dout.get(), d_x.get(), d_w.get(), d_mean.get(),
                     d_rstd.get(), N, C);
#if defined(LH_USE_CUDA)
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
#endif
  expect_close(d_out.host(), out, "layernorm out");
  expect_close(d_mean.host(), mean, "layernorm mean");
  expect_close(d_rstd.host(), rstd, "layernorm rstd");
  expect_close(d_dx.host(), dx, "layernorm dinp");
  expect_close(d_dw.host(), dw, "layernorm dweight", 1e-3, 1e-4);
  expect_close(d_db.host(), db, "layernorm dbias", 1e-3, 1e-4);
}

TEST_F(OpsGpu, GeluForwardBackward) {
  const int64_t n = 100003;
  auto x = randn(n, 18, 3.0f), dout = randn(n, 19), dx = randn(n, 20);
  std::vector<float> out(n);
  DevF d_x(x), d_out(out), d_dout(dout), d_dx(dx);
  gelu_forward(cpu, out.data(), x.data(), n);
  gelu_forward(gpu, d_out.get(), d_x.get(), n);
  expect_close(d_out.host(), out, "gelu out", 1e-5, 1e-5);
  gelu_backward(cpu, dx.data(), x.data(), dout.data(), n);
  gelu_backward(gpu, d_dx.get(), d_x.get(), d_dout.get(), n);
  expect_close(d_dx.host(), dx, "gelu dinp", 1e-5, 1e-5);
}

TEST_F(OpsGpu, SoftmaxForwardBackward) {
  const int rows = 77, cols = 300;
  auto x = randn(rows * cols, 21, 3.0f), dout = randn(rows * cols, 22), dx = randn(rows * cols, 23);
  std::vector<float> out(rows * cols);
  DevF d_x(x), d_out(out), d_dout(dout), d_dx(dx);
  softmax_forward(cpu, out.data(), x.data(), rows, cols);
  softmax_forward(gpu, d_out.get(), d_x.get(), rows, cols);
  expect_close(d_out.host(), out, "softmax out", 1e-6, 1e-4);
  softmax_backward(cpu, dx.data(), out.data(), dout.data(), rows, cols);
  softmax_backward(gpu, d_dx.get(), d_out.get(), d_dout.get(), rows, cols);
  expect_close(d_dx.host(), dx, "softmax dinp");
}

TEST_F(OpsGpu, AttentionForwardBackward) {
  const int B = 2, T = 33, NH = 3, hs = 8, C = NH * hs;
  auto qkv = randn(size_t(B) * T * 3 * C, 24), dout = randn(size_t(B) * T * C, 25);
  auto dqkv = randn(qkv.size(), 26);
  std::vector<float> out(B * T * C), att(size_t(B) * NH * T * T);
  std::vector<float> ws(attention_backward_workspace(B, T, C, NH) / sizeof(float));
  DevF d_qkv(qkv), d_dout(dout), d_dqkv(dqkv), d_out(out), d_att(att), d_ws(ws);
  attention_forward(cpu, out.data(), att.data(), qkv.data(), B, T, C, NH);
  attention_forward(gpu, d_out.get(), d_att.get(), d_qkv.get(), B, T, C, NH);
  expect_close(d_out.host(), out, "attention out");
  expect_close(d_att.host(), att, "attention probabilities", 1e-6, 1e-4);
  attention_backward(cpu, dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH, ws.data());
  attention_backward(gpu, d_dqkv.get(), d_dout.get(), d_qkv.get(), d_att.get(), B, T, C, NH, d_ws.get());
  expect_close(d_dqkv.host(), dqkv, "attention dqkv");
}

TEST_F(OpsGpu, EmbeddingForwardBackward) {
  const int B = 3, T = 17, C = 40, V = 11;  // 51 positions over 11 tokens: the atomic adds collide
  auto tok = rand_tokens(B * T, V, 27);
  auto wte = randn(V * C, 28), wpe = randn(T * C, 29), dout = randn(B * T * C, 30);
  auto dwte = randn(V * C, 31), dwpe = randn(T * C, 32);
  std::vector<float> out(B * T * C);
  DevI d_tok(tok);
  DevF d_wte(wte), d_wpe(wpe), d_dout(dout), d_dwte(dwte), d_dwpe(dwpe), d_out(out);
  embedding_forward(cpu, out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  embedding_forward(gpu, d_out.get(), d_tok.get(), d_wte.get(), d_wpe.get(), B, T, C);
  expect_close(d_out.host(), out, "embedding out", 0, 0);
  embedding_backward(cpu, dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
  embedding_backward(gpu, d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tok.get(), B, T, C);
  expect_close(d_dwte.host(), dwte, "embedding dwte", 1e-5, 1e-5);
  expect_close(d_dwpe.host(), dwpe, "embedding dwpe", 1e-5, 1e-5);
}

TEST_F(OpsGpu, CrossEntropyForwardBackward) {
  const int N = 37, V = 1000;
  auto logits = randn(N * V, 33, 4.0f), dl = randn(N * V, 34);
  auto targets = rand_tokens(N, V, 35);
  std::vector<float> losses(N), probs(N * V);
  DevF d_logits(logits), d_dl(dl), d_losses(losses), d_probs(probs);
  DevI d_targets(targets);
  crossentropy_forward(cpu, losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  crossentropy_forward(gpu, d_losses.get(), d_probs.get(), d_logits.get(), d_targets.get(), N, V);
  expect_close(d_losses.host(), losses, "crossentropy losses");
  expect_close(d_probs.host(), probs, "crossentropy probs", 1e-7, 1e-4);
  crossentropy_backward(cpu, dl.data(), probs.data(), targets.data(), 1.0f / N, N, V);
  crossentropy_backward(gpu, d_dl.get(), d_probs.get(), d_targets.get(), 1.0f / N, N, V);
  expect_close(d_dl.host(), dl, "crossentropy dlogits", 1e-6, 1e-5);
}

TEST_F(OpsGpu, ResidualAddScaleSums) {
  const int64_t n = 300001;
  auto a = randn(n, 36), b = randn(n, 37);
  std::vector<float> out(n);
  DevF d_a(a), d_b(b), d_out(out);
  residual_forward(cpu, out.data(), a.data(), b.data(), n);
  residual_forward(gpu, d_out.get(), d_a.get(), d_b.get(), n);
  expect_close(d_out.host(), out, "residual", 0, 0);
  add_inplace(cpu, a.data(), b.data(), n);
  add_inplace(gpu, d_a.get(), d_b.get(), n);
  scale_inplace(cpu, a.data(), 0.75f, n);
  scale_inplace(gpu, d_a.get(), 0.75f, n);
  expect_close(d_a.host(), a, "add_inplace + scale_inplace", 0, 0);
  EXPECT_NEAR(sum(gpu, d_a.get(), n), sum(cpu, a.data(), n), 1e-3);
  float ss = sum_squares(cpu, a.data(), n);
  EXPECT_NEAR(sum_squares(gpu, d_a.get(), n), ss, 1e-6 * ss);
}

TEST_F(OpsGpu, AdamWAndClip) {
  const int64_t n = 70001;
  auto p = randn(n, 38), g = randn(n, 39), m = randn(n, 40, 0.1f), v = randn(n, 41, 0.1f);
  for (auto& x : v) x = x * x;
  DevF d_p(p), d_g(g), d_m(m), d_v(v);
  AdamWConfig cfg;
  for (int t = 1; t <= 3; ++t) {
    adamw_update(cpu, p.data(), g.data(), m.data(), v.data(), n, cfg, t, 0.1f);
    adamw_update(gpu, d_p.get(), d_g.get(), d_m.get(), d_v.get(), n, cfg, t, 0.1f);
  }
  expect_close(d_p.host(), p, "adamw param", 1e-6, 1e-5);
  expect_close(d_m.host(), m, "adamw m", 1e-7, 1e-5);
  expect_close(d_v.host(), v, "adamw v", 1e-7, 1e-5);
  float* cg[] = {g.data(), p.data()};
  float* gg[] = {d_g.get(), d_p.get()};
  int64_t sizes[] = {n, n};
  float cn = clip_grad_norm(cpu, cg, sizes, 2, 1.0f);
  float gn = clip_grad_norm(gpu, gg, sizes, 2, 1.0f);
  EXPECT_NEAR(gn, cn, 1e-4 * cn);
  expect_close(d_g.host(), g, "clipped grads", 1e-7, 1e-5);
}

}  // namespace
}  // namespace lh
