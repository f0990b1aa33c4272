// scripts/slurm/longhaul.sbatch (issue 41) submitted with `sbatch --wait` to the one-node cluster of
// scripts/slurm/minicluster.sh: a 4-worker pipeline job reproduces `launch`'s losses with per-task logs and the key
// nowhere but its file; a coordinator that fails ends the job with its code, and so does a workers' step that fails
// (no hang); an open key file is refused; a requeued job resumes; and no daemon or process of the cluster outlives
// it. Label `integration`; skipped unless root with slurm-wlm and munge installed.
#include <sys/stat.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>

#include "tests/common/netns_support.h"
#include "tests/common/run_command.h"
#include "tests/integration/launch_util.h"
#include "web/http_server.h"

namespace lh {
namespace {

using ShellRun = testing::CommandRun;

ShellRun shell(const std::string& cmd) {
  return testing::run_command(cmd);
}

// A single-quoted shell word (the paths here hold no quote).
std::string shell_word(const std::string& s) {
  return "'" + s + "'";
}

std::string skip_reason() {
  if (!bin()) return "LH_BIN is not set (ctest sets it to the longhaul binary)";
  if (::geteuid() != 0) return "needs root: the test's one-node Slurm cluster runs slurmd, which starts jobs as users";
  for (const char* tool : {"munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "setsid"})
    if (shell(std::string("command -v ") + tool).code != 0)
      return std::string(tool) + " is not installed (scripts/setup.sh installs slurm-wlm and munge)";
  return "";
}

// A /proc/PID file's bytes ("" when the process is gone or hides it).
std::string proc_file(const std::string& pid, const char* name) {
  std::ifstream in("/proc/" + pid + "/" + name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "PID: command line" of every other process whose command line or environment holds `needle`: the cluster's
// daemons name its directory, and its jobs' steps and tasks carry SLURM_CONF (under it) in their environment.
std::vector<std::string> processes_holding(const std::string& needle) {
  std::vector<std::string> found;
  const std::string self = std::to_string(::getpid());
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos || pid == self) continue;
    std::string cmd = proc_file(pid, "cmdline");
    if (cmd.find(needle) == std::string::npos && proc_file(pid, "environ").find(needle) == std::string::npos) continue;
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    found.push_back(pid + ": " + cmd);
  }
  return found;
}

// "PID: command line" of every process running $LH_BIN (its argv[0]).
std::vector<std::string> longhaul_processes() {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = proc_file(pid, "cmdline");
    if (cmd.rfind(std::string(bin()) + '\0', 0) != 0) continue;
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    found.push_back(pid + ": " + cmd);
  }
  return found;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}

// A one-node cluster brought up under a fresh directory for each test, and always brought down.
class Slurm : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    std::string t = ::testing::TempDir() + "lh_slurm_XXXXXX";
    ASSERT_NE(::mkdtemp(t.data()), nullptr);
    ::chmod(t.c_str(), 0755);
    dir_ = t;
    cluster_ = dir_ + "/cluster";
    logs_ = dir_ + "/logs";
    up_ = true;  // a cluster half up is brought down too
    const ShellRun up =
        shell("bash " + shell_word(source_script("slurm/minicluster.sh")) + " up " + shell_word(cluster_));
    ASSERT_EQ(up.code, 0) << up.output;
    ASSERT_NE(up.output.find("export SLURM_CONF=" + cluster_ + "/slurm.conf"), std::string::npos) << up.output;
    // What TearDown looks for is seen: munged, slurmctld and slurmd name the cluster's directory.
    ASSERT_GE(processes_holding(cluster_).size(), 3u) << joined(processes_holding(cluster_));
  }

