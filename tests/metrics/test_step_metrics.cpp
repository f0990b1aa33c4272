// Tests for WorkerStepMetrics JSON lines (round trip, validation errors naming line and field) and the
// job summary (per-link totals, codec switches, loss and tokens/s, tables). Label `metrics`.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "metrics/metrics_summary.h"
#include "metrics/step_metrics.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

LinkTraffic traffic(int src, int dst, const std::string& role, uint64_t raw, uint64_t wire,
                    const std::string& codec = "", const std::string& dir = "send") {
  LinkTraffic t;
  t.src = src;
  t.dst = dst;
  t.role = role;
  t.dir = dir;
  t.codec = codec;
  t.raw_bytes = raw;
  t.wire_bytes = wire;
  t.messages = 2;
  t.seconds = 0.5;
  return t;
}

TEST(WorkerStepMetrics, RoundTripsThroughALine) {
  WorkerStepMetrics m;
  m.step = 12;
  m.worker = 3;
  m.stage = 3;
  m.loss = 2.75;
  m.tokens_per_s = 1234.5;
  m.links = {traffic(3, 2, "act_grad", 4000000, 1000000, "int8"), traffic(2, 3, "act", 4000000, 1000000, "", "recv")};
  const std::string line = step_metrics_to_line(m);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  WorkerStepMetrics back = value_of(parse_step_metrics_line(line, 7, "m.jsonl"));
  EXPECT_EQ(back.step, 12);
  EXPECT_EQ(back.worker, 3);
  EXPECT_EQ(back.stage, 3);
  EXPECT_EQ(back.loss, 2.75);
  EXPECT_FALSE(back.val_loss.has_value());
  EXPECT_EQ(back.tokens_per_s, 1234.5);
  EXPECT_EQ(back.source_line, 7);
  ASSERT_EQ(back.links.size(), 2u);
  EXPECT_EQ(back.links[0].role, "act_grad");
  EXPECT_EQ(back.links[0].codec, "int8");
  EXPECT_EQ(back.links[0].raw_bytes, 4000000u);
  EXPECT_EQ(back.links[0].wire_bytes, 1000000u);
  EXPECT_EQ(back.links[0].messages, 2u);
  EXPECT_EQ(back.links[0].seconds, 0.5);
  EXPECT_EQ(back.links[1].dir, "recv");
  EXPECT_EQ(step_metrics_to_line(back), line);
}

TEST(WorkerStepMetrics, AcceptsMinimalAndForeignLines) {
  // `longhaul train` lines: no worker, stage or links; extra fields are ignored.
  WorkerStepMetrics m = value_of(parse_step_metrics_line(R"({"step":5,"loss":3.1,"lr":0.001,"extra":[1,2]})", 1, "f"));
  EXPECT_EQ(m.worker, 0);
  EXPECT_TRUE(m.links.empty());
  EXPECT_EQ(m.lr, 0.001);
  // A null loss (a diverged run writes NaN as null) is absent, not an error.
  EXPECT_FALSE(value_of(parse_step_metrics_line(R"({"step":5,"loss":null})", 1, "f")).loss.has_value());
}

