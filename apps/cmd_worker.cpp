// `longhaul worker --coordinator tcp://HOST:PORT` (or `--from-env`): one worker process of a pipeline job (its stage,
// codecs and training settings come from the coordinator's plan). Started by users on each machine and by `launch`.
#include <netdb.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include "apps/commands.h"
#include "apps/from_env.h"
#include "apps/job_cli.h"
#include "core/log.h"
#include "job/job_worker.h"

namespace lh::app {
namespace {

// SIGTERM (what Slurm and Kubernetes send before a kill): the first asks the job to checkpoint and stop; a second one,
// or one before training began (nothing to save), ends the worker at once.
volatile std::sig_atomic_t g_term = 0;
std::atomic<bool> g_training{false};
void on_term(int sig) {
  if (g_term || !g_training) {
    static const char msg[] = "longhaul worker: stopped by SIGTERM\n";
    (void)!write(2, msg, sizeof(msg) - 1);
    _exit(128 + sig);
  }
  g_term = sig;
}

struct WorkerFlags {
  std::string coordinator;
  SecretFlags secret;
  std::string hostname;
  std::string site;
  std::string link;
  std::string ucx_tls;
  double compute_speed = 0;
  double join_timeout_s = 600, receive_timeout_s = 600, coordinator_timeout_s = 600;
  int rank = -1;
  double connect_timeout_s = 5;
  std::string data_ports;
  std::string advertise;
  std::string data_bind;
  bool relay_only = false;
  bool no_allow_list = false;
  bool from_env = false, show_place = false, start_coordinator = false, key_stdin = false;
  std::vector<std::string> coordinator_args;  // after --: the job flags of the coordinator --start-coordinator starts
};

// --key-stdin: the job secret is the first line of standard input (how `launch --hosts` hands it over the ssh channel,
// never in an argument or the environment), and the worker stops when standard input closes: ssh without a terminal
// does not signal a remote command when its launcher goes, it closes the channel.
JobSecret secret_from_stdin() {
  std::string line;
  char c = 0;
  for (;;) {
    const ssize_t n = ::read(0, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') break;
    if (line.size() >= 4096) fail("--key-stdin: the first line of standard input is longer than a job secret", 2);
    line.push_back(c);
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty()) fail("--key-stdin: standard input closed before it gave the job secret (one line of hex)", 2);
  bool weak = false;
  auto secret = JobSecret::parse(line, &weak);
  if (!secret.ok()) fail("--key-stdin: " + secret.status().message(), 2);
  if (weak) fail("--key-stdin: not a job key (the first line of a key file: 64 hex digits)", 2);
  std::thread([] {
    char buf[256];
    for (;;) {
      const ssize_t n = ::read(0, buf, sizeof(buf));
      if (n > 0 || (n < 0 && errno == EINTR)) continue;
      break;
    }
    static const char msg[] = "longhaul worker: standard input closed (the launcher is gone): stopping\n";
    (void)!::write(2, msg, sizeof(msg) - 1);
    std::_Exit(1);
  }).detach();
  return *secret;
}

// True when something accepts a TCP connection at host:port within a second (a coordinator already listening).
bool listening(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return false;
  bool ok = false;
  for (addrinfo* a = res; a && !ok; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      ok = ::poll(&p, 1, 1000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    ::close(fd);
  }
  freeaddrinfo(res);
  return ok;
}

// --start-coordinator at rank 0: `longhaul coordinator` as a child process on the place's port, with the job flags
// given after --, unless a coordinator already listens there (then this worker joins it). Returns its pid (0: none).
pid_t start_coordinator(const WorkerFlags& f, const EnvPlace& place) {
  if (listening(place.coordinator_host, place.coordinator_port)) {
    std::printf("a coordinator already listens at %s: joining it\n", place.coordinator.c_str());
    return 0;
  }
  std::vector<std::string> args = {self_exe(), "coordinator", "--listen",
                                   "tcp://0.0.0.0:" + std::to_string(place.coordinator_port)};
  if (std::find(f.coordinator_args.begin(), f.coordinator_args.end(), "--workers") == f.coordinator_args.end())
    args.insert(args.end(), {"--workers", std::to_string(place.world)});
  if (!f.secret.key_file.empty()) args.insert(args.end(), {"--key-file", f.secret.key_file});
  args.insert(args.end(), f.coordinator_args.begin(), f.coordinator_args.end());
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) fail(std::string("--start-coordinator: fork: ") + std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlives the worker that started it
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "longhaul worker --start-coordinator: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  std::printf("started the job's coordinator (pid %d) on port %d\n", int(pid), place.coordinator_port);
  std::fflush(stdout);
  return pid;
}

// The names this worker goes by: its --hostname (this machine's name and pid by default) and --site (or $LH_SITE
// with --from-env), checked.
void set_identity(const WorkerFlags& f, JobWorkerOptions& o) {
  o.hostname = f.hostname;
  o.site = f.site;
  if (o.site.empty() && f.from_env && std::getenv("LH_SITE")) o.site = std::getenv("LH_SITE");
  if (!o.site.empty()) {
    const bool ok = o.site.size() <= 64 && std::all_of(o.site.begin(), o.site.end(), [](char c) {
                      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
                    });
    if (!ok)
      fail(std::string(f.site.empty() ? "LH_SITE" : "--site") + " '" + o.site +
               "': a site is up to 64 letters, digits, '-', '_' or '.'",
           2);
  }
  if (o.hostname.empty()) {
    // Several workers may share a machine: the pid tells them apart in the coordinator's messages.
    char buf[256] = {0};
    gethostname(buf, sizeof(buf) - 1);
    o.hostname = std::string(buf) + " pid " + std::to_string(getpid());
  }
}

// The data plane's flags, checked: --data-ports, --advertise, --data-bind, --relay-only (which takes none of them).
void set_data_plane_options(const WorkerFlags& f, JobWorkerOptions& o) {
  if (!f.data_ports.empty()) {
    auto range = parse_port_range(f.data_ports);
    if (!range.ok()) fail("--data-ports '" + f.data_ports + "': " + range.status().message(), 2);
    o.ucx.data_ports = f.data_ports;
  }
  if (!f.advertise.empty()) {
    Status ok = check_advertised_host(f.advertise);
    if (!ok.ok()) fail("--advertise '" + f.advertise + "': " + ok.message(), 2);
    o.ucx.advertise = f.advertise;
  }
  if (!f.data_bind.empty()) {
    if (f.advertise.empty()) fail("--data-bind '" + f.data_bind + "' needs --advertise (the address peers connect to)", 2);
    o.ucx.data_bind = f.data_bind;
  }
  if (f.relay_only) {
    for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--advertise", &f.advertise},
                                      {"--data-ports", &f.data_ports},
                                      {"--data-bind", &f.data_bind},
                                      {"--ucx-tls", &f.ucx_tls}})
      if (!value->empty()) fail(std::string("--relay-only opens no data ports: it takes no ") + flag, 2);
    o.ucx.relay_only = true;
  }
}

void run_worker(const WorkerFlags& f) {
  JobWorkerOptions o;
  std::optional<EnvPlace> place;
  if (f.from_env) {
    if (f.rank >= 0) fail("--rank and --from-env both give this worker's rank: choose one", 2);
    auto p = place_from_env([](const char* name) { return std::getenv(name); }, scontrol_hostnames, f.coordinator);
    if (!p.ok()) fail("--from-env: " + p.status().message(), 2);
    place = *p;
    std::printf("--from-env: %s\n", place->describe().c_str());
    std::fflush(stdout);
    if (f.show_place) return;
    o.coordinator = place->coordinator;
  } else {
    if (f.show_place) fail("--show-place shows what --from-env reads: give --from-env", 2);
    if (f.start_coordinator) fail("--start-coordinator needs --from-env (it starts the coordinator at rank 0)", 2);
    if (f.coordinator.empty()) fail("--coordinator tcp://HOST:PORT is required (or --from-env)", 2);
    if (f.coordinator.rfind("tcp://", 0) != 0 || f.coordinator.rfind(':') <= 6)
      fail("--coordinator '" + f.coordinator + "': expected tcp://HOST:PORT", 2);
    o.coordinator = f.coordinator;
  }
  if (!f.coordinator_args.empty() && !f.start_coordinator)
    fail("the arguments after -- are the job flags of --start-coordinator's coordinator: give --start-coordinator", 2);
  set_identity(f, o);
  o.compute_speed = f.compute_speed;
  o.ucx.tls = f.ucx_tls;
  set_data_plane_options(f, o);
  o.allow_list = !f.no_allow_list;
  o.rank = place ? place->rank : f.rank;
  o.connect_timeout = std::chrono::milliseconds(int64_t(f.connect_timeout_s * 1000));
  if (!f.link.empty()) {
    auto shape = parse_link_shape(f.link);
    if (!shape.ok()) fail("--link '" + f.link + "': " + shape.status().message(), 2);
    o.link = *shape;
  }
  if (f.key_stdin && (!f.secret.key_file.empty() || !f.secret.token_file.empty() || !f.secret.token.empty()))
    fail("--key-stdin and --key-file (or --token) both give the job secret: choose one", 2);
  const JobSecret secret = f.key_stdin ? secret_from_stdin() : required_secret(f.secret, "worker");
  o.token = secret.join_proof();
  o.curve = secret.client_curve();
  o.join_timeout = std::chrono::milliseconds(int64_t(f.join_timeout_s * 1000));
  o.receive_timeout = std::chrono::milliseconds(int64_t(f.receive_timeout_s * 1000));
  o.coordinator_timeout = std::chrono::milliseconds(int64_t(f.coordinator_timeout_s * 1000));
  set_log_role("worker " + o.hostname);
  o.on_rank = [host = o.hostname](int rank) {
    // `ps -o comm`, `top` and `pgrep longhaul` then tell the workers of a machine apart.
    name_this_process("longhaul-w" + std::to_string(rank));
    set_log_role("worker " + std::to_string(rank) + " " + host);
  };
  o.on_training = [](bool on) { g_training = on; };
  o.stop_requested = [] { return g_term ? std::string("this worker was sent SIGTERM") : std::string(); };
  struct sigaction sa {};
  sa.sa_handler = on_term;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  const pid_t coordinator = place && f.start_coordinator && place->rank == 0 ? start_coordinator(f, *place) : 0;
  // The coordinator this worker started is watched: one that fails (a bad job flag after --, a port taken) ends
  // this worker too, at once, rather than leaving it to wait for a coordinator that will never answer.
  std::atomic<bool> worker_done{false};
  std::atomic<int> coordinator_code{-1};
  std::thread watch;
  if (coordinator > 0)
    watch = std::thread([&] {
      int st = 0;
      const pid_t none = 0;
      while (waitpid(coordinator, &st, WNOHANG) == none) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
      coordinator_code = code;
      if (code != 0 && !worker_done) {
        std::fprintf(stderr,
                     "longhaul: error: the job's coordinator (pid %d) exited with code %d before the job "
                     "ended; this worker stops\n",
                     int(coordinator), code);
        std::fflush(nullptr);
        std::_Exit(code);
      }
    });
  Status s = run_job_worker(o);
  worker_done = true;
  if (coordinator > 0) {
    // The coordinator ends with the job; a worker that failed tells it to stop first.
    if (!s.ok()) kill(coordinator, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (coordinator_code < 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (coordinator_code < 0) kill(coordinator, SIGKILL);
    watch.join();
    const int code = coordinator_code;
    if (s.ok() && code != 0)
      fail("the job's coordinator (pid " + std::to_string(coordinator) + ") exited with code " + std::to_string(code),
           code);
  }
  if (!s.ok()) fail("worker " + o.hostname + ": " + s.message());
}

RegisterCommand reg("", 40, [](CLI::App& app) {
  auto f = std::make_shared<WorkerFlags>();
  auto* cmd = app.add_subcommand("worker", "join a pipeline job's coordinator and train the stage it assigns");
  cmd->add_option("--coordinator", f->coordinator,
                  "the coordinator's tcp://HOST:PORT (required unless --from-env finds it)");
  cmd->add_flag("--from-env", f->from_env,
                "take this worker's rank, the job's size and the coordinator's address from its launcher: Slurm "
                "(SLURM_PROCID, SLURM_NTASKS, the first host of SLURM_JOB_NODELIST), torchrun (RANK, WORLD_SIZE, "
                "MASTER_ADDR, port MASTER_PORT + 1) or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX, "
                "LH_WORLD_SIZE, LH_SERVICE); LH_COORDINATOR, LH_COORDINATOR_PORT and LH_ENGINE override");
  cmd->add_flag("--show-place", f->show_place, "with --from-env: print the place it found and exit");
  cmd->add_flag("--start-coordinator", f->start_coordinator,
                "with --from-env, at rank 0: start the job's coordinator beside this worker (the job flags follow "
                "--; --workers is the job's size), unless one already listens at the address");
  cmd->add_option("coordinator_args", f->coordinator_args,
                  "after --: the job flags of the coordinator --start-coordinator starts, e.g. -- --pp 4 --steps 100");
  add_secret_flags(cmd, f->secret);
  cmd->add_flag("--key-stdin", f->key_stdin,
                "read the job secret (hex) from the first line of standard input, and stop when standard input closes "
                "(how `launch --hosts` starts workers over ssh)");
  cmd->add_option("--hostname", f->hostname, "name shown by the coordinator (default: host and pid)");
  cmd->add_option("--site", f->site,
                  "the site this worker is at (with --from-env also $LH_SITE): when workers name sites, the "
                  "coordinator gives each site's workers consecutive ranks (pipeline neighbours share a site), ordered "
                  "in a site by the rank each asks for (--rank, or its launcher's)");
  cmd->add_option("--link", f->link, "in-process shaper on this worker's outgoing links: RATE[,DELAY], e.g. 20M,30ms");
  cmd->add_option("--ucx-tls", f->ucx_tls, "UCX transports (default: $UCX_TLS or UCX's choice)");
  cmd->add_option("--rank", f->rank,
                  "ask for this rank, i.e. this place in the grid (keep pipeline neighbours on one site); a rank "
                  "another worker holds is not given, and the worker takes a free one")
      ->check(CLI::Range(0, 4095));
  cmd->add_option("--data-ports", f->data_ports,
                  "LO-HI: the TCP ports the data plane listens on for its peers (one per network interface UCX "
                  "uses), so a firewall can open exactly these; default: any free port (as root with the "
                  "allow-list, 16 free ports between 20000 and 32000)")
      ->type_name("LO-HI");
  cmd->add_option("--advertise", f->advertise,
                  "HOST (DNS name or IPv4 address) peers should connect to for this worker's data, instead of the "
                  "addresses of its interfaces: the worker listens on a port of --data-ports (any free one without "
                  "it) and its peers connect there (UCX client-server mode)")
      ->type_name("HOST");
  cmd->add_option("--data-bind", f->data_bind,
                  "ADDR: the IPv4 address of this host's interface the --advertise listener binds, when the advertised "
                  "address is not this host's own (a forwarded port, NAT); default: the advertised address's interface "
                  "when it is local, else every interface")
      ->type_name("ADDR");
  cmd->add_flag("--relay-only", f->relay_only,
               "open no data port at all (UCX gets no network transport): every pair of this worker goes through the "
               "job's relay, for a worker that must expose nothing (the coordinator must run a relay: no --no-relay)");
  cmd->add_flag("--no-allow-list", f->no_allow_list,
               "as root, the worker lets only the job's members (and this host's loopback) reach its data ports, with "
               "an nftables table of its own; this flag leaves the ports open to every address");
  cmd->add_option("--connect-timeout", f->connect_timeout_s,
                  "seconds the pre-flight waits for a peer's direct connection before the pair goes through the "
                  "relay (or the job ends, with --no-relay)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  cmd->add_option("--compute-speed", f->compute_speed, "GFLOP/s reported for --partition speed (0: unknown)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--join-timeout", f->join_timeout_s, "seconds to wait for the plan and the start")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  cmd->add_option("--receive-timeout", f->receive_timeout_s, "seconds a stage waits for a neighbour's tensor")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  cmd->add_option("--coordinator-timeout", f->coordinator_timeout_s,
                  "seconds to wait for a lost coordinator to come back at the same address (restarted with --resume); "
                  "the job rolls back to its last checkpoint meanwhile (0: stop at once)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 7.0 * 86400));
  cmd->callback([f] { run_worker(*f); });
});

}  // namespace
}  // namespace lh::app