  void TearDown() override {
    if (!up_) return;
    const ShellRun down =
        shell("bash " + shell_word(source_script("slurm/minicluster.sh")) + " down " + shell_word(cluster_));
    EXPECT_EQ(down.code, 0) << down.output;
    // Nothing the cluster started outlives it: daemons, slurmstepd, the job's longhaul processes.
    std::vector<std::string> left = processes_holding(cluster_);
    for (int i = 0; i < 100 && !left.empty(); ++i) {
      std::this_thread::sleep_for(100ms);
      left = processes_holding(cluster_);
    }
    EXPECT_TRUE(left.empty()) << "left behind by the cluster under " << cluster_ << ":\n" << joined(left);
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  // `sbatch --wait --ntasks 4 longhaul.sbatch ARGS` under a time limit (bounded: a job that hangs fails the test),
  // while /proc is searched for `secret` in every command line and environment, and `meanwhile(job)` is called
  // every 100 ms once the job has an id. *job is the job's id.
  ShellRun sbatch(const std::string& args, const std::string& secret, std::string* job,
                  const std::string& sbatch_flags = "",
                  const std::function<void(const std::string&)>& meanwhile = nullptr) {
    const std::string out = dir_ + "/sbatch.txt";
    const std::string cmd = "cd " + shell_word(dir_) + " && SLURM_CONF=" + shell_word(cluster_ + "/slurm.conf") +
                            " timeout 300 sbatch --wait --ntasks 4 " + sbatch_flags + " --output " +
                            shell_word(dir_ + "/batch-%j.out") + " " +
                            shell_word(source_script("slurm/longhaul.sbatch")) + " " + args;
    const auto t0 = std::chrono::steady_clock::now();
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    std::set<std::string> leaks;
    int st = 0;
    double first_step_s = -1;
    while (::waitpid(pid, &st, WNOHANG) != pid) {
      if (!secret.empty())
        for (const std::string& p : processes_holding(secret)) leaks.insert(p);
      // The job's own longhaul processes, to show the search above saw them.
      for (const std::string& p : longhaul_processes()) job_processes_.insert(p);
      if (first_step_s < 0 && job->empty()) {
        const std::string said = slurp(out);
        const size_t at = said.find("Submitted batch job ");
        if (at != std::string::npos) *job = said.substr(at + 20, said.find('\n', at) - at - 20);
      }
      if (first_step_s < 0 && !job->empty() && std::filesystem::exists(logs_ + "/" + *job + "-coordinator.out"))
        first_step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (meanwhile && !job->empty()) meanwhile(*job);
      std::this_thread::sleep_for(100ms);
    }
    const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(leaks.empty()) << "the key is in a command line or environment:\n"
                               << joined({leaks.begin(), leaks.end()});
    ShellRun r{WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0), slurp(out)};
    if (job->empty()) {
      const size_t at = r.output.find("Submitted batch job ");
      if (at != std::string::npos) *job = r.output.substr(at + 20, r.output.find('\n', at) - at - 20);
    }
    std::printf("sbatch --wait: the coordinator's step began after %.1f s; sbatch returned after %.1f s\n",
                first_step_s, total_s);
    RecordProperty("sbatch_first_step_s", std::to_string(first_step_s));
    RecordProperty("sbatch_total_s", std::to_string(total_s));
    return r;
  }

  // A Slurm client command on this cluster.
  ShellRun slurm(const std::string& cmd) const {
    return shell("SLURM_CONF=" + shell_word(cluster_ + "/slurm.conf") + " timeout 30 " + cmd);
  }

  std::string batch_log(const std::string& job) const { return slurp(dir_ + "/batch-" + job + ".out"); }

  // Count of the distinct longhaul processes sbatch() saw running whose command line holds `words` and `key`.
  int seen_running(const std::string& words, const std::string& key) const {
    int n = 0;
    for (const std::string& p : job_processes_)
      n += p.find(words) != std::string::npos && p.find(" --key-file " + key) != std::string::npos;
    return n;
  }

