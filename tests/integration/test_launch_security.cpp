// Multi-process pipeline jobs through the real binary ($LH_BIN), split by topic from test_launch.cpp (the Launch
// fixture and helpers: tests/integration/launch_util.h). This file: the job secret (a fresh one without a key file, a
// readable one refused), forged, misattributed and replayed packets dropped, a flood of garbage that does not stop the
// job, a stranger in the site kept off the data ports, and `bench link` measuring packet authentication.
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

// `launch` without --key-file (as the README runs it in a checkout) makes a fresh secret next to its metrics, 0600,
// and another launch elsewhere makes another: no secret comes with the repository (it ignores *.key). A key file
// others can read is refused, naming chmod 600, whether given or found next to the metrics.
TEST_F(Launch, WithoutAKeyFileLaunchMakesAFreshSecretAndRefusesAReadableOne) {
  const std::string a = temp_path("fresh_a.jsonl"), b = temp_path("fresh_b.jsonl");
  const std::string key_a = a.substr(0, a.size() - 6) + ".key", key_b = b.substr(0, b.size() - 6) + ".key";
  ::unlink(key_a.c_str());
  ::unlink(key_b.c_str());
  BinRun first = run(launch_args(1, 2, a));
  ASSERT_EQ(first.code, 0) << first.output;
  BinRun second = run(launch_args(1, 2, b));
  ASSERT_EQ(second.code, 0) << second.output;
  struct stat st {};
  ASSERT_EQ(::stat(key_a.c_str(), &st), 0) << first.output;
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const std::string secret_a = slurp(key_a).substr(0, 64), secret_b = slurp(key_b).substr(0, 64);
  EXPECT_EQ(secret_a.find_first_not_of("0123456789abcdef"), std::string::npos) << secret_a;
  EXPECT_EQ(secret_a.size(), 64u);
  EXPECT_NE(secret_a, secret_b);
  EXPECT_EQ(first.output.find(secret_a), std::string::npos) << "launch printed the secret";
  ASSERT_EQ(::chmod(key_a.c_str(), 0644), 0);
  BinRun found = run(launch_args(1, 2, a));
  EXPECT_EQ(found.code, 2) << found.output;
  EXPECT_NE(found.output.find("other users of this machine can read or change the job secret (mode 644); chmod 600 '" +
                              key_a + "'"),
            std::string::npos)
      << found.output;
  BinRun given = run(launch_args(1, 2, b, {"--key-file", key_a}));
  EXPECT_EQ(given.code, 2) << given.output;
  EXPECT_NE(given.output.find("--key-file '" + key_a + "': other users"), std::string::npos) << given.output;
  ASSERT_EQ(::chmod(key_a.c_str(), 0400), 0);  // as a Kubernetes Secret with defaultMode: 0400
  BinRun readonly = run(launch_args(1, 2, a));
  EXPECT_EQ(readonly.code, 0) << readonly.output;
  EXPECT_EQ(slurp(key_a).substr(0, 64), secret_a) << "the key next to the metrics is reused";
}

// Authenticated data plane, in a real job: before step 4's first activation each sending stage also sends what an
// attacker would (LH_FAULT_FORGE: that packet altered, the same packet claiming another member's rank, and step
// 3's first activation again). Every receiving worker drops and counts all three, and the job, with encrypted
// packets, trains exactly as a job with plain authenticated packets and no attacker.
TEST_F(Launch, ForgedMisattributedAndReplayedPacketsAreDroppedAndChangeNothing) {
  const int steps = 8;
  const std::vector<std::string> extra = {"--pp", "3", "--restarts", "0"};
  const std::string straight = temp_path("forge_straight.jsonl"), metrics = temp_path("forge.jsonl");
  BinRun ref = run(launch_args(3, steps, straight, extra), 300s);
  ASSERT_EQ(ref.code, 0) << ref.output;
  std::vector<std::string> forged = extra;
  forged.push_back("--encrypt-data");
  setenv("LH_FAULT_FORGE", "4", 1);  // inherited by launch's workers
  BinRun attacked = run(launch_args(3, steps, metrics, forged), 300s);
  unsetenv("LH_FAULT_FORGE");
  ASSERT_EQ(attacked.code, 0) << attacked.output;
  EXPECT_NE(attacked.output.find("fault injection: sent a forged, a misattributed and a replayed packet"),
            std::string::npos)
      << attacked.output;
  EXPECT_NE(attacked.output.find("AES-256-GCM tag does not verify"), std::string::npos) << attacked.output;
  EXPECT_NE(attacked.output.find("a replay"), std::string::npos) << attacked.output;
  expect_same_losses(losses_of(metrics), losses_of(straight), steps);
  // What each worker's data plane refused, from its last report.
  std::map<int, uint64_t> refused, refused_ref;
  auto collect = [](const std::string& path, std::map<int, uint64_t>& out) {
    auto records = read_step_metrics_file(path);
    ASSERT_TRUE(records.ok()) << records.status().to_string();
    for (const WorkerStepMetrics& m : *records) {
      ASSERT_TRUE(m.auth_failures.has_value()) << "worker " << m.worker << " step " << m.step;
      out[m.worker] = std::max(out[m.worker], *m.auth_failures);
    }
  };
  collect(metrics, refused);
  collect(straight, refused_ref);
  EXPECT_EQ(refused[0], 0u);
  EXPECT_EQ(refused[1], 3u);
  EXPECT_EQ(refused[2], 3u);
  for (const auto& [w, n] : refused_ref) EXPECT_EQ(n, 0u) << "worker " << w << " without an attacker";
}

