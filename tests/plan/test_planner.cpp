// Tests for cluster descriptions (JSON/YAML, every bad field named) and the planner: predictions that follow from the
// simulator's exact cases, --link and --slowdown on top of a cluster, and searches that avoid slow links and give a
// slow worker fewer blocks. Run by ctest with label `plan`.
#include <gtest/gtest.h>

#include "compress/codec_chain.h"
#include "core/gpt.h"
#include "plan/auto_codec.h"
#include "plan/cluster.h"
#include "plan/planner.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

const char* kTwoSites = R"({
  "workers": [{"name": "a", "count": 2, "gflops": 40, "site": "east", "memory_gb": 16},
              {"name": "b0", "gflops": 20, "site": "west"}],
  "links": {"default": {"bandwidth": "1G", "latency": "1ms"},
            "rules": [{"between": ["east", "west"], "bandwidth": "100M", "latency": "40ms"},
                      {"from": "a1", "to": "b0", "bandwidth": 5e6}]}})";

TEST(Cluster, ReadsWorkersSitesAndLinkRules) {
  Cluster c = value_of(Cluster::parse(kTwoSites, false, "c.json"));
  ASSERT_EQ(c.size(), 3);
  EXPECT_EQ(c.worker(0).name, "a0");
  EXPECT_EQ(c.worker(1).name, "a1");
  EXPECT_EQ(c.worker(2).site, "west");
  EXPECT_DOUBLE_EQ(c.worker(1).gflops, 40);
  EXPECT_DOUBLE_EQ(c.worker(0).memory_gb, 16);
  EXPECT_DOUBLE_EQ(c.bandwidth(0, 1), 1e9);
  EXPECT_DOUBLE_EQ(c.latency(0, 1), 1e-3);
  EXPECT_DOUBLE_EQ(c.bandwidth(0, 2), 100e6);
  EXPECT_DOUBLE_EQ(c.latency(2, 0), 40e-3);
  EXPECT_DOUBLE_EQ(c.bandwidth(1, 2), 5e6);    // the one-way rule, later, wins
  EXPECT_DOUBLE_EQ(c.latency(1, 2), 40e-3);    // it set no latency
  EXPECT_DOUBLE_EQ(c.bandwidth(2, 1), 100e6);  // the other way is untouched

  // The same description in YAML, and the JSON `probe` writes, read back to the same cluster.
  const char* yaml = R"(
workers:
  - {name: a, count: 2, gflops: 40, site: east, memory_gb: 16}
  - {name: b0, gflops: 20, site: west}
links:
  default: {bandwidth: 1G, latency: 1ms}
  rules:
    - {between: [east, west], bandwidth: 100M, latency: 40ms}
    - {from: a1, to: b0, bandwidth: 5e6}
)";
  for (const Cluster& d :
       {value_of(Cluster::parse(yaml, true, "c.yaml")), value_of(Cluster::from_json(c.to_json(), "written"))}) {
    ASSERT_EQ(d.size(), 3);
    for (int a = 0; a < 3; ++a) {
      EXPECT_EQ(d.worker(a).name, c.worker(a).name);
      EXPECT_DOUBLE_EQ(d.worker(a).gflops, c.worker(a).gflops);
      for (int b = 0; b < 3; ++b)
        if (a != b) {
          EXPECT_DOUBLE_EQ(d.bandwidth(a, b), c.bandwidth(a, b)) << a << "->" << b;
          EXPECT_DOUBLE_EQ(d.latency(a, b), c.latency(a, b)) << a << "->" << b;
        }
    }
  }
}

