// Multi-process pipeline jobs through the real binary ($LH_BIN), split by topic from test_launch.cpp (the Launch
// fixture and helpers: tests/integration/launch_util.h). This file: a killed worker stops the job naming it, a
// recovered or resumed job goes on from its last checkpoint with the same losses, a lost packet rolls the job back, an
// elastic job goes on without a replica, corrupted checkpoints and shards are set aside, a killed coordinator restarted
// with --resume finishes the job, and workers whose connections are reset reconnect as themselves.
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

// The name `ps -o comm`, `top` and `pgrep` show.
std::string process_name(pid_t pid) {
  std::string s = slurp("/proc/" + std::to_string(pid) + "/comm");
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

class KilledWorker : public Launch, public ::testing::WithParamInterface<bool> {};

// A pipeline stage (param false) or a data-parallel replica (true) dies mid-job.
TEST_P(KilledWorker, StopsTheJobNamingIt) {
  const std::string kind = GetParam() ? "replica" : "stage";
  std::string metrics = temp_path("kill_" + kind + ".jsonl"), out = temp_path("kill_launch_" + kind + ".txt");
  // Without a wait policy longhaul re-executes itself to set one; it must keep its name doing so.
  unsetenv("OMP_WAIT_POLICY");
  // No replacement: the job stops (RecoveryTest covers a job that goes on).
  std::vector<std::string> extra = {"--heartbeat-timeout", "2", "--restarts", "0", "--replace-timeout", "0"};
  if (GetParam()) extra.insert(extra.end(), {"--dp", "2"});
  pid_t launch = spawn(launch_args(2, 100000, metrics, extra), out);
  std::string pids = wait_for_line(out, "workers: pids ", 60s);
  std::istringstream ps(pids);
  pid_t a = 0, b = 0;
  ps >> a >> b;
  ASSERT_GT(b, 0) << slurp(out);
  // Let it train a step, then kill one worker as a crashed machine would.
  for (int i = 0; i < 1200 && newest_loss_step(metrics) == 0; ++i) std::this_thread::sleep_for(50ms);
  ASSERT_GT(newest_loss_step(metrics), 0) << slurp(out);
  // Processes are named longhaul; workers also by the rank the coordinator gave them.
  EXPECT_EQ(process_name(launch), "longhaul");
  EXPECT_EQ((std::set<std::string>{process_name(a), process_name(b)}),
            (std::set<std::string>{"longhaul-w0", "longhaul-w1"}));
  ASSERT_EQ(kill(b, SIGKILL), 0);
  const int code = wait_exit(launch, 60s);
  const std::string text = slurp(out);
  EXPECT_GT(code, 0) << text;
  EXPECT_NE(text.find("(pid " + std::to_string(b) + ") was killed by signal 9"), std::string::npos) << text;
  EXPECT_NE(text.find("longhaul: error: worker "), std::string::npos) << text;
  // Nothing left behind: launch reaped both workers.
  EXPECT_NE(kill(a, 0), 0);
  EXPECT_NE(kill(b, 0), 0);
}
INSTANTIATE_TEST_SUITE_P(StageOrReplica, KilledWorker, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Replica" : "Stage"; });

// Every record of a metrics file, as (worker, step) → loss line count, to find steps reported twice.
std::map<std::pair<int, int64_t>, int> records_per_step(const std::string& metrics_path) {
  std::map<std::pair<int, int64_t>, int> n;
  std::ifstream in(metrics_path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object()) ++n[{j.value("worker", -1), j.value("step", int64_t(-1))}];
  }
  return n;
}

class RecoveredWorker : public Launch, public ::testing::WithParamInterface<std::string> {};

// SIGKILL one worker at a random step: launch starts another process, the coordinator rolls the job back to its last
// checkpoint, every worker loads its state, and the job completes with the same per-step losses as a run that was
// never interrupted (1e-6 relative); no step is reported twice. A 4-stage pipeline with error-feedback codecs on its
// links ("stages"), 2 stages × 2 replicas with compressed gradients ("replicas"), and the same averaged two steps
// late (--sync delayed:D=2: the checkpoints hold the averages still in flight; "delayed").
TEST_P(RecoveredWorker, GoesOnFromTheLastCheckpointWithTheSameLosses) {
  const int steps = 24;
  const std::string kind = GetParam();
  std::vector<std::string> grid = {"--compress-fwd", "ef+int4", "--compress-bwd", "int8", "--link", "20M,1ms"};
  if (kind != "stages") grid.insert(grid.end(), {"--pp", "2", "--dp", "2", "--compress-grad", "ef+int4"});
  if (kind == "delayed") grid.insert(grid.end(), {"--sync", "delayed:D=2"});
  const std::string straight = temp_path("straight_" + kind + ".jsonl");
  BinRun ref = run(launch_args(4, steps, straight, grid), 300s);
  ASSERT_EQ(ref.code, 0) << ref.output;

  const std::string metrics = temp_path("recovered_" + kind + ".jsonl"), out = temp_path("recovered_" + kind + ".txt");
  const std::string dir = temp_path("ckpt_" + kind);
  std::vector<std::string> extra = grid;
  extra.insert(extra.end(), {"--checkpoint-dir", dir, "--checkpoint-every", "3", "--heartbeat-timeout", "2"});
  pid_t launch = spawn(launch_args(4, steps, metrics, extra), out);
  std::istringstream ps(wait_for_line(out, "workers: pids ", 60s));
  std::vector<pid_t> pids(4, 0);
  for (pid_t& p : pids) ps >> p;
  ASSERT_GT(pids[3], 0) << slurp(out);
  // A step between 4 and 15 (after a checkpoint or between two), a worker chosen the same way.
  const unsigned seed = unsigned(getpid());
  const int64_t kill_after = 4 + int64_t(seed % 12);
  const pid_t victim = pids[(seed / 12) % 4];
  for (int i = 0; i < 2400 && newest_loss_step(metrics) < kill_after; ++i) std::this_thread::sleep_for(25ms);
  ASSERT_GE(newest_loss_step(metrics), kill_after) << slurp(out);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const auto killed_at = std::chrono::steady_clock::now();
  const int code = wait_exit(launch, 300s);
  const std::string text = slurp(out);
  ASSERT_EQ(code, 0) << "killed pid " << victim << " after step " << kill_after << "\n" << text;
  EXPECT_NE(text.find("(pid " + std::to_string(victim) + ") was killed by signal 9"), std::string::npos) << text;
  EXPECT_NE(text.find("in its place"), std::string::npos) << text;
  std::printf("recovery: killed pid %d after step %lld; the job finished %.1f s later\n", int(victim),
              static_cast<long long>(kill_after),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count());
  expect_same_losses(losses_of(metrics), losses_of(straight), steps);
  for (const auto& [key, n] : records_per_step(metrics))
    EXPECT_EQ(n, 1) << "worker " << key.first << " step " << key.second << " reported " << n << " times";
  EXPECT_EQ(records_per_step(metrics).size(), size_t(4 * steps));
}
INSTANTIATE_TEST_SUITE_P(StagesOrReplicas, RecoveredWorker, ::testing::Values("stages", "replicas", "delayed"),
                         [](const auto& info) { return info.param; });

// The data plane loses a packet (LH_FAULT_DROP_SEND: an activation reported sent that never leaves): the two
// stages wait on each other for good. The coordinator sees the cycle in their heartbeats once it has lasted the
// stall timeout, names it, and rolls the job back to its last checkpoint with new endpoints; the job finishes with
// the losses of a run that lost nothing. (With --replace-timeout 0 it would stop naming the loss instead of hanging.)
TEST_F(Launch, APacketLostByTheDataPlaneRollsTheJobBack) {
  const int steps = 12;
  std::vector<std::string> extra = {"--link",          "20M,1ms", "--heartbeat-timeout", "2",
                                    "--stall-timeout", "2",       "--restarts",          "0"};
  const std::string straight = temp_path("lost_straight.jsonl");
  BinRun ref = run(launch_args(2, steps, straight, extra), 300s);
  ASSERT_EQ(ref.code, 0) << ref.output;
  const std::string metrics = temp_path("lost.jsonl"), dir = temp_path("lost_ckpt");
  extra.insert(extra.end(), {"--checkpoint-dir", dir, "--checkpoint-every", "3"});
  setenv("LH_FAULT_DROP_SEND", "5", 1);  // inherited by launch's workers; only stage 0 sends activations
  BinRun lossy = run(launch_args(2, steps, metrics, extra), 300s);
  unsetenv("LH_FAULT_DROP_SEND");
  ASSERT_EQ(lossy.code, 0) << lossy.output;
  EXPECT_NE(lossy.output.find("fault injection: dropping the activation step 5"), std::string::npos) << lossy.output;
  EXPECT_NE(lossy.output.find("the data plane lost a packet: rank "), std::string::npos) << lossy.output;
  // Both workers rolled back on the UCX worker they started with (none of UCX's worker teardown ran).
  for (int r : {0, 1}) {
    bool kept = false;
    std::istringstream lines(lossy.output);
    for (std::string line; std::getline(lines, line);)
      kept |= line.find("] rank " + std::to_string(r) + ": ") != std::string::npos &&
              line.find(
                  "; joining the next epoch on the same UCX worker, address and data ports (1 plan ended on "
                  "them)") != std::string::npos;
    EXPECT_TRUE(kept) << "rank " << r << "\n" << lossy.output;
  }
  expect_same_losses(losses_of(metrics), losses_of(straight), steps);
  for (const auto& [key, n] : records_per_step(metrics))
    EXPECT_EQ(n, 1) << "worker " << key.first << " step " << key.second;
}

// --elastic: a worker of a 2-stage × 2-replica job is SIGKILLed and no replacement is started. The job rolls back to
// its last checkpoint and goes on at once with the replica left (dp 2 → 1): the lost replica's other worker leaves
// cleanly, the survivors train on their own slices of each global batch, every step is reported once. Resumed later
// with the job's original flags and --elastic, it goes on with the one replica its checkpoint holds.
TEST_F(Launch, AnElasticJobGoesOnWithoutALostReplica) {
  const int steps = 16;
  const std::string metrics = temp_path("elastic.jsonl"), out = temp_path("elastic.txt");
  const std::string dir = temp_path("elastic_ckpt");
  std::vector<std::string> extra = {"--pp",      "2",
                                    "--dp",      "2",
                                    "--link",    "20M,1ms",
                                    "--elastic", "--checkpoint-dir",
                                    dir,         "--checkpoint-every",
                                    "3",         "--heartbeat-timeout",
                                    "2",         "--restarts",
                                    "0"};
  pid_t launch = spawn(launch_args(4, steps, metrics, extra), out);
  std::istringstream ps(wait_for_line(out, "workers: pids ", 60s));
  std::vector<pid_t> pids(4, 0);
  for (pid_t& p : pids) ps >> p;
  ASSERT_GT(pids[3], 0) << slurp(out);
  for (int i = 0; i < 2400 && newest_loss_step(metrics) < 5; ++i) std::this_thread::sleep_for(25ms);
  ASSERT_GE(newest_loss_step(metrics), 5) << slurp(out);
  ASSERT_EQ(kill(pids[3], SIGKILL), 0);
  const int code = wait_exit(launch, 300s);
  const std::string text = slurp(out);
  ASSERT_EQ(code, 0) << text;
  EXPECT_NE(text.find("--elastic: the job goes on without its replica"), std::string::npos) << text;
  EXPECT_NE(text.find("dp 2 → 1"), std::string::npos) << text;
  // Four workers report each step up to the checkpoint the job went back to, the two left each step after it.
  auto records = records_per_step(metrics);
  std::map<int64_t, std::set<int>> ranks;
  for (const auto& [key, n] : records) {
    EXPECT_EQ(n, 1) << "worker " << key.first << " step " << key.second << " reported " << n << " times";
    ranks[key.second].insert(key.first);
  }
  ASSERT_EQ(ranks.size(), size_t(steps));
  int64_t went_back = 0;
  while (went_back < steps && ranks[went_back + 1].size() == 4) ++went_back;
  EXPECT_GE(went_back, 3);
  EXPECT_EQ(went_back % 3, 0) << "the job went on from step " << went_back << ", not a checkpoint";
  for (int64_t st = went_back + 1; st <= steps; ++st) EXPECT_EQ(ranks[st], (std::set<int>{0, 1})) << "step " << st;
  const auto losses = losses_of(metrics);
  ASSERT_EQ(losses.size(), size_t(steps));
  for (const auto& [st, loss] : losses) EXPECT_TRUE(std::isfinite(loss)) << "step " << st;
  EXPECT_LT(losses.at(steps), losses.at(1));

  std::vector<std::string> more = launch_args(4, steps + 3, metrics, extra);  // the job's original flags
  more.push_back("--resume");
  BinRun again = run(more, 300s);
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("goes on with them"), std::string::npos) << again.output;
  records = records_per_step(metrics);
  for (int64_t st = steps + 1; st <= steps + 3; ++st) {
    EXPECT_EQ(records.count({0, st}), 1u) << "step " << st;
    EXPECT_EQ(records.count({1, st}), 1u) << "step " << st;
    EXPECT_EQ(records.count({2, st}), 0u) << "step " << st;
  }
}