TEST(WorkerStepMetrics, MalformedLinesNameLineAndField) {
  struct Case {
    const char* line;
    const char* says;
  };
  const Case cases[] = {
      {"{\"step\":1", "not valid JSON"},
      {"{\"step\":1,\"loss\":1e999}", "not valid JSON"},  // out_of_range, not a crash
      {"{\"step\":\"1\"}", "field 'step'"},
      {"[1,2]", "expected a JSON object"},
      {R"({"loss":1})", "field 'step': missing"},
      {R"({"step":-1})", "field 'step': must not be negative"},
      {R"({"step":1.5})", "field 'step': expected a non-negative integer"},
      {R"({"step":"3"})", "field 'step': expected a non-negative integer, got \"3\""},
      {R"({"step":1,"worker":-2})", "field 'worker'"},
      {R"({"step":1,"loss":"low"})", "field 'loss': expected a number"},
      {R"({"step":1,"tokens_per_s":-5})", "field 'tokens_per_s': must not be negative"},
      {R"({"step":1,"links":{}})", "field 'links': expected an array"},
      {R"({"step":1,"links":[3]})", "field 'links[0]': expected an object"},
      {R"({"step":1,"links":[{"dst":1,"role":"act"}]})", "field 'links[0].src': missing"},
      {R"({"step":1,"links":[{"src":1,"dst":1,"role":"act"}]})", "field 'links[0].dst': equals src"},
      {R"({"step":1,"links":[{"src":0,"dst":1}]})", "field 'links[0].role': missing"},
      {R"({"step":1,"links":[{"src":0,"dst":1,"role":"activations"}]})", "unknown role 'activations'"},
      {R"({"step":1,"links":[{"src":0,"dst":1,"role":"act","dir":"up"}]})", "field 'links[0].dir'"},
      {R"({"step":1,"links":[{"src":0,"dst":1,"role":"act"},{"src":0,"dst":1,"role":"act","wire_bytes":-4}]})",
       "field 'links[1].wire_bytes': must not be negative"},
      {R"({"step":1,"links":[{"src":0,"dst":1,"role":"act","raw_bytes":1e3}]})", "field 'links[0].raw_bytes'"},
      {R"({"step":1,"links":[{"src":0,"dst":1,"role":"act","seconds":-1}]})", "field 'links[0].seconds'"},
      {R"({"step":1,"links":[{"src":0,"dst":1,"role":"act","serial_s":-0.5}]})",
       "field 'links[0].serial_s': must not be negative"},
      {R"({"step":1,"links":[{"src":0,"dst":1,"role":"act","latency_s":"50ms"}]})",
       "field 'links[0].latency_s': expected a number"},
      {R"({"step":1,"links":[{"src":0,"dst":1,"role":"act","codec":4}]})", "field 'links[0].codec': expected a string"},
  };
  for (const Case& c : cases) {
    auto r = parse_step_metrics_line(c.line, 42, "run.jsonl");
    ASSERT_FALSE(r.ok()) << c.line;
    EXPECT_NE(r.status().message().find("run.jsonl line 42"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << c.line << " → " << r.status().message();
  }
}

TEST(WorkerStepMetrics, ReadsStreamsSkippingBlankLinesAndStopsAtTheFirstBadOne) {
  std::istringstream good("{\"step\":1}\n\n  \r\n{\"step\":2}\r\n");
  auto all = value_of(read_step_metrics(good, "s"));
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].source_line, 4);
  std::istringstream bad("{\"step\":1}\n{\"step\":2}\n{\"step\":x}\n");
  auto r = read_step_metrics(bad, "s");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("s line 3"), std::string::npos);
  auto missing = read_step_metrics_file("/nonexistent/metrics.jsonl");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/metrics.jsonl"), std::string::npos);
}

TEST(WorkerStepMetrics, WriterAppendsValidLines) {
  const std::string path = ::testing::TempDir() + "lh_step_metrics_writer.jsonl";
  {
    auto w = value_of(StepMetricsWriter::open(path));
    WorkerStepMetrics m;
    m.step = 1;
    ASSERT_TRUE(w.write(m).ok());
    EXPECT_FALSE(w.write_line("{\"step\":2}\n{\"step\":3}").ok());
  }
  {
    auto w = value_of(StepMetricsWriter::open(path, /*append=*/true));
    ASSERT_TRUE(w.write_line("{\"step\":2,\"worker\":1}").ok());
  }
  auto back = value_of(read_step_metrics_file(path));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].worker, 1);
  std::remove(path.c_str());
  EXPECT_FALSE(StepMetricsWriter::open("/nonexistent/dir/m.jsonl").ok());
}

// A 2-stage job over 3 steps: worker 0 sends activations, worker 1 sends gradients and reports the
// loss; the activation codec changes from int8 to int4 at step 3; worker 1 also counts receives.
std::vector<WorkerStepMetrics> two_stage_job() {
  std::vector<WorkerStepMetrics> out;
  int line = 0;
  for (int step = 1; step <= 3; ++step) {
    WorkerStepMetrics w0;
    w0.step = step;
    w0.worker = 0;
    w0.tokens_per_s = 1000 + step;
    const bool int4 = step == 3;
    w0.links = {traffic(0, 1, "act", 8000000, int4 ? 1000000 : 2000000, int4 ? "int4" : "int8")};
    w0.source_line = ++line;
    WorkerStepMetrics w1;
    w1.step = step;
    w1.worker = 1;
    w1.stage = 1;
    w1.loss = 5.0 - step;
    w1.tokens_per_s = 900;
    w1.links = {traffic(1, 0, "act_grad", 8000000, 4000000, "bf16"),
                traffic(0, 1, "act", 8000000, 999, "", "recv")};  // ignored: the sender counted it
    w1.source_line = ++line;
    out.push_back(w0);
    out.push_back(w1);
  }
  return out;
}

