// Tests of metrics/step_trace.{h,cpp}, the LH_TRACE timeline: off without a directory, one Chrome trace event
// ("ph":"X", microseconds on the steady clock, pid = rank) per span into DIR/trace.rank<R>.jsonl, the file truncated
// on open, a directory that cannot be written named in the error, TraceScope timing a scope, and a moved trace
// keeping one owner of its file. Label `metrics`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "metrics/step_trace.h"

namespace lh {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class StepTraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "lh_step_trace_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> lines_of(const std::string& path) const {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
  std::string dir_;
};

long long micros(StepTrace::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

TEST_F(StepTraceTest, WithoutADirectoryItIsOffAndWritesNothing) {
  auto t = StepTrace::open("", 2);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_FALSE(t->on());
  auto now = StepTrace::Clock::now();
  t->span("F0", 1, now, now + 1ms);
  t->flush();
  { TraceScope scope(*t, "norm", 1); }
  EXPECT_TRUE(fs::is_empty(dir_));
  StepTrace by_default;
  EXPECT_FALSE(by_default.on());
}

TEST_F(StepTraceTest, DirFromEnvReadsLhTrace) {
  const char* old = std::getenv("LH_TRACE");
  const std::string saved = old ? old : "";
  ::unsetenv("LH_TRACE");
  EXPECT_EQ(StepTrace::dir_from_env(), "");
  ::setenv("LH_TRACE", "/some/dir", 1);
  EXPECT_EQ(StepTrace::dir_from_env(), "/some/dir");
  if (old)
    ::setenv("LH_TRACE", saved.c_str(), 1);
  else
    ::unsetenv("LH_TRACE");
}

TEST_F(StepTraceTest, WritesOneChromeTraceEventPerSpan) {
  auto t = StepTrace::open(dir_, 3);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_TRUE(t->on());
  const std::string path = dir_ + "/trace.rank3.jsonl";
  EXPECT_TRUE(fs::exists(path));
  const auto t0 = StepTrace::Clock::now();
  t->span("F3", 7, t0, t0 + 1500us);
  t->span("wait_sends", 8, t0 + 2ms, t0 + 2ms);
  t->flush();

  auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 2u);
  // One object per line, in the order written.
  auto a = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(a["name"], "F3");
  EXPECT_EQ(a["ph"], "X");
  EXPECT_EQ(a["ts"].get<long long>(), micros(t0));
  EXPECT_EQ(a["dur"].get<long long>(), 1500);
  EXPECT_EQ(a["pid"].get<int>(), 3);
  EXPECT_EQ(a["tid"].get<int>(), 0);
  EXPECT_EQ(a["args"]["step"].get<long long>(), 7);
  EXPECT_EQ(a.size(), 7u) << lines[0];
  EXPECT_EQ(a["args"].size(), 1u);

  auto b = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(b["name"], "wait_sends");
  EXPECT_EQ(b["ts"].get<long long>(), micros(t0 + 2ms));
  EXPECT_EQ(b["dur"].get<long long>(), 0);
  EXPECT_EQ(b["args"]["step"].get<long long>(), 8);

  // The exact bytes of a line, which scripts/trace_merge.sh and trace viewers read.
  EXPECT_EQ(lines[0], "{\"name\":\"F3\",\"ph\":\"X\",\"ts\":" + std::to_string(micros(t0)) +
                          ",\"dur\":1500,\"pid\":3,\"tid\":0,\"args\":{\"step\":7}}");
}

