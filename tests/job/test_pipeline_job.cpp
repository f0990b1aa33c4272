// End-to-end pipeline jobs inside one process: a JobCoordinator and worker threads running
// run_job_worker over real ZeroMQ and UCX (tcp). Losses match the single-process trainer, a live
// set-codec switches both ends of a link at one step, and a silent worker stops the job with its name.
// Label `job`.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zmq.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "core/exec.h"
#include "core/rng.h"
#include "job/job_coordinator.h"
#include "job/job_worker.h"
#include "tests/common/http_client.h"
#include "tests/common/netns_support.h"
#include "tests/common/result_value.h"
#include "transport/control_client.h"

namespace lh {
namespace {

using namespace std::chrono_literals;

std::string corpus() {
  static const std::string path = [] {
    const char* words[] = {"alpha ", "beta ", "gamma ", "delta ", "links ", "are ", "slow. ", "far\n"};
    Rng rng(11);
    std::string text;
    while (text.size() < 100000) text += words[rng.next_u32() % 8];
    std::string p = ::testing::TempDir() + "lh_pipeline_job_corpus_" + std::to_string(getpid()) + ".txt";
    std::ofstream(p) << text;
    return p;
  }();
  return path;
}

JobConfig job(int stages, int steps) {
  JobConfig c;
  c.train.model.layers = 4;
  c.train.model.d_model = 32;
  c.train.model.heads = 2;
  c.train.model.seq = 16;
  c.train.batch = 8;
  c.train.steps = steps;
  c.train.warmup = 1;
  c.train.seed = 21;
  c.train.data = corpus();
  c.workers = c.pp = stages;
  c.microbatches = 4;
  return c;
}

JobCoordinatorOptions coordinator_options() {
  JobCoordinatorOptions o;
  o.control.token = "test-token";
  o.control.heartbeat_interval = 100ms;
  o.control.heartbeat_timeout = 1500ms;
  return o;
}

JobWorkerOptions worker_options(const std::string& endpoint) {
  JobWorkerOptions w;
  w.coordinator = endpoint;
  w.token = "test-token";
  w.ucx.tls = std::getenv("LH_TEST_UCX_TLS") ? std::getenv("LH_TEST_UCX_TLS") : "tcp";
  w.join_timeout = 30s;
  w.receive_timeout = 60s;
  return w;
}

class PipelineJob : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { set_num_threads(1); }
};

TEST_F(PipelineJob, TwoStagesReproduceTheTrainerAndSwitchCodecsLive) {
  const int steps = 8;
  JobConfig cfg = job(2, steps);
  cfg.partition = "speed";  // equal speeds below: the even split, settled by the coordinator
  auto coord = value_of(JobCoordinator::start(cfg, coordinator_options()));
  std::vector<Status> results(2);
  std::vector<std::thread> workers;
  for (int i = 0; i < 2; ++i)
    workers.emplace_back([&, i] {
      JobWorkerOptions w = worker_options(coord->endpoint());
      w.link = value_of(parse_link_shape("4M,2ms"));  // slow enough that a live change lands mid-run
      w.compute_speed = 10;
      results[i] = run_job_worker(w);
    });
  // Once step 1 is reported, switch the activation link to int8.
  int64_t switch_step = -1;
  for (int i = 0; i < 2000 && switch_step < 0; ++i) {
    auto s = value_of(coord->summary());
    if (s.last_step >= 1) {
      auto reply = coord->handle_ctl("set-codec", R"({"link":"0-1","dir":"fwd","spec":"int8"})");
      ASSERT_TRUE(reply.ok()) << reply.status().to_string();
      switch_step = nlohmann::json::parse(*reply)["from_step"].get<int64_t>();
    } else {
      std::this_thread::sleep_for(5ms);
    }
  }
  for (auto& t : workers) t.join();
  for (const Status& s : results) ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_TRUE(coord->wait(30s).ok());
  ASSERT_GT(switch_step, 1);
  ASSERT_LE(switch_step, steps) << "the job finished before the change could apply";

  MetricsSummary sum = value_of(coord->summary());
  ASSERT_EQ(sum.loss.size(), size_t(steps));
  // Before the switch the links carry fp32, so the losses are the trainer's.
  auto trainer = value_of(Trainer::create(cfg.train));
  for (int64_t step = 1; step < switch_step; ++step) {
    const float ref = value_of(trainer->step()).loss;
    EXPECT_NEAR(sum.loss[step - 1].value, ref, 1e-5 * ref) << "step " << step;
  }
  ASSERT_EQ(sum.val_loss.size(), 1u);  // evaluated after the last step (eval_every > steps)
  EXPECT_EQ(sum.val_loss[0].step, steps);
  ASSERT_EQ(sum.codec_switches.size(), 1u);
  EXPECT_EQ(sum.codec_switches[0].step, switch_step);
  EXPECT_EQ(sum.codec_switches[0].from, "none");
  EXPECT_EQ(sum.codec_switches[0].to, "int8");

  std::string status = value_of(coord->handle_ctl("status", "{}"));
  auto js = nlohmann::json::parse(status);
  EXPECT_EQ(js["links"][0]["spec"], "int8");
  EXPECT_EQ(js["partition"], "2,2");
  EXPECT_GT(js["links"][0]["measured_bps"].get<double>(), 0);
  EXPECT_FALSE(coord->handle_ctl("set-codec", R"({"link":"0-2","dir":"fwd","spec":"int8"})").ok());
  EXPECT_FALSE(coord->handle_ctl("set-codec", R"({"link":"0-1","dir":"fwd","spec":"int9"})").ok());
  EXPECT_FALSE(coord->handle_ctl("reboot", "{}").ok());
}

// A bare DEALER speaking the control protocol as a (misbehaving) member would.
struct RawMember {
  void* ctx = zmq_ctx_new();
  void* sock = zmq_socket(ctx, ZMQ_DEALER);
  uint32_t seq = 0;
  explicit RawMember(const std::string& ep) {
    int linger = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_connect(sock, ep.c_str());
  }
  ~RawMember() {
    zmq_close(sock);
    zmq_ctx_term(ctx);
  }
  void send(const ControlMessage& m) {
    const std::vector<uint8_t> b = encode_message(m, seq++);
    zmq_send(sock, b.data(), b.size(), 0);
  }
  template <class T>
  std::optional<T> next() {
    for (int i = 0; i < 200; ++i) {
      zmq_pollitem_t item{sock, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 5000) <= 0) return std::nullopt;
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      zmq_msg_recv(&msg, sock, 0);
      auto* p = static_cast<uint8_t*>(zmq_msg_data(&msg));
      auto d = decode_message(std::vector<uint8_t>(p, p + zmq_msg_size(&msg)));
      zmq_msg_close(&msg);
      if (d.ok())
        if (auto* t = std::get_if<T>(&*d)) return *t;
    }
    return std::nullopt;
  }
};