// Two replicas report a loss per step; step 2 has come from replica 0 alone so far. The point says how
// many values it combines, so a live progress line can wait for the whole step (apps/job_cli.cpp).
TEST(MetricsSummary, LossPointsCountTheirReporters) {
  std::vector<WorkerStepMetrics> records;
  auto add = [&](int64_t step, int worker, double loss) {
    WorkerStepMetrics m;
    m.step = step;
    m.worker = worker;
    m.loss = loss;
    m.source_line = int(records.size()) + 1;
    records.push_back(m);
  };
  add(1, 0, 4.0);
  add(1, 1, 5.0);
  add(2, 0, 3.0);
  MetricsSummary s = value_of(summarize_step_metrics(records));
  ASSERT_EQ(s.loss.size(), 2u);
  EXPECT_EQ(s.loss[0].count, 2);
  EXPECT_DOUBLE_EQ(s.loss[0].value, 4.5);
  EXPECT_EQ(s.loss[1].count, 1);
  EXPECT_DOUBLE_EQ(s.loss[1].value, 3.0);
}

TEST(MetricsSummary, TotalsPerLinkPreferTheSender) {
  MetricsSummary s = value_of(summarize_step_metrics(two_stage_job()));
  EXPECT_EQ(s.records, 6u);
  EXPECT_EQ(s.workers, 2);
  EXPECT_EQ(s.first_step, 1);
  EXPECT_EQ(s.last_step, 3);
  ASSERT_EQ(s.links.size(), 2u);
  const LinkTotals& act = s.links[0];
  EXPECT_EQ(act.role, "act");
  EXPECT_EQ(act.counted_by, "send");
  EXPECT_EQ(act.raw_bytes, 24000000u);
  EXPECT_EQ(act.wire_bytes, 5000000u);
  EXPECT_EQ(act.messages, 6u);
  EXPECT_DOUBLE_EQ(act.seconds, 1.5);
  EXPECT_DOUBLE_EQ(act.ratio(), 4.8);
  EXPECT_EQ(act.codecs, (std::vector<std::string>{"int8", "int4"}));
  EXPECT_EQ(s.links[1].role, "act_grad");
  EXPECT_EQ(s.total.raw_bytes, 48000000u);
  EXPECT_EQ(s.total.wire_bytes, 17000000u);
  ASSERT_EQ(s.codec_switches.size(), 1u);
  EXPECT_EQ(s.codec_switches[0].step, 3);
  EXPECT_EQ(s.codec_switches[0].from, "int8");
  EXPECT_EQ(s.codec_switches[0].to, "int4");
  ASSERT_EQ(s.loss.size(), 3u);
  EXPECT_EQ(s.loss[2].value, 2.0);
  ASSERT_EQ(s.tokens_per_s.size(), 3u);
  EXPECT_EQ(s.tokens_per_s[0].value, 900);  // the slower worker
  auto wire = s.wire_bytes_per_step.at(LinkKey{0, 1, "act"});
  ASSERT_EQ(wire.size(), 3u);
  EXPECT_EQ(wire[2].value, 1000000.0);
  auto raw = s.raw_bytes_per_step.at(LinkKey{0, 1, "act"});
  ASSERT_EQ(raw.size(), 3u);
  EXPECT_EQ(raw[0].step, 1);
  EXPECT_EQ(raw[2].value, 8000000.0);
  // The receiver's 999 wire bytes of 0→1 are not in the series: the sender's count wins there too.
  EXPECT_EQ(s.wire_bytes_per_step.at(LinkKey{1, 0, "act_grad"})[1].value, 4000000.0);
}

TEST(MetricsSummary, FallsBackToTheReceiversCount) {
  WorkerStepMetrics m;
  m.step = 0;
  m.worker = 1;
  m.links = {traffic(0, 1, "act", 100, 50, "", "recv")};
  MetricsSummary s = value_of(summarize_step_metrics({m}));
  ASSERT_EQ(s.links.size(), 1u);
  EXPECT_EQ(s.links[0].counted_by, "recv");
  EXPECT_NE(format_link_table(s).find("0→1*"), std::string::npos);
}

