// Multi-process pipeline jobs through the real binary ($LH_BIN), split by topic from test_launch.cpp (the Launch
// fixture and helpers: tests/integration/launch_util.h). This file: bad flags are named, one declaration of the model
// flags serves every command, and `demo` shows the links, their savings and a live switch.
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

TEST_F(Launch, BadFlagsAreNamed) {
  struct Case {
    std::vector<std::string> args;
    std::string names;
  };
  const std::vector<Case> cases = {
      {{"launch", "--workers", "2", "--schedule", "zigzag"}, "--schedule"},
      {{"launch", "--tp", "2", "--heads", "2", "--schedule", "eager"}, "--schedule eager with --tp 2"},
      {{"launch", "--dp", "2", "--schedule", "async"}, "--schedule async with --dp"},
      {{"launch", "--workers", "2", "--schedule", "async:predict", "--checkpoint-dir", "/tmp/x"},
       "--schedule async:predict with --checkpoint-dir"},
      {{"launch", "--workers", "2", "--schedule", "async", "--subspace-k", "8"}, "--schedule async with --subspace-k"},
      {{"launch", "--workers", "2", "--compress-fwd", "int9"}, "int9"},
      {{"launch", "--workers", "2", "--compress-bwd", "preset:fastest"}, "unknown preset 'fastest'"},
      {{"launch", "--workers", "2", "--compression", "fast"}, "--compression 'fast'"},
      {{"launch", "--workers", "2", "--compression", "safe", "--compress-fwd", "int8"}, "sets --compress-fwd itself"},
      {{"launch", "--workers", "2", "--compression", "frontier", "--subspace-k", "8"}, "sets --subspace-k itself"},
      {{"launch", "--workers", "2", "--link", "fast"}, "--link"},
      {{"launch", "--workers", "2", "--pp", "3"}, "--workers"},
      {{"launch", "--workers", "2", "--encrypt-data", "--no-data-auth"}, "--no-data-auth"},
      {{"launch", "--workers", "8", "--layers", "4"}, "--pp"},
      {{"launch", "--workers", "2", "--batch", "6", "--microbatches", "4"}, "--microbatches"},
      {{"launch", "--workers", "2", "--link", "1M", "--netns", "1M"}, "--netns"},
      {{"launch", "--workers", "2", "--site-rate", "100M"}, "--site-rate needs --nat-sites"},
      {{"launch", "--workers", "2", "--nat-sites", "3"}, "--nat-sites 3: more sites than the job's 2 workers"},
      {{"launch", "--workers", "2", "--nat-sites", "1", "--netns", "1M"}, "--nat-sites and --netns exclude"},
      {{"launch", "--workers", "2", "--relay-port", "70000"}, "--relay-port"},
      {{"launch", "--workers", "2", "--relay", "tcp://h:1", "--no-relay"}, "--relay excludes --no-relay"},
      {{"launch", "--workers", "2", "--relay-key-file", "/nonexistent/r.key"},
       "--relay-key-file is for a relay run elsewhere"},
      {{"launch", "--workers", "2", "--relay", "tcp://127.0.0.1:9", "--relay-key-file", "/nonexistent/r.key"},
       "--relay-key-file '/nonexistent/r.key': cannot open it"},
      {{"worker", "--coordinator", "tcp://127.0.0.1:9", "--data-ports", "9-1"},
       "--data-ports '9-1': the range is empty"},
      {{"worker", "--coordinator", "tcp://127.0.0.1:9", "--data-ports", "40000"},
       "--data-ports '40000': expected LO-HI"},
      {{"worker", "--coordinator", "tcp://127.0.0.1:9", "--rank", "5000"}, "--rank"},
      {{"worker", "--coordinator", "tcp://127.0.0.1:9", "--connect-timeout", "0"}, "--connect-timeout"},
      {{"launch", "--workers", "2", "--model", "huge"}, "--model"},
      {{"launch", "--workers", "2", "--data", "/nonexistent/x.txt"}, "--data"},
      {{"launch", "--steps", "3"}, "--workers"},
      {{"launch", "--workers", "2", "--dp", "0"}, "--dp"},
      {{"launch", "--workers", "2", "--dp", "2", "--sync", "sometimes"}, "--sync 'sometimes': unknown kind"},
      {{"launch", "--workers", "2", "--dp", "2", "--sync", "diloco:H=0"}, "H must be an integer >= 1"},
      {{"launch", "--workers", "2", "--dp", "2", "--sync", "delayed:D=0"}, "D must be an integer in 1..8"},
      {{"launch", "--workers", "2", "--dp", "2", "--sync", "delayed", "--compress-grad", "powersgd:rank=4"},
       "--sync delayed does not wait for"},
      {{"launch", "--workers", "3", "--pp", "2", "--dp", "2"}, "--workers 3 must equal"},
      {{"launch", "--workers", "3", "--dp", "3", "--batch", "8"}, "--dp 3"},
      {{"launch", "--workers", "2", "--dp", "2", "--compress-grad", "int9"}, "--compress-grad"},
      {{"launch", "--workers", "2", "--dp", "2", "--compress-grad", "lowrank:rank=4"}, "'lowrank' cannot compress"},
      {{"launch", "--tp", "3", "--heads", "4"},
       "--tp 3 does not divide the model's 4 heads; give the shards whole "
       "heads with --tp-split 2:1:1"},
      {{"launch", "--tp", "2", "--tp-split", "3:1:1"}, "--tp-split 3:1:1 has 3 parts but --tp is 2"},
      {{"launch", "--tp", "2", "--heads", "6", "--d-model", "96", "--tp-split", "3:1"},
       "heads must divide: use --tp-split"},
      {{"launch", "--tp", "2", "--compress-tp", "int9"}, "--compress-tp 'int9'"},
      {{"launch", "--tp", "2", "--subspace-k", "8"}, "tensor parallelism does not support a subspace model"},
      {{"launch", "--workers", "2", "--tp-split", "1:1"}, "--tp-split 1:1 needs --tp > 1"},
      {{"coordinator", "--workers", "2", "--listen", "udp://x"}, "--listen"},
      {{"worker", "--coordinator", "localhost"}, "--coordinator"},
      {{"worker", "--coordinator", "tcp://127.0.0.1:1", "--link", "x"}, "--link"},
      {{"ctl", "--coordinator", "tcp://127.0.0.1:1", "set-codec", "--link", "0-1", "--dir", "up", "int8"}, "--dir"},
      {{"ctl", "--coordinator", "nowhere", "status"}, "--coordinator"},
      {{"launch", "--workers", "2", "--resume"}, "--resume needs --checkpoint-dir"},
      {{"launch", "--workers", "2", "--checkpoint-every", "5"}, "--checkpoint-every needs --checkpoint-dir"},
      {{"launch", "--workers", "2", "--checkpoint-dir", "/tmp/x", "--checkpoint-every", "0"}, "--checkpoint-every"},
      {{"launch", "--workers", "2", "--checkpoint-dir", "/tmp/x", "--keep-checkpoints", "0"}, "--keep-checkpoints"},
      {{"launch", "--workers", "2", "--restarts", "-1"}, "--restarts"},
      {{"launch", "--workers", "2", "--replace-timeout", "-5"}, "--replace-timeout"},
      {{"launch", "--workers", "2", "--elastic"}, "--elastic: the job has one replica"},
      {{"launch", "--dp", "2", "--elastic", "--replace-timeout", "0"}, "--elastic needs --replace-timeout > 0"},
      {{"bench", "codecs", "--isa", "sse9", "--sizes", "1024", "--specs", "int8"},
       "--isa sse9: unknown CPU instruction set 'sse9'"},
  };
  for (const Case& c : cases) {
    BinRun r = run(c.args, 60s);
    std::string cmd;
    for (auto& a : c.args) cmd += a + " ";
    EXPECT_NE(r.code, 0) << cmd;
    EXPECT_NE(r.output.find(c.names), std::string::npos) << cmd << "\n" << r.output;
  }
  if (geteuid() != 0) {
    BinRun r = run({"launch", "--workers", "2", "--netns", "20M"}, 60s);
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.output.find("--netns needs root"), std::string::npos) << r.output;
  }
}