// A member may park a checkpoint shard only for a step the job checkpoints and only once it has reported that step:
// shards for future steps (written to disk and fsync'd for nothing before) and for other steps are refused, and the
// honest shard still commits.
TEST_F(PipelineJob, ShardsForStepsNotReachedOrNotCheckpointedAreRefused) {
  const std::string dir = ::testing::TempDir() + "lh_pipeline_job_shards_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  JobConfig cfg = job(1, 10);
  cfg.checkpoint_every = 4;
  JobCoordinatorOptions o = coordinator_options();
  o.control.heartbeat_timeout = 10s;
  o.checkpoint_dir = dir;
  auto coord = value_of(JobCoordinator::start(cfg, o));
  RawMember m(coord->endpoint());
  m.send(Join{"test-token", "raw", "cpu", 1, std::vector<uint8_t>(16, 1), -1});
  auto plan = m.next<Plan>();
  ASSERT_TRUE(plan.has_value());
  m.send(Ready{plan->rank});
  ASSERT_TRUE(m.next<Barrier>().has_value());
  const std::vector<uint8_t> bytes(1000, 7);
  auto metrics = [&](int64_t step) {
    m.send(StepMetrics{0, step, "{\"step\":" + std::to_string(step) + ",\"worker\":0}"});
  };
  m.send(ShardSaved{0, 8, bytes});  // a future checkpoint step it has not reported
  metrics(1);
  metrics(2);
  metrics(3);
  m.send(ShardSaved{0, 3, bytes});  // reported, but the job checkpoints every 4 steps
  metrics(4);
  m.send(ShardSaved{0, 4, bytes});  // the honest one
  for (int i = 0; i < 500 && coord->last_checkpoint() < 4; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(coord->last_checkpoint(), 4);
  EXPECT_TRUE(std::filesystem::exists(dir + "/step_00000004/manifest.json"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/step_00000008"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/step_00000003"));
  coord.reset();
  std::filesystem::remove_all(dir);
}

// --tp-split speed: the coordinator gives the faster worker's shard index more heads (speeds as reported by
// `worker --compute-speed`), and the uneven job still reproduces the trainer.
TEST_F(PipelineJob, TensorShardsSplitByReportedSpeed) {
  const int steps = 3;
  JobConfig cfg = job(1, steps);
  cfg.workers = 2;
  cfg.tp = 2;
  cfg.train.model.heads = 4;
  cfg.tp_split = "speed";
  auto coord = value_of(JobCoordinator::start(cfg, coordinator_options()));
  const double speeds[2] = {30, 10};
  int ranks[2] = {-1, -1};
  std::vector<Status> results(2);
  std::vector<std::thread> workers;
  for (int i = 0; i < 2; ++i)
    workers.emplace_back([&, i] {
      JobWorkerOptions w = worker_options(coord->endpoint());
      w.compute_speed = speeds[i];
      w.on_rank = [&ranks, i](int rank) { ranks[i] = rank; };
      results[i] = run_job_worker(w);
    });
  for (auto& t : workers) t.join();
  for (const Status& s : results) ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_TRUE(coord->wait(30s).ok());
  auto js = nlohmann::json::parse(value_of(coord->handle_ctl("status", "{}")));
  EXPECT_EQ(js["job"]["tp_split"], ranks[0] == 0 ? "3:1" : "1:3");  // heads per shard index
  MetricsSummary sum = value_of(coord->summary());
  ASSERT_EQ(sum.loss.size(), size_t(steps));
  auto trainer = value_of(Trainer::create(cfg.train));
  for (int step = 1; step <= steps; ++step) {
    const float ref = value_of(trainer->step()).loss;
    EXPECT_NEAR(sum.loss[step - 1].value, ref, 1e-5 * ref) << "step " << step;
  }
}

// The live page (--http) while a 4-stage job runs, read by headless Chromium: the 3 stage links with codecs and
// savings, a loss curve that gains points, a set-codec that shows; then /metrics, valid exposition (promtool) whose
// byte counters equal the job's metrics, and /api/status equal to ctl status. The screenshot goes to the test's
// temporary folder (its path is printed) for the note.
TEST_F(PipelineJob, TheLivePageShowsTheJobAndMetricsAgreeWithItsFile) {
  const int steps = 60;
  JobConfig cfg = job(4, steps);
  JobCoordinatorOptions o = coordinator_options();
  o.http = "127.0.0.1:0";
  o.metrics_path = ::testing::TempDir() + "lh_live_page_" + std::to_string(getpid()) + ".jsonl";
  std::filesystem::remove(o.metrics_path);
  auto coord = value_of(JobCoordinator::start(cfg, o));
  const std::string url = coord->http_url();
  ASSERT_FALSE(url.empty());
  const int port = coord->http()->port();
  std::vector<Status> results(4);
  std::vector<std::thread> workers;
  for (int i = 0; i < 4; ++i)
    workers.emplace_back([&, i] {
      JobWorkerOptions w = worker_options(coord->endpoint());
      w.link = value_of(parse_link_shape("2M,2ms"));  // a few seconds of job for the browser to watch
      results[i] = run_job_worker(w);
    });
  auto wait_step = [&](int64_t step) {
    for (int i = 0; i < 3000 && coord->newest_step() < step; ++i) std::this_thread::sleep_for(10ms);
  };
  wait_step(2);
  const bool browser = have_command("chromium");
  std::string dom1, dom2;
  int64_t from = -1;
  if (browser) dom1 = chromium_dom(url);
  auto reply = coord->handle_ctl("set-codec", R"({"link":"1-2","dir":"fwd","spec":"int4"})");
  ASSERT_TRUE(reply.ok()) << reply.status().to_string();
  from = nlohmann::json::parse(*reply)["from_step"].get<int64_t>();
  wait_step(from + 1);
  if (browser) {
    dom2 = chromium_dom(url);
    const std::string png = ::testing::TempDir() + "lh_live_page.png";
    if (chromium_ran(dom2)) {
      EXPECT_TRUE(chromium_screenshot(url, png));
      std::printf("screenshot of the live page: %s\n", png.c_str());
    }
  }
  for (auto& t : workers) t.join();
  for (const Status& s : results) ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_TRUE(coord->wait(30s).ok());
  ASSERT_LT(from, steps) << "the job ended before the change applied: the page could not show it";

  if (browser && !(chromium_ran(dom1) && chromium_ran(dom2))) {
    std::printf("chromium did not run here, so the page's rendering was not checked: %s\n",
                dom1.substr(0, 2000).c_str());
  } else if (browser) {
    auto rows = [](const std::string& dom) {
      std::map<std::string, std::pair<std::string, double>> r;  // "0-1:fwd" → codec, saved %
      const std::regex row(
          "class=\"lh-link\" data-link=\"([^\"]+)\" data-dir=\"([^\"]+)\" data-codec=\"([^\"]*)\" "
          "data-saved=\"([^\"]+)\"");
      for (auto it = std::sregex_iterator(dom.begin(), dom.end(), row); it != std::sregex_iterator(); ++it)
        r[(*it)[1].str() + ":" + (*it)[2].str()] = {(*it)[3], std::stod((*it)[4])};
      return r;
    };
    const auto before = rows(dom1), after = rows(dom2);
    ASSERT_EQ(before.size(), 6u) << "3 stage links × fwd, bwd:\n" << dom1.substr(0, 3000);
    for (const char* l : {"0-1", "1-2", "2-3"}) {
      EXPECT_EQ(before.at(std::string(l) + ":fwd").first, "none");
      EXPECT_EQ(before.at(std::string(l) + ":bwd").first, "none");
    }
    ASSERT_EQ(after.size(), 6u);
    EXPECT_EQ(after.at("1-2:fwd").first, "int4") << "the set-codec shows on the page";
    EXPECT_GT(after.at("1-2:fwd").second, 10.0) << "and so do the bytes it saves";
    EXPECT_EQ(after.at("0-1:fwd").first, "none");
    const int p1 = std::stoi("0" + dom_attribute(dom1, "id=\"lh-loss\"", "data-points"));
    const int p2 = std::stoi("0" + dom_attribute(dom2, "id=\"lh-loss\"", "data-points"));
    EXPECT_GE(p1, 1);
    EXPECT_GT(p2, p1) << "the loss curve gains points";
    EXPECT_EQ(dom_attribute(dom2, "id=\"lh-state\"", "data-mode"), "live");
    EXPECT_NE(dom2.find("ctl set-codec"), std::string::npos) << "the switch is in the event list";
  } else {
    std::printf("chromium is not installed (scripts/setup.sh installs it): the page's rendering was not checked\n");
  }

  std::this_thread::sleep_for(1100ms);  // past the endpoint's one-second cache
  const std::string metrics = body_of(http_get(port, "/metrics"));
  ASSERT_FALSE(metrics.empty());
  MetricsSummary sum = value_of(coord->summary());
  uint64_t raw = 0, wire = 0;
  const std::regex sample("^longhaul_link_(raw|wire)_bytes_total\\{[^}]*\\} ([0-9]+)$");
  std::istringstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_match(line, m, sample)) (m[1] == "raw" ? raw : wire) += std::stoull(m[2]);
  }
  EXPECT_EQ(raw, sum.total.raw_bytes) << "/metrics' raw byte counters against the metrics file's";
  EXPECT_EQ(wire, sum.total.wire_bytes);
  EXPECT_NE(metrics.find("longhaul_link_codec_info{link=\"1-2\",dir=\"fwd\",codec=\"int4\"} 1"), std::string::npos);
  EXPECT_NE(metrics.find("longhaul_step " + std::to_string(steps) + "\n"), std::string::npos);
  EXPECT_NE(metrics.find("longhaul_workers_lost_total 0\n"), std::string::npos);
  const std::string file = ::testing::TempDir() + "lh_live_page_metrics_" + std::to_string(getpid()) + ".txt";
  std::ofstream(file) << metrics;
  int code = 1;
  // The format as Prometheus reads it (python3-prometheus-client's parser) and its naming conventions.
  std::string said = run_capture("/usr/bin/python3 " + source_script("check_prometheus.py") + " < " + file, &code);
  EXPECT_EQ(code, 0) << "scripts/check_prometheus.py: " << said;
  EXPECT_EQ(said.rfind("ok: ", 0), 0u) << said;
  if (have_command("promtool")) {  // Prometheus' own lint, where it is installed
    said = run_capture("promtool check metrics < " + file, &code);
    EXPECT_EQ(code, 0) << "promtool check metrics: " << said;
    EXPECT_EQ(said, "") << "promtool's lint";
  }
  std::filesystem::remove(file);
  const auto status = nlohmann::json::parse(body_of(http_get(port, "/api/status")), nullptr, false);
  ASSERT_TRUE(status.is_object());
  const auto ctl = nlohmann::json::parse(value_of(coord->handle_ctl("status", "")));
  EXPECT_EQ(status["links"], ctl["links"]);
  EXPECT_EQ(status["step"], ctl["step"]);
  EXPECT_EQ(status["http"], url);
  coord.reset();
  std::filesystem::remove(o.metrics_path);
}