  std::string dir_, cluster_, logs_;
  std::set<std::string> job_processes_;  // "PID:command line" of the longhaul processes seen while sbatch waited
  bool up_ = false;
};

// Flags of the script that are the same for every test: the binary, the logs, one thread and TCP per worker
// (as `launch_args` gives `launch`'s workers), a port of its own for the coordinator.
std::string script_flags(const std::string& key, const std::string& logs) {
  auto port = free_tcp_port("0.0.0.0");
  EXPECT_TRUE(port.ok()) << port.status().to_string();
  return "--key-file " + shell_word(key) + " --port " + std::to_string(port.ok() ? *port : 5555) + " --logs " +
         shell_word(logs) + " --longhaul " + shell_word(bin()) +
         " --flags '--threads 1 --log-level warn' --worker-flags '--ucx-tls tcp'";
}

TEST_F(Slurm, SbatchJobMatchesLaunch) {
  const int steps = 6;
  const std::string ref = temp_path("slurm_ref.jsonl"), got = dir_ + "/slurm_job.jsonl";
  ASSERT_NO_FATAL_FAILURE(run_reference_launch(4, steps, ref, {"--pp", "4"}));

  const std::string key = make_key("slurm");
  const std::string hex = slurp(key).substr(0, 64);
  ASSERT_EQ(hex.size(), 64u);
  std::string job_flags = "--pp 4 --microbatches 4 --metrics " + shell_word(got);
  for (const std::string& f : model_flags(steps)) job_flags += " " + f;
  std::string job;
  const ShellRun s = sbatch(script_flags(key, logs_) + " -- " + job_flags, hex, &job);
  ASSERT_FALSE(job.empty()) << s.output;
  const std::string batch = batch_log(job);
  ASSERT_EQ(s.code, 0) << s.output << "\nbatch log:\n" << batch;
  EXPECT_NE(batch.find("coordinator exited with code 0, workers' step with code 0"), std::string::npos) << batch;

  const std::string coordinator = slurp(logs_ + "/" + job + "-coordinator.out");
  EXPECT_NE(coordinator.find("listening on tcp://0.0.0.0:"), std::string::npos) << coordinator;
  EXPECT_NE(coordinator.find("4 workers (pp 4"), std::string::npos) << "--workers is the job's tasks: " << coordinator;
  std::string logs = batch + coordinator;
  for (int task = 0; task < 4; ++task) {
    const std::string path = logs_ + "/" + job + "-" + std::to_string(task) + ".out";
    ASSERT_TRUE(std::filesystem::exists(path)) << "no log of task " << task << "; batch log:\n" << batch;
    const std::string worker = slurp(path);
    EXPECT_NE(worker.find("--from-env: rank " + std::to_string(task) +
                          " of 4 (slurm: SLURM_PROCID=" + std::to_string(task) + ", SLURM_NTASKS=4)"),
              std::string::npos)
        << worker;
    logs += worker;
  }
  EXPECT_EQ(logs.find(hex), std::string::npos) << "a log holds the key";
  // The search for the key saw the job's processes: its coordinator and four workers (by the key file's path).
  const std::string seen = joined({job_processes_.begin(), job_processes_.end()});
  EXPECT_GE(seen_running(" coordinator --listen tcp://0.0.0.0:", key), 1) << seen;
  EXPECT_GE(seen_running(" worker --from-env --key-file " + key, key), 4) << seen;  // and the children they fork

  ASSERT_NO_FATAL_FAILURE(expect_losses_near(losses_of(got), losses_of(ref), steps));
}

// A job flag the coordinator refuses: the job ends at once with the coordinator's code and words, and no worker
// step is started to wait for a coordinator that is gone.
// One job over two allocations at two sites (two sbatch jobs of 2 tasks): site a's starts the coordinator, site b's
// joins it (--coordinator). SLURM_PROCID counts from 0 in each, so the coordinator assigns the ranks, each site's
// workers consecutive; the job trains as launch's 4 workers do, and both allocations end with code 0.
TEST_F(Slurm, TwoAllocationsAtTwoSitesRunOneJob) {
  const int steps = 6;
  const std::string ref = temp_path("sites_ref.jsonl"), got = dir_ + "/sites_job.jsonl";
  ASSERT_NO_FATAL_FAILURE(run_reference_launch(4, steps, ref, {"--pp", "4"}));
  const std::string key = make_key("slurm_sites");
  auto port = free_tcp_port("0.0.0.0");
  ASSERT_TRUE(port.ok()) << port.status().to_string();
  const std::string common = "--key-file " + shell_word(key) + " --logs " + shell_word(logs_) + " --longhaul " +
                             shell_word(bin()) +
                             " --flags '--threads 1 --log-level info' --worker-flags '--ucx-tls tcp'";
  std::string job_flags = "--workers 4 --pp 4 --microbatches 4 --metrics " + shell_word(got);
  for (const std::string& f : model_flags(steps)) job_flags += " " + f;
  const std::string script = shell_word(source_script("slurm/longhaul.sbatch"));
  const std::string submit = "cd " + shell_word(dir_) +
                             " && export SLURM_CONF=" + shell_word(cluster_ + "/slurm.conf") +
                             " && timeout 300 sbatch --wait --ntasks 2 --output " + shell_word(dir_ + "/batch-%j.out") +
                             " " + script + " " + common;
  const ShellRun both =
      shell("(" + submit + " --site a --port " + std::to_string(*port) + " -- " + job_flags +
            "; echo \"site a: $?\") & sleep 2; (" + submit +
            " --site b --coordinator tcp://127.0.0.1:" + std::to_string(*port) + "; echo \"site b: $?\") & wait");
  ASSERT_NE(both.output.find("site a: 0"), std::string::npos) << both.output;
  ASSERT_NE(both.output.find("site b: 0"), std::string::npos) << both.output;
  std::vector<std::string> jobs;
  for (size_t at = 0; (at = both.output.find("Submitted batch job ", at)) != std::string::npos; at += 20)
    jobs.push_back(both.output.substr(at + 20, both.output.find('\n', at) - at - 20));
  ASSERT_EQ(jobs.size(), 2u) << both.output;
  // Each allocation's task t holds the rank its site's place gives: a's 0 and 1, b's 2 and 3.
  std::string all;
  for (const std::string& job : jobs) {
    const std::string batch = batch_log(job);
    all += batch;
    const int first = batch.find("at site b") != std::string::npos ? 2 : 0;
    for (int task = 0; task < 2; ++task) {
      const std::string said = slurp(logs_ + "/" + job + "-" + std::to_string(task) + ".out");
      const std::string want = "rank " + std::to_string(first + task) + " (stage " + std::to_string(first + task);
      EXPECT_NE(said.find(want), std::string::npos) << "job " << job << " task " << task << ":\n" << said;
    }
  }
  EXPECT_NE(all.find("join tcp://127.0.0.1:" + std::to_string(*port)), std::string::npos) << all;
  ASSERT_NO_FATAL_FAILURE(expect_losses_near(losses_of(got), losses_of(ref), steps, all));
}

TEST_F(Slurm, ACoordinatorThatFailsEndsTheJob) {
  const std::string key = make_key("slurm_bad");
  std::string job;
  const auto t0 = std::chrono::steady_clock::now();
  const ShellRun s = sbatch(script_flags(key, logs_) + " -- --pp 4 --steps -5", "", &job);
  ASSERT_FALSE(job.empty()) << s.output;
  EXPECT_NE(s.code, 0) << s.output;
  EXPECT_NE(s.code, 124) << "sbatch --wait hit its time limit: the job hung";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(120));
  const std::string coordinator = slurp(logs_ + "/" + job + "-coordinator.out");
  EXPECT_NE(coordinator.find("--steps"), std::string::npos) << "the coordinator's own words: " << coordinator;
  const std::string batch = batch_log(job);
  // The job's exit code is the coordinator's (CLI11 answers a value out of range with 105).
  const std::string said = "the coordinator ended (code " + std::to_string(s.code) + ") before it listened";
  EXPECT_NE(batch.find(said), std::string::npos) << said << "\n" << batch;
  EXPECT_FALSE(std::filesystem::exists(logs_ + "/" + job + "-0.out")) << "a worker step started";
}