TEST(MetricsSummary, RefusesDoubleCounting) {
  auto job = two_stage_job();
  job.push_back(job[2]);
  job.back().source_line = 99;
  auto r = summarize_step_metrics(job);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("line 99 repeats step 2 of worker 0 (first at line 3)"), std::string::npos)
      << r.status().message();
  WorkerStepMetrics twice;
  twice.step = 1;
  twice.source_line = 5;
  twice.links = {traffic(0, 1, "act", 1, 1), traffic(0, 1, "act", 1, 1)};
  auto r2 = summarize_step_metrics({twice});
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("line 5 counts link 0→1 act (send) at step 1 again"), std::string::npos)
      << r2.status().message();
}

TEST(MetricsSummary, LinkTableIsAligned) {
  MetricsSummary s = value_of(summarize_step_metrics(two_stage_job()));
  EXPECT_EQ(format_link_table(s),
            "link   role            messages  raw MB  wire MB  ratio  saved  busy s  codec\n"
            "0→1    act (fwd)              6   24.00     5.00  4.80x  79.2%    1.50  int8→int4\n"
            "1→0    act_grad (bwd)         6   24.00    12.00  2.00x  50.0%    1.50  bf16\n"
            "total                        12   48.00    17.00  2.82x  64.6%    3.00\n"
            "MB = 10^6 bytes; raw = the same tensors sent uncompressed in fp32; busy s = seconds the link was busy\n");
  EXPECT_EQ(format_link_table(value_of(summarize_step_metrics({}))), "no link traffic recorded\n");
}

TEST(MetricsSummary, StepSummaryShowsLossAndSwitches) {
  MetricsSummary s = value_of(summarize_step_metrics(two_stage_job()));
  const std::string text = format_step_summary(s);
  EXPECT_NE(text.find("steps 1..3, 6 records from 2 workers"), std::string::npos) << text;
  EXPECT_NE(text.find("loss: first 4.0000, last 2.0000, min 2.0000 at step 3"), std::string::npos) << text;
  EXPECT_NE(text.find("tokens/s: mean 900.0 over 3 steps"), std::string::npos) << text;
  EXPECT_NE(text.find("codec change: 0→1 act (fwd) int8 → int4 from step 3"), std::string::npos) << text;
  // Evenly spaced rows with both ends.
  std::vector<WorkerStepMetrics> many;
  for (int i = 0; i < 100; ++i) {
    WorkerStepMetrics m;
    m.step = i;
    m.loss = 100 - i;
    many.push_back(m);
  }
  const std::string rows = format_step_summary(value_of(summarize_step_metrics(many)), 5);
  for (const char* want :
       {"   0  100.0000\n", "  25   75.0000\n", "  50   50.0000\n", "  74   26.0000\n", "  99    1.0000\n"})
    EXPECT_NE(rows.find(want), std::string::npos) << want << " in\n" << rows;
}

}  // namespace
}  // namespace lh

namespace lh {
namespace {

TEST(WorkerStepMetrics, ReadsBuiltJsonWithSignedIntegers) {
  // LinkMeter::to_json builds its JSON from ints: non-negative values stored as signed integers.
  nlohmann::json links = nlohmann::json::array();
  links.push_back({{"src", int(0)},
                   {"dst", int(1)},
                   {"role", "act"},
                   {"dir", "send"},
                   {"raw_bytes", int64_t(8)},
                   {"wire_bytes", int64_t(2)},
                   {"messages", int(1)},
                   {"seconds", 0.0}});
  auto t = value_of(link_traffic_from_json(links, "meter"));
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].dst, 1);
  EXPECT_EQ(t[0].raw_bytes, 8u);
  links[0]["wire_bytes"] = int64_t(-2);
  auto bad = link_traffic_from_json(links, "meter");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("field 'links[0].wire_bytes': must not be negative"), std::string::npos);
  EXPECT_FALSE(link_traffic_from_json(nlohmann::json::object(), "meter").ok());
}

}  // namespace
}  // namespace lh