// A raw ZeroMQ client floods the coordinator of a running job with malformed messages and never reads the rejections:
// the job completes and no worker is declared dead (the flooder is cut off, the workers' messages flow). The
// message count is LH_FLOOD_MESSAGES (default 20000; scripts/resilience_check.sh sends 100000).
TEST_F(Launch, AFloodOfGarbageFromAPeerThatNeverReadsDoesNotStopTheJob) {
  const int steps = 30;
  const char* env = std::getenv("LH_FLOOD_MESSAGES");
  const int count = env ? std::atoi(env) : 20000;
  // The flooder holds the job secret (a member gone bad): strangers do not get past the CURVE handshake at all.
  const std::string key = make_key("flood");
  std::vector<std::string> extra = {"--heartbeat-timeout", "2", "--link", "8M,1ms", "--key-file", key};
  auto timed_run = [&](const std::string& name, bool flood) {
    const std::string metrics = temp_path(name + ".jsonl"), out = temp_path(name + ".txt");
    const auto t0 = std::chrono::steady_clock::now();
    pid_t launch = spawn(launch_args(2, steps, metrics, extra), out);
    std::string ep = wait_for_line(out, "coordinator ", 60s);
    ep = ep.substr(0, ep.find(' '));
    EXPECT_FALSE(ep.empty()) << slurp(out);
    int sent = 0, code = -2;
    if (flood && !ep.empty()) {
      void* ctx = zmq_ctx_new();
      void* sock = zmq_socket(ctx, ZMQ_DEALER);
      int hwm = 0, small = 1, linger = 0;  // send without limit, read nothing
      zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
      zmq_setsockopt(sock, ZMQ_RCVHWM, &small, sizeof(small));
      zmq_setsockopt(sock, ZMQ_RCVBUF, &small, sizeof(small));
      zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
      auto secret = JobSecret::load(key, "key");
      EXPECT_TRUE(secret.ok());
      const ZmqLoop::Curve curve = secret->client_curve();
      zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, curve.server_key.c_str(), 41);
      zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, curve.public_key.c_str(), 41);
      zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, curve.secret_key.c_str(), 41);
      EXPECT_EQ(zmq_connect(sock, ep.c_str()), 0);
      for (int i = 0; i < 1200 && newest_loss_step(metrics) == 0; ++i) std::this_thread::sleep_for(25ms);
      std::vector<uint8_t> msg(64);
      for (int i = 0; i < count; ++i) {
        // Half look like control messages (magic, version, a type) with a body that does not decode.
        for (size_t b = 0; b < msg.size(); ++b) msg[b] = uint8_t((i * 131 + int(b) * 7) & 0xff);
        if (i % 2 == 0) {
          const uint32_t magic = kControlMagic;
          const uint16_t version = kProtocolVersion, type = uint16_t(1 + i % 14);
          std::memcpy(msg.data(), &magic, 4);
          std::memcpy(msg.data() + 4, &version, 2);
          std::memcpy(msg.data() + 6, &type, 2);
        }
        if (zmq_send(sock, msg.data(), msg.size(), 0) == int(msg.size())) ++sent;
      }
      code = wait_exit(launch, 300s);  // the flooder stays connected, unread, until the job is over
      zmq_close(sock);
      zmq_ctx_term(ctx);
    }
    if (code == -2) code = wait_exit(launch, 300s);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string text = slurp(out);
    EXPECT_EQ(code, 0) << text;
    EXPECT_EQ(text.find("declared dead"), std::string::npos) << text;
    EXPECT_EQ(losses_of(metrics).size(), size_t(steps)) << text;
    if (flood) {
      EXPECT_EQ(sent, count);
      EXPECT_NE(text.find("rejected so far"), std::string::npos) << text;
    }
    return seconds;
  };
  const double quiet = timed_run("quiet", false), flooded = timed_run("flooded", true);
  std::printf("flood of %d malformed messages: job %.2f s, without it %.2f s (%.2fx)\n", count, flooded, quiet,
              flooded / quiet);
}