TEST(Cluster, BadDescriptionsNameTheField) {
  auto err = [](const std::string& text) { return Cluster::parse(text, false, "c.json").status(); };
  const std::string links = R"("links": {"default": {"bandwidth": "1G", "latency": "1ms"}})";
  expect_error(err("{"), "c.json: not valid JSON");
  expect_error(Cluster::parse("workers: [", true, "c.yaml").status(), "c.yaml: not valid YAML");
  expect_error(err(R"({)" + links + "}"), "c.json: workers: must be a non-empty array");
  expect_error(err(R"({"workers": [{"name": "x"}], )" + links + "}"), "workers[0].gflops: must be a number > 0");
  expect_error(err(R"({"workers": [{"gflops": -3}], )" + links + "}"), "workers[0].gflops");
  expect_error(err(R"({"workers": [{"gflops": 3, "speed": 1}], )" + links + "}"), "workers[0].speed: unknown field");
  expect_error(err(R"({"workers": [{"gflops": 3, "count": 0}], )" + links + "}"), "workers[0].count");
  expect_error(err(R"({"workers": [{"name": "x", "gflops": 3}, {"name": "x", "gflops": 3}], )" + links + "}"),
               "workers[1].name: 'x' names two workers");
  expect_error(err(R"({"workers": [{"gflops": 3}]})"), "c.json: links: must be an object");
  expect_error(err(R"({"workers": [{"gflops": 3}], "links": {"rules": []}})"), "links: needs 'default'");
  expect_error(err(R"({"workers": [{"gflops": 3}], "links": {"default": {"bandwidth": "fast", "latency": 0}}})"),
               "links.default.bandwidth: 'fast' is not a bandwidth");
  expect_error(err(R"({"workers": [{"gflops": 3}], "links": {"default": {"bandwidth": 0, "latency": 0}}})"),
               "links.default.bandwidth: a bandwidth must be > 0");
  expect_error(err(R"({"workers": [{"gflops": 3}], "links": {"default": {"bandwidth": "1G", "latency": "5 days"}}})"),
               "links.default.latency: '5 days' is not a latency");
  // A latency needs its unit, as --link's delay does: a bare number (once seconds here, ms in --link) is refused
  // naming the units, except 0 and the plain seconds of links.matrix that probe writes.
  expect_error(err(R"({"workers": [{"gflops": 3}], "links": {"default": {"bandwidth": "1G", "latency": 40}}})"),
               "links.default.latency: 40 has no unit: write \"40ms\", \"40s\" or \"40us\"");
  expect_error(err(R"({"workers": [{"gflops": 3}], "links": {"default": {"bandwidth": "1G", "latency": "40"}}})"),
               "links.default.latency: latency '40' has no unit: write 40ms, 40s or 40us");
  expect_error(
      Cluster::parse("workers: [{gflops: 3}]\nlinks: {default: {bandwidth: 1G, latency: 40}}", true, "c.yaml").status(),
      "c.yaml: links.default.latency: 40 has no unit");
  EXPECT_DOUBLE_EQ(value_of(Cluster::parse(R"({"workers": [{"gflops": 3}, {"gflops": 3}], "links": {"default":
               {"bandwidth": 100, "latency": 0}}})",
                                           false, "c.json"))
                       .bandwidth(0, 1),
                   100);  // bits/s, as in --link
  EXPECT_DOUBLE_EQ(value_of(Cluster::parse(R"({"workers": [{"gflops": 3}, {"gflops": 3}], "links": {"matrix":
               {"bandwidth": [[0, 1e6], [1e6, 0]], "latency": [[0, 0.04], [0.04, 0]]}}})",
                                           false, "c.json"))
                       .latency(0, 1),
                   0.04);
  expect_error(err(R"({"workers": [{"gflops": 3}], "links": {"default": {"bandwidth": "1G"}}})"),
               "links.default: needs both 'bandwidth' and 'latency'");
  expect_error(err(R"({"workers": [{"gflops": 3}, {"gflops": 3}], "links": {"matrix": {"bandwidth": [[0, 1]],
               "latency": [[0, 0], [0, 0]]}}})"),
               "links.matrix.bandwidth: must have one row per worker (2)");
  expect_error(err(R"({"workers": [{"gflops": 3}, {"gflops": 3}], "links": {"matrix": {"bandwidth": [[0, 1], [1, 0]],
               "latency": [[0, 0], [-1, 0]]}}})"),
               "links.matrix.latency[1][0]");
  expect_error(err(R"({"workers": [{"gflops": 3}], "links": {"default": {"bandwidth": 1, "latency": 0},
               "rules": [{"within": "mars", "bandwidth": 1}]}})"),
               "links.rules[0].within: 'mars' is neither a worker's name nor a site");
  expect_error(err(R"({"workers": [{"gflops": 3}], "links": {"default": {"bandwidth": 1, "latency": 0},
               "rules": [{"within": "w0"}]}})"),
               "links.rules[0]: sets neither 'bandwidth' nor 'latency'");
  expect_error(err(R"({"workers": [{"gflops": 3}], "links": {"default": {"bandwidth": 1, "latency": 0},
               "rules": [{"from": "w0", "bandwidth": 1}]}})"),
               "links.rules[0]: 'from' and 'to' go together");
  expect_error(Cluster::load("/nonexistent/c.json").status(), "cluster file /nonexistent/c.json: cannot be read");
}