namespace lh {
namespace {

// A 4-stage pipeline over 2 steps: act 0→1→2→3, act_grad 3→2→1→0, and every one of the 12 ordered
// worker pairs sends a grad-norm message (role other, 8 bytes, 1 message, 0.001 s) each step.
std::vector<WorkerStepMetrics> four_stage_job_with_norms() {
  std::vector<WorkerStepMetrics> out;
  for (int step = 1; step <= 2; ++step)
    for (int w = 0; w < 4; ++w) {
      WorkerStepMetrics m;
      m.step = step;
      m.worker = w;
      m.stage = w;
      if (w < 3) m.links.push_back(traffic(w, w + 1, "act", 4000000, 1000000, "int8"));
      if (w > 0) m.links.push_back(traffic(w, w - 1, "act_grad", 4000000, 2000000, "bf16"));
      for (int peer = 0; peer < 4; ++peer) {
        if (peer == w) continue;
        LinkTraffic norm = traffic(w, peer, "other", 8, 8);
        norm.messages = 1;
        norm.seconds = 0.001;
        m.links.push_back(norm);
      }
      out.push_back(m);
    }
  return out;
}

TEST(MetricsSummary, FoldsOtherPairsIntoOneRow) {
  MetricsSummary s = value_of(summarize_step_metrics(four_stage_job_with_norms()));
  ASSERT_EQ(s.links.size(), 3u + 3u + 12u);  // the summary itself keeps every pair
  EXPECT_EQ(s.total.messages, 6u * 2 * 2 + 12u * 2);
  EXPECT_EQ(s.total.raw_bytes, 6u * 2 * 4000000 + 12u * 2 * 8);
  EXPECT_EQ(s.total.wire_bytes, 3u * 2 * 1000000 + 3u * 2 * 2000000 + 12u * 2 * 8);

  const std::vector<LinkTotals> rows = folded_links(s);
  ASSERT_EQ(rows.size(), 7u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(rows[i].pairs, 1) << i;
    EXPECT_EQ(rows[i].role, i < 3 ? "act" : "act_grad") << i;
  }
  EXPECT_EQ(link_label(rows[3]), "1→0");
  const LinkTotals& other = rows[6];
  EXPECT_EQ(other.role, "other");
  EXPECT_EQ(other.pairs, 12);
  EXPECT_EQ(other.src, -1);
  EXPECT_EQ(other.dst, -1);
  EXPECT_EQ(other.counted_by, "send");
  EXPECT_EQ(other.messages, 24u);
  EXPECT_EQ(other.raw_bytes, 192u);
  EXPECT_EQ(other.wire_bytes, 192u);
  EXPECT_NEAR(other.seconds, 0.024, 1e-12);
  EXPECT_TRUE(other.codecs.empty());
  EXPECT_EQ(link_label(other), "12 pairs");

  EXPECT_EQ(format_link_table(s),
            "link      role            messages  raw MB  wire MB  ratio  saved  busy s  codec\n"
            "0→1       act (fwd)              4    8.00     2.00  4.00x  75.0%    1.00  int8\n"
            "1→2       act (fwd)              4    8.00     2.00  4.00x  75.0%    1.00  int8\n"
            "2→3       act (fwd)              4    8.00     2.00  4.00x  75.0%    1.00  int8\n"
            "1→0       act_grad (bwd)         4    8.00     4.00  2.00x  50.0%    1.00  bf16\n"
            "2→1       act_grad (bwd)         4    8.00     4.00  2.00x  50.0%    1.00  bf16\n"
            "3→2       act_grad (bwd)         4    8.00     4.00  2.00x  50.0%    1.00  bf16\n"
            "12 pairs  other                 24    0.00     0.00  1.00x   0.0%    0.02\n"
            "total                           48   48.00    18.00  2.67x  62.5%    6.02\n"
            "MB = 10^6 bytes; raw = the same tensors sent uncompressed in fp32; busy s = seconds the link was busy\n"
            "other = 12 worker pairs of small messages (grad-norm exchanges), summed into one row\n");
}

TEST(MetricsSummary, EvaluationTrafficKeepsItsRowsWhileNormsFold) {
  std::vector<WorkerStepMetrics> job = four_stage_job_with_norms();
  // Step 2 also evaluates: 4 validation activations of 64 KiB go 0→1 and 1→2 (role other).
  for (WorkerStepMetrics& m : job)
    if (m.step == 2 && m.worker < 2) {
      LinkTraffic eval = traffic(m.worker, m.worker + 1, "other", 4 * 65536, 4 * 16384, "int8");
      eval.messages = 4;
      for (LinkTraffic& l : m.links)
        if (l.role == "other" && l.dst == m.worker + 1) l = eval;
    }
  MetricsSummary s = value_of(summarize_step_metrics(job));
  std::vector<LinkTotals> rows = folded_links(s);
  ASSERT_EQ(rows.size(), 6u + 2u + 1u);
  EXPECT_EQ(link_label(rows[6]), "0→1");
  EXPECT_EQ(rows[6].role, "other");
  EXPECT_EQ(rows[6].raw_bytes, 8u + 4u * 65536);  // step 1's norm and step 2's evaluation
  EXPECT_EQ(link_label(rows[7]), "1→2");
  EXPECT_EQ(rows[8].pairs, 10);
  EXPECT_EQ(rows[8].raw_bytes, 10u * 2 * 8);
  const std::string table = format_link_table(s);
  EXPECT_NE(table.find("10 pairs  other"), std::string::npos) << table;
  EXPECT_EQ(table.find("0→2"), std::string::npos) << table;
}

TEST(MetricsSummary, OneOtherPairKeepsItsRowAndReceiverCountsAreMarked) {
  // Only 0→1 carries `other` traffic: nothing to fold, the row names its link.
  WorkerStepMetrics m;
  m.step = 0;
  m.worker = 0;
  m.links = {traffic(0, 1, "act", 100, 50, "int8"), traffic(0, 1, "other", 8, 8)};
  MetricsSummary one = value_of(summarize_step_metrics({m}));
  std::vector<LinkTotals> rows = folded_links(one);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].pairs, 1);
  EXPECT_EQ(link_label(rows[1]), "0→1");
  EXPECT_NE(format_link_table(one).find("\n0→1    other"), std::string::npos) << format_link_table(one);
  EXPECT_EQ(format_link_table(one).find("pairs"), std::string::npos) << format_link_table(one);