// A workers' step that fails while the coordinator waits on: the coordinator gets the grace period
// (LH_SLURM_GRACE), then SIGTERM, and the job ends with its code instead of hanging. A stand-in for longhaul whose
// coordinator never ends and whose workers fail at once.
TEST_F(Slurm, AFailedWorkerStepEndsTheJob) {
  const std::string fake = dir_ + "/fake-longhaul";
  std::ofstream(fake)
      << "#!/bin/sh\n"
         "case \" $* \" in *\" coordinator \"*) echo 'listening on tcp://0.0.0.0:1'; exec sleep 300;; esac\n"
         "echo 'worker: cannot reach the coordinator'; exit 3\n";
  ASSERT_EQ(::chmod(fake.c_str(), 0755), 0);
  const std::string key = make_key("slurm_workers_fail");
  std::string flags = script_flags(key, logs_);
  flags.replace(flags.find("--longhaul '"), flags.find("' --flags") - flags.find("--longhaul '") + 1,
                "--longhaul " + shell_word(fake));
  std::string job;
  const auto t0 = std::chrono::steady_clock::now();
  const ShellRun s = sbatch(flags + " -- --pp 4", "", &job, "--export=ALL,LH_SLURM_GRACE=2");
  ASSERT_FALSE(job.empty()) << s.output;
  const std::string batch = batch_log(job);
  EXPECT_NE(s.code, 0) << batch;
  EXPECT_NE(s.code, 124) << "sbatch --wait hit its time limit: the job hung\n" << batch;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(120));
  EXPECT_NE(batch.find("the workers' step failed (code 3)"), std::string::npos) << batch;
  EXPECT_NE(batch.find("a step still runs 2 s after the other ended: SIGTERM"), std::string::npos) << batch;
  const std::string ended = "coordinator exited with code " + std::to_string(s.code) + ", workers' step with code 3";
  EXPECT_NE(batch.find(ended), std::string::npos) << ended << "\n" << batch;
}

