// Runs `longhaul plan` and `longhaul probe` (the binary named by LH_BIN, which ctest sets) on generated cluster and
// metrics files: the plan table, the launch command, --evaluate, and clear errors for bad files and flags. Skips when
// LH_BIN is unset. Label `apps`.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/apps/cli_test.h"

namespace {

using CliRun = lh::testing::CommandRun;

class PlanCli : public lh::testing::CliTest {
 protected:
  PlanCli() : CliTest("plan_cli") {}
  CliRun run(const std::string& args) { return run_bin(args); }
};

const char* kSites = R"(# two sites of two machines, joined by a slow link
workers:
  - {name: a, count: 2, gflops: 40, site: a, memory_gb: 8}
  - {name: b, count: 2, gflops: 20, site: b, memory_gb: 8}
links:
  default: {bandwidth: 10G, latency: 50us}
  rules:
    - {between: [a, b], bandwidth: 20M, latency: 30ms}
)";
const char* kModel = "--layers 4 --d-model 128 --heads 4 --seq 32 --batch 8";

TEST_F(PlanCli, PrintsThePlansAndTheLaunchCommandOfTheBest) {
  const std::string c = write("sites.yaml", kSites);
  CliRun r = run("plan --cluster " + c + " " + kModel + " --top 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("on 4 workers of " + c), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the best plan, step by step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 (stage 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("longhaul launch --workers "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--layers 4 --d-model 128 --heads 4 --seq 32 --batch 8"), std::string::npos) << r.output;

  // JSON: the plans fastest first, and --evaluate of the best one's grid predicts the same step.
  r = run("plan --cluster " + c + " " + kModel + " --top 3 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j["plans"].size(), 3u);
  EXPECT_LE(j["plans"][0]["step_s"].get<double>(), j["plans"][1]["step_s"].get<double>());
  EXPECT_LT(j["seconds"].get<double>(), 60.0);
  r = run("plan --cluster " + c + " " + kModel + " --evaluate --json --workers 2 --pp 2");
  ASSERT_EQ(r.code, 0) << r.output;
  auto e = nlohmann::json::parse(r.output);
  EXPECT_EQ(e["pp"], 2);
  EXPECT_GT(e["step_s"].get<double>(), 0);

  // Uncompressed over the slow link is slower than int4 over it (ranks 1 and 2 are on different sites).
  r = run("plan --cluster " + c + " " + kModel + " --evaluate --json --workers 4 --pp 4");
  ASSERT_EQ(r.code, 0) << r.output;
  const double none = nlohmann::json::parse(r.output)["step_s"].get<double>();
  r = run("plan --cluster " + c + " " + kModel +
          " --evaluate --json --workers 4 --pp 4 --compress-link 1-2:fwd=int4 "
          "--compress-link 1-2:bwd=int4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_LT(nlohmann::json::parse(r.output)["step_s"].get<double>(), none);
}

TEST_F(PlanCli, BadInputIsNamed) {
  const std::string c = write("sites.yaml", kSites);
  CliRun r =
      run("plan --cluster " + write("bad.json", R"({"workers": [{"gflops": "fast"}], "links": {}})") + " " + kModel);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("workers[0].gflops: must be a number > 0"), std::string::npos) << r.output;
  r = run("plan --cluster " + dir_ + "/missing.json " + kModel);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot be read"), std::string::npos) << r.output;
  r = run("plan --cluster " + c + " " + kModel + " --pp 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--pp describes one job: add --evaluate"), std::string::npos) << r.output;
  r = run("plan --cluster " + c +
          " --layers 8 --d-model 128 --heads 4 --seq 32 --batch 8 --evaluate --workers 8 --pp 8");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("the job has 8 workers, the cluster 4"), std::string::npos) << r.output;
  r = run("plan --cluster " + c + " " + kModel + " --auto-ladder none,int3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("int3"), std::string::npos) << r.output;
  const std::string tiny = write("tiny.json", R"({"workers": [{"count": 2, "gflops": 10, "memory_gb": 0.00001}],
      "links": {"default": {"bandwidth": "1G", "latency": "1ms"}}})");
  r = run("plan --cluster " + tiny + " " + kModel);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no grid fits the workers' memory"), std::string::npos) << r.output;
}

// probe turns a job's metrics into a cluster that plan reads: GFLOP/s from compute_s, bandwidth from bulk sends (their
// serial time where the records carry it), latency from the senders' latency_s.
TEST_F(PlanCli, ProbeWritesAClusterFromMetrics) {
  std::string lines;
  for (int step = 1; step <= 4; ++step)
    for (int w = 0; w < 2; ++w) {
      nlohmann::json m = {
          {"step", step}, {"worker", w}, {"stage", w}, {"tokens_per_s", 100.0}, {"compute_s", w == 0 ? 0.010 : 0.040}};
      if (w == 0)
        m["links"] = {{{"src", 0},
                       {"dst", 1},
                       {"role", "act"},
                       {"dir", "send"},
                       {"raw_bytes", 400000},
                       {"wire_bytes", 400000},
                       {"messages", 4},
                       {"seconds", 0.032}}};
      else  // with the serial time and latency of the link meter: busy 0.232 s, of which 50 ms a message is delay
        m["links"] = {{{"src", 1},
                       {"dst", 0},
                       {"role", "act_grad"},
                       {"dir", "send"},
                       {"raw_bytes", 400000},
                       {"wire_bytes", 400000},
                       {"messages", 4},
                       {"seconds", 0.232},
                       {"serial_s", 0.032},
                       {"latency_s", 0.050}}};
      lines += m.dump() + "\n";
    }
  const std::string metrics = write("job.jsonl", lines);
  CliRun r = run("probe --from-metrics " + metrics + " " + kModel + " --workers 2 --pp 2 --microbatches 4");
  ASSERT_EQ(r.code, 0) << r.output;
  auto c = nlohmann::json::parse(r.output);
  ASSERT_EQ(c["workers"].size(), 2u);
  const double g0 = c["workers"][0]["gflops"].get<double>(), g1 = c["workers"][1]["gflops"].get<double>();
  EXPECT_GT(g0, 0);
  EXPECT_GT(g1, 0);
  // Worker 1 computed 4x as long for the same two blocks plus the head: slower, but by less than 4x / (head share).
  EXPECT_LT(g1, g0);
  EXPECT_NEAR(c["links"]["matrix"]["bandwidth"][0][1].get<double>(), 400000 * 8 / 0.032, 1e-6 * 1e8);
  // The rate from the serial time, not the busy time that holds the delay; the latency the meter measured.
  EXPECT_NEAR(c["links"]["matrix"]["bandwidth"][1][0].get<double>(), 400000 * 8 / 0.032, 1e-6 * 1e8);
  EXPECT_NEAR(c["links"]["matrix"]["latency"][1][0].get<double>(), 0.050, 1e-9);
  const std::string cluster = write("probed.json", r.output);
  r = run("plan --cluster " + cluster + " " + kModel + " --evaluate --workers 2 --pp 2 --microbatches 4");
  EXPECT_EQ(r.code, 0) << r.output;

  r = run("probe --from-metrics " + metrics + " " + kModel + " --workers 1 --pp 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("worker 1 is outside the job's 1 workers"), std::string::npos) << r.output;
}

}  // namespace
