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
int rank_of_pid(JobCoordinator& coord, pid_t pid) {
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

// One `longhaul launch`, step by step: check --hosts → build the emulated network (--nat-sites, --netns) → start the
// coordinator → start the workers → watch the job (live switches, signals, dead workers) → end it. The members are
// declared in the order the steps make them, so they are undone in reverse: the workers stop before the coordinator
// goes, and the coordinator before the namespaces under it.
class Launch {
 public:
  Launch(LaunchFlags& f, CLI::App* cmd) : f_(f), cmd_(cmd), job_(job_config_from_flags(f.job, cmd)) {}

  void run(const std::vector<ScheduledSwitch>& switches) {
    if (!job_.links.empty() && !f_.netns.empty()) fail("--link and --netns exclude each other: choose one", 2);
    listen_ = f_.listen;
    check_hosts();
    if (!f_.site_rate.empty() && f_.nat_sites == 0) fail("--site-rate needs --nat-sites", 2);
    if (f_.nat_sites > 0) build_nat_sites();
    if (!f_.netns.empty()) build_netns();
    start_coordinator();
    print_banner();
    catch_stop_signals({SIGINT, SIGTERM, SIGHUP}, /*restart=*/false);
    start_workers();
    plan_switches(switches);
    watch();
    end();
  }

 private:
  // --hosts: the workers start on the hostfile's machines over ssh; the coordinator listens where they reach it.
  void check_hosts() {
    if (!f_.hosts.empty()) {
      if (!f_.netns.empty() || f_.nat_sites > 0 || f_.job.elastic)
        fail("--hosts starts the workers on other machines: it takes no --netns, --nat-sites or --elastic", 2);
      auto read = read_hostfile(f_.hosts);
      if (!read.ok()) fail(read.status().message(), 2);
      slots_ = std::move(read).value();
      if (int(slots_.size()) < job_.workers)
        fail("--hosts '" + f_.hosts + "' has " + std::to_string(slots_.size()) + " slots, fewer than the job's " +
                 std::to_string(job_.workers) + " workers",
             2);
      slots_.resize(size_t(job_.workers));
      auto words = ssh_words(f_.ssh);
      if (!words.ok()) fail(words.status().message(), 2);
      ssh_ = std::move(words).value();
      const bool all_loopback =
          std::all_of(slots_.begin(), slots_.end(), [](const HostSlot& h) { return loopback_host(h.host); });
      if (!f_.coordinator_host.empty()) {
        coordinator_host_ = f_.coordinator_host;
      } else if (!all_loopback) {
        char name[256] = {0};
        gethostname(name, sizeof(name) - 1);
        coordinator_host_ = name;
      }
      if (!cmd_->get_option("--listen")->count() && !all_loopback) listen_ = "tcp://0.0.0.0:*";
    } else if (!f_.coordinator_host.empty() || cmd_->get_option("--ssh")->count() ||
               cmd_->get_option("--remote-longhaul")->count()) {
      fail("--coordinator-host, --ssh and --remote-longhaul go with --hosts FILE", 2);
    }
  }

  // --nat-sites: the workers in sites behind NAT routers, the coordinator on the public side.
  void build_nat_sites() {
    if (!f_.netns.empty()) fail("--nat-sites and --netns exclude each other: choose one", 2);
    if (f_.nat_sites > job_.workers)
      fail("--nat-sites " + std::to_string(f_.nat_sites) + ": more sites than the job's " +
               std::to_string(job_.workers) + " workers",
           2);
    if (geteuid() != 0) fail("--nat-sites needs root (network namespaces and nftables)", 2);
    const std::string wan_script = find_wan_script(f_.wan_script);
    nat_.script = wan_script.substr(0, wan_script.rfind('/') + 1) + "nat.sh";
    const int id = int(getpid() % 100000);
    const std::string pub = "10.216." + std::to_string(id % 250);
    nat_.env = "LH_NAT_PREFIX=lhn" + std::to_string(id) + " LH_NAT_PUBLIC=" + pub + " LH_NAT_LAN=10." +
               std::to_string(217 + id % 30);
    nat_.sites = f_.nat_sites;
    nat_.per_site = (job_.workers + f_.nat_sites - 1) / f_.nat_sites;
    std::string rate;
    if (!f_.site_rate.empty()) {
      auto shape = parse_link_shape(f_.site_rate);
      if (!shape.ok() || shape->rate_bps <= 0 || shape->delay.count() > 0)
        fail("--site-rate '" + f_.site_rate + "': " +
                 (shape.ok() ? std::string("expected a rate such as 100M (no delay)") : shape.status().message()),
             2);
      rate = " " + std::to_string(int64_t(shape->rate_bps));
    }
    nat_.up = true;
    const std::string up = nat_.env + " bash '" + nat_.script + "' up " + std::to_string(nat_.sites) + " " +
                           std::to_string(nat_.per_site) + rate + " >/dev/null";
    if (std::system(up.c_str()) != 0) fail("--nat-sites: could not build the sites with " + nat_.script);
    listen_ = "tcp://" + pub + ".254:*";
  }

  // --netns RATE: each worker in its own network namespace behind a tc tbf link.
  void build_netns() {
    auto shape = parse_link_shape(f_.netns);
    if (!shape.ok() || shape->rate_bps <= 0)
      fail("--netns '" + f_.netns + "': " + (shape.ok() ? std::string("needs a rate") : shape.status().message()), 2);
    if (shape->delay.count() > 0) fail("--netns '" + f_.netns + "': takes a rate only (tbf adds no delay)", 2);
    if (geteuid() != 0)
      fail("--netns needs root (network namespaces and tc); use --link RATE[,DELAY] for an in-process shaper", 2);
    wan_.script = find_wan_script(f_.wan_script);
    wan_.prefix = "lhj" + std::to_string(getpid() % 100000);
    wan_.subnet = "10.214." + std::to_string(getpid() % 250);
    std::string up = "LH_WAN_PREFIX=" + wan_.prefix + " LH_WAN_SUBNET=" + wan_.subnet + " bash '" + wan_.script +
                     "' up " + std::to_string(job_.workers) + " " + std::to_string(int64_t(shape->rate_bps));
    wan_.up = true;
    if (std::system(up.c_str()) != 0) fail("--netns: could not build the namespaces with " + wan_.script);
    listen_ = "tcp://" + wan_.subnet + ".254:*";
  }

  void start_coordinator() {
    secret_ = coordinator_secret(f_.job.secret, f_.job.metrics, &key_path_, &wrote_key_);
    const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
    threads_ = f_.worker_threads > 0 ? f_.worker_threads : std::max(1, cores / job_.workers);

    set_log_role("launch");
    auto coord = JobCoordinator::start(job_, coordinator_options(f_.job, listen_, *secret_));
    if (!coord.ok()) fail("--listen " + listen_ + ": " + coord.status().to_string());
    coord_ = std::move(coord).value();
    job_ = coord_->job();  // an --elastic job resumed with fewer replicas than its flags say
    ep_ = coord_->endpoint();
    // What the workers connect to: the endpoint as bound, or this machine's name for it when it listens on every
    // interface (--hosts beyond loopback).
    worker_ep_ = slots_.empty() ? ep_ : "tcp://" + coordinator_host_ + ep_.substr(ep_.rfind(':'));
  }

  void print_banner() {
    std::printf(
        "longhaul launch: %s, %d workers (pp %d × tp %d × dp %d, %d thread%s each), %lld steps, schedule %s, %d "
        "microbatches\n",
        job_.train.model.describe().c_str(), job_.workers, job_.pp, job_.tp, job_.dp, threads_,
        threads_ == 1 ? "" : "s", static_cast<long long>(job_.train.steps), schedule_kind_name(job_.schedule),
        job_.microbatches);
    std::vector<std::string> hosts;
    for (const HostSlot& h : slots_)
      if (std::find(hosts.begin(), hosts.end(), h.host) == hosts.end()) hosts.push_back(h.host);
    std::string where;
    for (const std::string& h : hosts) where += (where.empty() ? " " : ", ") + h;
    std::printf("codecs: fwd %s, bwd %s%s; links: %s\n", job_.compress_fwd.c_str(), job_.compress_bwd.c_str(),
                job_.compress_link.empty() ? "" : " (with per-link overrides)",
                !job_.links.empty() ? ("shaped " + describe_link_rules(job_.links)).c_str()
                : !slots_.empty()   ? ("over ssh to" + where).c_str()
                : !f_.netns.empty() ? ("netns tbf " + f_.netns).c_str()
                : nat_.up           ? (std::to_string(nat_.sites) + " sites behind NAT routers, up to " +
                             std::to_string(nat_.per_site) + " workers each")
                                .c_str()
                          : "loopback, unlimited");
    std::printf("coordinator %s  (longhaul ctl --coordinator %s --key-file %s status)\n", ep_.c_str(), ep_.c_str(),
                key_path_.empty() ? "<the job's key file>" : key_path_.c_str());
    if (wrote_key_) std::printf("wrote a new job secret to %s (mode 0600)\n", key_path_.c_str());
    print_page_address(*coord_, key_path_);
    if (coord_->resumed_from() > 0)
      std::printf("resuming from the checkpoint of step %lld in '%s'\n", static_cast<long long>(coord_->resumed_from()),
                  f_.job.checkpoint_dir.c_str());

    std::fflush(stdout);
  }

  // Starts worker slot `i`: a local process (in its namespace with --netns or --nat-sites), or over ssh with --hosts.
  Result<pid_t> start_worker(int i) {
    if (!slots_.empty()) return start_remote_worker(i);
    // launch's workers live and die with it (and its coordinator): they do not wait for another coordinator.
    std::vector<std::string> argv = {exe_,
                                     "--threads",
                                     std::to_string(threads_),
                                     "--log-level",
                                     level_,
                                     "worker",
                                     "--coordinator",
                                     ep_,
                                     "--coordinator-timeout",
                                     "0"};
    std::vector<std::string> prefix;
    if (!f_.ucx_tls.empty()) argv.insert(argv.end(), {"--ucx-tls", f_.ucx_tls});
    if (f_.no_allow_list) argv.push_back("--no-allow-list");
    if (wan_.up) prefix = {"ip", "netns", "exec", wan_.prefix + std::to_string(i), "env", "UCX_NET_DEVICES=eth0"};
    if (nat_.up) {
      // Slot i is rank i (the sites hold consecutive ranks: pipeline neighbours share a site but at its edges).
      prefix = {"ip", "netns", "exec", nat_.host(i), "env", "UCX_NET_DEVICES=eth0"};
      argv.insert(argv.end(), {"--rank", std::to_string(i)});
    }
    LH_ASSIGN_OR_RETURN(pid_t pid, group_.start(argv, prefix, secret_->to_hex()));
    slot_of_[pid] = i;
    return pid;
  }

  // Over ssh: the remote shell runs the worker in its place (exec), the secret on its standard input.
  Result<pid_t> start_remote_worker(int i) {
    const HostSlot& h = slots_[size_t(i)];
    std::vector<std::string> argv = {f_.remote_longhaul.empty() ? exe_ : f_.remote_longhaul, "--log-level", level_};
    if (f_.worker_threads > 0 ||
        std::all_of(slots_.begin(), slots_.end(), [](const HostSlot& x) { return loopback_host(x.host); }))
      argv.insert(argv.begin() + 1, {"--threads", std::to_string(threads_)});
    argv.insert(argv.end(), {"worker", "--coordinator", worker_ep_, "--coordinator-timeout", "0", "--key-stdin",
                             "--rank", std::to_string(i), "--hostname", h.host + " slot " + std::to_string(i)});
    if (!h.advertise.empty()) argv.insert(argv.end(), {"--advertise", h.advertise});
    if (!h.site.empty()) argv.insert(argv.end(), {"--site", h.site});
    if (!f_.ucx_tls.empty()) argv.insert(argv.end(), {"--ucx-tls", f_.ucx_tls});
    if (f_.no_allow_list) argv.push_back("--no-allow-list");
    std::vector<std::string> remote = ssh_;
    remote.insert(remote.end(), {"-T", "-o", "BatchMode=yes", h.host, "exec " + shell_command(argv)});
    const std::string label = "w" + std::to_string(i) + " " + h.host + (h.site.empty() ? "" : " " + h.site);
    LH_ASSIGN_OR_RETURN(pid_t pid, group_.start(remote, {}, secret_->to_hex(), label));
    slot_of_[pid] = i;
    return pid;
  }

  void start_workers() {
    exe_ = self_exe();
    level_ = spdlog::level::to_string_view(spdlog::get_level()).data();
    for (int i = 0; i < job_.workers; ++i) {
      auto pid = start_worker(i);
      if (!pid.ok()) fail(pid.status().message());
    }
    restarts_left_ = f_.restarts;
    std::printf("workers: pids");
    for (pid_t p : group_.pids()) std::printf(" %d", int(p));
    std::printf("\n");
    std::fflush(stdout);
  }

  // Switches naming no link apply to every pipeline link of the grid as resolved from the flags.
  void plan_switches(const std::vector<ScheduledSwitch>& switches) {
    for (const ScheduledSwitch& sw : switches) {
      if (!sw.link.empty()) {
        planned_.push_back(sw);
        continue;
      }
      auto topology = job_.topology();
      if (!topology.ok()) fail(topology.status().message());
      for (const PipelineLink& l : topology->pipeline_links()) {
        planned_.push_back(sw);
        planned_.back().link = l.name();
      }
    }
  }

  // The scheduled switches whose step was reported, through the same path as `longhaul ctl set-codec`.
  void make_due_switches() {
    for (size_t i = next_switch_; i < planned_.size() && printed_ >= planned_[i].after_step; i = ++next_switch_) {
      const ScheduledSwitch& sw = planned_[i];
      const nlohmann::json args = {{"link", sw.link}, {"dir", sw.dir}, {"spec", sw.spec}};
      auto r = coord_->handle_ctl("set-codec", args.dump());
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
  }

  // A worker process that ended badly. Returns whether the job goes on (it was forgiven or replaced).
  bool on_bad_exit(pid_t pid, int st) {
    // A worker process killed (a crash, the OOM killer, kill -9) is restarted: the coordinator rolls the job back
    // to its last checkpoint and gives the new process the lost worker's place.
    const bool killed = WIFSIGNALED(st);
    if (killed && f_.job.elastic) {
      // --elastic: the coordinator goes on without the lost worker's replica (its other workers leave).
      const int rank = rank_of_pid(*coord_, pid);
      group_.forgive(pid);
      std::printf("worker %s(pid %d) %s; --elastic: the job goes on without its replica\n",
                  rank >= 0 ? (std::to_string(rank) + " ").c_str() : "", int(pid), describe_exit(st).c_str());
      std::fflush(stdout);
      return true;
    }
    if (killed && restarts_left_ > 0 && f_.job.replace_timeout_s > 0) {
      --restarts_left_;
      const int rank = rank_of_pid(*coord_, pid);
      auto started = start_worker(slot_of_[pid]);
      if (started.ok()) {
        group_.forgive(pid);
        std::printf("worker %s(pid %d) %s; started pid %d in its place (%d restart%s left)\n",
                    rank >= 0 ? (std::to_string(rank) + " ").c_str() : "", int(pid), describe_exit(st).c_str(),
                    int(*started), restarts_left_, restarts_left_ == 1 ? "" : "s");
        std::fflush(stdout);
        return true;
      }
      std::printf("could not restart a worker: %s\n", started.status().message().c_str());
    }
    return false;
  }

  // Waits for the job's end, printing progress, making the scheduled switches, answering signals and dead workers.
  void watch() {
    bool preempting = false;
    for (;;) {
      result_ = coord_->wait(100ms);
      const bool finished = result_.code() != StatusCode::kUnavailable ||
                            result_.message() != "the job did not finish within the timeout";
      print_progress(*coord_, job_.train.steps, printed_, job_.dp);
      if (finished) break;
      make_due_switches();
      if (const int sig = preempt_or_stop_signal(*coord_, preempting, "", "launch was sent SIGTERM")) {
        failure_ = std::string("interrupted by signal ") + strsignal(sig) + "; stopping every worker";
        interrupted_ = true;
        break;
      }
      if (auto bad = group_.poll()) {
        if (on_bad_exit(bad->first, bad->second)) continue;
        // The others hear of it through the coordinator within the heartbeat timeout; wait for that.
        auto grace = std::chrono::milliseconds(int64_t(f_.job.heartbeat_timeout_s * 1000)) + 5s;
        result_ = coord_->wait(grace);
        break;
      }
      if (group_.all_exited()) {
        result_ = coord_->wait(std::chrono::milliseconds(int64_t(f_.job.heartbeat_timeout_s * 1000)) + 2s);
        break;
      }
    }
  }

  // Stops what is left, names the cause of a failure (a dead worker's rank and pid first) and prints the tables.
  void end() {
    // Workers leave after the coordinator saw their last step; give them a moment, then stop the rest.
    if (stop_signal()) {
      // Told by the coordinator first: a worker sent SIGTERM mid-job would otherwise ask for a checkpoint.
      coord_->stop(failure_);
      group_.stop(2s);
    } else if (!group_.wait_all(failure_.empty() && result_.ok() ? 30s : 3s)) {
      group_.stop(2s);
    }
    // A worker process that died is the cause; the coordinator's message (a neighbour that lost it) follows.
    for (const auto& [pid, st] : group_.abnormal()) {
      if (stop_signal()) break;  // we stopped them
      if (!WIFSIGNALED(st) && !failure_.empty()) continue;
      const int rank = rank_of_pid(*coord_, pid);
      failure_ += (failure_.empty() ? "" : "; ") + std::string("worker ") +
                  (rank >= 0 ? std::to_string(rank) + " " : std::string()) + "(pid " + std::to_string(pid) + ") " +
                  describe_exit(st);
    }
    print_progress(*coord_, job_.train.steps, printed_, job_.dp);
    print_job_summary(*coord_, f_.job.metrics);
    if (!failure_.empty() || !result_.ok()) {
      std::string msg = failure_;
      const bool timed_out = result_.message() == "the job did not finish within the timeout";
      if (!result_.ok() && !timed_out)
        msg += (msg.empty() ? "" : "; ") + std::string("the job stopped: ") + result_.message();
      const std::string hint = resume_hint(*coord_, f_.job, "launch");
      fail((msg.empty() ? "the job failed" : msg) + (hint.empty() ? "" : "\n" + hint),
           coord_->preempted() && !interrupted_ ? kPreemptedExitCode : 1);
    }
  }

  LaunchFlags& f_;
  CLI::App* cmd_;
  JobConfig job_;
  std::string listen_;
  std::vector<HostSlot> slots_;
  std::vector<std::string> ssh_;
  std::string coordinator_host_ = "127.0.0.1";
  WanNamespaces wan_;
  NatSites nat_;
  std::string key_path_;
  bool wrote_key_ = false;
  std::optional<JobSecret> secret_;
  int threads_ = 1;
  std::unique_ptr<JobCoordinator> coord_;
  std::string ep_, worker_ep_;
  WorkerGroup group_;
  std::string exe_;
  const char* level_ = "";
  std::map<pid_t, int> slot_of_;  // worker process → its slot (its network namespace with --netns)
  int restarts_left_ = 0;
  std::vector<ScheduledSwitch> planned_;
  int64_t printed_ = 0;
  size_t next_switch_ = 0;
  bool interrupted_ = false;
  std::string failure_;
  Status result_ = Status::Ok();
};

}  // namespace

void run_launch(LaunchFlags& f, CLI::App* cmd, const std::vector<ScheduledSwitch>& switches) {
  Launch(f, cmd).run(switches);
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