JobConfig pipeline_job(int stages, int microbatches) {
  JobConfig j;
  j.train.model.layers = 4;
  j.train.model.d_model = 64;
  j.train.model.heads = 2;
  j.train.model.seq = 16;
  j.train.batch = 8;
  j.workers = j.pp = stages;
  j.microbatches = microbatches;
  return j;
}

// On free links and equal stages the prediction is the simulator's known case: the bubble is (S − 1)/(M + S − 1)
// (here within 1%: the last stage's head of 256 outputs adds 1% to its blocks' work).
TEST(Planner, EqualStagesOnFreeLinksHaveTheTheoreticalBubble) {
  for (int M : {1, 2, 4, 8}) {
    JobConfig j = pipeline_job(4, M);
    j.train.model.d_model = 1024;
    Cluster c = Cluster::uniform(4, 10, 1e15, 0);
    JobPlan p = value_of(evaluate_plan(c, j));
    EXPECT_NEAR(p.bubble, 3.0 / (M + 3), 0.01) << "M=" << M;
    // Between the equal pipelines of its fastest (a middle) and its slowest (the last) stage.
    EXPECT_GE(p.pipeline_s, (M + 3) * (p.stage_forward_s[1] + p.stage_backward_s[1]) * (1 - 1e-12));
    EXPECT_LE(p.pipeline_s, (M + 3) * (p.stage_forward_s[3] + p.stage_backward_s[3]) * (1 + 1e-12));
    EXPECT_GT(p.stage_forward_s[3], p.stage_forward_s[1]);
    EXPECT_DOUBLE_EQ(p.norm_s, 0);  // no latency
    EXPECT_NEAR(p.step_s, p.pipeline_s + p.optimizer_s, 1e-12);
  }
}

// A link-bound job: transfers are packet bytes over the bandwidth, and the step is at least every transfer of the
// slow direction plus one latency each way. --link caps the cluster's links and adds its delay.
TEST(Planner, LinkBoundStepsAreBytesOverRateAndLatency) {
  JobConfig j = pipeline_job(2, 4);
  j.schedule = ScheduleKind::kGPipe;
  j.compress_fwd = "int8";
  Cluster c = Cluster::uniform(2, 10, 1e15, 0);
  j.links = {"1M,30ms"};
  JobPlan p = value_of(evaluate_plan(c, j));
  const double rows = 8.0 / 4 * 16;
  const double act8 =
      double(value_of(value_of(compress::parse_codec_spec("int8")).packet_bytes(Shape{int64_t(rows), 64})));
  const double act32 =
      double(value_of(value_of(compress::parse_codec_spec("none")).packet_bytes(Shape{int64_t(rows), 64})));
  EXPECT_DOUBLE_EQ(p.fwd_transfer_s[0], act8 * 8 / 1e6);
  EXPECT_DOUBLE_EQ(p.bwd_transfer_s[0], act32 * 8 / 1e6);
  const double compute = p.stage_forward_s[0] + p.stage_backward_s[0] + p.stage_forward_s[1] + p.stage_backward_s[1];
  EXPECT_NEAR(p.pipeline_s, compute + 4 * (p.fwd_transfer_s[0] + p.bwd_transfer_s[0]) + 2 * 0.030, 1e-9);
  EXPECT_NEAR(p.norm_s, 0.030, 1e-12);  // the gradient norm's one hop
  EXPECT_EQ(p.bottleneck, "link 0-1 bwd");
  EXPECT_DOUBLE_EQ(p.wire_bytes, 4 * (act8 + act32));

  // A rule for one direction only; the cluster's own latency adds to the emulated delay.
  Cluster slow = Cluster::uniform(2, 10, 1e15, 0.005);
  j.links = {"0-1:bwd=2M,10ms"};
  JobPlan q = value_of(evaluate_plan(slow, j));
  EXPECT_DOUBLE_EQ(q.bwd_transfer_s[0], act32 * 8 / 2e6);
  EXPECT_LT(q.fwd_transfer_s[0], 1e-6);
  EXPECT_NEAR(q.norm_s, 0.015, 1e-12);
}

