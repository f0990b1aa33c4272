// CUDA-vs-CPU tests of the GPT: the same seed gives the same loss, gradients and optimizer step on both
// devices, and a short training run follows the CPU losses (labels core, gpu; skipped without a device).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <thread>

#include "core/cuda_runtime.h"
#include "core/gpt.h"
#include "core/rng.h"
#include "core/trainer.h"
#include "tests/core/tp_threads.h"

namespace lh {
namespace {

class GptGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: " << cuda_device_summary();
  }
};

void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, float atol, float rtol,
                  const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < cpu.size() && bad < 5; ++i)
    if (!(std::fabs(gpu[i] - cpu[i]) <= atol + rtol * std::fabs(cpu[i]))) {
      ADD_FAILURE() << what << "[" << i << "]: cuda " << gpu[i] << " cpu " << cpu[i];
      ++bad;
    }
}

void compare_model(const GptConfig& cfg) {
  auto cpu = Gpt::create(cfg, Device::cpu, 3);
  auto gpu = Gpt::create(cfg, Device::cuda, 3);
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << gpu.status().to_string();
  const int B = 3, T = cfg.seq;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  Rng rng(4);
  for (int i = 0; i < B * T; ++i) {
    tok[i] = static_cast<int32_t>(rng.below(cfg.vocab));
    tgt[i] = static_cast<int32_t>(rng.below(cfg.vocab));
  }
  ActivationCache cc, gc;
  auto lc = cpu->forward(cc, tok.data(), tgt.data(), B, T);
  auto lg = gpu->forward(gc, tok.data(), tgt.data(), B, T);
  ASSERT_TRUE(lc.ok() && lg.ok()) << lg.status().to_string();
  EXPECT_NEAR(*lg, *lc, 1e-4f * std::fabs(*lc));
  ASSERT_TRUE(cpu->backward(cc).ok());
  ASSERT_TRUE(gpu->backward(gc).ok());
  auto gc_groups = gpu->param_groups(), cc_groups = cpu->param_groups();
  for (size_t i = 0; i < cc_groups.size(); ++i)
    expect_close(gc_groups[i]->grads.to_vector(), cc_groups[i]->grads.to_vector(), 2e-5f, 2e-3f,
                 cc_groups[i]->name + " grad");
  AdamW oc, og;
  ASSERT_TRUE(oc.init(cc_groups, Device::cpu).ok());
  ASSERT_TRUE(og.init(gc_groups, Device::cuda).ok());
  AdamWConfig a;
  ASSERT_TRUE(oc.step(cpu->exec(), cc_groups, a, 1.0f, 1).ok());
  ASSERT_TRUE(og.step(gpu->exec(), gc_groups, a, 1.0f, 1).ok());
  for (size_t i = 0; i < cc_groups.size(); ++i)
    expect_close(gc_groups[i]->params.to_vector(), cc_groups[i]->params.to_vector(), 1e-5f, 1e-4f,
                 cc_groups[i]->name + " param after AdamW");
}

TEST_F(GptGpu, ForwardBackwardAndStepMatchCpu) {
  GptConfig c = gpt_preset("tiny").value();
  c.seq = 48;
  compare_model(c);
}

TEST_F(GptGpu, TiedAndSubspaceMatchCpu) {
  GptConfig c = gpt_preset("tiny").value();
  c.seq = 32;
  c.tied_head = true;
  compare_model(c);
  c.tied_head = false;
  c.subspace_k = 16;
  compare_model(c);
}

TEST_F(GptGpu, TrainingRunFollowsTheCpuLosses) {
  const std::string path = ::testing::TempDir() + "lh_gpu_text.txt";
  {
    std::ofstream out(path);
    for (int i = 0; i < 800; ++i) out << "the quick brown fox " << i << " jumps over the lazy dog\n";
  }
  TrainConfig c;
  c.model = gpt_preset("tiny").value();
  c.data = path;
  c.steps = 20;
  c.batch = 8;
  c.eval_every = 0;
  c.seed = 5;
  auto tc = Trainer::create(c);
  c.device = Device::cuda;
  auto tg = Trainer::create(c);
  ASSERT_TRUE(tc.ok() && tg.ok()) << tg.status().to_string();
  for (int s = 0; s < 20; ++s) {
    auto a = (*tc)->step();
    auto b = (*tg)->step();
    ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
    EXPECT_NEAR(b->loss, a->loss, 2e-3f * a->loss) << "step " << s + 1;
  }
  auto text = (*tg)->sample(30, "the ", 0.f, 1);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(text->size(), 30u);
}

// Tensor shards (heads split 3:1) on the device: the same loss as the CPU shards and the same gradients, from the
// same kernels; the partial sums go through ThreadSum (a host round trip, as ProcessGroup does for CUDA tensors).
TEST_F(GptGpu, TensorShardsMatchCpu) {
  GptConfig cfg;
  cfg.vocab = 32;
  cfg.seq = 8;
  cfg.layers = 2;
  cfg.d_model = 16;
  cfg.heads = 4;
  const int B = 3, T = cfg.seq;
  std::vector<int32_t> tok(B * T), tgt(B * T);
  Rng rng(5);
  for (int i = 0; i < B * T; ++i) {
    tok[i] = static_cast<int32_t>(rng.below(cfg.vocab));
    tgt[i] = static_cast<int32_t>(rng.below(cfg.vocab));
  }
  std::vector<std::vector<float>> grads[2];
  float losses[2][2] = {};
  for (Device dev : {Device::cpu, Device::cuda}) {
    const int d = dev == Device::cuda;
    std::vector<Gpt> shards;
    for (const TpShard& sh : {TpShard{0, 2, 0, 3}, TpShard{1, 2, 3, 4}}) {
      GptParts p;
      p.tp = sh;
      auto m = Gpt::create(cfg, dev, 9, p);
      ASSERT_TRUE(m.ok()) << m.status().to_string();
      shards.push_back(std::move(*m));
    }
    ThreadSum group(2);
    Status st[2];
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      shards[t].set_tp_all_reduce([&group, t](Tensor& x, int, TpSite) { return group(t, x); });
      threads.emplace_back([&, t] {
        ActivationCache cache;
        auto l = shards[t].forward(cache, tok.data(), tgt.data(), B, T);
        st[t] = l.ok() ? shards[t].backward(cache) : l.status();
        if (l.ok()) losses[d][t] = *l;
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < 2; ++t) ASSERT_TRUE(st[t].ok()) << device_name(dev) << ": " << st[t].to_string();
    for (Gpt& m : shards)
      for (ParamGroup* g : m.param_groups()) grads[d].push_back(g->grads.to_vector());
  }
  EXPECT_EQ(losses[1][0], losses[1][1]);  // the shards hold the same activations on the device too
  EXPECT_NEAR(losses[1][0], losses[0][0], 1e-4f * std::fabs(losses[0][0]));
  ASSERT_EQ(grads[1].size(), grads[0].size());
  for (size_t i = 0; i < grads[0].size(); ++i) expect_close(grads[1][i], grads[0][i], 2e-5f, 2e-3f, "group grad");
}

}  // namespace
}  // namespace lh
