// Tests for the GPT model: full-model finite-difference gradient checks (untied, tied, subspace),
// stage-wise forward/backward equal to the whole model, seeded init per group, config errors (label core).
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "core/gpt.h"
#include "core/ops.h"
#include "core/rng.h"
#include "tests/core/tp_threads.h"

namespace lh {
namespace {

GptConfig tiny_config() {
  GptConfig c;
  c.vocab = 16;
  c.seq = 6;
  c.layers = 2;
  c.d_model = 8;
  c.heads = 2;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
  int B, T;
};

Batch make_batch(const GptConfig& c, int B, int T, uint64_t seed) {
  Batch b{{}, {}, B, T};
  Rng rng(seed);
  for (int i = 0; i < B * T; ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng.below(c.vocab)));
    b.targets.push_back(static_cast<int32_t>(rng.below(c.vocab)));
  }
  return b;
}

float loss_of(Gpt& m, const Batch& b) {
  ActivationCache c;
  auto r = m.forward(c, b.tokens.data(), b.targets.data(), b.B, b.T);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : NAN;
}

// For every parameter slice: the analytic gradient along a random direction d against the central
// difference (L(θ+εd) − L(θ−εd)) / 2ε. A direction sums many coordinates, so the signal stays far above
// float32 rounding, and a per-slice check points at the tensor whose gradient is wrong.
void check_gradients(const GptConfig& cfg, uint64_t seed) {
  auto made = Gpt::create(cfg, Device::cpu, seed);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Gpt& m = *made;
  // Larger-than-default weights so every path carries a gradient well above rounding noise.
  Rng init(seed + 99);
  for (auto* g : m.param_groups())
    for (int64_t i = 0; i < g->numel; ++i) g->params.at(i) += 0.3f * init.normal();
  const Batch b = make_batch(cfg, 2, cfg.seq, seed + 1);
  ActivationCache cache;
  ASSERT_TRUE(m.zero_grad().ok());
  auto loss = m.forward(cache, b.tokens.data(), b.targets.data(), b.B, b.T);
  ASSERT_TRUE(loss.ok()) << loss.status().to_string();
  ASSERT_TRUE(m.backward(cache).ok());

  Rng dir_rng(seed + 7);
  int checked = 0;
  for (auto* g : m.param_groups()) {
    for (const auto& s : g->slices) {
      std::vector<float> d(s.numel());
      double analytic = 0, dnorm = 0;
      for (int64_t i = 0; i < s.numel(); ++i) {
        d[i] = dir_rng.normal();
        dnorm += double(d[i]) * d[i];
      }
      dnorm = std::sqrt(dnorm);
      for (int64_t i = 0; i < s.numel(); ++i) {
        d[i] = static_cast<float>(d[i] / dnorm);
        analytic += double(d[i]) * g->grads.at(s.offset + i);
      }
      const float eps = 1e-2f;
      float* p = g->params.data<float>() + s.offset;
      std::vector<float> saved(p, p + s.numel());
      for (int64_t i = 0; i < s.numel(); ++i) p[i] = saved[i] + eps * d[i];
      const double lp = loss_of(m, b);
      for (int64_t i = 0; i < s.numel(); ++i) p[i] = saved[i] - eps * d[i];
      const double lm = loss_of(m, b);
      std::copy(saved.begin(), saved.end(), p);
      const double numeric = (lp - lm) / (2.0 * eps);
      EXPECT_NEAR(numeric, analytic, 2e-2 * std::fabs(analytic) + 2e-4)
          << g->name << "." << s.name << " (" << cfg.describe() << ")";
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(GptGradient, UntiedHeadMatchesFiniteDifferences) {
  check_gradients(tiny_config(), 11);
}

TEST(GptGradient, TiedHeadMatchesFiniteDifferences) {
  GptConfig c = tiny_config();
  c.tied_head = true;
  check_gradients(c, 12);
}

TEST(GptGradient, SubspaceMatchesFiniteDifferences) {
  GptConfig c = tiny_config();
  c.subspace_k = 3;
  check_gradients(c, 13);
}

TEST(Gpt, SubspaceKeepsResidualStreamInFPlusSpanU) {
  GptConfig c = tiny_config();
  c.layers = 3;
  c.subspace_k = 3;
  auto m = Gpt::create(c, Device::cpu, 5);
  ASSERT_TRUE(m.ok());
  const Batch b = make_batch(c, 2, c.seq, 6);
  ActivationCache cache;
  auto x = m->embed_forward(cache, b.tokens.data(), Device::cpu, b.B, b.T);
  ASSERT_TRUE(x.ok());
  auto y = m->blocks_forward(0, 2, cache, *x);  // the last block (2) is full rank, so stop before it
  ASSERT_TRUE(y.ok());
  // r = x − F[tok] must lie in span(U): r − U Uᵀ r = 0.
  const Tensor& U = m->subspace_basis();
  const Tensor& F = m->subspace_fixed_embedding();
  const int C = c.d_model, K = c.subspace_k;
  for (const Tensor* t : {&*x, &*y}) {
    for (int bt = 0; bt < b.B * b.T; ++bt) {
      std::vector<double> r(C), coef(K, 0.0);
      for (int j = 0; j < C; ++j) r[j] = t->at(int64_t(bt) * C + j) - F.at(int64_t(b.tokens[bt]) * C + j);
      for (int k = 0; k < K; ++k)
        for (int j = 0; j < C; ++j) coef[k] += U.at(j * K + k) * r[j];
      for (int j = 0; j < C; ++j) {
        double proj = 0;
        for (int k = 0; k < K; ++k) proj += U.at(j * K + k) * coef[k];
        EXPECT_NEAR(proj, r[j], 1e-5);
      }
    }
  }
}

TEST(Gpt, SubspaceBoundaryIsExactForValuesAndGradients) {
  GptConfig c = tiny_config();
  c.layers = 3;
  c.subspace_k = 3;
  auto whole = Gpt::create(c, Device::cpu, 41);
  ASSERT_TRUE(whole.ok());
  const Batch b = make_batch(c, 2, c.seq, 42);
  ActivationCache full;
  auto loss = whole->forward(full, b.tokens.data(), b.targets.data(), b.B, b.T);
  ASSERT_TRUE(loss.ok());
  ASSERT_TRUE(whole->backward(full).ok());

  // Stage 0: embedding + blocks 0-1; stage 1: the full-rank last block + head. Only K values per token
  // (and the token ids) cross the boundary in either direction.
  auto s0 = Gpt::create(c, Device::cpu, 41, GptParts{true, 0, 2, false, {}});
  auto s1 = Gpt::create(c, Device::cpu, 41, GptParts{false, 2, 3, true, {}});
  ASSERT_TRUE(s0.ok() && s1.ok());
  ActivationCache c0, c1;
  auto x0 = s0->embed_forward(c0, b.tokens.data(), Device::cpu, b.B, b.T);
  ASSERT_TRUE(x0.ok());
  auto x = s0->blocks_forward(0, 2, c0, *x0);
  ASSERT_TRUE(x.ok());
  Tensor wire, rebuilt;
  ASSERT_TRUE(s0->subspace_encode(*x, b.tokens.data(), Device::cpu, wire).ok());
  EXPECT_EQ(wire.shape(), (Shape{b.B, b.T, c.subspace_k}));
  ASSERT_TRUE(s1->subspace_decode(wire, b.tokens.data(), Device::cpu, rebuilt).ok());
  std::vector<float> xv = x->to_vector(), rv = rebuilt.to_vector();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_NEAR(rv[i], xv[i], 1e-5f);
  auto y = s1->blocks_forward(2, 3, c1, rebuilt);
  ASSERT_TRUE(y.ok());
  auto l1 = s1->head_forward(c1, *y, b.targets.data(), Device::cpu);
  ASSERT_TRUE(l1.ok());
  EXPECT_NEAR(*l1, *loss, 1e-5f);

  Tensor d = Tensor::zeros({b.B, b.T, c.d_model}), dwire, d0;
  ASSERT_TRUE(s1->head_backward(c1, 1.0f, d).ok());
  ASSERT_TRUE(s1->blocks_backward(2, 3, c1, d).ok());
  ASSERT_TRUE(s1->subspace_grad_encode(d, dwire).ok());
  EXPECT_EQ(dwire.shape(), (Shape{b.B, b.T, c.subspace_k}));
  ASSERT_TRUE(s0->subspace_grad_decode(dwire, d0).ok());
  ASSERT_TRUE(s0->blocks_backward(0, 2, c0, d0).ok());
  ASSERT_TRUE(s0->embed_backward(c0, d0).ok());
  auto close = [](const std::vector<float>& a, const std::vector<float>& e, const std::string& what) {
    ASSERT_EQ(a.size(), e.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], e[i], 1e-6f + 1e-4f * std::fabs(e[i])) << what << i;
  };
  close(s0->embedding().grads.to_vector(), whole->embedding().grads.to_vector(), "embedding ");
  close(s0->block(0).grads.to_vector(), whole->block(0).grads.to_vector(), "block 0 ");
  close(s0->block(1).grads.to_vector(), whole->block(1).grads.to_vector(), "block 1 ");
  // A full-width tensor where K-wide is expected is refused.
  Tensor wrong = Tensor::zeros({b.B, b.T, c.d_model});
  EXPECT_EQ(s1->subspace_decode(wrong, b.tokens.data(), Device::cpu, rebuilt).code(), StatusCode::kInvalidArgument);
  auto plain = Gpt::create(tiny_config(), Device::cpu, 1);
  EXPECT_NE(plain->subspace_grad_encode(d, dwire).message().find("subspace_k=0"), std::string::npos);
}

TEST(Gpt, StagesInSequenceEqualTheWholeModel) {
  GptConfig c = tiny_config();
  c.layers = 3;
  auto whole = Gpt::create(c, Device::cpu, 21);
  ASSERT_TRUE(whole.ok());
  const Batch b = make_batch(c, 3, c.seq, 22);
  ActivationCache full;
  auto loss = whole->forward(full, b.tokens.data(), b.targets.data(), b.B, b.T);
  ASSERT_TRUE(loss.ok());
  ASSERT_TRUE(whole->backward(full).ok());

  // Three "stages", each its own model part built from the same seed, each with its own cache.
  GptParts p0{true, 0, 1, false, {}}, p1{false, 1, 2, false, {}}, p2{false, 2, 3, true, {}};
  auto s0 = Gpt::create(c, Device::cpu, 21, p0), s1 = Gpt::create(c, Device::cpu, 21, p1),
       s2 = Gpt::create(c, Device::cpu, 21, p2);
  ASSERT_TRUE(s0.ok() && s1.ok() && s2.ok());
  EXPECT_FALSE(s1->embedding().defined());
  EXPECT_EQ(s1->param_groups().size(), 1u);
  EXPECT_EQ(s1->block(1).params.to_vector(), whole->block(1).params.to_vector());
  ActivationCache c0, c1, c2;
  auto a0 = s0->embed_forward(c0, b.tokens.data(), Device::cpu, b.B, b.T);
  ASSERT_TRUE(a0.ok());
  auto a1 = s0->blocks_forward(0, 1, c0, *a0);
  ASSERT_TRUE(a1.ok());
  Tensor recv1 = a1->clone();  // what crosses the wire
  auto a2 = s1->blocks_forward(1, 2, c1, recv1);
  ASSERT_TRUE(a2.ok());
  Tensor recv2 = a2->clone();
  auto a3 = s2->blocks_forward(2, 3, c2, recv2);
  ASSERT_TRUE(a3.ok());
  auto l2 = s2->head_forward(c2, *a3, b.targets.data(), Device::cpu);
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(*l2, *loss);
  Tensor d = Tensor::zeros({b.B, b.T, c.d_model});
  ASSERT_TRUE(s2->head_backward(c2, 1.0f, d).ok());
  ASSERT_TRUE(s2->blocks_backward(2, 3, c2, d).ok());
  ASSERT_TRUE(s1->blocks_backward(1, 2, c1, d).ok());
  ASSERT_TRUE(s0->blocks_backward(0, 1, c0, d).ok());
  ASSERT_TRUE(s0->embed_backward(c0, d).ok());
  EXPECT_EQ(s0->embedding().grads.to_vector(), whole->embedding().grads.to_vector());
  EXPECT_EQ(s0->block(0).grads.to_vector(), whole->block(0).grads.to_vector());
  EXPECT_EQ(s1->block(1).grads.to_vector(), whole->block(1).grads.to_vector());
  EXPECT_EQ(s2->block(2).grads.to_vector(), whole->block(2).grads.to_vector());
  EXPECT_EQ(s2->head().grads.to_vector(), whole->head().grads.to_vector());
  // Blocks outside a part are refused, not run on missing weights.
  EXPECT_EQ(s1->blocks_forward(0, 1, c1, recv1).status().code(), StatusCode::kInvalidArgument);
}

double sum_sq(const std::vector<float>& v, int64_t begin, int64_t n) {
  double s = 0;
  for (int64_t i = begin; i < begin + n; ++i) s += double(v[i]) * v[i];
  return s;
}

TEST(Gpt, TensorShardsEqualTheWholeModel) {
  GptConfig c = tiny_config();
  c.d_model = 16;
  c.heads = 4;  // head size 4; split 3:1
  auto whole = Gpt::create(c, Device::cpu, 41);
  ASSERT_TRUE(whole.ok());
  const Batch b = make_batch(c, 3, c.seq, 42);
  ActivationCache full;
  auto loss = whole->forward(full, b.tokens.data(), b.targets.data(), b.B, b.T);
  ASSERT_TRUE(loss.ok());
  ASSERT_TRUE(whole->backward(full).ok());

  const TpShard shards[2] = {{0, 2, 0, 3}, {1, 2, 3, 4}};
  std::vector<Gpt> parts;
  for (const TpShard& sh : shards) {
    GptParts p;
    p.tp = sh;
    auto m = Gpt::create(c, Device::cpu, 41, p);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    parts.push_back(std::move(*m));
  }
  EXPECT_EQ(parts[0].local_heads(), 3);
  // Without its all-reduce a shard refuses to run its blocks.
  {
    ActivationCache cache;
    auto l = parts[1].forward(cache, b.tokens.data(), b.targets.data(), b.B, b.T);
    ASSERT_FALSE(l.ok());
    EXPECT_NE(l.status().message().find("no all-reduce"), std::string::npos) << l.status().message();
    ASSERT_TRUE(parts[1].zero_grad().ok());
  }
  ThreadSum group(2);
  float losses[2] = {0, 0};
  Status statuses[2];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    parts[t].set_tp_all_reduce([&group, t](Tensor& x, int, TpSite) { return group(t, x); });
    threads.emplace_back([&, t] {
      ActivationCache cache;
      auto l = parts[t].forward(cache, b.tokens.data(), b.targets.data(), b.B, b.T);
      statuses[t] = l.ok() ? parts[t].backward(cache) : l.status();
      if (l.ok()) losses[t] = *l;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 2; ++t) ASSERT_TRUE(statuses[t].ok()) << statuses[t].to_string();
  EXPECT_EQ(losses[0], losses[1]);  // both shards hold the same activations
  EXPECT_NEAR(losses[0], *loss, 1e-5 * *loss);
  // Shard 1 holds MLP units [48, 64): rows 48.. of the first MLP matrix [64, 16].
  const int hs = 4, C = c.d_model;
  const ParamGroup& w = whole->block(1);
  const std::vector<float> wp = w.params.to_vector();
  const std::vector<float> fc1 = parts[1].block(1).params.to_vector();
  const ParamSlice& fc = parts[1].block(1).slices[kFcW];
  EXPECT_EQ(fc.shape, (Shape{4 * hs, C}));
  for (int64_t i = 0; i < fc.numel(); ++i)
    ASSERT_EQ(fc1[fc.offset + i], wp[w.slices[kFcW].offset + 4 * hs * 3 * C + i]) << i;
  // Per slice: sharded slices split the whole one's values and gradients (sums of squares add up); replicated
  // slices hold the whole one's.
  for (int l = 0; l < c.layers; ++l) {
    const ParamGroup& whole_g = whole->block(l);
    const std::vector<float> wgp = whole_g.params.to_vector(), wgg = whole_g.grads.to_vector();
    for (int i = 0; i < kNumBlockSlices; ++i) {
      const ParamSlice& ws = whole_g.slices[i];
      double p_sq = 0, g_sq = 0;
      for (int t = 0; t < 2; ++t) {
        const ParamGroup& g = parts[t].block(l);
        const std::vector<float> pp = g.params.to_vector(), pg = g.grads.to_vector();
        const ParamSlice& ss = g.slices[i];
        EXPECT_EQ(ss.tp_replicated, ws.tp_replicated);
        if (ss.tp_replicated) {
          EXPECT_EQ(ss.numel(), ws.numel());
          for (int64_t k = 0; k < ss.numel(); ++k)
            EXPECT_NEAR(pg[ss.offset + k], wgg[ws.offset + k], 1e-5 + 1e-4 * std::fabs(wgg[ws.offset + k]))
                << ss.name << " shard " << t;
        } else {
          p_sq += sum_sq(pp, ss.offset, ss.numel());
          g_sq += sum_sq(pg, ss.offset, ss.numel());
        }
      }
      if (!ws.tp_replicated) {
        EXPECT_NEAR(p_sq, sum_sq(wgp, ws.offset, ws.numel()), 1e-9) << ws.name;
        EXPECT_NEAR(g_sq, sum_sq(wgg, ws.offset, ws.numel()), 1e-4 * g_sq + 1e-12) << ws.name;
      }
    }
  }
  EXPECT_EQ(parts[0].embedding().params.to_vector(), whole->embedding().params.to_vector());
  for (int t = 0; t < 2; ++t) {
    const std::vector<float> eg = parts[t].embedding().grads.to_vector(), weg = whole->embedding().grads.to_vector();
    for (size_t k = 0; k < eg.size(); ++k) ASSERT_NEAR(eg[k], weg[k], 1e-5 + 1e-4 * std::fabs(weg[k])) << k;
  }
  // A shard must name a range of the heads; a subspace model cannot be sharded.
  GptParts bad;
  bad.tp = {1, 2, 4, 4};
  EXPECT_FALSE(Gpt::create(c, Device::cpu, 41, bad).ok());
  GptConfig sub = c;
  sub.subspace_k = 4;
  bad.tp = {0, 2, 0, 2};
  auto s = Gpt::create(sub, Device::cpu, 41, bad);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("subspace"), std::string::npos);
}

TEST(Gpt, MicrobatchCachesAccumulateGradients) {
  GptConfig c = tiny_config();
  auto m = Gpt::create(c, Device::cpu, 31);
  ASSERT_TRUE(m.ok());
  const Batch b = make_batch(c, 4, c.seq, 32);
  ActivationCache whole;
  ASSERT_TRUE(m->zero_grad().ok());
  ASSERT_TRUE(m->forward(whole, b.tokens.data(), b.targets.data(), 4, c.seq).ok());
  ASSERT_TRUE(m->backward(whole).ok());
  std::vector<float> g_whole = m->block(0).grads.to_vector();
  // Two microbatches of 2 in flight at once (both forwards before both backwards), each scaled by 1/2.
  ASSERT_TRUE(m->zero_grad().ok());
  ActivationCache mb[2];
  const int half = 2 * c.seq;
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE(m->forward(mb[i], b.tokens.data() + i * half, b.targets.data() + i * half, 2, c.seq).ok());
  for (int i = 1; i >= 0; --i) ASSERT_TRUE(m->backward(mb[i], 0.5f).ok());
  std::vector<float> g_mb = m->block(0).grads.to_vector();
  for (size_t i = 0; i < g_whole.size(); ++i) EXPECT_NEAR(g_mb[i], g_whole[i], 1e-5f + 1e-4f * std::fabs(g_whole[i]));
}

TEST(Gpt, ConfigErrorsNameTheField) {
  GptConfig c = tiny_config();
  c.heads = 3;
  Status s = c.validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("heads=3"), std::string::npos) << s.message();
  c = tiny_config();
  c.layers = 0;
  EXPECT_NE(c.validate().message().find("layers=0"), std::string::npos);
  c = tiny_config();
  c.subspace_k = 9;
  EXPECT_NE(c.validate().message().find("subspace_k=9"), std::string::npos);
  auto bad = gpt_preset("huge");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tiny|small|base"), std::string::npos);
  EXPECT_TRUE(gpt_preset("small").ok());
  EXPECT_EQ(Gpt::create(tiny_config(), Device::cpu, 1, GptParts{true, 1, 0, true, {}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(Gpt, RejectsSequenceLongerThanContext) {
  GptConfig c = tiny_config();
  auto m = Gpt::create(c, Device::cpu, 1);
  ASSERT_TRUE(m.ok());
  const Batch b = make_batch(c, 1, c.seq + 1, 2);
  ActivationCache cache;
  auto r = m->forward(cache, b.tokens.data(), b.targets.data(), 1, c.seq + 1);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(Gpt, CudaDeviceIsAClearErrorWithoutOne) {
  auto m = Gpt::create(tiny_config(), Device::cuda, 1);
  if (m.ok()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(m.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace lh