TEST(Planner, SlowdownAndAutoFollowTheJob) {
  JobConfig j = pipeline_job(2, 4);
  Cluster c = Cluster::uniform(2, 10, 1e15, 0);
  JobPlan base = value_of(evaluate_plan(c, j));
  j.slowdown = {"1=3"};
  JobPlan slowed = value_of(evaluate_plan(c, j));
  EXPECT_NEAR(slowed.stage_forward_s[1], 3 * base.stage_forward_s[1], 1e-12);
  EXPECT_NEAR(slowed.stage_forward_s[0], base.stage_forward_s[0], 1e-12);
  EXPECT_EQ(slowed.bottleneck, "stage 1 compute");

  // auto keeps none on a free link and compresses a slow one.
  j.slowdown.clear();
  j.compress_fwd = j.compress_bwd = "auto";
  EXPECT_EQ(value_of(evaluate_plan(c, j)).fwd_codec[0], "none");
  j.links = {"200k"};
  JobPlan a = value_of(evaluate_plan(c, j));
  EXPECT_NE(a.fwd_codec[0], "none");
  EXPECT_NE(a.bwd_codec[0], "none");
}

// auto links are predicted as auto settles in a job: chosen together, the least lossy codecs whose predicted step is
// within --auto-tolerance of the fastest's. Over slow, distant links that is within the tolerance of the fastest
// fixed codec; with a slow stage that hides the links, less lossy codecs.
TEST(Planner, AutoLinksSettleWithinTheToleranceOfTheFastestStep) {
  const std::vector<std::string> ladder = {"none", "bf16", "int8", "int4"};
  std::map<std::string, int> lossiness;
  for (const char* slowdown : {"", "1=40"}) {
    JobConfig j = pipeline_job(4, 4);
    j.train.model.d_model = 256;
    j.links = {"10M,50ms"};
    if (*slowdown) j.slowdown = {slowdown};
    Cluster c = Cluster::uniform(4, 10, 1e15, 0);
    std::vector<double> fixed;
    std::string steps;
    for (const std::string& spec : ladder) {
      j.compress_fwd = j.compress_bwd = spec;
      fixed.push_back(value_of(evaluate_plan(c, j)).step_s);
      steps += " " + spec + " " + std::to_string(fixed.back());
    }
    j.compress_fwd = j.compress_bwd = "auto";
    JobPlan a = value_of(evaluate_plan(c, j));
    EXPECT_LE(a.step_s, (1 + j.auto_tolerance) * *std::min_element(fixed.begin(), fixed.end()))
        << slowdown << ":" << steps;
    std::string chosen;
    for (const auto* codecs : {&a.fwd_codec, &a.bwd_codec})
      for (const std::string& codec : *codecs) {
        chosen += " " + codec;
        lossiness[slowdown] += int(std::find(ladder.begin(), ladder.end(), codec) - ladder.begin());
      }
    // None of the links can take a less lossy codec and keep the step within the tolerance.
    for (size_t l = 0; l < a.fwd_codec.size(); ++l)
      for (int dir = 0; dir < 2; ++dir) {
        const std::string& now = (dir == 0 ? a.fwd_codec : a.bwd_codec)[l];
        const int idx = int(std::find(ladder.begin(), ladder.end(), now) - ladder.begin());
        if (idx == 0) continue;
        JobConfig t = j;
        t.compress_fwd = t.compress_bwd = "none";
        for (size_t m = 0; m < a.fwd_codec.size(); ++m)
          for (int e = 0; e < 2; ++e) {
            const std::string spec =
                m == l && e == dir ? ladder[size_t(idx - 1)] : (e == 0 ? a.fwd_codec : a.bwd_codec)[m];
            t.compress_link.push_back(std::to_string(m) + "-" + std::to_string(m + 1) + (e == 0 ? ":fwd=" : ":bwd=") +
                                      spec);
          }
        EXPECT_GT(value_of(evaluate_plan(c, t)).step_s,
                  (1 + j.auto_tolerance) * *std::min_element(fixed.begin(), fixed.end()) * (1 - 1e-9))
            << slowdown << ": link " << l << (dir == 0 ? ":fwd " : ":bwd ") << now << " could be "
            << ladder[size_t(idx - 1)] << "; chose" << chosen << ";" << steps;
      }
  }
  EXPECT_LT(lossiness["1=40"], lossiness[""]);
}