// The flag names listed under "Model and training" in `longhaul <command> --help`.
std::set<std::string> model_flags_in_help(const std::string& command) {
  BinRun r = run({command, "--help"}, 30s);
  EXPECT_EQ(r.code, 0) << r.output;
  std::set<std::string> flags;
  std::istringstream in(r.output);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Model and training", 0) == 0) {
      inside = true;
      continue;
    }
    if (!inside) continue;
    if (line.find_first_not_of(' ') == std::string::npos) break;
    std::istringstream words(line);
    std::string w;
    words >> w;
    if (w.rfind("--", 0) == 0) flags.insert(w);
  }
  return flags;
}

TEST_F(Launch, OneDeclarationOfTheModelFlagsServesEveryCommand) {
  const std::set<std::string> train = model_flags_in_help("train");
  EXPECT_GE(train.size(), 15u);
  for (const char* f :
       {"--data", "--model", "--layers", "--subspace-k", "--steps", "--batch", "--seed", "--eval-every"})
    EXPECT_EQ(train.count(f), 1u) << f;
  for (const char* cmd : {"launch", "coordinator", "demo"}) EXPECT_EQ(model_flags_in_help(cmd), train) << cmd;
}

TEST_F(Launch, DemoShowsTheLinksTheirSavingsAndALiveSwitch) {
  const std::string metrics = temp_path("demo.jsonl"), png = temp_path("demo.png");
  // 20 ms links make a step last at least 6 one-way delays, so the switch after step 3 (scheduled ahead
  // of every worker) lands well before step 16 even on a loaded machine.
  std::vector<std::string> args = {
      "--log-level", "warn",      "demo",        "--metrics", metrics,  "--png",    png,
      "--steps",     "16",        "--switch-at", "3",         "--link", "50M,20ms", "--worker-threads",
      "1",           "--ucx-tls", "tcp"};
  for (const char* f : {"--layers", "4", "--d-model", "32", "--heads", "2", "--seq", "16", "--batch", "8"})
    args.push_back(f);
  BinRun r = run(args, 300s);
  ASSERT_EQ(r.code, 0) << r.output;
  // Four stages: three links each way, each with its own row, the forward ones switched live.
  for (const char* row : {"0→1", "1→2", "2→3", "1→0", "2→1", "3→2"})
    EXPECT_NE(r.output.find(row), std::string::npos) << row;
  EXPECT_NE(r.output.find("int8→int4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fewer bytes"), std::string::npos) << r.output;
  auto records = read_step_metrics_file(metrics);
  ASSERT_TRUE(records.ok()) << records.status().to_string();
  auto sum = summarize_step_metrics(*records);
  ASSERT_TRUE(sum.ok());
  ASSERT_EQ(sum->codec_switches.size(), 3u);  // 0-1, 1-2, 2-3 forward
  for (const CodecSwitch& c : sum->codec_switches) {
    EXPECT_EQ(c.from, "int8");
    EXPECT_EQ(c.to, "int4");
    EXPECT_GT(c.step, 3);
    EXPECT_LE(c.step, 16);
  }
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    EXPECT_NE(r.output.find("plot: " + png), std::string::npos) << r.output;
    EXPECT_GT(slurp(png).size(), 1000u);
  }
  BinRun bad = run({"demo", "--switch-to", "int9"}, 30s);
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--switch-to"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("int9"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace lh