  // Two pairs, one of them only counted by its receiver: folded, marked, and the codecs listed once.
  WorkerStepMetrics r;
  r.step = 0;
  r.worker = 2;
  r.links = {traffic(1, 2, "other", 10, 5, "fp16", "recv"), traffic(2, 1, "other", 20, 10, "fp16")};
  MetricsSummary two = value_of(summarize_step_metrics({m, r}));
  rows = folded_links(two);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].pairs, 3);
  EXPECT_EQ(rows[1].counted_by, "send+recv");
  EXPECT_EQ(rows[1].raw_bytes, 38u);
  EXPECT_EQ(rows[1].wire_bytes, 23u);
  EXPECT_EQ(rows[1].codecs, std::vector<std::string>{"fp16"});
  const std::string table = format_link_table(two);
  EXPECT_NE(table.find("\n3 pairs*  other"), std::string::npos) << table;
  EXPECT_NE(table.find("fp16\n"), std::string::npos) << table;
  EXPECT_NE(table.find("or for some of these pairs)"), std::string::npos) << table;
}

}  // namespace
}  // namespace lh

namespace lh {
namespace {

// Workers that know the grid name every link; the name survives the line and becomes a table column.
TEST(MetricsSummary, NamedLinksGetANameColumn) {
  WorkerStepMetrics m;
  m.step = 1;
  m.worker = 0;
  LinkTraffic g;
  g.src = 0;
  g.dst = 1;
  g.role = "grad";
  g.codec = "int8";
  g.link = "s0d0-s0d1:fwd";
  g.raw_bytes = 4000;
  g.wire_bytes = 1000;
  g.messages = 3;
  m.links = {g};
  WorkerStepMetrics back = value_of(parse_step_metrics_line(step_metrics_to_line(m), 1, "m.jsonl"));
  ASSERT_EQ(back.links.size(), 1u);
  EXPECT_EQ(back.links[0].link, "s0d0-s0d1:fwd");
  MetricsSummary s = value_of(summarize_step_metrics({back}));
  ASSERT_EQ(s.links.size(), 1u);
  EXPECT_EQ(s.links[0].link, "s0d0-s0d1:fwd");
  const std::string table = format_link_table(s);
  EXPECT_NE(table.find("link   name           role"), std::string::npos) << table;
  EXPECT_NE(table.find("0→1    s0d0-s0d1:fwd  grad"), std::string::npos) << table;
  // A name that is not a string is an error naming the field.
  auto bad = parse_step_metrics_line(
      R"({"step":1,"links":[{"src":0,"dst":1,"role":"grad","dir":"send","link":7,"raw_bytes":1,"wire_bytes":1,"messages":1}]})",
      3, "m.jsonl");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("link"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace lh
