// Multi-process pipeline jobs through the real binary ($LH_BIN), split by topic from test_launch.cpp (the Launch
// fixture and helpers: tests/integration/launch_util.h). This file: `ctl set-codec` switches a link's codec mid-run:
// activations, the replicas' gradients, the tensor shards' sums and one replica group's.
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

TEST_F(Launch, CtlSwitchesACodecMidRun) {
  // Long enough (about 0.1 s a step here) that the four ctl calls below, ~0.7 s each, land while it runs.
  const int steps = 200;
  std::string metrics = temp_path("ctl.jsonl");
  CtlJob job;
  ASSERT_NO_FATAL_FAILURE(start_ctl_job(&job, 2, steps, metrics, {"--link", "2M,1ms"}, "ctl-test", "ctl"));
  auto with = [&](std::vector<std::string> more) { return job.ctl(std::move(more)); };
  BinRun set = run(with({"--json", "set-codec", "--link", "0-1", "--dir", "fwd", "int8"}), 60s);
  ASSERT_EQ(set.code, 0) << set.output;
  const auto reply = nlohmann::json::parse(set.output);
  const int64_t planned = reply["from_step"].get<int64_t>();
  // The reply comes once every worker has scheduled the change, each saying from which step: the planned one, or
  // (an end that had begun it already) its next. The sender's is where the link switches.
  ASSERT_EQ(reply["applied"].size(), 2u) << set.output;
  int64_t from = -1;
  for (const auto& a : reply["applied"]) {
    EXPECT_GE(a["from_step"].get<int64_t>(), planned) << set.output;
    if (a["rank"].get<int>() == 0) from = a["from_step"].get<int64_t>();
  }
  BinRun set_back = run(with({"set-codec", "--link", "0-1", "--dir", "bwd", "int8"}), 60s);
  ASSERT_EQ(set_back.code, 0) << set_back.output;
  EXPECT_NE(set_back.output.find("acknowledged by rank(s) "), std::string::npos) << set_back.output;
  EXPECT_NE(set_back.output.find(": applies from step"), std::string::npos) << set_back.output;
  BinRun status = run(with({"status"}), 30s);
  EXPECT_EQ(status.code, 0) << status.output;
  EXPECT_NE(status.output.find("int8"), std::string::npos) << status.output;
  BinRun wrong_link = run(with({"set-codec", "--link", "0-2", "--dir", "fwd", "int8"}), 30s);
  EXPECT_NE(wrong_link.code, 0);
  EXPECT_NE(wrong_link.output.find("0-2"), std::string::npos) << wrong_link.output;

  ASSERT_EQ(wait_exit(job.launch, 300s), 0) << slurp(job.out);
  ASSERT_LE(from, steps) << "the job ended before the switch";
  auto records = read_step_metrics_file(metrics);
  ASSERT_TRUE(records.ok());
  auto sum = summarize_step_metrics(*records);
  ASSERT_TRUE(sum.ok());
  ASSERT_EQ(sum->codec_switches.size(), 2u);
  EXPECT_EQ(sum->codec_switches[0].step, from);
  EXPECT_EQ(sum->codec_switches[0].to, "int8");
  EXPECT_NE(slurp(job.out).find("int8"), std::string::npos);  // the summary table's codec column
}

// How many links of `role` the summary has; each is expected to have used `codecs`, in that order.
int links_that_used(const MetricsSummary& sum, const std::string& role, const std::vector<std::string>& codecs) {
  int links = 0;
  for (const LinkTotals& t : sum.links)
    if (t.role == role) {
      ++links;
      EXPECT_EQ(t.codecs, codecs) << role << " " << t.src << "→" << t.dst;
    }
  return links;
}

// `ctl set-codec --role grad` switches the replicas' gradient codec live, at one step on every replica.
TEST_F(Launch, CtlSwitchesTheGradientCodecMidRun) {
  const int steps = 40;
  std::string metrics = temp_path("ctl_grad.jsonl");
  CtlJob job;
  ASSERT_NO_FATAL_FAILURE(
      start_ctl_job(&job, 2, steps, metrics, {"--dp", "2", "--link", "2M,1ms"}, "ctl-grad", "ctl_grad"));
  auto with = [&](std::vector<std::string> more) { return job.ctl(std::move(more)); };
  // Bad requests are refused, naming what is wrong, and the job goes on.
  BinRun bad_spec = run(with({"set-codec", "--role", "grad", "lowrank:rank=2"}), 30s);
  EXPECT_NE(bad_spec.code, 0);
  EXPECT_NE(bad_spec.output.find("'lowrank' cannot compress"), std::string::npos) << bad_spec.output;
  BinRun bad_link = run(with({"set-codec", "--role", "grad", "--link", "d0-d1:fwd", "int8"}), 30s);
  EXPECT_NE(bad_link.code, 0);
  EXPECT_NE(bad_link.output.find("drop the :fwd/:bwd"), std::string::npos) << bad_link.output;
  BinRun set = run(with({"--json", "set-codec", "--role", "grad", "int8"}), 30s);
  ASSERT_EQ(set.code, 0) << set.output;
  const int64_t from = nlohmann::json::parse(set.output)["from_step"].get<int64_t>();
  BinRun status = run(with({"status"}), 30s);
  EXPECT_NE(status.output.find("link replicas grad -> int8 from step " + std::to_string(from)), std::string::npos)
      << status.output;
  EXPECT_NE(status.output.find("replicas grad"), std::string::npos) << status.output;  // the traffic row
  EXPECT_NE(status.output.find("dp 2"), std::string::npos) << status.output;
  ASSERT_EQ(wait_exit(job.launch, 300s), 0) << slurp(job.out);
  ASSERT_LE(from, steps) << "the job ended before the switch";
  auto records = read_step_metrics_file(metrics);
  ASSERT_TRUE(records.ok());
  auto sum = summarize_step_metrics(*records);
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(links_that_used(*sum, "grad", {"none", "int8"}), 2);
  // Both replicas switched at the same step: the step's gradient bytes drop about 4× from `from` on.
  const auto& wire = sum->wire_bytes_per_step.at(LinkKey{0, 1, "grad"});
  for (const StepPoint& p : wire) {
    if (p.step == from - 1) {
      EXPECT_GT(p.value, 0) << "step " << p.step;
    }
    if (p.step >= from)
      EXPECT_LT(p.value * 3, wire.front().value) << "step " << p.step;
    else
      EXPECT_EQ(p.value, wire.front().value) << "step " << p.step;
  }
  EXPECT_EQ(records->size(), size_t(2 * steps));
}

