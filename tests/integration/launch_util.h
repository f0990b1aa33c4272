// Helpers of the tests that run the real binary ($LH_BIN): spawn it, wait for it, read what it wrote, the tiny test
// model's flags, a launch job steered through ctl, and the Launch fixture (skipped without LH_BIN). Used by
// the tests of tests/integration (test_launch_*.cpp, the launchers, Slurm, FromEnv and the live page).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "metrics/step_metrics.h"

namespace lh {

using namespace std::chrono_literals;

inline const char* bin() {
  return std::getenv("LH_BIN");
}

// Every worker these tests start speaks UCX over loopback only: another test's network namespace (veth pairs that
// come and go, NetnsLinksAsRoot runs beside these under ctest -j) must not become a lane of theirs, or vanish under
// one (a worker then fails with "No such device", or its packets are lost). --netns workers name eth0 themselves.
inline const bool g_loopback_only = [] { return setenv("UCX_NET_DEVICES", "lo", /*overwrite=*/0) == 0; }();

// A per-process path, removed first: a file left by an earlier run whose pid was the same must not leak in.
inline std::string temp_path(const std::string& name) {
  std::string p = ::testing::TempDir() + "lh_launch_" + std::to_string(getpid()) + "_" + name;
  ::unlink(p.c_str());
  return p;
}

// A job secret from `longhaul keygen` in a per-process path (defined below: run()).
inline std::string make_key(const std::string& name);

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `$LH_BIN args...` with stdout and stderr into `out`, and `env` set in its environment (an empty value unsets the
// variable).
inline pid_t spawn_env(const std::vector<std::string>& args, const std::string& out,
                       const std::map<std::string, std::string>& env) {
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (const auto& [name, value] : env) {
      if (value.empty())
        unsetenv(name.c_str());
      else
        setenv(name.c_str(), value.c_str(), 1);
    }
    int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv = {const_cast<char*>(bin())};
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(bin(), argv.data());
    _exit(127);
  }
  return pid;
}

inline pid_t spawn(const std::vector<std::string>& args, const std::string& out) {
  return spawn_env(args, out, {});
}

// The exit code, or -1 when it had to be killed after `timeout`, or 128+signal.
inline int wait_exit(pid_t pid, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGTERM);
      std::this_thread::sleep_for(3s);
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(20ms);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

struct BinRun {
  int code;
  std::string output;
};
inline BinRun run(const std::vector<std::string>& args, std::chrono::seconds timeout = 120s) {
  static int n = 0;
  std::string out = temp_path("run" + std::to_string(n++) + ".txt");
  int code = wait_exit(spawn(args, out), timeout);
  return {code, slurp(out)};
}

inline std::string make_key(const std::string& name) {
  const std::string path = temp_path(name + ".key");
  BinRun made = run({"keygen", path});
  EXPECT_EQ(made.code, 0) << made.output;
  return path;
}

// Waits until `path` holds a line starting with `prefix`; returns the rest of it.
inline std::string wait_for_line(const std::string& path, const std::string& prefix, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::istringstream in(slurp(path));
    for (std::string line; std::getline(in, line);)
      if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
    std::this_thread::sleep_for(50ms);
  }
  return "";
}

// Spawns `$LH_BIN args` (a `coordinator`) with its output into `out`; *ep is the endpoint it listens on ("" if it
// never said).
inline pid_t spawn_coordinator(const std::vector<std::string>& args, const std::string& out, std::string* ep) {
  pid_t pid = spawn(args, out);
  *ep = wait_for_line(out, "listening on ", std::chrono::seconds(60));
  *ep = ep->substr(0, ep->find_first_of("; "));
  return pid;
}

// The tiny model of the in-process pipeline tests: a few steps take seconds.
// The test model; `heads` is the one flag tests change (tp splits need more heads than the default 2).
inline std::vector<std::string> model_flags(int steps, int heads = 2) {
  return {"--layers", "4",  "--d-model", "32", "--heads", std::to_string(heads),
          "--seq",    "16", "--batch",   "8",  "--steps", std::to_string(steps),
          "--warmup", "1",  "--seed",    "21"};
}

// `extra` with a "--heads N" pair taken out into *heads.
inline std::vector<std::string> take_heads(std::vector<std::string> extra, int* heads) {
  for (size_t i = 0; i + 1 < extra.size(); ++i)
    if (extra[i] == "--heads") {
      *heads = std::stoi(extra[i + 1]);
      extra.erase(extra.begin() + i, extra.begin() + i + 2);
      break;
    }
  return extra;
}

inline std::vector<std::string> launch_args(int workers, int steps, const std::string& metrics,
                                            std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {
      "--log-level", "warn", "launch",    "--workers", std::to_string(workers), "--worker-threads", "1",
      "--ucx-tls",   "tcp",  "--metrics", metrics};
  if (std::find(extra.begin(), extra.end(), "--microbatches") == extra.end())
    a.insert(a.end(), {"--microbatches", "4"});
  int heads = 2;
  extra = take_heads(std::move(extra), &heads);
  for (auto& f : model_flags(steps, heads)) a.push_back(f);
  for (auto& f : extra) a.push_back(f);
  return a;
}