// --partition auto: from the speeds (over --slowdown), then blocks moved while the predicted step shrinks — never
// predicted slower than the speed split or the even one, and the last stage (which also holds the head) no fuller
// than the others on equal machines.
TEST(Planner, PartitionAutoIsNeverPredictedSlowerThanSpeedOrEven) {
  JobConfig j = pipeline_job(4, 4);
  j.train.model.layers = 12;
  j.train.model.d_model = 128;
  Cluster c = Cluster::uniform(4, 10, 1e15, 0);
  for (const std::vector<std::string>& slow : {std::vector<std::string>{}, {"2=3"}}) {
    j.slowdown = slow;
    const std::string planned = value_of(plan_partition(c, j));
    j.partition = planned;
    const double auto_step = value_of(evaluate_plan(c, j)).step_s;
    for (const std::string other : {"", "speed"}) {
      j.partition = other;
      EXPECT_LE(auto_step, value_of(evaluate_plan(c, j)).step_s * (1 + 1e-12)) << planned << " vs '" << other << "'";
    }
    j.partition = "auto";
    EXPECT_DOUBLE_EQ(value_of(evaluate_plan(c, j)).step_s, auto_step);
    Partition p = value_of(Partition::parse(planned, 12, 4));
    if (slow.empty()) {
      EXPECT_LE(p.counts()[3], p.counts()[0]) << planned;
    } else {
      EXPECT_LT(p.counts()[2], p.counts()[0]) << planned;
      EXPECT_LT(p.counts()[2], p.counts()[1]) << planned;
    }
  }
}

// --dp-split speed: a replica on a slower machine gets a smaller share, and the step is predicted shorter than with
// equal shares (where the slow replica sets the pace).
TEST(Planner, UnequalSharesSpeedUpAJobWithASlowReplica) {
  JobConfig j = pipeline_job(1, 2);
  j.workers = 2;
  j.dp = 2;
  j.train.batch = 16;
  Cluster c = Cluster::uniform(2, 10, 1e15, 0);
  c.set_gflops(1, 2.5);
  JobPlan even = value_of(evaluate_plan(c, j));
  j.dp_split = "speed";
  JobPlan split = value_of(evaluate_plan(c, j));
  // Speeds 10 and 2.5: 16 sequences in shares of 2 → 14:2 (1.4 against 0.8 units of time; equal: 3.2 for the slow).
  EXPECT_LT(split.step_s, 0.6 * even.step_s);
  j.dp_split = "4:1";
  EXPECT_DOUBLE_EQ(value_of(evaluate_plan(c, j)).step_s, split.step_s);
  j.dp_split = "14:2";
  EXPECT_DOUBLE_EQ(value_of(evaluate_plan(c, j)).step_s, split.step_s);
  j.dp_split = "1:1";
  EXPECT_DOUBLE_EQ(value_of(evaluate_plan(c, j)).step_s, even.step_s);
}

TEST(Planner, FlopsPerStepMatchTheModelsCount) {
  JobConfig j = pipeline_job(2, 2);
  j.partition = "3,1";
  const std::vector<double> f = value_of(train_flops_per_step(j));
  ASSERT_EQ(f.size(), 2u);
  Gpt whole = value_of(Gpt::create(j.train.model, Device::cpu, 1));
  const double tokens = double(j.train.batch) * j.train.model.seq;
  EXPECT_NEAR(f[0] + f[1], whole.train_flops_per_token(j.train.model.seq) * tokens, 1e-6 * (f[0] + f[1]));
  EXPECT_GT(f[0], f[1]);  // three blocks against one block and the head of 256 outputs
}

TrainConfig small_model(int layers) {
  TrainConfig t;
  t.model.layers = layers;
  t.model.d_model = 128;
  t.model.heads = 4;
  t.model.seq = 64;
  t.batch = 16;
  return t;
}