// The TCP ports listening in network namespace `ns` (ss), sorted.
std::vector<int> ports_listening_in(const std::string& ns) {
  std::vector<int> ports;
  FILE* p = popen(("ip netns exec " + ns + " ss -ltnH 2>/dev/null").c_str(), "r");
  if (!p) return ports;
  char line[512];
  while (fgets(line, sizeof(line), p)) {
    std::istringstream f(line);
    std::string state, recvq, sendq, local;
    f >> state >> recvq >> sendq >> local;
    const size_t colon = local.rfind(':');
    if (colon != std::string::npos) ports.push_back(std::atoi(local.c_str() + colon + 1));
  }
  pclose(p);
  std::sort(ports.begin(), ports.end());
  return ports;
}

// Issue 37, item 3: a stranger inside a job's site (the site router's address, no member's) sends raw garbage, holds
// half-open connections and trickles bytes into every data port of both workers for as long as the job runs. As root
// the workers' allow-lists drop its packets before UCX sees a byte: it never connects, no worker crashes or piles up
// descriptors, and the job's losses are those of the same job on loopback.
TEST_F(Launch, AStrangerInTheSiteCannotReachTheDataPortsAsRoot) {
  if (std::string why = nat_unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  if (Status ok = DataPortAllowList::available(); !ok.ok()) GTEST_SKIP() << ok.message();
  const int steps = 20;
  const std::string base = temp_path("stranger_base.jsonl"), metrics = temp_path("stranger.jsonl");
  ASSERT_EQ(run(launch_args(2, steps, base), 180s).code, 0);
  std::vector<std::string> args = launch_args(2, steps, metrics, {"--nat-sites", "1"});
  args[1] = "info";  // --log-level: the workers' allow-list lines
  const std::string out = temp_path("stranger.txt");
  const pid_t launch = spawn(args, out);
  const int id = int(launch % 100000);
  const std::string prefix = "lhn" + std::to_string(id), lan = "10." + std::to_string(217 + id % 30) + ".0.";
  const std::vector<std::string> hosts = {prefix + "s0h0", prefix + "s0h1"};
  // The workers' data ports, once both listen.
  std::vector<std::pair<std::string, int>> targets;
  for (int i = 0; i < 600 && targets.empty(); ++i) {
    std::vector<std::pair<std::string, int>> found;
    bool both = true;
    for (size_t h = 0; h < hosts.size(); ++h) {
      auto ports = ports_listening_in(hosts[h]);
      both = both && !ports.empty();
      for (int port : ports) found.push_back({lan + std::to_string(h + 1), port});
    }
    if (both)
      targets = found;
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(targets.empty()) << slurp(out);
  // The stranger: in the site's router namespace (on the LAN, not a member), until killed; after each round it
  // writes "ROUNDS CONNECTED" to the pipe.
  int counts[2];
  ASSERT_EQ(pipe(counts), 0);
  const pid_t stranger = fork();
  if (stranger == 0) {
    close(counts[0]);
    const int netns = open(("/var/run/netns/" + prefix + "r0").c_str(), O_RDONLY);
    if (netns < 0 || setns(netns, CLONE_NEWNET) != 0) _exit(3);
    std::vector<int> held;  // half-open and slow connections it keeps
    uint64_t rounds = 0, connected = 0;
    char garbage[4096];
    for (size_t i = 0; i < sizeof(garbage); ++i) garbage[i] = char(i * 131 + 7);
    for (;;) {
      for (const auto& [ip, port] : targets) {
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(uint16_t(port));
        inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
        connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
        pollfd p{fd, POLLOUT, 0};
        int err = 1;
        socklen_t len = sizeof(err);
        if (poll(&p, 1, 50) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
          ++connected;
          (void)!write(fd, garbage, sizeof(garbage));
        }
        if (held.size() < 64)
          held.push_back(fd);  // half-open: never closed
        else
          close(fd);
      }
      for (int fd : held) (void)!write(fd, garbage, 1);  // slow: a byte a round
      ++rounds;
      const std::string line = std::to_string(rounds) + " " + std::to_string(connected) + "\n";
      (void)!write(counts[1], line.data(), line.size());
    }
  }
  close(counts[1]);
  fcntl(counts[0], F_SETFL, O_NONBLOCK);
  // The workers' descriptors while it runs.
  size_t most_fds = 0;
  std::vector<pid_t> worker_pids;
  int code = -1;
  for (int i = 0; i < 3600; ++i) {
    int status = 0;
    if (waitpid(launch, &status, WNOHANG) == launch) {
      code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    for (const std::string& h : hosts) {
      FILE* p = popen(("ip netns pids " + h + " 2>/dev/null").c_str(), "r");
      if (!p) continue;
      for (int pid = 0; fscanf(p, "%d", &pid) == 1;) {
        std::error_code ec;
        size_t n = 0;
        for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
             !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
          ++n;
        most_fds = std::max(most_fds, n);
      }
      pclose(p);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(stranger, SIGKILL);
  waitpid(stranger, nullptr, 0);
  std::string said;
  char buf[4096];
  for (ssize_t n; (n = read(counts[0], buf, sizeof(buf))) > 0;) said.append(buf, size_t(n));
  close(counts[0]);
  const std::string output = slurp(out);
  ASSERT_EQ(code, 0) << output;
  std::istringstream last(
      said.substr(said.rfind('\n', said.size() - 2) == std::string::npos ? 0 : said.rfind('\n', said.size() - 2) + 1));
  uint64_t rounds = 0, connected = 0;
  last >> rounds >> connected;
  EXPECT_GE(rounds, 2u) << "the stranger hardly ran: the check below proves little\n" << said;
  std::string ports;
  for (const auto& [ip, port] : targets) ports += " " + ip + ":" + std::to_string(port);
  EXPECT_EQ(connected, 0u) << "the stranger reached a data port " << connected << " times (ports" << ports << ")\n"
                           << output;
  EXPECT_NE(output.find("allow-list: data ports"), std::string::npos) << output;
  EXPECT_GT(most_fds, 0u);
  EXPECT_LT(most_fds, 200u) << "a worker's descriptors piled up";
  expect_same_losses(losses_of(metrics), losses_of(base), steps);
  std::printf("stranger: %llu rounds against %zu ports, %llu connected; the workers' most descriptors: %zu\n",
              (unsigned long long)rounds, targets.size(), (unsigned long long)connected, most_fds);
}

// `bench link` prints what authenticating or encrypting each packet costs beside memcpy in the same run (the
// security issue's figures); here only that every row is there and measured, never how fast it is.
TEST_F(Launch, BenchLinkMeasuresPacketAuthentication) {
  BinRun b = run({"bench", "link", "--json", "--total", "4194304", "--repeats", "1", "--pings", "20", "--no-netns",
                  "--job-steps", "4", "--job-repeats", "1"},
                 300s);
  ASSERT_EQ(b.code, 0) << b.output;
  const auto j = nlohmann::json::parse(b.output.substr(b.output.rfind("{\"bench\"")));
  const auto& rows = j.at("crypto").at("rows");
  std::set<std::string> names;
  for (const auto& r : rows) {
    names.insert(r.at("name").get<std::string>());
    EXPECT_GT(r.at("Bps").get<double>(), 0) << r.dump();
    EXPECT_GT(r.at("core_share_1gbit").get<double>(), 0) << r.dump();
  }
  for (const char* want : {"memcpy", "mac poly1305 seal", "mac poly1305 open", "aead chacha20-poly1305 seal"})
    EXPECT_TRUE(names.count(want)) << want << " missing from " << rows.dump();
  // The same job with each packet protection, side by side.
  std::set<std::string> modes;
  for (const auto& r : j.at("job").at("rows")) {
    modes.insert(r.at("protection").get<std::string>());
    EXPECT_GT(r.at("tokens_per_s").get<double>(), 0) << r.dump();
  }
  EXPECT_EQ(modes, (std::set<std::string>{"none", "mac", "aead"}));
}

}  // namespace
}  // namespace lh
