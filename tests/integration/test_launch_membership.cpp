// Multi-process pipeline jobs through the real binary ($LH_BIN), split by topic from test_launch.cpp (the Launch
// fixture and helpers: tests/integration/launch_util.h). This file: a coordinator and workers started apart run a job,
// workers join apart and a paused one finishes, a stalled link is named while the job goes on, and the pre-flight
// measures each link.
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

// `longhaul coordinator` and two `longhaul worker` processes, as on two machines (here both on loopback), sharing a
// job secret made by `longhaul keygen`. A worker and a ctl with another secret are refused (their CURVE handshake
// fails, and the coordinator logs it), one without any secret is told where to find it, and the job runs on. The
// secret itself is printed nowhere.
TEST_F(Launch, CoordinatorAndWorkersRunAJob) {
  const int steps = 3;
  std::string metrics = temp_path("coord.jsonl"), out = temp_path("coord.txt"), key = temp_path("job.key");
  const std::string other = temp_path("other.key");
  BinRun made = run({"keygen", key});
  ASSERT_EQ(made.code, 0) << made.output;
  ASSERT_EQ(run({"keygen", other}).code, 0);
  struct stat st {};
  ASSERT_EQ(::stat(key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_NE(run({"keygen", key}).output.find("never overwritten"), std::string::npos);
  const std::string secret = slurp(key).substr(0, 64);
  std::vector<std::string> args = {"--log-level", "warn", "coordinator", "--listen", "tcp://127.0.0.1:*",
                                   "--workers",   "2",    "--key-file",  key,        "--metrics",
                                   metrics};
  for (auto& f : model_flags(steps)) args.push_back(f);
  std::string ep;
  pid_t coord = spawn_coordinator(args, out, &ep);
  ASSERT_FALSE(ep.empty()) << slurp(out);
  EXPECT_NE(slurp(out).find("--key-file " + key), std::string::npos) << slurp(out);
  // Strangers: a worker and ctl holding another job's secret, and a ctl holding none.
  BinRun intruder = run({"--log-level", "warn", "worker", "--coordinator", ep, "--key-file", other, "--join-timeout",
                         "3", "--ucx-tls", "tcp"},
                        60s);
  EXPECT_NE(intruder.code, 0);
  EXPECT_NE(intruder.output.find("job secret differs"), std::string::npos) << intruder.output;
  for (const std::vector<std::string>& cmd :
       {std::vector<std::string>{"status"},
        std::vector<std::string>{"set-codec", "--link", "0-1", "--dir", "fwd", "int8"}}) {
    std::vector<std::string> a = {"ctl", "--coordinator", ep, "--key-file", other, "--timeout", "2"};
    a.insert(a.end(), cmd.begin(), cmd.end());
    BinRun r = run(a, 30s);
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("a --key-file other than the job's"), std::string::npos) << r.output;
  }
  BinRun keyless = run({"ctl", "--coordinator", ep, "status"}, 30s);
  EXPECT_NE(keyless.code, 0);
  EXPECT_NE(keyless.output.find("no job secret"), std::string::npos) << keyless.output;
  BinRun shown = run({"ctl", "--coordinator", ep, "--key-file", key, "status"}, 30s);
  EXPECT_EQ(shown.code, 0) << shown.output;
  EXPECT_NE(shown.output.find("connection(s) refused (no job secret)"), std::string::npos) << shown.output;
  std::vector<pid_t> workers;
  for (int i = 0; i < 2; ++i)
    workers.push_back(spawn(
        {"--threads", "1", "--log-level", "warn", "worker", "--coordinator", ep, "--key-file", key, "--ucx-tls", "tcp"},
        temp_path("coord_worker" + std::to_string(i) + ".txt")));
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(wait_exit(workers[size_t(i)], 120s), 0) << slurp(temp_path("coord_worker" + std::to_string(i) + ".txt"));
  ASSERT_EQ(wait_exit(coord, 60s), 0) << slurp(out);
  const std::string text = slurp(out);
  EXPECT_NE(text.find("link traffic"), std::string::npos) << text;
  EXPECT_NE(text.find("refused a connection whose CURVE handshake failed"), std::string::npos) << text;
  EXPECT_EQ(text.find(secret), std::string::npos) << "the coordinator printed the job secret";
  EXPECT_EQ(losses_of(metrics).size(), size_t(steps));
}

// As across machines, started by hand: a worker that joins seconds after another (longer than the heartbeat
// timeout) keeps the first one alive by heartbeating while it waits for the plan, and a worker paused mid-run for
// less than the timeout (SIGSTOP, SIGCONT) carries on. The job completes.
TEST_F(Launch, WorkersJoiningApartAndAPausedWorkerFinishTheJob) {
  const int steps = 20;
  std::string metrics = temp_path("apart.jsonl"), out = temp_path("apart.txt"), token = make_key("apart_token");
  std::vector<std::string> args = {
      "--log-level",         "warn", "coordinator", "--listen", "tcp://127.0.0.1:*", "--workers", "2",
      "--heartbeat-timeout", "3",    "--key-file",  token,      "--metrics",         metrics};
  for (auto& f : model_flags(steps)) args.push_back(f);
  std::string ep;
  pid_t coord = spawn_coordinator(args, out, &ep);
  ASSERT_FALSE(ep.empty()) << slurp(out);
  auto worker = [&](int i) {
    return spawn({"--threads", "1", "--log-level", "warn", "worker", "--coordinator", ep, "--key-file", token,
                  "--ucx-tls", "tcp", "--link", "4M,1ms"},
                 temp_path("apart_worker" + std::to_string(i) + ".txt"));
  };
  std::vector<pid_t> workers = {worker(0)};
  // Twice the heartbeat timeout (LH_JOIN_GAP_S; scripts/resilience_check.sh waits 60 s).
  const char* gap = std::getenv("LH_JOIN_GAP_S");
  std::this_thread::sleep_for(std::chrono::seconds(gap ? std::max(1, std::atoi(gap)) : 6));
  workers.push_back(worker(1));
  // Once a step is done, pause one worker for half the timeout.
  int64_t step = -1;
  for (int i = 0; i < 600 && step < 1; ++i) {
    BinRun s = run({"ctl", "--coordinator", ep, "--key-file", token, "--json", "status"}, 30s);
    ASSERT_EQ(s.code, 0) << s.output;
    step = nlohmann::json::parse(s.output)["step"].get<int64_t>();
    if (step < 1) std::this_thread::sleep_for(50ms);
  }
  ASSERT_GE(step, 1) << slurp(out);
  ASSERT_EQ(::kill(workers[1], SIGSTOP), 0);
  std::this_thread::sleep_for(2000ms);
  ASSERT_EQ(::kill(workers[1], SIGCONT), 0);
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(wait_exit(workers[size_t(i)], 120s), 0) << slurp(temp_path("apart_worker" + std::to_string(i) + ".txt"));
  ASSERT_EQ(wait_exit(coord, 60s), 0) << slurp(out);
  EXPECT_EQ(losses_of(metrics).size(), size_t(steps));
  EXPECT_LT(step, steps) << "the pause came after the last step";
}

// A worker whose training thread stops for 6 s (its heartbeats going on, so it is not dead) leaves its neighbour
// waiting: the coordinator names the stalled link by the job's link name, with what each end is doing, from the
// progress the heartbeats carry (--stall-timeout 2); the job then completes.
TEST_F(Launch, AStalledLinkIsNamedAndTheJobGoesOn) {
  const int steps = 8;
  std::string metrics = temp_path("stall.jsonl"), out = temp_path("stall.txt"), token = make_key("stall_token");
  std::vector<std::string> args = {"--log-level",
                                   "warn",
                                   "coordinator",
                                   "--listen",
                                   "tcp://127.0.0.1:*",
                                   "--workers",
                                   "2",
                                   "--heartbeat-timeout",
                                   "3",
                                   "--stall-timeout",
                                   "2",
                                   "--key-file",
                                   token,
                                   "--metrics",
                                   metrics};
  for (auto& f : model_flags(steps)) args.push_back(f);
  std::string ep;
  pid_t coord = spawn_coordinator(args, out, &ep);
  ASSERT_FALSE(ep.empty()) << slurp(out);
  std::vector<pid_t> workers;
  const std::vector<std::string> logs = {temp_path("stall_worker0.txt"), temp_path("stall_worker1.txt")};
  for (int i = 0; i < 2; ++i) {
    if (i == 1) setenv("LH_FAULT_STALL", "3:6000", 1);  // inherited by this worker only
    workers.push_back(spawn({"--threads", "1", "--log-level", "warn", "worker", "--coordinator", ep, "--key-file",
                             token, "--ucx-tls", "tcp"},
                            logs[size_t(i)]));
    unsetenv("LH_FAULT_STALL");
  }
  // While it lasts, `ctl status` shows it too.
  std::string shown;
  for (int i = 0; i < 400 && shown.find("stalled links") == std::string::npos; ++i) {
    shown = run({"ctl", "--coordinator", ep, "--key-file", token, "status"}, 30s).output;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_NE(shown.find("which is not sending to it"), std::string::npos) << shown;
  for (int i = 0; i < 2; ++i) EXPECT_EQ(wait_exit(workers[size_t(i)], 120s), 0) << slurp(logs[size_t(i)]);
  ASSERT_EQ(wait_exit(coord, 60s), 0) << slurp(out);
  const std::string log = slurp(out);
  EXPECT_NE(log.find("stalled data-plane link 0-1:"), std::string::npos) << log;
  EXPECT_NE(log.find("which is not sending to it"), std::string::npos) << log;
  EXPECT_NE(log.find("finished step 3"), std::string::npos) << log;
  EXPECT_NE(slurp(logs[1]).find("stalling for 6000 ms after step 3"), std::string::npos) << slurp(logs[1]);
  EXPECT_EQ(losses_of(metrics).size(), size_t(steps));
}

// Before step 1 every pair that talks probes its link (round trips, a short burst each way); `ctl status` shows the
// matrix and `longhaul probe --coordinator` turns it, with the steps so far, into a cluster `plan` reads. Link 1-2
// is shaped to 5 Mbit/s with 20 ms one way; the others are loopback.
TEST_F(Launch, ThePreflightMeasuresEachLinkAndProbeReadsItFromTheRunningJob) {
  std::string metrics = temp_path("preflight.jsonl");
  CtlJob job;
  ASSERT_NO_FATAL_FAILURE(
      start_ctl_job(&job, 3, 60, metrics, {"--link", "1-2=5M,20ms"}, "preflight-test", "preflight"));
  BinRun status = run(job.ctl({"--json", "status"}), 30s);
  ASSERT_EQ(status.code, 0) << status.output;
  const auto pf = nlohmann::json::parse(status.output)["workers"]["preflight"];
  ASSERT_EQ(pf.size(), 6u) << pf.dump();  // 3 pairs (every two stages carry the gradient norm), both ways
  for (const auto& e : pf) {
    EXPECT_TRUE(e["ok"].get<bool>()) << e.dump();
    const int a = e["src"], b = e["dst"];
    const double rtt = e["rtt_ms"], mbps = e["mbps"];
    if (std::min(a, b) == 1 && std::max(a, b) == 2) {
      EXPECT_EQ(e["link"], a == 1 ? "1-2:fwd" : "1-2:bwd");
      EXPECT_GE(rtt, 39.0) << e.dump();
      EXPECT_LT(rtt, 150.0) << e.dump();
      EXPECT_GT(mbps, 5 * 0.6) << e.dump();
      EXPECT_LT(mbps, 5 * 1.5) << e.dump();
    } else {
      EXPECT_LT(rtt, 20.0) << e.dump();
      if (std::abs(a - b) == 1)
        EXPECT_GT(mbps, 50.0) << e.dump();  // neighbours get a burst
      else
        EXPECT_EQ(mbps, 0.0) << e.dump();  // 0-2 only carries the norm
    }
  }
  // The cluster needs each worker's compute seconds after step 1: ask until they are in.
  BinRun probe;
  for (int i = 0; i < 200; ++i) {
    probe = run({"probe", "--coordinator", job.ep, "--key-file", job.token}, 30s);
    if (probe.code == 0 || probe.output.find("no compute_s after step 1") == std::string::npos) break;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_EQ(probe.code, 0) << probe.output;
  auto cluster = Cluster::from_json(nlohmann::json::parse(probe.output), "probe");
  ASSERT_TRUE(cluster.ok()) << cluster.status().to_string() << "\n" << probe.output;
  ASSERT_EQ(cluster->workers().size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_GT(cluster->worker(r).gflops, 0) << probe.output;
  EXPECT_GT(cluster->bandwidth(1, 2), 5e6 * 0.6) << probe.output;
  EXPECT_LT(cluster->bandwidth(1, 2), 5e6 * 1.5) << probe.output;
  EXPECT_GE(cluster->latency(1, 2), 0.019) << probe.output;
  EXPECT_LT(cluster->latency(1, 2), 0.075) << probe.output;
  EXPECT_GT(cluster->bandwidth(0, 1), 50e6) << probe.output;
  EXPECT_LT(cluster->latency(0, 1), 0.01) << probe.output;
  // A probe needs a source, and only one.
  BinRun neither = run({"probe"}, 30s);
  EXPECT_NE(neither.code, 0);
  EXPECT_NE(neither.output.find("either --from-metrics FILE"), std::string::npos) << neither.output;
  kill(job.launch, SIGTERM);
  wait_exit(job.launch, 60s);
}

}  // namespace
}  // namespace lh
