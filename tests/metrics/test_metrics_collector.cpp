// Tests for MetricsCollector: workers' lines validated, written to the job's file, summarised.
// Run by ctest with label `metrics`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

#include "metrics/metrics_collector.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

std::string line(int worker, int step, const std::string& extra = "") {
  return "{\"step\":" + std::to_string(step) + ",\"worker\":" + std::to_string(worker) + extra + "}";
}

TEST(MetricsCollector, WritesValidLinesAndRefusesTheRest) {
  const std::string path = ::testing::TempDir() + "lh_collector_" + std::to_string(getpid()) + ".jsonl";
  auto c = value_of(MetricsCollector::open(path));
  EXPECT_EQ(c->newest_step(), -1);
  const std::string traffic =
      ",\"links\":[{\"src\":0,\"dst\":1,\"role\":\"act\",\"raw_bytes\":400,\"wire_bytes\":100,\"messages\":1}]";
  ASSERT_TRUE(c->add(0, 1, line(0, 1, traffic)).ok());
  ASSERT_TRUE(c->add(1, 1, line(1, 1, ",\"loss\":4.5")).ok());
  ASSERT_TRUE(c->add(0, 2, line(0, 2, traffic)).ok());
  struct Bad {
    int rank;
    int step;
    std::string text;
    const char* says;
  };
  for (const Bad& b :
       {Bad{1, 2, line(0, 2), "the line says worker 0"}, Bad{1, 3, line(1, 2), "the line says step 2"},
        Bad{1, 2, "{\"step\":2,", "not valid JSON"}, Bad{1, 2, line(1, 2) + "\n" + line(1, 2), "more than one line"},
        Bad{0, 1, line(0, 1), "already reported"}}) {
    Status s = c->add(b.rank, b.step, b.text);
    ASSERT_FALSE(s.ok()) << b.says;
    EXPECT_NE(s.message().find(b.says), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("metrics from rank " + std::to_string(b.rank)), std::string::npos) << s.message();
  }
  EXPECT_EQ(c->newest_step(), 2);
  EXPECT_EQ(c->records(), 3u);
  auto back = value_of(read_step_metrics_file(path));
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[1].loss, 4.5);
  std::remove(path.c_str());
}

// A member holds the secret but may not crash or grow the coordinator: a line nested 100,000 deep (it overflowed the
// stack where the coordinator copied its "auto" field) and one over the size limit are refused, named, before they
// are parsed; one rank's kept lines are capped, and the other ranks are not held to it.
TEST(MetricsCollector, NestedOversizedAndTooManyLinesAreRefusedNamed) {
  auto c = value_of(MetricsCollector::open(""));
  std::string deep = "{\"step\":1,\"worker\":0,\"auto\":";
  for (int i = 0; i < 100000; ++i) deep += '[';
  for (int i = 0; i < 100000; ++i) deep += ']';
  deep += '}';
  Status s = c->add(0, 1, deep);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("metrics from rank 0 for step 1 line 1: JSON nested more than 64 levels deep"),
            std::string::npos)
      << s.message();
  std::string big = line(0, 1, ",\"pad\":\"" + std::string(kMaxMetricsLineBytes, 'x') + "\"");
  s = c->add(0, 1, big);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(std::to_string(big.size()) + " bytes of JSON, more than the " +
                             std::to_string(kMaxMetricsLineBytes) + " allowed"),
            std::string::npos)
      << s.message();
  // Brackets inside strings are no nesting: a legitimate line with them is taken.
  const std::string first = line(0, 1, ",\"note\":\"" + std::string(200, '[') + "\\\"{\"");
  ASSERT_TRUE(c->add(0, 1, first).ok());
  c->set_kept_bytes_per_rank(first.size() + line(0, 2).size());
  ASSERT_TRUE(c->add(0, 2, line(0, 2)).ok());
  s = c->add(0, 3, line(0, 3));  // one line past rank 0's share
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("refused: the coordinator keeps at most"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("of one worker's metrics, and rank 0's lines so far take"), std::string::npos);
  ASSERT_TRUE(c->add(1, 3, line(1, 3)).ok());
  EXPECT_TRUE(c->has(0, 2));
  EXPECT_FALSE(c->has(0, 3));
  // A rollback drops the later steps and what they took.
  ASSERT_TRUE(c->truncate_after(0).ok());
  ASSERT_TRUE(c->add(0, 1, line(0, 1)).ok());
  EXPECT_EQ(c->records(), 1u);
}

TEST(MetricsCollector, SummarisesTheJob) {
  auto c = value_of(MetricsCollector::open(""));
  for (int step = 1; step <= 3; ++step) {
    ASSERT_TRUE(c->add(0, step,
                       line(0, step,
                            ",\"links\":[{\"src\":0,\"dst\":1,\"role\":\"act\",\"raw_bytes\":400,"
                            "\"wire_bytes\":100,\"messages\":1}]"))
                    .ok());
    ASSERT_TRUE(c->add(1, step, line(1, step, ",\"loss\":" + std::to_string(5 - step))).ok());
  }
  MetricsSummary s = value_of(c->summary());
  ASSERT_EQ(s.links.size(), 1u);
  EXPECT_EQ(s.links[0].raw_bytes, 1200u);
  EXPECT_EQ(s.links[0].wire_bytes, 300u);
  ASSERT_EQ(s.loss.size(), 3u);
  EXPECT_FALSE(MetricsCollector::open("/nonexistent/dir/m.jsonl").ok());
}

}  // namespace
}  // namespace lh