// A job's newest checkpoint is damaged after it was committed: --resume warns, names it, falls back to the one before,
// re-runs the steps after it, and ends with the losses of the run that wrote them; the metrics file keeps one record
// per worker and step.
TEST_F(Launch, ResumeFallsBackPastACorruptedCheckpoint) {
  const int steps = 8;
  const std::string metrics = temp_path("resume.jsonl"), dir = temp_path("resume_ckpt");
  std::vector<std::string> extra = {"--checkpoint-dir", dir, "--checkpoint-every", "3"};
  BinRun first = run(launch_args(2, steps, metrics, extra), 300s);
  ASSERT_EQ(first.code, 0) << first.output;
  const std::map<int64_t, double> want = losses_of(metrics);
  // Checkpoints at 3, 6 and 8 (the last step); damage step 8's shard of rank 1.
  const std::string shard = dir + "/step_00000008/rank_0001.shard";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << shard;
    f.seekp(40);
    f.put('\x7f');
  }
  // As if the job had crashed in step 8: its metrics end with step 7 and a torn line, which the resumed job drops
  // along with step 7 (after its checkpoint), then reports steps 7 and 8 again.
  {
    std::ifstream in(metrics);
    std::string kept;
    for (std::string line; std::getline(in, line);)
      if (nlohmann::json::parse(line).value("step", 0) <= 7) kept += line + "\n";
    std::ofstream(metrics) << kept << R"({"worker":1,"step":8,"lo)";
  }
  extra.push_back("--resume");
  BinRun again = run(launch_args(2, steps, metrics, extra), 300s);
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("checkpoint step 8 cannot be used"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("corrupted"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("resuming from the checkpoint of step 6"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("dropping line"), std::string::npos) << again.output;  // the torn one
  expect_same_losses(losses_of(metrics), want, steps);
  for (const auto& [key, n] : records_per_step(metrics))
    EXPECT_EQ(n, 1) << "worker " << key.first << " step " << key.second;
  EXPECT_EQ(records_per_step(metrics).size(), size_t(2 * steps));
  // Another job's flags do not resume this one's checkpoints.
  std::vector<std::string> other = extra;
  other.insert(other.end(), {"--lr", "0.01"});
  BinRun foreign = run(launch_args(2, steps + 2, temp_path("foreign.jsonl"), other), 300s);
  EXPECT_NE(foreign.code, 0) << foreign.output;
  EXPECT_NE(foreign.output.find("another job configuration"), std::string::npos) << foreign.output;
  EXPECT_NE(foreign.output.find("no checkpoint in"), std::string::npos) << foreign.output;
}

// A shard that verifies (its size and xxHash64 match the manifest: a writer of the checkpoint directory, or a bad
// worker, made it so) but cannot be loaded: the worker says why instead of dying silently, the coordinator sets that
// checkpoint aside and goes back to the one before, and the job finishes with the losses of the run that wrote them.
// Before, the worker exited, was declared dead, and the job rolled back to the same checkpoint again.
TEST_F(Launch, AShardAWorkerCannotLoadIsSetAsideAndTheJobFallsBack) {
  const int steps = 8;
  const std::string metrics = temp_path("hostile.jsonl"), dir = temp_path("hostile_ckpt");
  std::vector<std::string> extra = {"--checkpoint-dir", dir, "--checkpoint-every", "3"};
  BinRun first = run(launch_args(2, steps, metrics, extra), 300s);
  ASSERT_EQ(first.code, 0) << first.output;
  const std::map<int64_t, double> want = losses_of(metrics);
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/step_00000006/rank_0001.shard").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "checkpoints are the owner's only";
  // As if the job had stopped in step 8, before its last checkpoint; step 6's shard of rank 1 is replaced.
  std::filesystem::remove_all(dir + "/step_00000008");
  const std::string hostile(4096, 'x');
  std::ofstream(dir + "/step_00000006/rank_0001.shard", std::ios::binary) << hostile;
  {
    const std::string path = dir + "/step_00000006/manifest.json";
    nlohmann::json m = nlohmann::json::parse(slurp(path));
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx",
                  static_cast<unsigned long long>(XXH64(hostile.data(), hostile.size(), 0)));
    for (auto& sh : m["shards"])
      if (sh["rank"] == 1) {
        sh["bytes"] = hostile.size();
        sh["xxh64"] = hex;
      }
    std::ofstream(path) << m.dump(1) << "\n";
  }
  extra.push_back("--resume");
  BinRun again = run(launch_args(2, steps, metrics, extra), 300s);
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("resuming from the checkpoint of step 6"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("cannot load its shard of the checkpoint of step 6: the checkpoint of step 6"),
            std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("is set aside as '" + dir + "/step_00000006.unusable'"), std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("goes back to step 3"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("declared dead"), std::string::npos) << again.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/step_00000006.unusable/why.txt"));
  expect_same_losses(losses_of(metrics), want, steps);
}

// A TCP port on loopback that is free now and whose next port (the relay's) is free too, below the ephemeral range
// (32768 up on Linux): a coordinator restarted on it must find it again, and no outgoing connection (another test's,
// or a worker's reconnection that connects to itself) can be handed it meanwhile.
int free_port() {
  auto is_free = [](int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(uint16_t(port));
    const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    if (fd >= 0) close(fd);
    return ok;
  };
  // Even ports from 20000 to 31998, starting at one this process picks (parallel tests start apart).
  const int start = int(getpid() % 6000);
  for (int i = 0; i < 6000; ++i) {
    const int port = 20000 + 2 * ((start + i) % 6000);
    if (is_free(port) && is_free(port + 1)) return port;
  }
  return 0;
}

// The coordinator of a job started as separate processes is SIGKILLed: its workers roll back and wait for it
// (--coordinator-timeout, default 600 s), and a coordinator started again with --resume on the same address and
// checkpoint directory takes the job back from its last checkpoint; the same worker processes finish it, every step
// reported once.
TEST_F(Launch, ACoordinatorKilledAndStartedWithResumeFinishesTheJob) {
  const int steps = 60;
  const std::string metrics = temp_path("coord_kill.jsonl"), dir = temp_path("coord_kill_ckpt");
  const std::string token = make_key("coord_kill_token");
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
  auto start_coordinator = [&](const std::string& out, bool resume) {
    std::vector<std::string> args = {"--log-level",
                                     "warn",
                                     "coordinator",
                                     "--listen",
                                     ep,
                                     "--workers",
                                     "2",
                                     "--key-file",
                                     token,
                                     "--metrics",
                                     metrics,
                                     "--checkpoint-dir",
                                     dir,
                                     "--checkpoint-every",
                                     "2",
                                     "--heartbeat-timeout",
                                     "2"};
    if (resume) args.push_back("--resume");
    for (auto& f : model_flags(steps)) args.push_back(f);
    pid_t pid = spawn(args, out);
    EXPECT_FALSE(wait_for_line(out, "listening on ", 60s).empty()) << slurp(out);
    return pid;
  };
  const std::string out1 = temp_path("coord_kill1.txt"), out2 = temp_path("coord_kill2.txt");
  pid_t coord = start_coordinator(out1, false);
  auto start_workers = [&](const std::vector<std::string>& logs) {
    std::vector<pid_t> w;
    for (const std::string& log : logs)
      w.push_back(spawn({"--threads", "1", "--log-level", "warn", "worker", "--coordinator", ep, "--key-file", token,
                         "--ucx-tls", "tcp", "--link", "4M,1ms"},
                        log));
    return w;
  };
  const std::vector<std::string> logs = {temp_path("coord_kill_w0.txt"), temp_path("coord_kill_w1.txt")};
  std::vector<pid_t> workers = start_workers(logs);
  for (int i = 0; i < 2400 && newest_loss_step(metrics) < 5; ++i) std::this_thread::sleep_for(25ms);
  ASSERT_GE(newest_loss_step(metrics), 5) << slurp(out1);
  ASSERT_EQ(kill(coord, SIGKILL), 0);
  wait_exit(coord, 30s);
  std::this_thread::sleep_for(3s);  // longer than the heartbeat timeout: the workers notice and wait
  for (pid_t w : workers) EXPECT_EQ(kill(w, 0), 0) << "a worker gave up on its coordinator";
  pid_t coord2 = start_coordinator(out2, true);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(wait_exit(workers[size_t(i)], 300s), 0) << slurp(logs[size_t(i)]);
  ASSERT_EQ(wait_exit(coord2, 60s), 0) << slurp(out2);
  EXPECT_NE(slurp(out2).find("resuming from the checkpoint of step"), std::string::npos) << slurp(out2);
  EXPECT_EQ(losses_of(metrics).size(), size_t(steps));
  for (const auto& [key, n] : records_per_step(metrics))
    EXPECT_EQ(n, 1) << "worker " << key.first << " step " << key.second;
}

// A TCP forwarder between workers and their coordinator that can reset every connection it carries (RST both ways,
// what was buffered is lost), as a NAT or a flaky path does. It keeps listening: the workers' ZeroMQ reconnects.
class ResettingProxy {
 public:
  explicit ResettingProxy(int target_port) : target_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && listen(listen_fd_, 16) == 0 &&
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~ResettingProxy() {
    stop_ = true;
    thread_.join();
    for (auto& [a, b] : pairs_) {
      close(a);
      close(b);
    }
    close(listen_fd_);
  }
  int port() const { return port_; }
  int accepted() const { return accepted_; }
  // Resets every connection now; returns how many were reset.
  int reset_all() {
    reset_ = true;
    while (reset_) std::this_thread::sleep_for(1ms);
    return last_reset_;
  }

 private:
  static void rst_close(int fd) {
    linger l{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close(fd);
  }
  void run() {
    std::vector<char> buf(1 << 16);
    while (!stop_) {
      if (reset_) {
        for (auto& [a, b] : pairs_) {
          rst_close(a);
          rst_close(b);
        }
        last_reset_ = int(pairs_.size());
        pairs_.clear();
        reset_ = false;
      }
      std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}};
      for (auto& [a, b] : pairs_) {
        fds.push_back({a, POLLIN, 0});
        fds.push_back({b, POLLIN, 0});
      }
      if (poll(fds.data(), fds.size(), 10) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        int c = accept(listen_fd_, nullptr, nullptr);
        int u = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in t{};
        t.sin_family = AF_INET;
        t.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        t.sin_port = htons(uint16_t(target_));
        if (c >= 0 && connect(u, reinterpret_cast<sockaddr*>(&t), sizeof(t)) == 0) {
          pairs_.emplace_back(c, u);
          ++accepted_;
        } else {
          if (c >= 0) close(c);
          close(u);
        }
      }
      std::vector<size_t> dead;
      for (size_t i = 0; i < pairs_.size(); ++i)
        for (int side = 0; side < 2; ++side) {
          const pollfd& p = fds[1 + 2 * i + size_t(side)];
          if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
          int from = side == 0 ? pairs_[i].first : pairs_[i].second,
              to = side == 0 ? pairs_[i].second : pairs_[i].first;
          ssize_t n = read(from, buf.data(), buf.size());
          bool ok = n > 0;
          for (ssize_t off = 0; ok && off < n;) {
            ssize_t w = write(to, buf.data() + off, size_t(n - off));
            ok = w > 0;
            off += std::max<ssize_t>(w, 0);
          }
          if (!ok) dead.push_back(i);
        }
      std::sort(dead.begin(), dead.end());
      dead.erase(std::unique(dead.begin(), dead.end()), dead.end());
      for (auto it = dead.rbegin(); it != dead.rend(); ++it) {
        close(pairs_[*it].first);
        close(pairs_[*it].second);
        pairs_.erase(pairs_.begin() + long(*it));
      }
    }
  }
  int target_, listen_fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false}, reset_{false};
  std::atomic<int> accepted_{0}, last_reset_{0};
  std::vector<std::pair<int, int>> pairs_;  // proxy thread only
  std::thread thread_;
};

