// The live page through the real binary ($LH_BIN): `launch --http` prints its address, `ctl page-url` its token,
// hostile HTTP clients (slowloris, huge headers, a thousand idle connections, a request flood) leave the job
// completing with no worker lost and the coordinator's descriptors and threads bounded, `report --html` writes the
// page with the job inside, and bad --http values are named. Label `integration`.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <regex>

#include "metrics/metrics_summary.h"
#include "tests/common/http_client.h"
#include "tests/integration/launch_util.h"

namespace lh {
namespace {

// The port of "live page: http://127.0.0.1:PORT/ ..." in a launch's output (0 before it says).
int page_port(const std::string& out) {
  std::smatch m;
  const std::string text = slurp(out);
  return std::regex_search(text, m, std::regex("live page: http://127\\.0\\.0\\.1:([0-9]+)/")) ? std::stoi(m[1]) : 0;
}

// Mean tokens/s over the steps of a metrics file (the slowest worker's per step, as `report` takes it).
double mean_tokens_per_s(const std::string& metrics) {
  auto records = read_step_metrics_file(metrics);
  if (!records.ok()) return 0;
  auto sum = summarize_step_metrics(*records);
  if (!sum.ok() || sum->tokens_per_s.empty()) return 0;
  double total = 0;
  for (const StepPoint& p : sum->tokens_per_s) total += p.value;
  return total / double(sum->tokens_per_s.size());
}

// Hostile clients against `port` until `stop`: slowloris connections that never finish their headers, requests
// with 64 KiB headers, up to a thousand idle connections, and a flood of honest requests for the page's data.
struct Attack {
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  std::atomic<uint64_t> flood_ok{0}, huge_refused{0};
  int idle = 0;
  void start(int port) {
    rlimit r{};
    getrlimit(RLIMIT_NOFILE, &r);
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
    idle = int(std::min<rlim_t>(1000, r.rlim_cur > 200 ? r.rlim_cur - 200 : 0));
    threads.emplace_back([this, port] {  // slowloris
      std::vector<int> fds;
      while (!stop) {
        while (fds.size() < 16) {
          const int fd = connect_to(port);
          if (fd < 0) break;
          (void)!::send(fd, "GET /api/page HTTP/1.1\r\n", 24, MSG_NOSIGNAL);
          fds.push_back(fd);
        }
        for (size_t i = 0; i < fds.size();) {
          if (::send(fds[i], "X-a: b\r\n", 8, MSG_NOSIGNAL) < 0) {  // cut by the server: open another
            ::close(fds[i]);
            fds.erase(fds.begin() + long(i));
          } else {
            ++i;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      }
      for (int fd : fds) ::close(fd);
    });
    threads.emplace_back([this, port] {  // huge headers
      const std::string huge = "X-Filler: " + std::string(64 * 1024, 'a') + "\r\n";
      while (!stop) {
        if (status_of(http_get(port, "/metrics", huge)) != 200) ++huge_refused;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
    threads.emplace_back([this, port] {  // idle connections
      std::vector<int> fds;
      for (int i = 0; i < idle && !stop; ++i) {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fd < 0) break;
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(uint16_t(port));
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        (void)::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
        fds.push_back(fd);
      }
      while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      for (int fd : fds) ::close(fd);
    });
    threads.emplace_back([this, port] {  // a flood of honest requests
      while (!stop)
        if (status_of(http_get(port, "/api/page")) == 200) ++flood_ok;
    });
  }
  void finish() {
    stop = true;
    for (auto& t : threads) t.join();
  }
};

class LivePage : public Launch {};

TEST_F(LivePage, HostileClientsLeaveTheJobAndTheCoordinatorBounded) {
  const int steps = 30;
  const std::vector<std::string> extra = {"--pp", "4", "--link", "2M,2ms", "--http", "127.0.0.1:0"};
  // The same job without visitors first: its step time is the baseline the note compares with.
  const std::string calm_metrics = temp_path("calm.jsonl");
  BinRun calm = run(launch_args(4, steps, calm_metrics, extra), 300s);
  ASSERT_EQ(calm.code, 0) << calm.output;
  EXPECT_NE(calm.output.find("live page: http://127.0.0.1:"), std::string::npos) << calm.output;

  const std::string metrics = temp_path("hostile.jsonl"), out = temp_path("hostile_launch.txt");
  const pid_t launch = spawn(launch_args(4, steps, metrics, extra), out);
  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {
    port = page_port(out);
    if (!port) std::this_thread::sleep_for(50ms);
  }
  ASSERT_GT(port, 0) << slurp(out);
  const std::string proc = "/proc/" + std::to_string(launch);
  const size_t fds0 = dir_entries(proc + "/fd"), threads0 = dir_entries(proc + "/task");
  Attack attack;
  attack.start(port);
  size_t fds_max = fds0, threads_max = threads0;
  int code = -2;
  auto deadline = std::chrono::steady_clock::now() + 300s;
  for (int st = 0;; std::this_thread::sleep_for(100ms)) {
    fds_max = std::max(fds_max, dir_entries(proc + "/fd"));
    threads_max = std::max(threads_max, dir_entries(proc + "/task"));
    if (waitpid(launch, &st, WNOHANG) == launch) {
      code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(launch, SIGKILL);
      waitpid(launch, &st, 0);
      break;
    }
  }
  attack.finish();
  const std::string said = slurp(out);
  ASSERT_EQ(code, 0) << said;
  EXPECT_EQ(said.find("stopped heartbeating"), std::string::npos) << said;
  EXPECT_EQ(losses_of(metrics).size(), size_t(steps));
  // The coordinator's (launch's) descriptors: its HTTP threads' and queue's connections (4 + 16, and one accepted
  // while the queue is full) beyond what it held before, and a few of the job's own that come and go; its threads are
  // the same ones throughout (the workers are other processes). A thousand idle connections would be a thousand.
  EXPECT_LE(fds_max, fds0 + 4 + 16 + 1 + 8) << "descriptors before " << fds0;
  EXPECT_LE(threads_max, threads0 + 1) << "threads before " << threads0;
  EXPECT_GT(attack.huge_refused.load(), 0u);
  const double calm_tps = mean_tokens_per_s(calm_metrics), hostile_tps = mean_tokens_per_s(metrics);
  std::printf(
      "hostile clients (16 slowloris, %d idle connections, 64 KiB headers, a request flood: %llu pages served): "
      "%.0f tokens/s against %.0f without them (%.2fx); the coordinator held at most %zu descriptors (%zu before) "
      "and %zu threads (%zu before)\n",
      attack.idle, static_cast<unsigned long long>(attack.flood_ok.load()), hostile_tps, calm_tps,
      calm_tps > 0 ? hostile_tps / calm_tps : 0.0, fds_max, fds0, threads_max, threads0);
}

TEST_F(LivePage, CtlPrintsThePageAddressWithItsTokenAndReportWritesThePage) {
  const int steps = 40;
  const std::string metrics = temp_path("page_url.jsonl");
  CtlJob job;
  ASSERT_NO_FATAL_FAILURE(
      start_ctl_job(&job, 2, steps, metrics, {"--link", "2M,1ms", "--http", "127.0.0.1:0"}, "page-url", "page_url"));
  BinRun url = run(job.ctl({"page-url"}), 30s);
  ASSERT_EQ(url.code, 0) << url.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(url.output, m, std::regex("http://127\\.0\\.0\\.1:([0-9]+)/#token=([0-9a-f]{48})")))
      << url.output;
  const int port = std::stoi(m[1]);
  const std::string token = m[2];
  EXPECT_EQ(slurp(job.token).find(token), std::string::npos) << "the page token is not the secret";
  EXPECT_EQ(status_of(http_get(port, "/api/page", "Authorization: Bearer " + token + "\r\n")), 200);
  BinRun as_json = run(job.ctl({"--json", "page-url"}), 30s);
  ASSERT_EQ(as_json.code, 0) << as_json.output;
  EXPECT_EQ(nlohmann::json::parse(as_json.output)["token"], token);
  ASSERT_EQ(wait_exit(job.launch, 300s), 0) << slurp(job.out);

  const std::string html = temp_path("report.html");
  BinRun report = run({"report", metrics, "--html", html}, 60s);
  ASSERT_EQ(report.code, 0) << report.output;
  EXPECT_NE(report.output.find("wrote " + html), std::string::npos);
  const std::string page = slurp(html);
  EXPECT_NE(page.find("<script id=\"lh-data\" type=\"application/json\">"), std::string::npos);
  if (!have_command("chromium")) GTEST_SKIP() << "chromium is not installed (scripts/setup.sh installs it)";
  const std::string dom = chromium_dom("file://" + html, 1000);
  if (!chromium_ran(dom)) GTEST_SKIP() << "chromium did not run here: " << dom.substr(0, 2000);
  EXPECT_EQ(dom_attribute(dom, "id=\"lh-state\"", "data-mode"), "report");
  EXPECT_EQ(dom_attribute(dom, "id=\"lh-loss\"", "data-points"), std::to_string(steps));
  EXPECT_NE(dom.find("data-link=\"0-1\" data-dir=\"fwd\" data-codec=\"none\""), std::string::npos)
      << dom.substr(0, 4000);
  const std::string png = ::testing::TempDir() + "lh_report_page.png";
  EXPECT_TRUE(chromium_screenshot("file://" + html, png, 1000));
  std::printf("screenshot of report --html: %s\n", png.c_str());
}

TEST_F(LivePage, BadHttpAddressesAreNamed) {
  struct Case {
    std::string http, says;
  } cases[] = {{"127.0.0.1:99999", "the port '99999' is not a number in 0..65535"},
               {"nowhere:80", "'nowhere' is not an IPv4 address"},
               {"[::1]:80", "IPv6 is not supported"}};
  for (const Case& c : cases) {
    BinRun r = run(launch_args(1, 2, temp_path("bad_http.jsonl"), {"--http", c.http}), 60s);
    EXPECT_NE(r.code, 0) << c.http;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.http << ": " << r.output;
  }
  BinRun page = run(
      {"ctl", "--coordinator", "tcp://127.0.0.1:1", "--key-file", make_key("no_page"), "--timeout", "1", "page-url"},
      30s);
  EXPECT_NE(page.code, 0);
}

}  // namespace
}  // namespace lh
