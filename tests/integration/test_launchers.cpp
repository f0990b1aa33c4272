// Issue 41's launchers through the real binary ($LH_BIN): preemption (SIGTERM to a worker or to launch saves a
// checkpoint, and --resume goes on with the uninterrupted run's losses), and `launch --hosts` over OpenSSH (an sshd of
// the test's own on a free port: losses, the key in no argv, nothing left behind when launch is interrupted).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "tests/integration/launch_util.h"
#include "web/http_server.h"

namespace lh {
namespace {

// The pids `launch` printed ("workers: pids 12 13").
std::vector<pid_t> worker_pids(const std::string& out) {
  std::istringstream in(wait_for_line(out, "workers: pids", 60s));
  std::vector<pid_t> pids;
  for (int p; in >> p;) pids.push_back(p);
  return pids;
}

// Every process's command line (arguments joined by spaces), by pid.
std::map<pid_t, std::string> command_lines() {
  std::map<pid_t, std::string> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::string cmd = slurp("/proc/" + std::string(e->d_name) + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (!cmd.empty()) out[pid] = cmd;
  }
  closedir(d);
  return out;
}

std::string key_hex(const std::string& key_file) {
  std::string k = slurp(key_file);
  while (!k.empty() && (k.back() == '\n' || k.back() == ' ')) k.pop_back();
  return k;
}

// A job slowed to a few steps a second, whose worker 1 stalls after step 6 for 3 s: a signal sent then lands mid-job,
// whatever the machine's speed.
std::vector<std::string> preemptible_job(int steps, const std::string& metrics, const std::string& dir) {
  return launch_args(2, steps, metrics, {"--link", "20M,5ms", "--checkpoint-dir", dir, "--checkpoint-every", "1000"});
}

// SIGTERM to a worker (what Slurm and Kubernetes send before a kill): the job saves a checkpoint a step or two later
// and stops with exit code 75; the same command with --resume goes on from it and ends with the losses of a run that
// was never interrupted.
TEST_F(Launch, ASigtermedWorkerCheckpointsTheJobAndResumeGoesOnWithTheSameLosses) {
  const int steps = 24;
  const std::string straight = temp_path("straight.jsonl"), metrics = temp_path("preempted.jsonl");
  const std::string dir = temp_path("preempt_ckpt");
  BinRun first = run(preemptible_job(steps, straight, temp_path("straight_ckpt")), 300s);
  ASSERT_EQ(first.code, 0) << first.output;
  const std::string out = temp_path("preempted.txt");
  const pid_t launch = spawn_env(preemptible_job(steps, metrics, dir), out, {{"LH_FAULT_STALL", "6:3000"}});
  const std::vector<pid_t> pids = worker_pids(out);
  ASSERT_EQ(pids.size(), 2u) << slurp(out);
  ASSERT_FALSE(wait_for_line(out, "step 6/", 120s).empty()) << slurp(out);
  ASSERT_EQ(kill(pids[1], SIGTERM), 0);
  const int code = wait_exit(launch, 180s);
  const std::string said = slurp(out);
  ASSERT_EQ(code, 75) << said;
  EXPECT_NE(said.find("this worker was sent SIGTERM"), std::string::npos) << said;
  EXPECT_NE(said.find("its checkpoint is committed"), std::string::npos) << said;
  EXPECT_NE(said.find("with --resume"), std::string::npos) << said;
  const int64_t saved = newest_loss_step(metrics);
  EXPECT_GT(saved, 6);
  EXPECT_LT(saved, steps);
  char step_dir[32];
  std::snprintf(step_dir, sizeof(step_dir), "/step_%08lld", static_cast<long long>(saved));
  EXPECT_TRUE(std::filesystem::exists(dir + step_dir + "/manifest.json")) << dir + step_dir;

  std::vector<std::string> again = preemptible_job(steps, metrics, dir);
  again.push_back("--resume");
  BinRun resumed = run(again, 300s);
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from the checkpoint of step " + std::to_string(saved)), std::string::npos)
      << resumed.output;
  expect_same_losses(losses_of(metrics), losses_of(straight), steps);
}

// SIGTERM to launch itself (a scheduler stopping the job's first process) checkpoints the same way; a job that keeps
// no checkpoints stops at once saying so.
TEST_F(Launch, ASigtermedLaunchCheckpointsTheJobOrSaysWhyNot) {
  for (const bool keeps : {true, false}) {
    SCOPED_TRACE(keeps ? "with --checkpoint-dir" : "without");
    const std::string metrics = temp_path("term.jsonl"), dir = temp_path("term_ckpt"), out = temp_path("term.txt");
    std::vector<std::string> args = preemptible_job(40, metrics, dir);
    if (!keeps) args.resize(args.size() - 4);  // no --checkpoint-dir, --checkpoint-every
    const pid_t launch = spawn_env(args, out, {{"LH_FAULT_STALL", "6:3000"}});
    ASSERT_FALSE(wait_for_line(out, "step 6/", 120s).empty()) << slurp(out);
    ASSERT_EQ(kill(launch, SIGTERM), 0);
    const int code = wait_exit(launch, 180s);
    const std::string said = slurp(out);
    EXPECT_EQ(code, 75) << said;
    EXPECT_NE(said.find("launch was sent SIGTERM"), std::string::npos) << said;
    if (keeps) {
      EXPECT_NE(said.find("its checkpoint is committed"), std::string::npos) << said;
      EXPECT_FALSE(std::filesystem::is_empty(dir)) << said;
    } else {
      EXPECT_NE(said.find("the job keeps no checkpoints (--checkpoint-dir)"), std::string::npos) << said;
    }
  }
}

// An sshd of the test's own: a generated host key and user key, its own config on a free loopback port; an ssh
// config that reaches it. Stopped (and its files removed) with the object.
class Sshd {
 public:
  Sshd() : dir_(temp_path("sshd")) {}
  ~Sshd() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // Empty when it runs; else why not.
  std::string start() {
    std::filesystem::create_directories(dir_);
    ::mkdir("/run/sshd", 0755);  // privilege separation's empty directory
    for (const char* key : {"host_key", "user_key"}) {
      const std::string cmd = "ssh-keygen -q -t ed25519 -N '' -f '" + dir_ + "/" + key + "' >/dev/null 2>&1";
      if (std::system(cmd.c_str()) != 0) return std::string("ssh-keygen failed for ") + key;
    }
    std::filesystem::copy_file(dir_ + "/user_key.pub", dir_ + "/authorized_keys");
    auto port = free_tcp_port("127.0.0.1");
    if (!port.ok()) return port.status().message();
    port_ = *port;
    std::ofstream(dir_ + "/sshd_config") << "Port " << port_ << "\nListenAddress 127.0.0.1\nHostKey " << dir_
                                          << "/host_key\nAuthorizedKeysFile " << dir_
                                          << "/authorized_keys\nPasswordAuthentication no\nKbdInteractiveAuthentication "
                                             "no\nPubkeyAuthentication yes\nPermitRootLogin prohibit-password\n"
                                             "StrictModes no\nUsePAM no\nPidFile "
                                          << dir_ << "/sshd.pid\nLogLevel ERROR\n";
    std::ofstream(dir_ + "/ssh_config") << "Host *\n  Port " << port_ << "\n  IdentityFile " << dir_
                                        << "/user_key\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
                                           "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  User root\n";
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int fd = ::open((dir_ + "/sshd.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, 1);
      dup2(fd, 2);
      const std::string conf = dir_ + "/sshd_config";
      execl("/usr/sbin/sshd", "/usr/sbin/sshd", "-D", "-e", "-f", conf.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 100; ++i) {  // until it answers (ssh -o BatchMode=yes … true)
      if (std::system(("ssh -F '" + dir_ + "/ssh_config' -o BatchMode=yes -o ConnectTimeout=2 127.0.0.1 true "
                       ">/dev/null 2>&1")
                          .c_str()) == 0)
        return "";
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return "sshd exited: " + slurp(dir_ + "/sshd.log");
      }
      std::this_thread::sleep_for(100ms);
    }
    return "sshd did not answer within 10 s: " + slurp(dir_ + "/sshd.log");
  }
  std::string ssh() const { return "ssh -F " + dir_ + "/ssh_config"; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

class SshLaunch : public Launch {
 protected:
  void SetUp() override {
    Launch::SetUp();
    if (IsSkipped()) return;
    if (geteuid() != 0) GTEST_SKIP() << "needs root (sshd logs users in; CI runs as root)";
    if (access("/usr/sbin/sshd", X_OK) != 0 || std::system("command -v ssh >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "needs openssh-server and openssh-client (scripts/setup.sh installs them)";
    const std::string why = sshd_.start();
    if (!why.empty()) FAIL() << why;
  }
  void interrupt_with(int sig);
  Sshd sshd_;
};

// Three workers on two hostfile entries (the same machine by two names), started over ssh: the job's losses are
// launch's, each worker's output comes back with its label, and the key is in no process's arguments.
TEST_F(SshLaunch, WorkersStartedOverSshTrainAsLaunchsDoAndTheKeyIsInNoArgv) {
  const int steps = 6;
  const std::string key = make_key("ssh"), hosts = temp_path("hosts");
  std::ofstream(hosts) << "# a hostfile\nlocalhost slots=2 site=a\n127.0.0.1 slots=1   # the same machine\n";
  const std::string local_metrics = temp_path("local.jsonl"), ssh_metrics = temp_path("ssh.jsonl");
  std::vector<std::string> extra = {"--key-file", key, "--schedule", "gpipe"};
  ASSERT_NO_FATAL_FAILURE(run_reference_launch(3, steps, local_metrics, extra));
  std::vector<std::string> args = launch_args(3, steps, ssh_metrics, extra);
  args[1] = "info";  // the workers' own lines come back labelled
  args.insert(args.end(), {"--hosts", hosts, "--ssh", sshd_.ssh()});
  const std::string out = temp_path("ssh_launch.txt");
  const pid_t launch = spawn(args, out);
  // While it runs: the key in no process's arguments.
  const std::string hex = key_hex(key);
  ASSERT_GE(hex.size(), 32u);
  bool saw_worker = false;
  int code = -2;
  for (int i = 0; i < 3000 && code == -2; ++i) {
    for (const auto& [pid, cmd] : command_lines()) {
      EXPECT_EQ(cmd.find(hex), std::string::npos) << "pid " << pid << ": " << cmd;
      saw_worker |= cmd.find("--key-stdin") != std::string::npos && cmd.find(" worker ") != std::string::npos;
    }
    int st = 0;
    if (waitpid(launch, &st, WNOHANG) == launch) code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    std::this_thread::sleep_for(100ms);
  }
  if (code == -2) code = wait_exit(launch, 10s);
  const std::string said = slurp(out);
  ASSERT_EQ(code, 0) << said;
  EXPECT_TRUE(saw_worker) << "no `longhaul worker --key-stdin` process was seen";
  EXPECT_NE(said.find("over ssh to localhost, 127.0.0.1"), std::string::npos) << said;
  for (const char* label : {"[w0 localhost a] ", "[w2 127.0.0.1] "})
    EXPECT_NE(said.find(label), std::string::npos) << label << "\n" << said;
  ASSERT_NO_FATAL_FAILURE(expect_losses_near(losses_of(ssh_metrics), losses_of(local_metrics), steps, said, 1e-6));
}

// Interrupting launch (Ctrl-C), or killing it outright, closes every ssh channel: no remote worker is left running.
TEST_F(SshLaunch, InterruptingLaunchLeavesNoRemoteWorker) {
  for (const int sig : {SIGINT, SIGKILL}) {
    SCOPED_TRACE(strsignal(sig));
    interrupt_with(sig);
  }
}

void SshLaunch::interrupt_with(int sig) {
  const std::string key = make_key("ssh_int"), hosts = temp_path("hosts_int");
  std::ofstream(hosts) << "localhost slots=3\n";
  const std::string metrics = temp_path("int.jsonl");
  std::vector<std::string> args = launch_args(3, 100000, metrics, {"--key-file", key});
  args.insert(args.end(), {"--hosts", hosts, "--ssh", sshd_.ssh()});
  const std::string out = temp_path("ssh_int.txt");
  const pid_t launch = spawn(args, out);
  for (int i = 0; i < 1200 && newest_loss_step(metrics) < 2; ++i) std::this_thread::sleep_for(100ms);
  ASSERT_GE(newest_loss_step(metrics), 2) << slurp(out);
  const std::string ep = wait_for_line(out, "coordinator ", 5s);
  const std::string endpoint = ep.substr(0, ep.find(' '));
  ASSERT_EQ(endpoint.rfind("tcp://", 0), 0u) << slurp(out);
  auto workers = [&] {
    int n = 0;
    for (const auto& [pid, cmd] : command_lines())
      n += cmd.find(" worker ") != std::string::npos && cmd.find(endpoint) != std::string::npos;
    return n;
  };
  EXPECT_EQ(workers(), 3) << slurp(out);
  ASSERT_EQ(kill(launch, sig), 0);
  const int code = wait_exit(launch, 60s);
  EXPECT_NE(code, 0) << slurp(out);
  EXPECT_NE(code, -1) << "launch did not stop: " << slurp(out);
  int left = -1;
  for (int i = 0; i < 100 && left != 0; ++i) {  // sshd ends a session's command when its channel closes
    left = workers();
    if (left) std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(left, 0) << "remote workers left running after launch stopped:\n" << slurp(out);
}

// Bad hostfiles and flags are named (no root, no sshd needed).
TEST_F(Launch, BadHostfilesAndSshFlagsAreNamed) {
  const std::string hosts = temp_path("bad_hosts");
  const std::vector<std::pair<std::string, std::string>> files = {
      {"", "no hosts"},
      {"# only a comment\n", "no hosts"},
      {"hostA slots=0\n", "line 1: slots '0' is not a number of workers from 1 to 4096"},
      {"hostA\nhostB slots=two\n", "line 2: slots 'two'"},
      {"hostA colour=red\n", "unknown field 'colour'"},
      {"hostA slots\n", "'slots': expected slots=N, site=NAME or advertise=ADDR"},
      {"-oProxyCommand=x\n", "is not a host name or address"},
      {"hostA advertise=a;b\n", "advertise 'a;b' is not a host name"},
      {"hostA slots=1 slots=2\n", "slots is given twice"},
      {"hostA slots=1\n", "has 1 slots, fewer than the job's 2 workers"},
  };
  for (const auto& [text, want] : files) {
    std::ofstream(hosts) << text;
    BinRun r = run({"launch", "--workers", "2", "--steps", "2", "--hosts", hosts});
    EXPECT_EQ(r.code, 2) << text << "\n" << r.output;
    EXPECT_NE(r.output.find(want), std::string::npos) << "want '" << want << "' for:\n" << text << "\n" << r.output;
  }
  std::ofstream(hosts) << "localhost slots=2\n";
  const std::vector<std::pair<std::vector<std::string>, std::string>> flags = {
      {{"--hosts", temp_path("missing_hosts")}, "cannot read it"},
      {{"--hosts", hosts, "--ssh", "ssh -o 'A B'"}, "no quotes or backslashes"},
      {{"--ssh", "ssh"}, "go with --hosts FILE"},
      {{"--hosts", hosts, "--netns", "10M"}, "it takes no --netns"},
  };
  for (const auto& [extra, want] : flags) {
    std::vector<std::string> args = {"launch", "--workers", "2", "--steps", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    BinRun r = run(args);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  }
  // worker --key-stdin: nothing on standard input, something that is not a key, and a key given twice.
  const std::string empty = temp_path("empty_stdin");
  std::ofstream(empty) << "";
  const std::string notkey = temp_path("notkey_stdin");
  std::ofstream(notkey) << "not-a-key\n";
  for (const auto& [input, want] : std::vector<std::pair<std::string, std::string>>{
           {empty, "standard input closed before it gave the job secret"}, {notkey, "--key-stdin: not a job key"}}) {
    const std::string said = temp_path("ks.txt");
    const std::string cmd = std::string(bin()) + " worker --coordinator tcp://127.0.0.1:9 --key-stdin < '" + input +
                            "' > '" + said + "' 2>&1";
    const int st = std::system(cmd.c_str());
    EXPECT_EQ(WEXITSTATUS(st), 2) << slurp(said);
    EXPECT_NE(slurp(said).find(want), std::string::npos) << slurp(said);
  }
  BinRun both = run({"worker", "--coordinator", "tcp://127.0.0.1:9", "--key-stdin", "--key-file", "x.key"});
  EXPECT_EQ(both.code, 2) << both.output;
  EXPECT_NE(both.output.find("--key-stdin and --key-file (or --token) both give the job secret"), std::string::npos)
      << both.output;
}

}  // namespace
}  // namespace lh
