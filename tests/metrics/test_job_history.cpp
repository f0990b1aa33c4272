// JobHistory (the live page's series, events, counters and gauges, bounded however long a job runs),
// report_page_data (the same from a metrics file) and PrometheusText (the exposition format). Label `metrics`.
#include <gtest/gtest.h>

#include <cmath>

#include "metrics/job_history.h"
#include "metrics/metrics_summary.h"
#include "metrics/prometheus_text.h"

namespace lh {
namespace {

WorkerStepMetrics record(int64_t step, int worker, double loss, uint64_t raw, uint64_t wire,
                         const std::string& codec = "int8") {
  WorkerStepMetrics m;
  m.step = step;
  m.worker = worker;
  m.loss = loss;
  m.tokens_per_s = 100.0 + worker;
  LinkTraffic l;
  l.src = worker;
  l.dst = worker + 1;
  l.role = "act";
  l.codec = codec;
  l.link = std::to_string(worker) + "-" + std::to_string(worker + 1) + ":fwd";
  l.raw_bytes = raw;
  l.wire_bytes = wire;
  l.messages = 4;
  l.seconds = 0.5;
  l.serial_s = 0.25;
  l.latency_s = 0.04;
  m.links.push_back(l);
  LinkTraffic recv = l;  // the receiver's count of the same bytes: not counted twice
  recv.dir = "recv";
  m.links.push_back(recv);
  return m;
}

TEST(JobHistory, PointsStayBoundedAndKeepEveryByteAndTheMeanLoss) {
  JobHistory h(/*max_points=*/64, /*max_events=*/10);
  double loss_sum = 0;
  for (int64_t step = 1; step <= 1000; ++step) {
    const double loss = 5.0 - step * 0.001;
    loss_sum += loss;
    h.observe(record(step, 0, loss, 1000, 250));
  }
  EXPECT_LE(h.points(), size_t(64));
  EXPECT_GE(h.points(), size_t(32)) << "widening halves the points, no more";
  EXPECT_EQ(h.stride(), 16);
  const nlohmann::json p = h.points_json();
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(p.back()["raw_bytes"].get<uint64_t>(), 1000u * 1000) << "cumulative bytes survive the downsampling";
  EXPECT_EQ(p.back()["wire_bytes"].get<uint64_t>(), 250u * 1000);
  EXPECT_EQ(p.back()["step"].get<int64_t>(), 1008) << "the last bucket's end (a multiple of the stride)";
  double weighted = 0;
  int64_t prev = 0;
  for (const auto& pt : p) {
    const int64_t step = pt["step"].get<int64_t>();
    const int64_t n = std::min<int64_t>(step, 1000) - prev;
    weighted += pt["loss"].get<double>() * double(n);
    prev = step;
  }
  EXPECT_NEAR(weighted, loss_sum, 1e-6) << "each point's loss is the mean of its steps'";
  for (size_t i = 1; i < p.size(); ++i) EXPECT_LT(p[i - 1]["step"], p[i]["step"]);
}

TEST(JobHistory, EventsAreCappedAndRollbacksForgetLaterSteps) {
  JobHistory h(512, 3);
  for (int i = 0; i < 5; ++i) h.event(i, "info", "event " + std::to_string(i), 1000.0 + i);
  const nlohmann::json e = h.events_json();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e.front()["text"], "event 2");
  EXPECT_EQ(e.back()["text"], "event 4");
  EXPECT_EQ(h.events_dropped(), 2u);
  for (int64_t step = 1; step <= 10; ++step) h.observe(record(step, 0, 3.0, 100, 50));
  h.truncate_after(6);
  EXPECT_EQ(h.points_json().back()["step"].get<int64_t>(), 6);
  EXPECT_EQ(h.points_json().back()["raw_bytes"].get<uint64_t>(), 600u);
  // The counters keep what crossed: the steps run again cross again.
  ASSERT_EQ(h.counters().size(), 1u);
  EXPECT_EQ(h.counters()[0].raw_bytes, 1000u);
}

TEST(JobHistory, CountersSplitByCodecAndGaugesMeasureTheLink) {
  JobHistory h;
  h.observe(record(1, 0, 4.0, 1000, 1000, "none"));
  h.observe(record(2, 0, 3.9, 1000, 250, "int8"));
  WorkerStepMetrics relayed = record(3, 0, 3.8, 1000, 250, "int8");
  relayed.links[0].relayed = true;
  relayed.auth_failures = 7;
  relayed.val_loss = 3.5;
  h.observe(relayed);
  const auto counters = h.counters();
  ASSERT_EQ(counters.size(), 3u);  // none, int8 direct, int8 relayed
  uint64_t raw = 0, wire = 0;
  for (const LinkCounter& c : counters) {
    EXPECT_EQ(c.link, "0-1:fwd");
    raw += c.raw_bytes;
    wire += c.wire_bytes;
  }
  EXPECT_EQ(raw, 3000u);
  EXPECT_EQ(wire, 1500u);
  const auto gauges = h.gauges();
  ASSERT_EQ(gauges.size(), 1u);
  EXPECT_DOUBLE_EQ(*gauges[0].bytes_per_s, 250 / 0.25) << "wire bytes over the serial time";
  EXPECT_DOUBLE_EQ(*gauges[0].latency_s, 0.04);
  EXPECT_EQ(h.auth_failures(), 7u);
  EXPECT_DOUBLE_EQ(*h.latest().val_loss, 3.5);
  EXPECT_DOUBLE_EQ(*h.latest().loss, 3.8);
  const nlohmann::json e = h.events_json();
  ASSERT_EQ(e.size(), 1u) << "the first relayed traffic of a pair is an event, once";
  EXPECT_EQ(e[0]["kind"], "relay");
}

TEST(JobHistory, TheReportPageCarriesLinksSeriesAndSwitches) {
  std::vector<WorkerStepMetrics> records;
  for (int64_t step = 1; step <= 6; ++step)
    records.push_back(record(step, 0, 4.0 - 0.1 * step, 1000, step <= 3 ? 1000 : 250, step <= 3 ? "none" : "int8"));
  for (auto& r : records) r.links.pop_back();  // sender counts only, as a file often has
  auto summary = summarize_step_metrics(records);
  ASSERT_TRUE(summary.ok()) << summary.status().to_string();
  const nlohmann::json d = report_page_data(records, *summary, "report of x.jsonl");
  EXPECT_EQ(d["mode"], "report");
  ASSERT_EQ(d["links"].size(), 1u);
  EXPECT_EQ(d["links"][0]["link"], "0-1");
  EXPECT_EQ(d["links"][0]["dir"], "fwd");
  EXPECT_EQ(d["links"][0]["spec"], "int8");
  EXPECT_EQ(d["links"][0]["raw_bytes"].get<uint64_t>(), 6000u);
  EXPECT_EQ(d["points"].size(), 6u);
  ASSERT_EQ(d["events"].size(), 1u);
  EXPECT_EQ(d["events"][0]["kind"], "codec");
  EXPECT_EQ(d["events"][0]["step"], 4);
}

TEST(PrometheusText, WritesFamiliesAndEscapesLabels) {
  PrometheusText p;
  p.family("longhaul_x_bytes_total", "counter", "Bytes.\nSecond line.");
  p.sample("longhaul_x_bytes_total", {{"link", "a\"b\\c\nd"}}, uint64_t(18446744073709551615ull));
  p.family("longhaul_y", "gauge", "A gauge.");
  p.sample("longhaul_y", {}, 0.5);
  p.sample("longhaul_y", {{"k", "v"}}, std::nan(""));
  EXPECT_EQ(p.str(),
            "# HELP longhaul_x_bytes_total Bytes. Second line.\n# TYPE longhaul_x_bytes_total counter\n"
            "longhaul_x_bytes_total{link=\"a\\\"b\\\\c\\nd\"} 18446744073709551615\n"
            "# HELP longhaul_y A gauge.\n# TYPE longhaul_y gauge\nlonghaul_y 0.5\nlonghaul_y{k=\"v\"} NaN\n");
  EXPECT_THROW(p.family("longhaul_y", "gauge", "again"), std::logic_error);
}

}  // namespace
}  // namespace lh
