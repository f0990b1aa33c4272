// Tests for the Trainer: same seed → same losses, exact resume from a checkpoint, metrics lines,
// sampling, the lr schedule, and clear errors for bad data, devices and checkpoints (label core).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/exec.h"
#include "core/trainer.h"
#include "tests/common/temp_dir.h"
#include "tests/core/one_thread.h"

namespace lh {
namespace {

// One thread: these models are too small to gain from more, and on a machine shared with other jobs
// (ctest -j, other builds) OpenMP barriers between busy cores cost far more than the work.
LH_ONE_THREAD_IN_THIS_FILE();

// A small text with enough structure to learn from, written once per test binary.
const std::string& text_file() {
  static std::string path = [] {
    std::string p = temp_dir("train") + "/text.txt";
    std::ofstream out(p);
    const char* lines[] = {"the quick brown fox jumps over the lazy dog\n", "pack my box with five dozen liquor jugs\n",
                           "how vexingly quick daft zebras jump\n", "sphinx of black quartz, judge my vow\n"};
    for (int i = 0; i < 1500; ++i) out << lines[(i * 7) % 4] << i << "\n";
    return p;
  }();
  return path;
}

TrainConfig tiny_run(int64_t steps) {
  TrainConfig c;
  c.model = gpt_preset("tiny").value();
  c.model.seq = 32;
  c.data = text_file();
  c.steps = steps;
  c.batch = 4;
  c.warmup = 5;
  c.eval_every = 0;
  c.eval_batches = 2;
  c.seed = 77;
  return c;
}

class Recorder : public TrainObserver {
 public:
  void on_step(const StepStats& s, std::optional<float>) override { losses.push_back(s.loss); }
  void on_checkpoint(const std::string& p) override { checkpoints.push_back(p); }
  std::vector<float> losses;
  std::vector<std::string> checkpoints;
};

std::vector<float> run_losses(const TrainConfig& cfg) {
  auto t = Trainer::create(cfg);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return {};
  Recorder r;
  Status s = (*t)->run(&r);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return r.losses;
}

TEST(Trainer, SameSeedGivesIdenticalLosses) {
  TrainConfig c = tiny_run(12);
  std::vector<float> a = run_losses(c), b = run_losses(c);
  ASSERT_EQ(a.size(), 12u);
  EXPECT_EQ(a, b);
  c.seed = 78;
  std::vector<float> other = run_losses(c);
  EXPECT_NE(a, other);
}

TEST(Trainer, ResumeContinuesExactly) {
  // 100 steps straight, against 50 steps, a checkpoint, a fresh process-like Trainer, and 50 more.
  TrainConfig straight = tiny_run(100);
  std::vector<float> full = run_losses(straight);
  ASSERT_EQ(full.size(), 100u);

  TrainConfig first = tiny_run(100);
  first.checkpoint_dir = temp_dir("train");
  first.checkpoint_every = 50;
  first.steps = 100;
  auto t1 = Trainer::create(first);
  ASSERT_TRUE(t1.ok());
  for (int i = 0; i < 50; ++i) ASSERT_TRUE((*t1)->step().ok());
  ASSERT_TRUE((*t1)->save(first.checkpoint_dir + "/" + checkpoint_filename(50)).ok());
  t1->reset();

  TrainConfig second = tiny_run(100);
  second.resume = first.checkpoint_dir;  // a directory: its latest checkpoint
  second.model_explicit = false;
  auto t2 = Trainer::create(second);
  ASSERT_TRUE(t2.ok()) << t2.status().to_string();
  EXPECT_EQ((*t2)->steps_done(), 50);
  Recorder r;
  ASSERT_TRUE((*t2)->run(&r).ok());
  ASSERT_EQ(r.losses.size(), 50u);
  for (int i = 0; i < 50; ++i)
    EXPECT_NEAR(r.losses[i], full[50 + i], 1e-6 * std::fabs(full[50 + i])) << "step " << 51 + i;
}

TEST(Trainer, RunWritesPeriodicCheckpointsThatResume) {
  TrainConfig c = tiny_run(6);
  c.checkpoint_dir = temp_dir("train") + "/ckpts";  // created by run()
  c.checkpoint_every = 2;
  auto t = Trainer::create(c);
  ASSERT_TRUE(t.ok());
  Recorder r;
  ASSERT_TRUE((*t)->run(&r).ok());
  ASSERT_EQ(r.checkpoints.size(), 3u);
  EXPECT_EQ(r.checkpoints.back(), c.checkpoint_dir + "/" + checkpoint_filename(6));
  // Resuming a finished run asks for more steps rather than silently doing nothing.
  TrainConfig again = c;
  again.resume = c.checkpoint_dir;
  auto done = Trainer::create(again);
  ASSERT_FALSE(done.ok());
  EXPECT_NE(done.status().message().find("--steps"), std::string::npos) << done.status().message();
  again.steps = 8;
  auto more = Trainer::create(again);
  ASSERT_TRUE(more.ok()) << more.status().to_string();
  EXPECT_EQ((*more)->steps_done(), 6);
}

TEST(Trainer, ResumeRefusesBadCheckpointsAndMismatches) {
  TrainConfig c = tiny_run(4);
  c.checkpoint_dir = temp_dir("train");
  ASSERT_TRUE(run_losses(c).size() == 4u);
  const std::string ckpt = c.checkpoint_dir + "/" + checkpoint_filename(4);

  TrainConfig other_model = tiny_run(10);
  other_model.resume = ckpt;
  other_model.model.layers = 3;
  auto r1 = Trainer::create(other_model);
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.status().message().find("layers=2"), std::string::npos) << r1.status().message();

