// Multi-process pipeline jobs through the real binary ($LH_BIN), split by topic from test_launch.cpp (the Launch
// fixture and helpers: tests/integration/launch_util.h). This file: every grid `launch` runs (stages, replicas, tensor
// shards, DiLoCo, delayed averaging) reproduces `train`'s losses, and the compression presets and replica link
// overrides set the codecs the job meters.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "metrics/metrics_summary.h"
#include "metrics/step_metrics.h"
#include "plan/cluster.h"
#include "tests/common/netns_support.h"
#include "tests/integration/launch_util.h"
#include "transport/allow_list.h"
#include "transport/job_secret.h"
#include "transport/messages.h"

namespace lh {
namespace {

void expect_launch_matches_train(int workers, const std::string& schedule, std::vector<std::string> model_extra = {},
                                 std::vector<std::string> grid_extra = {}) {
  const int steps = 4;
  std::string train_metrics = temp_path("train.jsonl"), job_metrics = temp_path("job.jsonl");
  std::vector<std::string> train = {"--threads", "1", "--log-level", "warn",       "train",
                                    "--sample",  "0", "--metrics",   train_metrics};
  int heads = 2;
  std::vector<std::string> train_extra = take_heads(model_extra, &heads);
  for (auto& f : model_flags(steps, heads)) train.push_back(f);
  train.insert(train.end(), train_extra.begin(), train_extra.end());
  BinRun t = run(train);
  ASSERT_EQ(t.code, 0) << t.output;
  std::vector<std::string> extra = {"--schedule", schedule};
  extra.insert(extra.end(), model_extra.begin(), model_extra.end());
  extra.insert(extra.end(), grid_extra.begin(), grid_extra.end());
  BinRun l = run(launch_args(workers, steps, job_metrics, extra));
  ASSERT_EQ(l.code, 0) << l.output;
  EXPECT_NE(l.output.find("link traffic"), std::string::npos) << l.output;
  EXPECT_NE(l.output.find("total"), std::string::npos) << l.output;
  EXPECT_NE(l.output.find("metrics: " + job_metrics), std::string::npos) << l.output;
  auto ref = losses_of(train_metrics), got = losses_of(job_metrics);
  ASSERT_EQ(ref.size(), size_t(steps));
  ASSERT_EQ(got.size(), size_t(steps)) << l.output;
  for (auto& [step, loss] : ref) EXPECT_NEAR(got[step], loss, 1e-5 * std::abs(loss)) << "step " << step;
  auto records = read_step_metrics_file(job_metrics);
  ASSERT_TRUE(records.ok());
  EXPECT_EQ(records->size(), size_t(steps * workers));  // every worker, every step
}

TEST_F(Launch, TwoStagesReproduceTrain) {
  expect_launch_matches_train(2, "1f1b");
}

TEST_F(Launch, FourStagesGPipeReproduceTrain) {
  expect_launch_matches_train(4, "gpipe");
}

// The async schedule in real processes: four stages over links with a delay (steps overlap, each stage's order
// depends on timing) give the losses of one process running the same rule.
TEST_F(Launch, AsyncStagesOverDistantLinksMatchOneProcess) {
  const int steps = 5;
  std::map<int, std::map<int64_t, double>> losses;
  for (int workers : {1, 4}) {
    std::string metrics = temp_path("async" + std::to_string(workers) + ".jsonl");
    std::vector<std::string> extra = {"--schedule", "async:predict"};
    if (workers > 1) extra.insert(extra.end(), {"--link", "1G,10ms"});
    BinRun l = run(launch_args(workers, steps, metrics, extra));
    ASSERT_EQ(l.code, 0) << l.output;
    losses[workers] = losses_of(metrics);
    ASSERT_EQ(losses[workers].size(), size_t(steps)) << l.output;
  }
  for (auto& [step, loss] : losses[1]) EXPECT_NEAR(losses[4][step], loss, 1e-5 * std::abs(loss)) << "step " << step;
}

// Eager over links with a delay: each stage runs what has arrived, in real processes over UCX and the shaper.
TEST_F(Launch, FourStagesEagerOverDistantLinksReproduceTrain) {
  expect_launch_matches_train(4, "eager", {}, {"--link", "1G,10ms"});
}

TEST_F(Launch, SubspaceStagesReproduceTrain) {
  expect_launch_matches_train(2, "1f1b", {"--subspace-k", "8"});
}

// Data parallelism: each replica trains on its half of the global batch and the gradients are averaged.
TEST_F(Launch, TwoReplicasReproduceTrain) {
  expect_launch_matches_train(2, "1f1b", {}, {"--dp", "2"});
}

TEST_F(Launch, TwoStagesTimesTwoReplicasReproduceTrain) {
  expect_launch_matches_train(4, "1f1b", {}, {"--dp", "2"});
}

// --dp-split: replica 0 trains on 6 of the 8 sequences, replica 1 on 2; weighted, the update is the whole batch's.
TEST_F(Launch, UnequalReplicaSharesReproduceTrain) {
  expect_launch_matches_train(4, "1f1b", {}, {"--dp", "2", "--dp-split", "3:1", "--microbatches", "2"});
}

// --dp-split speed: a replica slowed 3x gets a quarter of the batch.
TEST_F(Launch, DpSplitBySpeedGivesASlowedReplicaLess) {
  std::vector<std::string> args =
      launch_args(2, 3, temp_path("dp_speed.jsonl"),
                  {"--dp", "2", "--dp-split", "speed", "--slowdown", "1=3", "--microbatches", "2"});
  args[1] = "info";  // the coordinator's log names the split
  BinRun r = run(args, 300s);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("dp split by speed (sequences per replica): 6:2"), std::string::npos) << r.output;
  BinRun bad = run(launch_args(2, 3, temp_path("dp_bad.jsonl"), {"--dp-split", "3:1"}), 60s);
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--dp-split 3:1 needs --dp > 1"), std::string::npos) << bad.output;
}

// Tensor parallelism: each shard holds its heads of every block and the shards sum their partial results.
TEST_F(Launch, TwoTensorShardsReproduceTrain) {
  expect_launch_matches_train(2, "1f1b", {}, {"--tp", "2"});
}

TEST_F(Launch, FourTensorShardsReproduceTrain) {
  expect_launch_matches_train(4, "1f1b", {"--heads", "4"}, {"--tp", "4"});
}

TEST_F(Launch, UnevenTensorShardsReproduceTrain) {
  expect_launch_matches_train(2, "1f1b", {"--heads", "4"}, {"--tp", "2", "--tp-split", "3:1"});
}

TEST_F(Launch, StagesTimesShardsTimesReplicasReproduceTrain) {  // 8 workers: pp 2 × tp 2 × dp 2
  expect_launch_matches_train(8, "1f1b", {}, {"--tp", "2", "--dp", "2"});
}

// DiLoCo's outer step with H=1, outer_lr=1 and no momentum gives back the inner step's weights.
TEST_F(Launch, DilocoWithAUnitOuterStepReproducesTrain) {
  expect_launch_matches_train(2, "1f1b", {}, {"--sync", "diloco:H=1,outer_lr=1,outer_momentum=0"});
}

// --sync delayed through the binary: two replicas and a two-stage pipeline take the same delayed updates (the
// replicas' averages are the whole batch's gradient), and they differ from every-step updates after the warmup.
TEST_F(Launch, DelayedAveragingAgreesAcrossGrids) {
  const int steps = 4;
  std::string replicas = temp_path("delayed_dp.jsonl"), stages = temp_path("delayed_pp.jsonl"),
              every = temp_path("every_dp.jsonl");
  BinRun a = run(launch_args(2, steps, replicas, {"--dp", "2", "--sync", "delayed:D=1"}));
  ASSERT_EQ(a.code, 0) << a.output;
  BinRun b = run(launch_args(2, steps, stages, {"--sync", "delayed:D=1"}));
  ASSERT_EQ(b.code, 0) << b.output;
  BinRun c = run(launch_args(2, steps, every, {"--dp", "2"}));
  ASSERT_EQ(c.code, 0) << c.output;
  auto la = losses_of(replicas), lb = losses_of(stages), lc = losses_of(every);
  ASSERT_EQ(la.size(), size_t(steps)) << a.output;
  ASSERT_EQ(lb.size(), size_t(steps)) << b.output;
  ASSERT_EQ(lc.size(), size_t(steps)) << c.output;
  for (auto& [step, loss] : lb) EXPECT_NEAR(la[step], loss, 1e-5 * std::abs(loss)) << "step " << step;
  // The warmup (--warmup 1) runs every-step, so steps 1 and 2 start from the same weights; step 3 of the delayed
  // run has not applied step 2's average yet (it computes at predicted weights), every-step's has.
  EXPECT_NEAR(la[1], lc[1], 1e-5 * std::abs(lc[1]));
  EXPECT_NEAR(la[2], lc[2], 1e-5 * std::abs(lc[2]));
  EXPECT_GT(std::abs(la[3] - lc[3]), 1e-4);
}

// The end-of-job table shows the replicas' gradient traffic with its codec, compressed.
TEST_F(Launch, CompressedGradientsAreMeteredAsGrad) {
  std::string metrics = temp_path("grad.jsonl");
  BinRun r = run(launch_args(2, 3, metrics, {"--dp", "2", "--compress-grad", "ef+int4"}));
  ASSERT_EQ(r.code, 0) << r.output;
  std::istringstream in(r.output);
  int grad_rows = 0;
  for (std::string line; std::getline(in, line);)
    if (line.find(" grad ") != std::string::npos) {
      ++grad_rows;
      EXPECT_NE(line.find("ef+int4"), std::string::npos) << line;
      EXPECT_NE(line.find("7."), std::string::npos) << line;  // ratio about 7.5x
    }
  EXPECT_EQ(grad_rows, 2) << r.output;  // 0→1 and 1→0
}

// --compression names a point of the frontier: frontier makes a subspace model (K = d_model/8) whose links carry
// int4 codes packed by zstd; a codec preset sets both directions' chains, which the metrics name in full.
TEST_F(Launch, CompressionPresetsSetTheModelAndTheChains) {
  struct Case {
    std::string name, codec;
    bool subspace;
  };
  for (const Case& c :
       {Case{"--compression frontier", "int4+zstd", true}, Case{"--compression safe", "int8+zstd", false},
        Case{"--compress-fwd preset:lossless", "zstd", false}}) {
    std::string metrics = temp_path("compression_" + std::to_string(c.subspace) + c.codec + ".jsonl");
    const std::string flag = c.name.substr(0, c.name.find(' ')), value = c.name.substr(c.name.find(' ') + 1);
    std::vector<std::string> extra = {flag, value};
    if (flag == "--compress-fwd") extra.insert(extra.end(), {"--compress-bwd", "preset:lossless"});
    BinRun r = run(launch_args(2, 3, metrics, extra));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(r.output.find("subspace_k=4") != std::string::npos, c.subspace) << c.name << "\n" << r.output;
    std::ifstream in(metrics);
    int sends = 0;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("links")) continue;
      for (const auto& l : j.at("links")) {
        if (l.value("dir", "") != "send" || (l.value("role", "") != "act" && l.value("role", "") != "act_grad"))
          continue;
        ++sends;
        EXPECT_EQ(l.value("codec", ""), c.codec) << c.name << ": " << l.dump();
        EXPECT_LT(l.at("wire_bytes").get<double>(), l.at("raw_bytes").get<double>()) << l.dump();
      }
    }
    EXPECT_GT(sends, 0) << c.name;
  }
}

// A --compress-link entry naming replica links sets that stage's group codec; the others keep --compress-grad.
TEST_F(Launch, ReplicaLinkOverrideSetsOneGroupsCodec) {
  std::string metrics = temp_path("grad_group.jsonl");
  BinRun r =
      run(launch_args(4, 2, metrics, {"--dp", "2", "--compress-grad", "int8", "--compress-link", "s1d0-s1d1=bf16"}));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("s0d0-s0d1:fwd  grad"), std::string::npos) << r.output;
  std::istringstream in(r.output);
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find(" grad ") == std::string::npos) continue;
    ++rows;
    const bool stage1 = line.find("s1d0-s1d1") != std::string::npos;
    EXPECT_NE(line.find(stage1 ? "bf16" : "int8"), std::string::npos) << line;
  }
  EXPECT_EQ(rows, 4) << r.output;
}

}  // namespace
}  // namespace lh