TEST_F(StepTraceTest, EachRankHasItsOwnFileAndLargeStepsAreKept) {
  auto r0 = StepTrace::open(dir_, 0);
  auto r1 = StepTrace::open(dir_, 1);
  ASSERT_TRUE(r0.ok() && r1.ok());
  const auto t0 = StepTrace::Clock::now();
  const int64_t big = int64_t(1) << 40;
  r0->span("B0", big, t0, t0 + 1us);
  r1->span("RA1", 1, t0, t0 + 2us);
  r0->flush();
  r1->flush();
  auto l0 = lines_of(dir_ + "/trace.rank0.jsonl");
  auto l1 = lines_of(dir_ + "/trace.rank1.jsonl");
  ASSERT_EQ(l0.size(), 1u);
  ASSERT_EQ(l1.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(l0[0])["args"]["step"].get<int64_t>(), big);
  EXPECT_EQ(nlohmann::json::parse(l0[0])["pid"].get<int>(), 0);
  EXPECT_EQ(nlohmann::json::parse(l1[0])["name"], "RA1");
  EXPECT_EQ(nlohmann::json::parse(l1[0])["pid"].get<int>(), 1);
}

TEST_F(StepTraceTest, OpeningTruncatesAnEarlierRunsFile) {
  const std::string path = dir_ + "/trace.rank5.jsonl";
  std::ofstream(path) << "an earlier run's line\nand another\n";
  {
    auto t = StepTrace::open(dir_, 5);
    ASSERT_TRUE(t.ok());
    auto now = StepTrace::Clock::now();
    t->span("opt", 1, now, now);
  }  // closing flushes
  auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(lines[0])["name"], "opt");
}

TEST_F(StepTraceTest, ADirectoryThatCannotBeWrittenIsNamed) {
  const std::string missing = dir_ + "/no/such/dir";
  auto t = StepTrace::open(missing, 4);
  ASSERT_FALSE(t.ok());
  const std::string msg = t.status().to_string();
  EXPECT_NE(msg.find("LH_TRACE"), std::string::npos) << msg;
  EXPECT_NE(msg.find(missing + "/trace.rank4.jsonl"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
}

TEST_F(StepTraceTest, TraceScopeTimesItsScope) {
  auto t = StepTrace::open(dir_, 1);
  ASSERT_TRUE(t.ok());
  const auto before = StepTrace::Clock::now();
  {
    TraceScope scope(*t, "eval", 12);
    std::this_thread::sleep_for(20ms);
  }
  const auto after = StepTrace::Clock::now();
  t->flush();
  auto lines = lines_of(dir_ + "/trace.rank1.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  auto e = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(e["name"], "eval");
  EXPECT_EQ(e["args"]["step"].get<int64_t>(), 12);
  EXPECT_GE(e["ts"].get<long long>(), micros(before));
  EXPECT_GE(e["dur"].get<long long>(), 20000);
  EXPECT_LE(e["ts"].get<long long>() + e["dur"].get<long long>(), micros(after));
}

TEST_F(StepTraceTest, AMovedTraceKeepsOneOwnerOfItsFile) {
  auto opened = StepTrace::open(dir_, 6);
  ASSERT_TRUE(opened.ok());
  StepTrace a = std::move(*opened);
  EXPECT_TRUE(a.on());
  EXPECT_FALSE(opened->on());
  const auto now = StepTrace::Clock::now();
  opened->span("lost", 1, now, now);  // the moved-from trace is off: nothing written
  a.span("kept", 1, now, now);
  StepTrace b;
  b = std::move(a);
  EXPECT_FALSE(a.on());
  ASSERT_TRUE(b.on());
  b.span("kept_too", 2, now, now);
  // Assigning over an open trace closes (and so flushes) its file.
  auto other = StepTrace::open(dir_, 7);
  ASSERT_TRUE(other.ok());
  b = std::move(*other);
  auto lines = lines_of(dir_ + "/trace.rank6.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines[0])["name"], "kept");
  EXPECT_EQ(nlohmann::json::parse(lines[1])["name"], "kept_too");
  b.span("seven", 3, now, now);
  b.flush();
  auto seven = lines_of(dir_ + "/trace.rank7.jsonl");
  ASSERT_EQ(seven.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(seven[0])["pid"].get<int>(), 7);
}

}  // namespace
}  // namespace lh
