// `longhaul launch --workers S --pp S [job flags] [--link RATE[,DELAY] | --netns RATE]`: a whole pipeline job on
// this machine — the coordinator in this process, S `longhaul worker` processes — stopped together on failure.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "apps/commands.h"
#include "apps/hostfile.h"
#include "apps/job_cli.h"
#include "apps/launch.h"
#include "core/log.h"
#include "grid/link_shapes.h"
#include "transport/link_shaper.h"

namespace lh::app {
namespace {

using namespace std::chrono_literals;

volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

std::string describe_exit(int st) {
  if (WIFEXITED(st)) return "exited with code " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st))
    return "was killed by signal " + std::to_string(WTERMSIG(st)) + " (" + strsignal(WTERMSIG(st)) + ")";
  return "stopped";
}

// The worker processes: started in this process group with a parent-death signal, so none outlives launch. A remote
// worker (`label` given: the argv is an ssh command) gets the secret on its standard input, which stays open while it
// runs (closing it stops the worker: ssh does not forward signals), and its output comes back prefixed with `label`.
class WorkerGroup {
 public:
  ~WorkerGroup() {
    stop(3s);
    for (std::thread& t : readers_) t.join();
  }
  Result<pid_t> start(const std::vector<std::string>& argv, const std::vector<std::string>& prefix,
                      const std::string& secret, const std::string& label = "") {
    std::vector<std::string> all = prefix;
    all.insert(all.end(), argv.begin(), argv.end());
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    if (!label.empty() && (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0))
      return io_error(std::string("pipe: ") + std::strerror(errno));
    std::fflush(nullptr);
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return io_error("fork failed");
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(126);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      unsetenv("LH_JOB_TOKEN");
      if (label.empty()) {
        setenv("LH_JOB_KEY", secret.c_str(), 1);  // not on the command line, where `ps` shows it
      } else {
        unsetenv("LH_JOB_KEY");
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(out[1], 2);
      }
      std::vector<char*> args;
      for (auto& a : all) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::fprintf(stderr, "longhaul launch: cannot run %s\n", args[0]);
      _exit(127);
    }
    pids_.push_back(pid);
    status_[pid] = -1;
    if (!label.empty()) {
      ::close(in[0]);
      ::close(out[1]);
      const std::string line = secret + "\n";
      if (::write(in[1], line.data(), line.size()) != ssize_t(line.size()))
        return io_error("could not hand the job secret to " + label + ": " + std::strerror(errno));
      stdin_[pid] = in[1];
      readers_.emplace_back([fd = out[0], tag = "[" + label + "] "] { prefix_lines(fd, tag); });
    }
    return pid;
  }
  // A worker that was replaced: its exit is no longer the job's failure.
  void forgive(pid_t pid) { forgiven_.insert(pid); }
  const std::vector<pid_t>& pids() const { return pids_; }
  // Reaps what has exited; returns the first abnormal exit not reported yet.
  std::optional<std::pair<pid_t, int>> poll() {
    std::optional<std::pair<pid_t, int>> bad;
    for (pid_t p : pids_) {
      if (status_[p] != -1) continue;
      int st = 0;
      if (waitpid(p, &st, WNOHANG) != p) continue;
      status_[p] = st;
      if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        abnormal_.emplace_back(p, st);
        if (!bad) bad = abnormal_.back();
      }
    }
    return bad;
  }
  // Every worker that did not exit with 0, in the order they were reaped; killed ones first.
  std::vector<std::pair<pid_t, int>> abnormal() const {
    std::vector<std::pair<pid_t, int>> out;
    for (auto& a : abnormal_)
      if (WIFSIGNALED(a.second) && !forgiven_.count(a.first)) out.push_back(a);
    for (auto& a : abnormal_)
      if (!WIFSIGNALED(a.second) && !forgiven_.count(a.first)) out.push_back(a);
    return out;
  }
  bool all_exited() {
    poll();
    for (pid_t p : pids_)
      if (status_[p] == -1) return false;
    return true;
  }
  bool wait_all(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!all_exited()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(20ms);
    }
    return true;
  }
  // Remote workers' channels closed (they stop), then SIGTERM, then SIGKILL after `grace`; reaps everything.
  void stop(std::chrono::milliseconds grace) {
    const bool remote = !stdin_.empty();
    for (auto& [pid, fd] : stdin_) ::close(fd);
    stdin_.clear();
    if (all_exited()) return;
    if (remote && wait_all(grace)) return;
    for (pid_t p : pids_)
      if (status_[p] == -1) kill(p, SIGTERM);
    if (wait_all(grace)) return;
    for (pid_t p : pids_)
      if (status_[p] == -1) {
        kill(p, SIGKILL);
        waitpid(p, &status_[p], 0);
      }
  }

 private:
  // One remote worker's output, a line at a time with its label in front, until the channel closes.
  static void prefix_lines(int fd, const std::string& tag) {
    static std::mutex mu;
    std::string pending;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) pending.append(buf, size_t(n));
      size_t start = 0;
      for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
        std::lock_guard<std::mutex> lock(mu);
        std::fwrite(tag.data(), 1, tag.size(), stdout);
        std::fwrite(pending.data() + start, 1, nl + 1 - start, stdout);
        std::fflush(stdout);
      }
      pending.erase(0, start);
      if (n <= 0) break;
    }
    if (!pending.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      std::printf("%s%s\n", tag.c_str(), pending.c_str());
      std::fflush(stdout);
    }
    ::close(fd);
  }

  std::vector<pid_t> pids_;
  std::map<pid_t, int> status_;
  std::map<pid_t, int> stdin_;  // remote workers: the write end of their standard input
  std::vector<std::thread> readers_;
  std::vector<std::pair<pid_t, int>> abnormal_;
  std::set<pid_t> forgiven_;
};