// Workers whose TCP connections to the coordinator are reset mid-run (twice) reconnect as themselves: the job
// completes with every step reported once and the losses of an uninterrupted run (messages lost with a connection
// show as a gap in their numbering, and the job then rolls back to its last checkpoint rather than guess).
TEST_F(Launch, WorkersWhoseConnectionsAreResetReconnectAsThemselves) {
  const int steps = 24;
  const std::string train_metrics = temp_path("reset_train.jsonl"), metrics = temp_path("reset.jsonl");
  const std::string out = temp_path("reset_coord.txt"), dir = temp_path("reset_ckpt"), token = make_key("reset_tok");
  std::vector<std::string> train = {"--threads", "1", "--log-level", "warn", "train", "--metrics", train_metrics};
  for (auto& f : model_flags(steps)) train.push_back(f);
  BinRun t = run(train);
  ASSERT_EQ(t.code, 0) << t.output;
  std::vector<std::string> args = {"--log-level",
                                   "warn",
                                   "coordinator",
                                   "--listen",
                                   "tcp://127.0.0.1:*",
                                   "--workers",
                                   "2",
                                   "--key-file",
                                   token,
                                   "--metrics",
                                   metrics,
                                   "--checkpoint-dir",
                                   dir,
                                   "--checkpoint-every",
                                   "4",
                                   "--heartbeat-timeout",
                                   "3"};
  for (auto& f : model_flags(steps)) args.push_back(f);
  std::string ep;
  pid_t coord = spawn_coordinator(args, out, &ep);
  ASSERT_FALSE(ep.empty()) << slurp(out);
  ResettingProxy proxy(std::stoi(ep.substr(ep.rfind(':') + 1)));
  ASSERT_GT(proxy.port(), 0);
  const std::string via = "tcp://127.0.0.1:" + std::to_string(proxy.port());
  std::vector<pid_t> workers;
  std::vector<std::string> logs = {temp_path("reset_w0.txt"), temp_path("reset_w1.txt")};
  for (const std::string& log : logs)
    workers.push_back(spawn({"--threads", "1", "--log-level", "info", "worker", "--coordinator", via, "--key-file",
                             token, "--ucx-tls", "tcp", "--link", "4M,1ms"},
                            log));
  int resets = 0;
  for (int64_t at : {3, 12}) {
    for (int i = 0; i < 4800 && newest_loss_step(metrics) < at; ++i) std::this_thread::sleep_for(25ms);
    resets += proxy.reset_all();
  }
  EXPECT_GE(resets, 2);
  for (size_t i = 0; i < workers.size(); ++i) EXPECT_EQ(wait_exit(workers[i], 300s), 0) << slurp(logs[i]);
  ASSERT_EQ(wait_exit(coord, 60s), 0) << slurp(out);
  EXPECT_GT(proxy.accepted(), 2) << "the workers did not reconnect";
  expect_same_losses(losses_of(metrics), losses_of(train_metrics), steps);
  for (const auto& [key, n] : records_per_step(metrics))
    EXPECT_EQ(n, 1) << "worker " << key.first << " step " << key.second;
  EXPECT_EQ(records_per_step(metrics).size(), size_t(2 * steps));
}

}  // namespace
}  // namespace lh
