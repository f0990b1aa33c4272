// `longhaul plan` (the fastest grids, partitions, microbatches and codecs for a model on a cluster description, with
// the launch command of the best; or, with --evaluate, the predicted step of one job), `longhaul probe --metrics`
// (a cluster description from what a job's workers measured) and `longhaul bench plan` (planning time for 10 to
// 1,000 workers).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "apps/job_cli.h"
#include "metrics/step_metrics.h"
#include "plan/auto_codec.h"
#include "plan/cluster_probe.h"
#include "plan/planner.h"
#include "transport/control_client.h"

namespace lh::app {
namespace {

struct PlanFlags {
  JobFlags job;
  std::string cluster;
  bool evaluate = false;
  bool json = false;
  int top = 5;
  int max_pp = 0, max_tp = 0, max_dp = 0, max_microbatches = 64;
  double tolerance = 0.02;
};

nlohmann::json plan_json(const JobPlan& p) {
  return {{"pp", p.pp},
          {"tp", p.tp},
          {"dp", p.dp},
          {"partition", p.partition},
          {"microbatches", p.microbatches},
          {"schedule", schedule_kind_name(p.schedule)},
          {"fwd_codec", p.fwd_codec},
          {"bwd_codec", p.bwd_codec},
          {"grad_codec", p.grad_codec},
          {"tp_codec", p.tp_codec},
          {"worker_of_rank", p.worker_of_rank},
          {"step_s", p.step_s},
          {"pipeline_s", p.pipeline_s},
          {"dp_exposed_s", p.dp_exposed_s},
          {"norm_s", p.norm_s},
          {"optimizer_s", p.optimizer_s},
          {"bubble", p.bubble},
          {"tokens_per_s", p.tokens_per_s},
          {"wire_bytes", p.wire_bytes},
          {"memory_gb", p.memory_gb},
          {"stage_forward_s", p.stage_forward_s},
          {"stage_backward_s", p.stage_backward_s},
          {"fwd_transfer_s", p.fwd_transfer_s},
          {"bwd_transfer_s", p.bwd_transfer_s},
          {"bottleneck", p.bottleneck}};
}

void print_breakdown(const JobPlan& p) {
  std::printf("  step %.4f s = pipeline %.4f + dp all-reduce exposed %.4f + gradient norm %.4f + optimizer %.4f\n",
              p.step_s, p.pipeline_s, p.dp_exposed_s, p.norm_s, p.optimizer_s);
  std::printf("  %.0f tokens/s, bubble %.1f%%, %.2f MB on the wire per step, %.3f GB per worker at most\n",
              p.tokens_per_s, 100 * p.bubble, p.wire_bytes / 1e6, p.memory_gb);
  for (size_t s = 0; s < p.stage_forward_s.size(); ++s)
    std::printf("  stage %zu: %d blocks, %.2f ms forward + %.2f ms backward per microbatch\n", s, p.partition[s],
                1e3 * p.stage_forward_s[s], 1e3 * p.stage_backward_s[s]);
  for (size_t l = 0; l < p.fwd_transfer_s.size(); ++l)
    std::printf("  link %zu-%zu: %s %.2f ms fwd, %s %.2f ms bwd per microbatch\n", l, l + 1, p.fwd_codec[l].c_str(),
                1e3 * p.fwd_transfer_s[l], p.bwd_codec[l].c_str(), 1e3 * p.bwd_transfer_s[l]);
  std::printf("  bottleneck: %s\n", p.bottleneck.c_str());
}

void run_plan(PlanFlags& f, CLI::App* cmd) {
  auto cluster = Cluster::load(f.cluster);
  if (!cluster.ok()) fail(cluster.status().message(), 2);
  if (f.evaluate) {
    JobConfig job = job_config_from_flags(f.job, cmd);
    auto p = evaluate_plan(*cluster, job);
    if (!p.ok()) fail(p.status().message(), 2);
    if (f.json) {
      std::printf("%s\n", plan_json(*p).dump().c_str());
      return;
    }
    std::printf("predicted for %s on %s:\n", p->describe().c_str(), f.cluster.c_str());
    print_breakdown(*p);
    return;
  }
  // A search: the flags that describe one job belong to --evaluate.
  for (const char* flag : {"--workers", "--pp", "--tp", "--dp", "--partition", "--microbatches", "--compress-fwd",
                           "--compress-bwd", "--compress-link", "--link", "--slowdown", "--tp-split", "--sync"})
    if (cmd->count(flag) > 0)
      fail(std::string(flag) +
               " describes one job: add --evaluate to predict that job, or bound the search with --max-pp, --max-tp, "
               "--max-dp",
           2);
  TrainConfig train = f.job.job.train;
  apply_model_flags(f.job.model, train);
  PlanOptions o;
  o.top = f.top;
  o.max_pp = f.max_pp;
  o.max_tp = f.max_tp;
  o.max_dp = f.max_dp;
  o.max_microbatches = f.max_microbatches;
  o.codec_tolerance = f.tolerance;
  o.grad_codec = f.job.job.compress_grad;
  o.tp_codec = f.job.job.compress_tp;
  if (o.grad_codec == "auto" || o.tp_codec == "auto")
    fail(
        "--compress-grad/--compress-tp auto: the search takes them as given; name a codec (it chooses pipeline "
        "codecs from --auto-ladder)",
        2);
  auto ladder = parse_auto_ladder(f.job.job.auto_ladder);
  if (!ladder.ok()) fail("--auto-ladder: " + ladder.status().message(), 2);
  o.ladder = *ladder;
  if (cmd->count("--schedule") > 0) {
    auto kind = parse_schedule_kind(f.job.schedule);
    if (!kind.ok()) fail("--schedule: " + kind.status().message(), 2);
    o.schedules = {*kind};
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto plans = search_plans(*cluster, train, o);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!plans.ok()) fail(plans.status().message(), 2);
  if (f.json) {
    nlohmann::json a = nlohmann::json::array();
    for (const JobPlan& p : *plans) a.push_back(plan_json(p));
    std::printf("%s\n",
                nlohmann::json{{"plans", a}, {"seconds", secs}, {"launch", launch_command(plans->front(), train)}}
                    .dump()
                    .c_str());
    return;
  }
  std::printf("plan: %s, batch %d, on %d workers of %s (planned in %.2f s)\n\n", train.model.describe().c_str(),
              train.batch, cluster->size(), f.cluster.c_str(), secs);
  std::printf("%3s %10s %10s %7s %9s %8s  %s\n", "#", "step s", "tokens/s", "bubble", "MB/step", "GB/wkr",
              "plan; bottleneck");
  for (size_t i = 0; i < plans->size(); ++i) {
    const JobPlan& p = (*plans)[i];
    std::printf("%3zu %10.4f %10.0f %6.1f%% %9.2f %8.3f  %s; %s\n", i + 1, p.step_s, p.tokens_per_s, 100 * p.bubble,
                p.wire_bytes / 1e6, p.memory_gb, p.describe().c_str(), p.bottleneck.c_str());
  }
  const JobPlan& best = plans->front();
  std::printf("\nthe best plan, step by step:\n");
  print_breakdown(best);
  std::printf("\nits workers (ranks are given in the order workers join: start them in this order):\n%s",
              placement_table(best, *cluster).c_str());
  std::printf("\nrun it (one machine, emulated):\n  %s\n", launch_command(best, train).c_str());
}

// A cluster description from what a job measured (plan/cluster_probe.h): a finished job's metrics file, or a
// running job's coordinator (its pre-flight probe of every pair and the records so far, through `ctl cluster`).
void run_probe(PlanFlags& f, CLI::App* cmd, const std::string& metrics_path, const std::string& coordinator,
               const SecretFlags& secret_flags) {
  if (metrics_path.empty() == coordinator.empty())
    fail("probe: give either --from-metrics FILE (a job's metrics) or --coordinator ADDR (a running job)", 2);
  if (!coordinator.empty()) {
    if (coordinator.rfind("tcp://", 0) != 0) fail("--coordinator '" + coordinator + "': expected tcp://HOST:PORT", 2);
    const JobSecret secret = required_secret(secret_flags, "probe");
    auto reply = ctl_request(coordinator, CtlRequest{secret.join_proof(), "cluster", ""}, std::chrono::seconds(10),
                             secret.client_curve());
    if (!reply.ok()) fail("--coordinator " + coordinator + ": " + reply.status().message());
    if (!reply->ok) fail("probe: " + reply->body);
    auto j = nlohmann::json::parse(reply->body, nullptr, false);
    if (j.is_discarded()) fail("probe: the coordinator's reply is not JSON: " + reply->body);
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  JobConfig job = job_config_from_flags(f.job, cmd);
  auto records = read_step_metrics_file(metrics_path);
  if (!records.ok()) fail(records.status().message(), 2);
  auto c = cluster_from_measurements(job, *records, nlohmann::json::array(), metrics_path);
  if (!c.ok()) fail(c.status().message(), 2);
  std::printf("%s\n", c->to_json().dump(1).c_str());
}

void bench_plan(const std::vector<int>& sizes, int repeats) {
  std::printf("%8s %8s %10s %10s  %s\n", "workers", "sites", "plan s", "step s", "best plan");
  for (int n : sizes) {
    // Four sites of mixed machines: fast links inside a site, slow ones between.
    const int sites = n >= 4 ? 4 : 1;
    Cluster c = Cluster::uniform(n, 1, 10e9, 50e-6);
    for (int i = 0; i < n; ++i) c.set_gflops(i, 20.0 + 60.0 * ((i * 7919) % 13) / 12.0);
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b)
        if (a != b && a % sites != b % sites)
          c.set_link(a, b, 100e6 + 400e6 * ((a + b) % 3), 0.02 + 0.01 * ((a * b) % 5));
    TrainConfig train;
    train.model = gpt_preset("base").value();
    train.batch = 512;
    train.model.seq = 128;
    PlanOptions o;
    double best = 1e300;
    Result<std::vector<JobPlan>> plans = invalid_argument("not run");
    for (int k = 0; k < repeats; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      plans = search_plans(c, train, o);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      if (!plans.ok()) fail(plans.status().message());
    }
    std::printf("%8d %8d %10.3f %10.4f  %s\n", n, sites, best, plans->front().step_s,
                plans->front().describe().c_str());
  }
  std::printf("target: a 1000-worker description planned in under 10 s (the fastest of the repeats)\n");
}

RegisterCommand reg_plan("", 75, [](CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  auto* cmd =
      app.add_subcommand("plan",
                         "search grids (pp × tp × dp), placement, partition, microbatches, schedule and a codec "
                         "per link for a model on a cluster description; prints the fastest plans and the "
                         "launch command of the best (--evaluate: predict one job's step instead)");
  cmd->add_option("--cluster", f->cluster, "cluster description, JSON or YAML (docs/plan.md)")->required();
  cmd->add_flag("--evaluate", f->evaluate,
                "predict the step of the job the job flags describe (rank r on the cluster's worker r; --link and "
                "--slowdown applied on top, as the emulation does)");
  cmd->add_flag("--json", f->json, "print JSON instead of tables");
  cmd->add_option("--top", f->top, "plans to print")->capture_default_str()->check(CLI::Range(1, 1000));
  cmd->add_option("--max-pp", f->max_pp, "search at most this many stages (0: the model's blocks)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--max-tp", f->max_tp, "search at most this many tp shards (0: the model's heads)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--max-dp", f->max_dp, "search at most this many replicas (0: any that divides --batch)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--max-microbatches", f->max_microbatches, "try at most this many microbatches")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--codec-tolerance", f->tolerance,
                  "a link takes the least lossy codec of --auto-ladder whose step is within this share of the "
                  "lossiest's")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  add_job_flags(cmd, f->job, "");
  cmd->callback([f, cmd] { run_plan(*f, cmd); });
});

RegisterCommand reg_probe("", 76, [](CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  auto metrics = std::make_shared<std::string>();
  auto coordinator = std::make_shared<std::string>();
  auto* cmd =
      app.add_subcommand("probe",
                         "write a cluster description for `plan` from what a job measured: each worker's "
                         "GFLOP/s from its compute seconds; each link's bandwidth and latency from a running "
                         "job's pre-flight probe (--coordinator), or its bandwidth while busy (--from-metrics)");
  cmd->add_option("--from-metrics", *metrics, "a job's metrics file (JSON lines; give the job's flags too)");
  cmd->add_option("--coordinator", *coordinator,
                  "a running job's coordinator, tcp://HOST:PORT: its pre-flight matrix and the steps so far");
  add_job_flags(cmd, f->job, "");
  cmd->callback([f, cmd, metrics, coordinator] { run_probe(*f, cmd, *metrics, *coordinator, f->job.secret); });
});

RegisterCommand reg_bench("bench", 40, [](CLI::App& bench) {
  auto sizes = std::make_shared<std::vector<int>>(std::vector<int>{10, 100, 1000});
  auto repeats = std::make_shared<int>(3);
  auto* cmd = bench.add_subcommand("plan", "time `plan`'s search on generated clusters of 10 to 1,000 workers");
  cmd->add_option("--workers", *sizes, "cluster sizes")->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_option("--repeats", *repeats, "runs per size (the fastest is printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->callback([sizes, repeats] { bench_plan(*sizes, *repeats); });
});

}  // namespace
}  // namespace lh::app