// Sites behind NAT routers (scripts/nat.sh; root): removed again when this goes out of scope.
struct NatSites {
  std::string script, env;
  int sites = 0, per_site = 0;
  bool up = false;
  ~NatSites() {
    if (up) (void)!std::system((env + " bash '" + script + "' down").c_str());
  }
  // Worker slot i's namespace: site i / per_site, host i % per_site.
  std::string host(int i) const {
    return "lhn" + std::to_string(getpid() % 100000) + "s" + std::to_string(i / per_site) + "h" +
           std::to_string(i % per_site);
  }
};

// Namespaces behind tc tbf links (root): removed again when this goes out of scope.
struct WanNamespaces {
  std::string script, prefix, subnet;
  bool up = false;
  ~WanNamespaces() {
    if (up) (void)!std::system(("LH_WAN_PREFIX=" + prefix + " bash '" + script + "' down").c_str());
  }
};

// The rank the coordinator gave the worker process `pid` (workers name themselves "HOST pid N").
int rank_of_pid(PipelineCoordinator& coord, pid_t pid) {
  auto st = coord.handle_ctl("status", "{}");
  if (!st.ok()) return -1;
  auto j = nlohmann::json::parse(*st, nullptr, false);
  if (j.is_discarded() || !j.contains("workers")) return -1;
  const auto& ws =
      j["workers"].is_object() && j["workers"].contains("workers") ? j["workers"]["workers"] : j["workers"];
  if (!ws.is_array()) return -1;
  const std::string tag = " pid " + std::to_string(pid);
  for (const auto& w : ws) {
    std::string host = w.value("hostname", std::string());
    if (host.size() >= tag.size() && host.compare(host.size() - tag.size(), tag.size(), tag) == 0)
      return w.value("rank", -1);
  }
  return -1;
}

}  // namespace