// A key file its group or others may read is refused before any step starts, naming chmod 600.
TEST_F(Slurm, AnOpenKeyFileIsRefused) {
  const std::string key = make_key("slurm_open");
  ASSERT_EQ(::chmod(key.c_str(), 0640), 0);
  std::string job;
  const ShellRun s = sbatch(script_flags(key, logs_) + " -- --pp 4 --steps 2", "", &job);
  ASSERT_FALSE(job.empty()) << s.output;
  EXPECT_EQ(s.code, 2) << s.output;
  const std::string batch = batch_log(job);
  EXPECT_NE(batch.find("is readable or writable by its group or others (mode 640): refusing to start; chmod 600"),
            std::string::npos)
      << batch;
  EXPECT_FALSE(std::filesystem::exists(logs_ + "/" + job + "-coordinator.out")) << "a step started";
}

// A job requeued while it runs (as Slurm requeues one after a node failure or preemption) starts again with
// --resume added to its job flags, since they hold --checkpoint-dir. A stand-in for longhaul records the flags:
// its coordinator listens, then on the first run waits to be requeued.
TEST_F(Slurm, ARequeuedJobResumesFromItsCheckpoints) {
  const std::string fake = dir_ + "/fake-longhaul", first_run = dir_ + "/first-run";
  std::ofstream(fake) << "#!/bin/sh\n"
                         "case \" $* \" in *\" coordinator \"*)\n"
                         "  echo \"args: $*\"; echo 'listening on tcp://0.0.0.0:1'\n"
                         "  [ -e '"
                      << first_run
                      << "' ] && exit 0\n"
                         "  touch '"
                      << first_run
                      << "'; exec sleep 300;;\n"
                         "esac\n";
  ASSERT_EQ(::chmod(fake.c_str(), 0755), 0);
  const std::string key = make_key("slurm_requeue");
  std::string flags = script_flags(key, logs_);
  flags.replace(flags.find("--longhaul '"), flags.find("' --flags") - flags.find("--longhaul '") + 1,
                "--longhaul " + shell_word(fake));
  bool requeued = false, released = false;
  std::string job;
  const ShellRun s =
      sbatch(flags + " -- --pp 4 --steps 20 --checkpoint-dir " + shell_word(dir_ + "/ckpt"), "", &job, "--requeue",
             [&](const std::string& id) {
               if (!requeued && std::filesystem::exists(first_run)) {
                 const ShellRun r = slurm("scontrol requeue " + id);
                 EXPECT_EQ(r.code, 0) << r.output;
                 requeued = true;
               } else if (requeued && !released &&
                          slurm("squeue -h -o %T -j " + id).output.find("PENDING") != std::string::npos) {
                 // Slurm holds a requeued job back for two minutes; it may start at once here.
                 const ShellRun r = slurm("scontrol update jobid=" + id + " StartTime=now");
                 EXPECT_EQ(r.code, 0) << r.output;
                 released = true;
               }
             });
  ASSERT_FALSE(job.empty()) << s.output;
  const std::string batch = batch_log(job), coordinator = slurp(logs_ + "/" + job + "-coordinator.out");
  EXPECT_EQ(s.code, 0) << s.output << "\nbatch log:\n" << batch << "\ncoordinator:\n" << coordinator;
  EXPECT_TRUE(released) << "the job was not requeued";
  EXPECT_NE(batch.find("requeued (run 1): the coordinator resumes from the newest checkpoint (--resume)"),
            std::string::npos)
      << batch;
  // Both runs' lines, the later appended: the first without --resume, the second with it.
  const size_t first = coordinator.find("args: "), second = coordinator.find("args: ", first + 1);
  ASSERT_NE(second, std::string::npos) << coordinator;
  const std::string run1 = coordinator.substr(first, coordinator.find('\n', first) - first),
                    run2 = coordinator.substr(second, coordinator.find('\n', second) - second);
  EXPECT_EQ(run1.find("--resume"), std::string::npos) << run1;
  EXPECT_NE(run2.find("--checkpoint-dir " + dir_ + "/ckpt --workers 4 --resume"), std::string::npos) << run2;
}

}  // namespace
}  // namespace lh