// `ctl set-codec --role tp` switches every tp group's partial sums at one step boundary.
TEST_F(Launch, CtlSwitchesTheTpCodecMidRun) {
  const int steps = 30;
  std::string metrics = temp_path("ctl_tp.jsonl");
  CtlJob job;
  ASSERT_NO_FATAL_FAILURE(
      start_ctl_job(&job, 2, steps, metrics, {"--tp", "2", "--link", "2M,1ms"}, "ctl-tp", "ctl_tp"));
  auto with = [&](std::vector<std::string> more) { return job.ctl(std::move(more)); };
  BinRun bad_spec = run(with({"set-codec", "--role", "tp", "int9"}), 30s);
  EXPECT_NE(bad_spec.code, 0);
  EXPECT_NE(bad_spec.output.find("int9"), std::string::npos) << bad_spec.output;
  BinRun bad_link = run(with({"set-codec", "--role", "tp", "--link", "t0-t1", "int8"}), 30s);
  EXPECT_NE(bad_link.code, 0);
  EXPECT_NE(bad_link.output.find("drop --link"), std::string::npos) << bad_link.output;
  BinRun set = run(with({"--json", "set-codec", "--role", "tp", "int8"}), 30s);
  ASSERT_EQ(set.code, 0) << set.output;
  const int64_t from = nlohmann::json::parse(set.output)["from_step"].get<int64_t>();
  BinRun status = run(with({"status"}), 30s);
  EXPECT_NE(status.output.find("link tp shards tp -> int8 from step " + std::to_string(from)), std::string::npos)
      << status.output;
  EXPECT_NE(status.output.find("tp 2"), std::string::npos) << status.output;
  ASSERT_EQ(wait_exit(job.launch, 300s), 0) << slurp(job.out);
  ASSERT_LE(from, steps) << "the job ended before the switch";
  auto records = read_step_metrics_file(metrics);
  ASSERT_TRUE(records.ok());
  auto sum = summarize_step_metrics(*records);
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(links_that_used(*sum, "tp", {"none", "int8"}), 2);
  // Both shards switched at the same step: the step's tp bytes drop about 4× from `from` on (evaluation steps send
  // more, so compare training-only steps: those without a validation loss).
  std::set<int64_t> eval_steps;
  for (const WorkerStepMetrics& m : *records)
    if (m.val_loss) eval_steps.insert(m.step);
  const auto& wire = sum->wire_bytes_per_step.at(LinkKey{0, 1, "tp"});
  for (const StepPoint& p : wire) {
    if (p.step < from || eval_steps.count(p.step)) continue;
    EXPECT_LT(p.value * 3, wire.front().value) << "step " << p.step;
  }
}

// `ctl set-codec --role grad --link s1d0-s1d1` switches only stage 1's replica group.
TEST_F(Launch, CtlSwitchesOneReplicaGroupsCodec) {
  const int steps = 30;
  std::string metrics = temp_path("ctl_group.jsonl");
  CtlJob job;
  ASSERT_NO_FATAL_FAILURE(
      start_ctl_job(&job, 4, steps, metrics, {"--dp", "2", "--link", "2M,1ms"}, "ctl-group", "ctl_group"));
  auto with = [&](std::vector<std::string> more) { return job.ctl(std::move(more)); };
  BinRun pipeline = run(with({"set-codec", "--role", "grad", "--link", "0-1", "int8"}), 30s);
  EXPECT_NE(pipeline.code, 0);
  EXPECT_NE(pipeline.output.find("names pipeline links; name replica links"), std::string::npos) << pipeline.output;
  BinRun set = run(with({"--json", "set-codec", "--role", "grad", "--link", "s1d0-s1d1", "int8"}), 30s);
  ASSERT_EQ(set.code, 0) << set.output;
  const int64_t from = nlohmann::json::parse(set.output)["from_step"].get<int64_t>();
  BinRun status = run(with({"status"}), 30s);
  EXPECT_NE(status.output.find("link s1 replicas grad -> int8 from step " + std::to_string(from)), std::string::npos)
      << status.output;
  ASSERT_EQ(wait_exit(job.launch, 300s), 0) << slurp(job.out);
  ASSERT_LE(from, steps) << "the job ended before the switch";
  auto records = read_step_metrics_file(metrics);
  ASSERT_TRUE(records.ok());
  auto sum = summarize_step_metrics(*records);
  ASSERT_TRUE(sum.ok());
  int grad_links = 0;
  for (const LinkTotals& t : sum->links)
    if (t.role == "grad") {
      ++grad_links;
      const bool stage1 = t.src >= 2;  // ranks 2, 3
      EXPECT_EQ(t.codecs, stage1 ? (std::vector<std::string>{"none", "int8"}) : (std::vector<std::string>{"none"}))
          << t.src << "→" << t.dst;
    }
  EXPECT_EQ(grad_links, 4);
}

}  // namespace
}  // namespace lh
