// Multi-process pipeline jobs through the real binary ($LH_BIN), split by topic from test_launch.cpp (the Launch
// fixture and helpers: tests/integration/launch_util.h). This file: slow and shaped links: a checkpoint over a 1 Mbit/s
// link, --netns links, pairs that cannot connect directly going through the relay, advertised addresses, NAT sites,
// per-link shaping and reshaping, and a slowed worker given fewer blocks.
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

// The middle value (0 for none).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The rate a link's sender measured in each step (wire bits over the seconds the link was busy), for `role`.
std::map<int64_t, double> link_rate_per_step(const std::string& metrics, int src, int dst, const std::string& role) {
  std::map<int64_t, double> out;
  auto records = read_step_metrics_file(metrics);
  EXPECT_TRUE(records.ok()) << records.status().to_string();
  if (!records.ok()) return out;
  for (const WorkerStepMetrics& m : *records)
    for (const LinkTraffic& t : m.links)
      if (t.src == src && t.dst == dst && t.role == role && t.dir == "send" && t.seconds > 0)
        out[m.step] = double(t.wire_bytes) * 8 / t.seconds;
  return out;
}

// A checkpoint over a slow link: each worker's shard (5.3 MB of the small model at pp 2) takes about 43 s through its
// 1 Mbit/s namespace link, eight times the heartbeat timeout. It goes up in acknowledged parts that the heartbeats
// pass, so the workers stay alive, the checkpoint commits and the job finishes. Before, the shard was one message
// queued ahead of the heartbeats, and every worker was declared dead at every checkpoint. Root only.
TEST_F(Launch, ACheckpointOverA1MbitLinkCompletesAsRoot) {
  if (std::string why = netns_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const std::string metrics = temp_path("slow_ckpt.jsonl"), dir = temp_path("slow_ckpt");
  std::filesystem::remove_all(dir);
  BinRun r = run({"--log-level",
                  "warn",
                  "launch",
                  "--workers",
                  "2",
                  "--worker-threads",
                  "1",
                  "--ucx-tls",
                  "tcp",
                  "--metrics",
                  metrics,
                  "--netns",
                  "1M",
                  "--model",
                  "small",
                  "--batch",
                  "4",
                  "--steps",
                  "3",
                  "--checkpoint-every",
                  "3",
                  "--checkpoint-dir",
                  dir},
                 400s);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("declared dead"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("rolls back"), std::string::npos) << r.output;
  ASSERT_TRUE(std::filesystem::exists(dir + "/step_00000003/manifest.json")) << r.output;
  for (const char* shard : {"/step_00000003/rank_0000.shard", "/step_00000003/rank_0001.shard"})
    EXPECT_GT(std::filesystem::file_size(dir + shard), uint64_t(4) << 20) << "over 32 s at 1 Mbit/s";
  std::filesystem::remove_all(dir);
}

// Each worker in its own network namespace behind a tc tbf link (scripts/wan.sh); root only.
TEST_F(Launch, NetnsLinksAsRoot) {
  if (std::string why = netns_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  std::string metrics = temp_path("netns.jsonl");
  BinRun r = run(launch_args(2, 3, metrics, {"--netns", "50M"}), 180s);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("netns tbf 50M"), std::string::npos) << r.output;
  EXPECT_EQ(losses_of(metrics).size(), 3u);
  BinRun ns = run({"--log-level", "warn", "launch", "--workers", "2", "--netns", "50M,10ms"}, 60s);
  EXPECT_NE(ns.code, 0);
  EXPECT_NE(ns.output.find("--netns"), std::string::npos) << ns.output;
}

// The per-step losses of a 4-stage job over loopback with every pair direct: the reference the relayed jobs match.
std::map<int64_t, double> direct_losses(int steps) {
  const std::string metrics = temp_path("direct.jsonl");
  BinRun r = run(launch_args(4, steps, metrics), 180s);
  EXPECT_EQ(r.code, 0) << r.output;
  return losses_of(metrics);
}

// A pair that cannot connect directly (LH_FAULT_NO_DIRECT stands in for NAT between them here; NatSitesAsRoot builds
// the NAT) goes through the coordinator's relay: the coordinator says so, the job completes with the losses of the
// same job with every pair direct, and `ctl status`-style metrics are untouched. With --no-relay the same job ends at
// its pre-flight, within seconds, naming the link.
TEST_F(Launch, APairThatCannotConnectDirectlyGoesThroughTheRelay) {
  const int steps = 3;
  const auto want = direct_losses(steps);
  setenv("LH_FAULT_NO_DIRECT", "1-2", 1);
  const std::string metrics = temp_path("relayed.jsonl");
  BinRun r = run(launch_args(4, steps, metrics), 180s);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("pre-flight: link 1-2 (rank 1 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cannot connect directly (rank 1: fault injection"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("relaying it through tcp://127.0.0.1:"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("link 0-1 ("), std::string::npos) << "only the cut pair is relayed\n" << r.output;
  expect_same_losses(losses_of(metrics), want, steps);

  const auto t0 = std::chrono::steady_clock::now();
  BinRun refused = run(launch_args(4, steps, temp_path("norelay.jsonl"), {"--no-relay"}), 180s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unsetenv("LH_FAULT_NO_DIRECT");
  EXPECT_NE(refused.code, 0) << refused.output;
  EXPECT_NE(refused.output.find("pre-flight: link 1-2 cannot connect directly, and relays are off (--no-relay)"),
            std::string::npos)
      << refused.output;
  EXPECT_LT(seconds, 60) << "the pre-flight's connect timeout (5 s) bounds it, not the receive timeout (600 s)";
  BinRun both = run({"launch", "--workers", "2", "--no-relay", "--relay-port", "7001"}, 60s);
  EXPECT_NE(both.output.find("--no-relay and --relay-port exclude each other"), std::string::npos) << both.output;
}

// A relay on a machine of its own (`longhaul relay`, here on loopback) instead of the coordinator's: the coordinator
// started with --relay sends the cut pair there, the job completes with the direct job's losses, and the relay
// counts what it forwarded; a bad --relay is named. Relay and coordinator share a --relay-key-file (the workers do
// not get it): each worker's hello carries its own rank's token from its plan.
TEST_F(Launch, AStandaloneRelayCarriesTheCutPair) {
  const int steps = 3;
  const auto want = direct_losses(steps);
  const std::string key = make_key("relay"), relay_key = make_key("relay_ranks");
  const std::string relay_out = temp_path("relay.txt");
  pid_t relay = spawn({"relay", "--listen", "tcp://127.0.0.1:*", "--key-file", key, "--relay-key-file", relay_key,
                       "--stats-every", "0"},
                      relay_out);
  std::string ep = wait_for_line(relay_out, "longhaul relay: listening on ", 30s);
  ep = ep.substr(0, ep.find(';'));
  ASSERT_FALSE(ep.empty()) << slurp(relay_out);
  setenv("LH_FAULT_NO_DIRECT", "1-2", 1);
  const std::string metrics = temp_path("standalone.jsonl");
  BinRun r =
      run(launch_args(4, steps, metrics, {"--key-file", key, "--relay", ep, "--relay-key-file", relay_key}), 180s);
  unsetenv("LH_FAULT_NO_DIRECT");
  kill(relay, SIGTERM);
  EXPECT_EQ(wait_exit(relay, 30s), 0);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("relaying it through " + ep), std::string::npos) << r.output;
  expect_same_losses(losses_of(metrics), want, steps);
  const std::string counts = wait_for_line(relay_out, "relay: 2 worker(s) connected; forwarded ", 5s);
  EXPECT_FALSE(counts.empty() || counts.rfind("0 packets", 0) == 0) << slurp(relay_out);
  BinRun bad = run({"launch", "--workers", "2", "--relay", "127.0.0.1:7001"}, 60s);
  EXPECT_NE(bad.output.find("--relay '127.0.0.1:7001': expected tcp://HOST:PORT"), std::string::npos) << bad.output;
}

// Workers started by hand with --advertise: each listens on a port of its --data-ports and its peers connect to the
// address it advertises (UCX client–server mode). The job completes with the losses of the same job on worker
// addresses. A worker that advertises an address nobody reaches (192.0.2.1, a documentation range) is named, with
// that address, when the pre-flight ends the job (--no-relay), within seconds.
TEST_F(Launch, WorkersAreReachedAtTheAddressTheyAdvertise) {
  const int steps = 3;
  const std::string base = temp_path("advertise_base.jsonl");
  ASSERT_EQ(run(launch_args(2, steps, base), 180s).code, 0);
  const std::string key = make_key("advertise");
  auto job = [&](const std::string& name, const std::vector<std::vector<std::string>>& worker_flags,
                 std::vector<std::string>* outputs, double* seconds) {
    const std::string metrics = temp_path(name + ".jsonl"), out = temp_path(name + ".txt");
    std::vector<std::string> args = {"--log-level", "info", "coordinator", "--listen", "tcp://127.0.0.1:*",
                                     "--workers",   "2",    "--key-file",  key,        "--no-relay",
                                     "--metrics",   metrics};
    for (auto& f : model_flags(steps)) args.push_back(f);
    args.insert(args.end(), {"--microbatches", "4"});
    const auto t0 = std::chrono::steady_clock::now();
    std::string ep;
    pid_t coord = spawn_coordinator(args, out, &ep);
    EXPECT_FALSE(ep.empty()) << slurp(out);
    std::vector<pid_t> workers;
    std::vector<std::string> worker_out;
    for (size_t i = 0; i < worker_flags.size(); ++i) {
      std::vector<std::string> w = {"--threads",  "1", "--log-level", "info", "worker", "--coordinator",  ep,
                                    "--key-file", key, "--ucx-tls",   "tcp",  "--rank", std::to_string(i)};
      w.insert(w.end(), worker_flags[i].begin(), worker_flags[i].end());
      worker_out.push_back(temp_path(name + "_worker" + std::to_string(i) + ".txt"));
      workers.push_back(spawn(w, worker_out.back()));
    }
    for (size_t i = 0; i < workers.size(); ++i) wait_exit(workers[i], 120s);
    const int code = wait_exit(coord, 60s);
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    outputs->push_back(slurp(out));
    for (const std::string& w : worker_out) outputs->push_back(slurp(w));
    return std::make_pair(code, metrics);
  };
  std::vector<std::string> out;
  double seconds = 0;
  auto [code, metrics] =
      job("advertised", {{"--advertise", "127.0.0.1", "--data-ports", "47400-47420"}, {"--advertise", "localhost"}},
          &out, &seconds);
  ASSERT_EQ(code, 0) << out[0];
  EXPECT_NE(out[1].find("listening on 127.0.0.1:474"), std::string::npos) << "bound to the advertised interface\n"
                                                                          << out[1];
  EXPECT_NE(out[1].find("for peers connecting to the advertised address 127.0.0.1"), std::string::npos) << out[1];
  EXPECT_NE(out[2].find("for peers connecting to the advertised address localhost"), std::string::npos) << out[2];
  expect_same_losses(losses_of(metrics), losses_of(base), steps);

  out.clear();
  auto [refused, unused] = job("unreachable", {{}, {"--advertise", "192.0.2.1"}}, &out, &seconds);
  EXPECT_NE(refused, 0) << out[0];
  EXPECT_NE(out[0].find("pre-flight: link 0-1 cannot connect directly, and relays are off (--no-relay)"),
            std::string::npos)
      << out[0];
  EXPECT_NE(out[0].find("at advertised 192.0.2.1:"), std::string::npos) << "the advertised address is named\n"
                                                                        << out[0];
  EXPECT_NE(out[0].find("such a pair needs the relay"), std::string::npos) << out[0];
  EXPECT_LT(seconds, 60) << "the connect timeout (5 s) bounds it";
  BinRun bad = run({"worker", "--coordinator", "tcp://127.0.0.1:9", "--advertise", "tcp://host:1"}, 30s);
  EXPECT_NE(bad.output.find("--advertise 'tcp://host:1': ':' is not allowed"), std::string::npos) << bad.output;
  bad = run({"worker", "--coordinator", "tcp://127.0.0.1:9", "--data-bind", "127.0.0.1"}, 30s);
  EXPECT_NE(bad.output.find("--data-bind '127.0.0.1' needs --advertise"), std::string::npos) << bad.output;
  bad = run({"worker", "--coordinator", "tcp://127.0.0.1:9", "--relay-only", "--data-ports", "40000-40010"}, 30s);
  EXPECT_NE(bad.output.find("--relay-only opens no data ports: it takes no --data-ports"), std::string::npos)
      << bad.output;

  // A worker that must expose nothing: --relay-only opens no data port, and its pair goes through the coordinator's
  // relay (the pre-flight finds it unreachable), with the same losses.
  out.clear();
  const std::string relay_key = make_key("relay_only");
  std::string ep;
  const std::string metrics2 = temp_path("relay_only.jsonl"), coord_out = temp_path("relay_only.txt");
  std::vector<std::string> args = {"--log-level",       "info",      "coordinator", "--listen",
                                   "tcp://127.0.0.1:*", "--workers", "2",           "--key-file",
                                   relay_key,           "--metrics", metrics2};
  for (auto& f : model_flags(steps)) args.push_back(f);
  args.insert(args.end(), {"--microbatches", "4"});
  pid_t coord = spawn_coordinator(args, coord_out, &ep);
  ASSERT_FALSE(ep.empty()) << slurp(coord_out);
  std::vector<pid_t> workers;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> w = {
        "--threads", "1",          "--log-level", "info",   "worker",          "--coordinator",
        ep,          "--key-file", relay_key,     "--rank", std::to_string(i), "--connect-timeout",
        "2"};
    if (i == 1) w.push_back("--relay-only");
    workers.push_back(spawn(w, temp_path("relay_only_worker" + std::to_string(i) + ".txt")));
  }
  for (pid_t w : workers) wait_exit(w, 120s);
  ASSERT_EQ(wait_exit(coord, 60s), 0) << slurp(coord_out);
  const std::string said = slurp(coord_out);
  EXPECT_NE(said.find("cannot connect directly"), std::string::npos) << said;
  EXPECT_NE(said.find("relaying it through"), std::string::npos) << said;
  const std::string w1 = slurp(temp_path("relay_only_worker1.txt"));
  EXPECT_EQ(w1.find("listening on"), std::string::npos) << w1;
  expect_same_losses(losses_of(metrics2), losses_of(base), steps);
}

// Two sites behind NAT routers (scripts/nat.sh: namespaces, nftables masquerade; root), ranks 0–1 in one and 2–3 in
// the other, the coordinator on the public side: the pairs across the sites (1-2, and the gradient norm's 0-2, 0-3,
// 1-3) cannot connect and go through the relay, the pairs inside a site stay direct, and the job's losses equal the
// same job's on loopback. With --no-relay it ends at its pre-flight, within seconds, naming the links.
TEST_F(Launch, NatSitesRelayTheLinksBetweenSitesAsRoot) {
  if (std::string why = nat_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const int steps = 3;
  const auto want = direct_losses(steps);
  const std::string metrics = temp_path("nat.jsonl");
  BinRun r = run(launch_args(4, steps, metrics, {"--nat-sites", "2"}), 240s);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 sites behind NAT routers"), std::string::npos) << r.output;
  for (const char* cut : {"link 0-2 (", "link 0-3 (", "link 1-2 (", "link 1-3 ("})
    EXPECT_NE(r.output.find(std::string("pre-flight: ") + cut), std::string::npos) << cut << "\n" << r.output;
  for (const char* direct : {"link 0-1 (", "link 2-3 ("})
    EXPECT_EQ(r.output.find(direct), std::string::npos) << direct << "\n" << r.output;
  expect_same_losses(losses_of(metrics), want, steps);

  const auto t0 = std::chrono::steady_clock::now();
  BinRun refused = run(launch_args(4, steps, temp_path("nat_norelay.jsonl"), {"--nat-sites", "2", "--no-relay"}), 240s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(refused.code, 0) << refused.output;
  EXPECT_NE(refused.output.find("pre-flight: links 0-2, 0-3, 1-2, 1-3 cannot connect directly, and relays are off"),
            std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("link 1-2 (rank 1 "), std::string::npos) << refused.output;
  EXPECT_LT(seconds, 90);
}

// Uneven emulated links: a default shape and per-link overrides by the job's link names, and `ctl set-link`
// reshaping a link while the job runs. The rates each sender measured show them.
TEST_F(Launch, UnevenLinksAreShapedPerLinkAndReshapedWhileTheJobRuns) {
  // Long enough that the ctl calls below (each a process start, which loads cuBLAS: ~0.7 s here) land mid-run.
  const int steps = 150;
  const std::string metrics = temp_path("uneven.jsonl");
  CtlJob job;
  ASSERT_NO_FATAL_FAILURE(start_ctl_job(&job, 3, steps, metrics, {"--pp", "3", "--link", "1G", "--link", "0-1:fwd=4M"},
                                        "uneven", "uneven"));
  auto with = [&](std::vector<std::string> more) { return job.ctl(std::move(more)); };
  BinRun bad = run(with({"set-link", "0-2=1M"}), 30s);
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("0-2"), std::string::npos) << bad.output;
  auto newest_step = [&] {
    BinRun status = run(with({"--json", "status"}), 30s);
    EXPECT_EQ(status.code, 0) << status.output;
    return status.code == 0 ? nlohmann::json::parse(status.output)["step"].get<int64_t>() : int64_t(0);
  };
  const int64_t fast_until = newest_step();  // steps reported before set-link crossed the fast link
  BinRun set = run(with({"--json", "set-link", "1-2:fwd=3M"}), 30s);
  ASSERT_EQ(set.code, 0) << set.output;
  EXPECT_EQ(nlohmann::json::parse(set.output)["links"].size(), 3u) << set.output;
  const int64_t reshaped_by = newest_step() + 1;  // the step in progress may have begun before it
  ASSERT_EQ(wait_exit(job.launch, 300s), 0) << slurp(job.out);
  ASSERT_LT(reshaped_by + 10, steps) << "the job ended before the link was reshaped";
  // Medians over steps: one step's rate can sag on a loaded machine (a packet's busy time ends when the inner send
  // completes). The fast links' rates are far below 1 Gbit/s (4 KiB packets: per-packet costs dominate) but well
  // above the shaped ones.
  const auto slow = link_rate_per_step(metrics, 0, 1, "act"), fast = link_rate_per_step(metrics, 1, 2, "act");
  ASSERT_EQ(slow.size(), size_t(steps));
  std::vector<double> slow_rates, before, after, back;
  for (const auto& [step, bps] : slow) slow_rates.push_back(bps);
  for (const auto& [step, bps] : fast) {
    if (step > 1 && step <= fast_until) before.push_back(bps);
    if (step > reshaped_by) after.push_back(bps);
  }
  for (const auto& [step, bps] : link_rate_per_step(metrics, 2, 1, "act_grad"))
    if (step > 1) back.push_back(bps);
  std::printf(
      "median rates (Mbit/s): 0-1:fwd %.2f; 1-2:fwd %.2f before set-link (%zu steps), %.2f after; 1-2:bwd %.2f\n",
      median(slow_rates) / 1e6, median(before) / 1e6, before.size(), median(after) / 1e6, median(back) / 1e6);
  EXPECT_GT(median(slow_rates), 2e6) << "0-1:fwd, shaped to 4 Mbit/s";
  EXPECT_LT(median(slow_rates), 4.5e6) << "0-1:fwd, shaped to 4 Mbit/s";
  EXPECT_GT(after.size(), 10u);
  EXPECT_LT(median(after), 3.4e6) << "1-2:fwd after set-link to 3 Mbit/s";
  if (!before.empty()) {
    EXPECT_GT(median(before), 2 * median(after)) << "1-2:fwd before set-link";
  }
  EXPECT_GT(median(back), 2 * 4.5e6) << "1-2:bwd stays at the default";
}

// --slowdown RANK=FACTOR: that worker really computes FACTOR times as long (it sleeps the difference); the losses are
// unchanged. Judged within the slowed run, so the machine's load (ctest -j) cannot tip it: the slowed worker's
// compute per step is several times the other's, and every one of its steps really lasted at least that long.
TEST_F(Launch, ASlowedWorkerReallyTakesLongerAndPartitionAutoGivesItFewerBlocks) {
  const int steps = 8;
  const std::string plain = temp_path("slow_plain.jsonl"), slowed = temp_path("slowed.jsonl");
  BinRun a = run(launch_args(2, steps, plain), 300s);
  ASSERT_EQ(a.code, 0) << a.output;
  BinRun b = run(launch_args(2, steps, slowed, {"--slowdown", "1=6"}), 300s);
  ASSERT_EQ(b.code, 0) << b.output;
  expect_same_losses(losses_of(slowed), losses_of(plain), steps);
  auto records = read_step_metrics_file(slowed);
  ASSERT_TRUE(records.ok()) << records.status().to_string();
  std::map<int, std::vector<double>> compute;
  const double tokens_per_step = 8 * 16;  // model_flags: --batch 8 --seq 16
  for (const WorkerStepMetrics& m : *records) {
    ASSERT_TRUE(m.compute_s && m.tokens_per_s) << "worker " << m.worker << " step " << m.step;
    compute[m.worker].push_back(*m.compute_s);
    // The compute it reports (slowed: measured × 6) fits inside the step's wall time: the sleep really happened.
    if (m.worker == 1) {
      EXPECT_LE(*m.compute_s, 1.05 * tokens_per_step / *m.tokens_per_s) << "step " << m.step;
    }
  }
  // Six times the compute of a stage like the other: well over twice it (a loose bound, not a speed test).
  EXPECT_GT(median(compute[1]), 2 * median(compute[0]));
  // --partition auto: the planner gives the slowed stage fewer blocks (4 blocks at speeds 1 and 1/6: 3,1), and the
  // job still computes the very same losses.
  const std::string planned = temp_path("slow_auto.jsonl");
  std::vector<std::string> args = launch_args(2, steps, planned, {"--slowdown", "1=6", "--partition", "auto"});
  args[1] = "info";  // the coordinator's log names the partition it planned
  BinRun c = run(args, 300s);
  ASSERT_EQ(c.code, 0) << c.output;
  EXPECT_NE(c.output.find("partition by the planner: 3,1"), std::string::npos) << c.output;
  expect_same_losses(losses_of(planned), losses_of(plain), steps);
  BinRun bad = run(launch_args(2, steps, temp_path("slow_bad.jsonl"), {"--slowdown", "2=3"}), 60s);
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("--slowdown '2=3'"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace lh