// A resumed or recovered job's losses against a run that was never interrupted: every step, to 1e-6 relative.
inline void expect_same_losses(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want, int steps) {
  ASSERT_EQ(got.size(), size_t(steps));
  ASSERT_EQ(want.size(), size_t(steps));
  for (const auto& [step, loss] : want) EXPECT_NEAR(got.at(step), loss, 1e-6 * std::fabs(loss)) << "step " << step;
}

// The run the Slurm, FromEnv and ssh launchers' jobs are checked against: `launch` with `workers` workers over
// `steps` steps and `extra`, its metrics into `metrics`; a test failure when it does not pass (callers wrap it in
// ASSERT_NO_FATAL_FAILURE).
inline void run_reference_launch(int workers, int steps, const std::string& metrics, std::vector<std::string> extra) {
  BinRun l = run(launch_args(workers, steps, metrics, std::move(extra)), std::chrono::seconds(300));
  ASSERT_EQ(l.code, 0) << l.output;
}

// A launcher's job's losses (`have`, `steps` of them) against its reference run's: every step, to `rel` relative.
// `said`: what the job printed, shown when a step is missing (a fatal failure: callers wrap it in
// ASSERT_NO_FATAL_FAILURE).
inline void expect_losses_near(const std::map<int64_t, double>& have, const std::map<int64_t, double>& want, int steps,
                               const std::string& said = "", double rel = 1e-5) {
  ASSERT_EQ(have.size(), size_t(steps)) << said;
  for (auto& [step, loss] : want) EXPECT_NEAR(have.at(step), loss, rel * std::abs(loss)) << "step " << step;
}

// Per step, the mean of the losses reported (one per replica of the last stage), as `report` takes it.
inline std::map<int64_t, double> losses_of(const std::string& metrics_path) {
  auto records = read_step_metrics_file(metrics_path);
  EXPECT_TRUE(records.ok()) << records.status().to_string();
  std::map<int64_t, std::pair<double, int>> sums;
  if (records.ok())
    for (auto& r : *records)
      if (r.loss) {
        sums[r.step].first += *r.loss;
        sums[r.step].second += 1;
      }
  std::map<int64_t, double> out;
  for (auto& [step, s] : sums) out[step] = s.first / s.second;
  return out;
}

// The newest step with a loss in a metrics file a running job is still appending to (0: none yet). Only complete
// lines count: a poll may catch the last one half-written.
inline int64_t newest_loss_step(const std::string& metrics_path) {
  std::string text = slurp(metrics_path);
  text.erase(text.find_last_of('\n') == std::string::npos ? 0 : text.find_last_of('\n') + 1);
  std::istringstream in(text);
  auto records = read_step_metrics(in, metrics_path);
  int64_t newest = 0;
  if (records.ok())
    for (const auto& r : *records)
      if (r.loss) newest = std::max(newest, r.step);
  return newest;
}

class Launch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!bin()) GTEST_SKIP() << "LH_BIN is not set (ctest sets it to the longhaul binary)";
  }
};

// A launch job steered through `ctl`: started over slow links, with its coordinator's endpoint found in its output.
struct CtlJob {
  pid_t launch = -1;
  std::string out, ep, token;
  // `ctl --coordinator EP --key-file KEY` followed by `more` (token: the key file).
  std::vector<std::string> ctl(std::vector<std::string> more) const {
    std::vector<std::string> a = {"ctl", "--coordinator", ep, "--key-file", token};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }
};

// Spawns `launch` with `workers`, `steps` and `extra` plus --token `token`, and returns once `ctl status` reports
// a finished step (so a set-codec lands mid-run).
inline void start_ctl_job(CtlJob* job, int workers, int steps, const std::string& metrics,
                          std::vector<std::string> extra, const std::string& token, const std::string& name) {
  job->token = temp_path(name + ".key");
  BinRun made = run({"keygen", job->token});
  ASSERT_EQ(made.code, 0) << made.output;
  job->out = temp_path(name + "_launch.txt");
  extra.insert(extra.end(), {"--key-file", job->token});
  job->launch = spawn(launch_args(workers, steps, metrics, extra), job->out);
  job->ep = wait_for_line(job->out, "coordinator ", 60s);
  job->ep = job->ep.substr(0, job->ep.find(' '));
  ASSERT_FALSE(job->ep.empty()) << slurp(job->out);
  EXPECT_EQ(slurp(job->out).find(slurp(job->token).substr(0, 64)), std::string::npos) << "launch printed the secret";
  int64_t step = -1;
  for (int i = 0; i < 600 && step < 1; ++i) {
    BinRun s = run(job->ctl({"--json", "status"}), 30s);
    ASSERT_EQ(s.code, 0) << s.output;
    step = nlohmann::json::parse(s.output)["step"].get<int64_t>();
    if (step < 1) std::this_thread::sleep_for(50ms);
  }
  ASSERT_GE(step, 1);
}

}  // namespace lh