void run_launch(LaunchFlags& f, CLI::App* cmd, const std::vector<ScheduledSwitch>& switches) {
  PipelineJobConfig job = job_config_from_flags(f.job, cmd);
  if (!job.links.empty() && !f.netns.empty()) fail("--link and --netns exclude each other: choose one", 2);
  std::string listen = f.listen;
  // --hosts: the workers start on the hostfile's machines over ssh; the coordinator listens where they reach it.
  std::vector<HostSlot> slots;
  std::vector<std::string> ssh;
  std::string coordinator_host = "127.0.0.1";
  if (!f.hosts.empty()) {
    if (!f.netns.empty() || f.nat_sites > 0 || f.job.elastic)
      fail("--hosts starts the workers on other machines: it takes no --netns, --nat-sites or --elastic", 2);
    auto read = read_hostfile(f.hosts);
    if (!read.ok()) fail(read.status().message(), 2);
    slots = std::move(read).value();
    if (int(slots.size()) < job.workers)
      fail("--hosts '" + f.hosts + "' has " + std::to_string(slots.size()) + " slots, fewer than the job's " +
               std::to_string(job.workers) + " workers",
           2);
    slots.resize(size_t(job.workers));
    auto words = ssh_words(f.ssh);
    if (!words.ok()) fail(words.status().message(), 2);
    ssh = std::move(words).value();
    const bool all_loopback =
        std::all_of(slots.begin(), slots.end(), [](const HostSlot& h) { return loopback_host(h.host); });
    if (!f.coordinator_host.empty()) {
      coordinator_host = f.coordinator_host;
    } else if (!all_loopback) {
      char name[256] = {0};
      gethostname(name, sizeof(name) - 1);
      coordinator_host = name;
    }
    if (!cmd->get_option("--listen")->count() && !all_loopback) listen = "tcp://0.0.0.0:*";
  } else if (!f.coordinator_host.empty() || cmd->get_option("--ssh")->count() ||
             cmd->get_option("--remote-longhaul")->count()) {
    fail("--coordinator-host, --ssh and --remote-longhaul go with --hosts FILE", 2);
  }
  WanNamespaces wan;
  NatSites nat;
  if (!f.site_rate.empty() && f.nat_sites == 0) fail("--site-rate needs --nat-sites", 2);
  if (f.nat_sites > 0) {
    if (!f.netns.empty()) fail("--nat-sites and --netns exclude each other: choose one", 2);
    if (f.nat_sites > job.workers)
      fail("--nat-sites " + std::to_string(f.nat_sites) + ": more sites than the job's " + std::to_string(job.workers) +
               " workers",
           2);
    if (geteuid() != 0) fail("--nat-sites needs root (network namespaces and nftables)", 2);
    const std::string wan_script = find_wan_script(f.wan_script);
    nat.script = wan_script.substr(0, wan_script.rfind('/') + 1) + "nat.sh";
    const int id = int(getpid() % 100000);
    const std::string pub = "10.216." + std::to_string(id % 250);
    nat.env = "LH_NAT_PREFIX=lhn" + std::to_string(id) + " LH_NAT_PUBLIC=" + pub + " LH_NAT_LAN=10." +
              std::to_string(217 + id % 30);
    nat.sites = f.nat_sites;
    nat.per_site = (job.workers + f.nat_sites - 1) / f.nat_sites;
    std::string rate;
    if (!f.site_rate.empty()) {
      auto shape = parse_link_shape(f.site_rate);
      if (!shape.ok() || shape->rate_bps <= 0 || shape->delay.count() > 0)
        fail("--site-rate '" + f.site_rate + "': " +
                 (shape.ok() ? std::string("expected a rate such as 100M (no delay)") : shape.status().message()),
             2);
      rate = " " + std::to_string(int64_t(shape->rate_bps));
    }
    nat.up = true;
    const std::string up = nat.env + " bash '" + nat.script + "' up " + std::to_string(nat.sites) + " " +
                           std::to_string(nat.per_site) + rate + " >/dev/null";
    if (std::system(up.c_str()) != 0) fail("--nat-sites: could not build the sites with " + nat.script);
    listen = "tcp://" + pub + ".254:*";
  }
  if (!f.netns.empty()) {
    auto shape = parse_link_shape(f.netns);
    if (!shape.ok() || shape->rate_bps <= 0)
      fail("--netns '" + f.netns + "': " + (shape.ok() ? std::string("needs a rate") : shape.status().message()), 2);
    if (shape->delay.count() > 0) fail("--netns '" + f.netns + "': takes a rate only (tbf adds no delay)", 2);
    if (geteuid() != 0)
      fail("--netns needs root (network namespaces and tc); use --link RATE[,DELAY] for an in-process shaper", 2);
    wan.script = find_wan_script(f.wan_script);
    wan.prefix = "lhj" + std::to_string(getpid() % 100000);
    wan.subnet = "10.214." + std::to_string(getpid() % 250);
    std::string up = "LH_WAN_PREFIX=" + wan.prefix + " LH_WAN_SUBNET=" + wan.subnet + " bash '" + wan.script + "' up " +
                     std::to_string(job.workers) + " " + std::to_string(int64_t(shape->rate_bps));
    wan.up = true;
    if (std::system(up.c_str()) != 0) fail("--netns: could not build the namespaces with " + wan.script);
    listen = "tcp://" + wan.subnet + ".254:*";
  }
  std::string key_path;
  bool wrote_key = false;
  const JobSecret secret = coordinator_secret(f.job.secret, f.job.metrics, &key_path, &wrote_key);
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = f.worker_threads > 0 ? f.worker_threads : std::max(1, cores / job.workers);

  set_log_role("launch");
  auto coord = PipelineCoordinator::start(job, coordinator_options(f.job, listen, secret));
  if (!coord.ok()) fail("--listen " + listen + ": " + coord.status().to_string());
  job = (*coord)->job();  // an --elastic job resumed with fewer replicas than its flags say
  const std::string ep = (*coord)->endpoint();
  // What the workers connect to: the endpoint as bound, or this machine's name for it when it listens on every
  // interface (--hosts beyond loopback).
  const std::string worker_ep =
      slots.empty() ? ep : "tcp://" + coordinator_host + ep.substr(ep.rfind(':'));
  std::printf(
      "longhaul launch: %s, %d workers (pp %d × tp %d × dp %d, %d thread%s each), %lld steps, schedule %s, %d "
      "microbatches\n",
      job.train.model.describe().c_str(), job.workers, job.pp, job.tp, job.dp, threads, threads == 1 ? "" : "s",
      static_cast<long long>(job.train.steps), schedule_kind_name(job.schedule), job.microbatches);
  std::vector<std::string> hosts;
  for (const HostSlot& h : slots)
    if (std::find(hosts.begin(), hosts.end(), h.host) == hosts.end()) hosts.push_back(h.host);
  std::string where;
  for (const std::string& h : hosts) where += (where.empty() ? " " : ", ") + h;
  std::printf("codecs: fwd %s, bwd %s%s; links: %s\n", job.compress_fwd.c_str(), job.compress_bwd.c_str(),
              job.compress_link.empty() ? "" : " (with per-link overrides)",
              !job.links.empty() ? ("shaped " + describe_link_rules(job.links)).c_str()
              : !slots.empty()   ? ("over ssh to" + where).c_str()
              : !f.netns.empty() ? ("netns tbf " + f.netns).c_str()
              : nat.up           ? (std::to_string(nat.sites) + " sites behind NAT routers, up to " +
                          std::to_string(nat.per_site) + " workers each")
                             .c_str()
                       : "loopback, unlimited");
  std::printf("coordinator %s  (longhaul ctl --coordinator %s --key-file %s status)\n", ep.c_str(), ep.c_str(),
              key_path.empty() ? "<the job's key file>" : key_path.c_str());
  if (wrote_key) std::printf("wrote a new job secret to %s (mode 0600)\n", key_path.c_str());
  print_page_address(**coord, key_path);
  if ((*coord)->resumed_from() > 0)
    std::printf("resuming from the checkpoint of step %lld in '%s'\n", static_cast<long long>((*coord)->resumed_from()),
                f.job.checkpoint_dir.c_str());

  std::fflush(stdout);

  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);

  WorkerGroup group;
  const std::string exe = self_exe();
  const char* level = spdlog::level::to_string_view(spdlog::get_level()).data();
  std::map<pid_t, int> slot_of;  // worker process → its slot (its network namespace with --netns)
  auto start_worker = [&](int i) -> Result<pid_t> {
    // launch's workers live and die with it (and its coordinator): they do not wait for another coordinator.
    std::vector<std::string> argv = {exe,
                                     "--threads",
                                     std::to_string(threads),
                                     "--log-level",
                                     level,
                                     "worker",
                                     "--coordinator",
                                     ep,
                                     "--coordinator-timeout",
                                     "0"};
    std::vector<std::string> prefix;
    if (!slots.empty()) {
      // Over ssh: the remote shell runs the worker in its place (exec), the secret on its standard input.
      const HostSlot& h = slots[size_t(i)];
      argv = {f.remote_longhaul.empty() ? exe : f.remote_longhaul, "--log-level", level};
      if (f.worker_threads > 0 || std::all_of(slots.begin(), slots.end(), [](const HostSlot& x) {
            return loopback_host(x.host);
          }))
        argv.insert(argv.begin() + 1, {"--threads", std::to_string(threads)});
      argv.insert(argv.end(), {"worker", "--coordinator", worker_ep, "--coordinator-timeout", "0", "--key-stdin",
                               "--rank", std::to_string(i), "--hostname", h.host + " slot " + std::to_string(i)});
      if (!h.advertise.empty()) argv.insert(argv.end(), {"--advertise", h.advertise});
      if (!h.site.empty()) argv.insert(argv.end(), {"--site", h.site});
      if (!f.ucx_tls.empty()) argv.insert(argv.end(), {"--ucx-tls", f.ucx_tls});
      if (f.no_allow_list) argv.push_back("--no-allow-list");
      std::vector<std::string> remote = ssh;
      remote.insert(remote.end(), {"-T", "-o", "BatchMode=yes", h.host, "exec " + shell_command(argv)});
      const std::string label = "w" + std::to_string(i) + " " + h.host + (h.site.empty() ? "" : " " + h.site);
      LH_ASSIGN_OR_RETURN(pid_t pid, group.start(remote, {}, secret.to_hex(), label));
      slot_of[pid] = i;
      return pid;
    }
    if (!f.ucx_tls.empty()) argv.insert(argv.end(), {"--ucx-tls", f.ucx_tls});
    if (f.no_allow_list) argv.push_back("--no-allow-list");
    if (wan.up) prefix = {"ip", "netns", "exec", wan.prefix + std::to_string(i), "env", "UCX_NET_DEVICES=eth0"};
    if (nat.up) {
      // Slot i is rank i (the sites hold consecutive ranks: pipeline neighbours share a site but at its edges).
      prefix = {"ip", "netns", "exec", nat.host(i), "env", "UCX_NET_DEVICES=eth0"};
      argv.insert(argv.end(), {"--rank", std::to_string(i)});
    }
    LH_ASSIGN_OR_RETURN(pid_t pid, group.start(argv, prefix, secret.to_hex()));
    slot_of[pid] = i;
    return pid;
  };
  for (int i = 0; i < job.workers; ++i) {
    auto pid = start_worker(i);
    if (!pid.ok()) fail(pid.status().message());
  }
  int restarts_left = f.restarts;
  std::printf("workers: pids");
  for (pid_t p : group.pids()) std::printf(" %d", int(p));
  std::printf("\n");
  std::fflush(stdout);

  // Switches naming no link apply to every pipeline link of the grid as resolved from the flags.
  std::vector<ScheduledSwitch> planned;
  for (const ScheduledSwitch& sw : switches) {
    if (!sw.link.empty()) {
      planned.push_back(sw);
      continue;
    }
    auto topology = job.topology();
    if (!topology.ok()) fail(topology.status().message());
    for (const PipelineLink& l : topology->pipeline_links()) {
      planned.push_back(sw);
      planned.back().link = l.name();
    }
  }
  int64_t printed = 0;
  bool preempting = false, interrupted = false;
  size_t next_switch = 0;
  std::string failure;
  Status result = Status::Ok();
  for (;;) {
    result = (*coord)->wait(100ms);
    const bool finished =
        result.code() != StatusCode::kUnavailable || result.message() != "the job did not finish within the timeout";
    print_progress(**coord, job.train.steps, printed, job.dp);
    if (finished) break;
    for (size_t i = next_switch; i < planned.size() && printed >= planned[i].after_step; i = ++next_switch) {
      const ScheduledSwitch& sw = planned[i];
      const nlohmann::json args = {{"link", sw.link}, {"dir", sw.dir}, {"spec", sw.spec}};
      auto r = (*coord)->handle_ctl("set-codec", args.dump());
      auto j = r.ok() ? nlohmann::json::parse(*r, nullptr, false) : nlohmann::json();
      if (r.ok())
        std::printf("set-codec %s %s %s from step %lld (live, as `longhaul ctl set-codec` does)\n", sw.link.c_str(),
                    sw.dir.c_str(), sw.spec.c_str(),
                    static_cast<long long>(j.is_object() ? j.value("from_step", int64_t(-1)) : -1));
      else
        std::printf("set-codec %s %s %s refused: %s\n", sw.link.c_str(), sw.dir.c_str(), sw.spec.c_str(),
                    r.status().message().c_str());
      std::fflush(stdout);
    }
    if (g_stop_signal == SIGTERM && !preempting) {
      // What a scheduler sends before its kill: the job saves a checkpoint and stops (a second signal stops it now).
      preempting = true;
      g_stop_signal = 0;
      std::printf("SIGTERM: the job saves a checkpoint and stops (send it again to stop at once)\n");
      std::fflush(stdout);
      (*coord)->preempt("launch was sent SIGTERM");
    }
    if (g_stop_signal) {
      failure = std::string("interrupted by signal ") + strsignal(g_stop_signal) + "; stopping every worker";
      interrupted = true;
      break;
    }
    if (auto bad = group.poll()) {
      // A worker process killed (a crash, the OOM killer, kill -9) is restarted: the coordinator rolls the job back
      // to its last checkpoint and gives the new process the lost worker's place.
      const bool killed = WIFSIGNALED(bad->second);
      if (killed && f.job.elastic) {
        // --elastic: the coordinator goes on without the lost worker's replica (its other workers leave).
        const int rank = rank_of_pid(**coord, bad->first);
        group.forgive(bad->first);
        std::printf("worker %s(pid %d) %s; --elastic: the job goes on without its replica\n",
                    rank >= 0 ? (std::to_string(rank) + " ").c_str() : "", int(bad->first),
                    describe_exit(bad->second).c_str());
        std::fflush(stdout);
        continue;
      }
      if (killed && restarts_left > 0 && f.job.replace_timeout_s > 0) {
        --restarts_left;
        const int rank = rank_of_pid(**coord, bad->first);
        auto pid = start_worker(slot_of[bad->first]);
        if (pid.ok()) {
          group.forgive(bad->first);
          std::printf("worker %s(pid %d) %s; started pid %d in its place (%d restart%s left)\n",
                      rank >= 0 ? (std::to_string(rank) + " ").c_str() : "", int(bad->first),
                      describe_exit(bad->second).c_str(), int(*pid), restarts_left, restarts_left == 1 ? "" : "s");
          std::fflush(stdout);
          continue;
        }
        std::printf("could not restart a worker: %s\n", pid.status().message().c_str());
      }
      // The others hear of it through the coordinator within the heartbeat timeout; wait for that.
      auto grace = std::chrono::milliseconds(int64_t(f.job.heartbeat_timeout_s * 1000)) + 5s;
      result = (*coord)->wait(grace);
      break;
    }
    if (group.all_exited()) {
      result = (*coord)->wait(std::chrono::milliseconds(int64_t(f.job.heartbeat_timeout_s * 1000)) + 2s);
      break;
    }
  }
  // Workers leave after the coordinator saw their last step; give them a moment, then stop the rest.
  if (g_stop_signal) {
    // Told by the coordinator first: a worker sent SIGTERM mid-job would otherwise ask for a checkpoint.
    (*coord)->stop(failure);
    group.stop(2s);
  } else if (!group.wait_all(failure.empty() && result.ok() ? 30s : 3s)) {
    group.stop(2s);
  }
  // A worker process that died is the cause; the coordinator's message (a neighbour that lost it) follows.
  for (const auto& [pid, st] : group.abnormal()) {
    if (g_stop_signal) break;  // we stopped them
    if (!WIFSIGNALED(st) && !failure.empty()) continue;
    const int rank = rank_of_pid(**coord, pid);
    failure += (failure.empty() ? "" : "; ") + std::string("worker ") +
               (rank >= 0 ? std::to_string(rank) + " " : std::string()) + "(pid " + std::to_string(pid) + ") " +
               describe_exit(st);
  }
  print_progress(**coord, job.train.steps, printed, job.dp);
  print_job_summary(**coord, f.job.metrics);
  if (!failure.empty() || !result.ok()) {
    std::string msg = failure;
    const bool timed_out = result.message() == "the job did not finish within the timeout";
    if (!result.ok() && !timed_out)
      msg += (msg.empty() ? "" : "; ") + std::string("the job stopped: ") + result.message();
    const std::string hint = resume_hint(**coord, f.job, "launch");
    fail((msg.empty() ? "the job failed" : msg) + (hint.empty() ? "" : "\n" + hint),
         (*coord)->preempted() && !interrupted ? kPreemptedExitCode : 1);
  }
}