  TrainConfig other_data = tiny_run(10);
  other_data.resume = ckpt;
  const std::string data2 = temp_dir("train") + "/other.txt";
  { std::ofstream(data2) << std::string(20000, 'z'); }
  other_data.data = data2;
  auto r2 = Trainer::create(other_data);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("other data"), std::string::npos) << r2.status().message();

  // A damaged checkpoint is never loaded.
  std::fstream f(ckpt, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(100);
  f.put('\x5a');
  f.close();
  TrainConfig damaged = tiny_run(10);
  damaged.resume = ckpt;
  auto r3 = Trainer::create(damaged);
  ASSERT_FALSE(r3.ok());
  EXPECT_EQ(r3.status().code(), StatusCode::kCorrupt);
}

TEST(Trainer, MetricsAreJsonLines) {
  TrainConfig c = tiny_run(6);
  c.eval_every = 3;
  c.metrics = temp_dir("train") + "/m.jsonl";
  ASSERT_EQ(run_losses(c).size(), 6u);
  std::ifstream in(c.metrics);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    ++n;
    EXPECT_EQ(j.at("step").get<int>(), n);
    EXPECT_TRUE(std::isfinite(j.at("loss").get<double>()));
    EXPECT_GT(j.at("lr").get<double>(), 0.0);
    EXPECT_GT(j.at("tokens_per_s").get<double>(), 0.0);
    EXPECT_EQ(j.contains("val_loss"), n % 3 == 0) << line;
  }
  EXPECT_EQ(n, 6);
  TrainConfig bad = tiny_run(2);
  bad.metrics = "/nonexistent/dir/m.jsonl";
  auto t = Trainer::create(bad);
  ASSERT_TRUE(t.ok());
  Status s = (*t)->run(nullptr);
  EXPECT_EQ(s.code(), StatusCode::kIo);
  EXPECT_NE(s.message().find("/nonexistent/dir/m.jsonl"), std::string::npos);
}

TEST(Trainer, SampleIsSeededAndOfTheAskedLength) {
  auto t = Trainer::create(tiny_run(3));
  ASSERT_TRUE(t.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*t)->step().ok());
  auto a = (*t)->sample(40, "the ", 0.8f, 5), b = (*t)->sample(40, "the ", 0.8f, 5);
  auto g1 = (*t)->sample(40, "", 0.f, 1), g2 = (*t)->sample(40, "", 0.f, 2);
  ASSERT_TRUE(a.ok() && b.ok() && g1.ok() && g2.ok());
  EXPECT_EQ(a->size(), 40u);
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(*g1, *g2);  // greedy decoding ignores the seed
  // A prompt longer than the context is cropped to the last seq bytes, not an error.
  EXPECT_TRUE((*t)->sample(3, std::string(100, 'a'), 1.f, 1).ok());
}

TEST(Trainer, LearningRateWarmsUpThenDecays) {
  TrainConfig c;
  c.lr = 1e-3f;
  c.warmup = 10;
  c.steps = 110;
  c.min_lr_frac = 0.1f;
  EXPECT_FLOAT_EQ(lr_at(c, 1), 1e-4f);
  EXPECT_FLOAT_EQ(lr_at(c, 10), 1e-3f);
  EXPECT_NEAR(lr_at(c, 60), 0.55e-3f, 1e-7);
  EXPECT_NEAR(lr_at(c, 110), 1e-4f, 1e-9);
  EXPECT_LT(lr_at(c, 80), lr_at(c, 40));
}

TEST(Trainer, BadInputsAreClearErrors) {
  TrainConfig missing = tiny_run(2);
  missing.data = "/nonexistent/corpus.txt";
  auto a = Trainer::create(missing);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kNotFound);
  EXPECT_NE(a.status().message().find("/nonexistent/corpus.txt"), std::string::npos);

  TrainConfig cuda = tiny_run(2);
  cuda.device = Device::cuda;
  auto b = Trainer::create(cuda);
  if (!b.ok()) {
    EXPECT_EQ(b.status().code(), StatusCode::kUnavailable) << b.status().to_string();
  }

  TrainConfig steps = tiny_run(0);
  EXPECT_NE(Trainer::create(steps).status().message().find("--steps"), std::string::npos);
  TrainConfig every = tiny_run(2);
  every.checkpoint_every = 5;
  EXPECT_NE(Trainer::create(every).status().message().find("--checkpoint-dir"), std::string::npos);
  TrainConfig no_resume = tiny_run(2);
  no_resume.resume = "/nonexistent/ckpt";
  EXPECT_EQ(Trainer::create(no_resume).status().code(), StatusCode::kNotFound);
  TrainConfig heads = tiny_run(2);
  heads.model.heads = 5;
  EXPECT_NE(Trainer::create(heads).status().message().find("heads=5"), std::string::npos);
}

}  // namespace
}  // namespace lh