// Bound beyond loopback, the coordinator's data needs the page token (the page itself carries none).
TEST_F(PipelineJob, ThePageBeyondLoopbackNeedsItsToken) {
  JobCoordinatorOptions o = coordinator_options();
  o.http = "0.0.0.0:0";
  o.http_token = "page-token-for-the-test";
  auto coord = value_of(JobCoordinator::start(job(2, 2), o));
  const int port = coord->http()->port();
  EXPECT_EQ(status_of(http_get(port, "/")), 200);
  for (const char* path : {"/metrics", "/api/status", "/api/page"}) {
    EXPECT_EQ(status_of(http_get(port, path)), 401) << path;
    EXPECT_EQ(status_of(http_get(port, path, "Authorization: Bearer page-token-for-the-test\r\n")), 200) << path;
  }
  EXPECT_EQ(status_of(http_get(port, "/etc/passwd")), 404);
  o.http_token.clear();
  auto refused = JobCoordinator::start(job(2, 2), o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("needs the job's page token"), std::string::npos);
}

TEST_F(PipelineJob, ASilentWorkerStopsTheJobNamingIt) {
  JobConfig cfg = job(2, 50);
  auto coord = value_of(JobCoordinator::start(cfg, coordinator_options()));
  Status real;
  std::thread worker([&] { real = run_job_worker(worker_options(coord->endpoint())); });
  // The other "worker" joins and then falls silent, as a crashed machine would.
  UcxOptions uo;
  uo.tls = std::getenv("LH_TEST_UCX_TLS") ? std::getenv("LH_TEST_UCX_TLS") : "tcp";
  auto plane = value_of(UcxDataPlane::create(uo));
  ControlClientOptions co;
  co.coordinator = coord->endpoint();
  co.token = "test-token";
  auto cc = value_of(ControlClient::connect(co));
  const auto& key = plane->data_public_key();
  Plan plan = value_of(cc->join(plane->address(), 30s, -1, Bytes(key.begin(), key.end()), local_ciphers()));
  ASSERT_TRUE(cc->ready(30s).ok());
  // Steps outside the job are refused before they reach the metrics (they would move the job's newest step).
  for (int64_t step : {int64_t(0), int64_t(999)})
    cc->send_metrics(step, R"({"step":)" + std::to_string(step) + R"(,"worker":)" + std::to_string(plan.rank) +
                               R"(,"tokens_per_s":1})");
  std::this_thread::sleep_for(300ms);
  cc->stop_heartbeats_for_test();
  worker.join();
  EXPECT_LT(coord->newest_step(), 50) << "a step outside the job was recorded";
  ASSERT_FALSE(real.ok());
  const std::string who = "worker " + std::to_string(plan.rank);
  EXPECT_NE(real.message().find(who), std::string::npos) << real.message();
  Status job_status = coord->wait(30s);
  ASSERT_FALSE(job_status.ok());
  EXPECT_NE(job_status.message().find(who + " "), std::string::npos) << job_status.message();
  EXPECT_NE(job_status.message().find("stopped heartbeating"), std::string::npos) << job_status.message();
}

}  // namespace
}  // namespace lh