void add_launch_flags(CLI::App* cmd, LaunchFlags& f, const std::string& metrics_default) {
  add_job_flags(cmd, f.job, metrics_default);
  cmd->add_option("--netns", f.netns, "each worker in its own network namespace behind a tc tbf link of RATE (root)");
  cmd->add_option("--nat-sites", f.nat_sites,
                  "the workers in N sites behind NAT routers, consecutive ranks per site, the coordinator (and its "
                  "relay) on the public side (scripts/nat.sh; root): pairs across sites go through the relay")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--site-rate", f.site_rate,
                  "with --nat-sites: each site's uplink limited to RATE both ways (tc tbf), e.g. 100M");
  cmd->add_option("--listen", f.listen, "coordinator address (PORT '*': any free port)")->capture_default_str();
  cmd->add_option("--ucx-tls", f.ucx_tls, "UCX transports for the workers (default: $UCX_TLS or UCX's choice)");
  cmd->add_flag("--no-allow-list", f.no_allow_list,
                "the workers leave their data ports open to every address (as root they otherwise admit only the "
                "job's members, with nftables)");
  cmd->add_option("--worker-threads", f.worker_threads, "BLAS/OpenMP threads per worker (0: cores / workers)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--restarts", f.restarts,
                  "worker processes killed during the job are started again this many times in all (the job rolls "
                  "back to its last checkpoint; needs --replace-timeout > 0)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000))
      ->group("Checkpoints and recovery");
  cmd->add_option("--wan-script", f.wan_script, "path of scripts/wan.sh for --netns (found next to the build)");
  cmd->add_option("--hosts", f.hosts,
                  "start the workers over ssh on the machines of a hostfile (one per line: HOST [slots=N] [site=NAME] "
                  "[advertise=ADDR]; ranks in file order, each site's together); the job secret goes over the ssh "
                  "channel, and a worker stops when its channel closes")
      ->group("Hosts over ssh");
  cmd->add_option("--ssh", f.ssh, "with --hosts: the ssh command (your config and agent apply), e.g. 'ssh -F FILE'")
      ->capture_default_str()
      ->group("Hosts over ssh");
  cmd->add_option("--remote-longhaul", f.remote_longhaul,
                  "with --hosts: the longhaul binary's path on the hosts (default: this one's path)")
      ->group("Hosts over ssh");
  cmd->add_option("--coordinator-host", f.coordinator_host,
                  "with --hosts: the name or address the hosts reach this machine at (default: its host name, or "
                  "127.0.0.1 when every host is this machine)")
      ->group("Hosts over ssh");
}

namespace {

RegisterCommand reg("", 20, [](CLI::App& app) {
  auto f = std::make_shared<LaunchFlags>();
  auto* cmd =
      app.add_subcommand("launch", "run a pipeline job on this machine: a coordinator and one process per worker");
  add_launch_flags(cmd, *f, "launch_metrics.jsonl");
  cmd->callback([f, cmd] { run_launch(*f, cmd); });
});

}  // namespace
}  // namespace lh::app