// Four equal workers, one of them a quarter as fast, free links, a pipeline of 4: the slow worker's stage gets fewer
// blocks; and the search never predicts worse than an even plan of the same grid.
TEST(Planner, ASlowWorkerGetsFewerBlocks) {
  Cluster c = Cluster::uniform(4, 40, 1e12, 0);
  c.set_gflops(2, 10);
  PlanOptions o;
  o.max_tp = o.max_dp = 1;
  o.top = 50;
  TrainConfig t = small_model(12);
  auto plans = value_of(search_plans(c, t, o));
  const JobPlan* four = nullptr;
  for (const JobPlan& p : plans)
    if (p.pp == 4 && !four) four = &p;
  ASSERT_NE(four, nullptr);
  int slow_stage = -1;
  for (int r = 0; r < 4; ++r)
    if (four->worker_of_rank[size_t(r)] == 2) slow_stage = r;
  ASSERT_GE(slow_stage, 0);
  for (int s = 0; s < 4; ++s)
    if (s != slow_stage) {
      EXPECT_LT(four->partition[size_t(slow_stage)], four->partition[size_t(s)]) << four->describe();
    }
  JobConfig even;
  even.train = t;
  even.workers = even.pp = 4;
  even.microbatches = four->microbatches;
  even.schedule = four->schedule;
  Cluster ordered = Cluster::uniform(4, 40, 1e12, 0);
  ordered.set_gflops(slow_stage, 10);  // the slow worker at the rank the plan gave it
  EXPECT_LT(four->step_s, value_of(evaluate_plan(ordered, even)).step_s);
  for (size_t i = 1; i < plans.size(); ++i) EXPECT_LE(plans[i - 1].step_s, plans[i].step_s);
}

// Two sites joined by a slow link: the best plan compresses what crosses it, or keeps its traffic inside a site.
TEST(Planner, TheBestPlanSparesTheSlowLink) {
  const char* text = R"({"workers": [{"name": "a", "count": 2, "gflops": 40, "site": "a"},
                                      {"name": "b", "count": 2, "gflops": 40, "site": "b"}],
                         "links": {"default": {"bandwidth": "10G", "latency": "50us"},
                                   "rules": [{"between": ["a", "b"], "bandwidth": "5M", "latency": "40ms"}]}})";
  Cluster c = value_of(Cluster::parse(text, false, "sites.json"));
  PlanOptions o;
  o.max_tp = 1;
  TrainConfig t = small_model(4);
  auto plans = value_of(search_plans(c, t, o));
  const JobPlan& best = plans.front();
  bool crosses = false;
  for (int s = 0; s + 1 < best.pp; ++s)
    for (int d = 0; d < best.dp; ++d) {
      const int a = best.worker_of_rank[size_t(s * best.dp + d)],
                b = best.worker_of_rank[size_t((s + 1) * best.dp + d)];
      if (c.worker(a).site != c.worker(b).site) {
        crosses = true;
        EXPECT_NE(best.fwd_codec[size_t(s)], "none") << best.describe();
      }
    }
  // Four stages in a row over the slow link, uncompressed, is what the plan must beat.
  JobConfig naive;
  naive.train = t;
  naive.workers = naive.pp = 4;
  naive.microbatches = 4;
  EXPECT_LT(best.step_s, value_of(evaluate_plan(c, naive)).step_s) << best.describe() << (crosses ? " (crosses)" : "");
  EXPECT_NE(launch_command(best, t).find("--pp " + std::to_string(best.pp)), std::string::npos);
}

TEST(Planner, ImpossiblePlansSayWhy) {
  const char* text = R"({"workers": [{"count": 2, "gflops": 40, "memory_gb": 0.0001}],
                         "links": {"default": {"bandwidth": "1G", "latency": "1ms"}}})";
  Cluster tiny = value_of(Cluster::parse(text, false, "tiny.json"));
  expect_error(search_plans(tiny, small_model(4), PlanOptions{}).status(), "no grid fits the workers' memory");
  PlanOptions bad;
  bad.ladder = {"none", "int3"};
  expect_error(search_plans(Cluster::uniform(2, 1, 1e9, 0), small_model(4), bad).status(), "--ladder entry 'int3'");
  JobConfig j = pipeline_job(4, 2);
  expect_error(evaluate_plan(Cluster::uniform(2, 1, 1e9, 0), j).status(), "the job has 4 workers, the cluster 2");
}

}  // namespace
}  // namespace lh
