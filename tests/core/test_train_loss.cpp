// The learning test of issue 3: on the default fortunes corpus the default small config, with a fixed
// seed, starts near ln(256) and gets below 3.2 within 150 steps; validation follows (label core).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <numeric>

#include "core/exec.h"
#include "core/trainer.h"
#include "tests/core/one_thread.h"

namespace lh {
namespace {

// One thread: these models are too small to gain from more, and on a machine shared with other jobs
// (ctest -j, other builds) OpenMP barriers between busy cores cost far more than the work.
LH_ONE_THREAD_IN_THIS_FILE();

TEST(TrainLoss, DefaultSmallConfigLearnsTheFortunesCorpus) {
  if (::access(kDefaultCorpusDir, R_OK) != 0) GTEST_SKIP() << "fortunes not installed (scripts/setup.sh)";
  TrainConfig cfg;  // the defaults of `longhaul train`: small model, batch 16 × seq 128, 150 steps
  cfg.model = gpt_preset("small").value();
  ASSERT_EQ(cfg.steps, 150);
  auto made = Trainer::create(cfg);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Trainer& t = **made;

  std::vector<float> losses;
  // The run stops as soon as the mean of the last 5 losses is below 3.2: the claim is "within 150
  // steps", and stopping early keeps the test short.
  auto recent_mean = [&] { return std::accumulate(losses.end() - 5, losses.end(), 0.0) / 5.0; };
  while (t.steps_done() < cfg.steps) {
    auto s = t.step();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    losses.push_back(s->loss);
    if (losses.size() >= 5 && recent_mean() < 3.2) break;
  }
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.15);
  ASSERT_GE(losses.size(), 5u);
  EXPECT_LT(recent_mean(), 3.2) << "after " << losses.size() << " steps";
  auto val = t.evaluate();
  ASSERT_TRUE(val.ok());
  EXPECT_LT(*val, 3.4);
  std::printf("loss %.3f -> %.3f (mean of last 5) in %zu steps; validation %.3f\n", losses.front(), recent_mean(),
              losses.size(), *val);
}

}  // namespace
}  // namespace lh
