// Tests for the gnuplot script and data files of `report --png`, and for running gnuplot (skipped
// where gnuplot is not installed). Label `metrics`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "metrics/metrics_plot.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

MetricsSummary job(bool with_loss, bool with_links) {
  std::vector<WorkerStepMetrics> records;
  for (int step = 0; step < 5; ++step) {
    WorkerStepMetrics m;
    m.step = step;
    if (with_loss) m.loss = 5.0 - step;
    if (with_loss && step == 4) m.val_loss = 1.5;
    if (with_links) {
      LinkTraffic t;
      t.src = 0;
      t.dst = 1;
      t.role = "act";
      t.raw_bytes = 4000000;
      t.wire_bytes = 1000000 + step;
      m.links.push_back(t);
    }
    records.push_back(m);
  }
  return value_of(summarize_step_metrics(records));
}

class MetricsPlot : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "lh_plot_test_" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(MetricsPlot, ScriptDrawsBothPanels) {
  std::string script = value_of(write_metrics_gnuplot(job(true, true), dir_, "/out/it's.png", "run 'a'"));
  const std::string text = slurp(script);
  EXPECT_NE(text.find("set output '/out/it''s.png'"), std::string::npos) << text;
  EXPECT_NE(text.find("set multiplot layout 2,1 title 'run ''a'''"), std::string::npos) << text;
  EXPECT_NE(text.find("title 'validation'"), std::string::npos);
  EXPECT_NE(text.find("title '0→1 fwd'"), std::string::npos) << text;
  EXPECT_NE(text.find("set ylabel 'cumulative MB'"), std::string::npos) << text;
  // Step 4: 4 MB raw, 1000004 bytes wire; so far 20 MB raw and 5000010 bytes wire.
  const std::string links = slurp(dir_ + "/links.dat");
  EXPECT_NE(links.find("\n4 4000000 1000004 20000000 5000010\n"), std::string::npos) << links;
  const std::string loss = slurp(dir_ + "/loss.dat");
  EXPECT_NE(loss.find("0 5.0"), std::string::npos) << loss;
}

TEST_F(MetricsPlot, LeavesOutEmptyPanels) {
  const std::string loss_only = slurp(value_of(write_metrics_gnuplot(job(true, false), dir_, "o.png", "t")));
  EXPECT_EQ(loss_only.find("multiplot"), std::string::npos);
  EXPECT_EQ(loss_only.find("links.dat"), std::string::npos);
  const std::string links_only = slurp(value_of(write_metrics_gnuplot(job(false, true), dir_, "o.png", "t")));
  EXPECT_EQ(links_only.find("loss.dat"), std::string::npos);
  auto none = write_metrics_gnuplot(job(false, false), dir_, "o.png", "t");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("nothing to plot"), std::string::npos);
}

LinkTraffic sent(int src, int dst, const std::string& role, uint64_t raw, uint64_t wire, const std::string& codec) {
  LinkTraffic t;
  t.src = src;
  t.dst = dst;
  t.role = role;
  t.codec = codec;
  t.raw_bytes = raw;
  t.wire_bytes = wire;
  t.messages = 1;
  return t;
}

// A 4-stage pipeline over steps 0..7: act 0→1→2→3 (int8; 0→1 switches to int4 at step 3, 2→3 to
// int2 at step 5), act_grad back in bf16, an evaluation at step 4 that sends 10x the activations,
// and a grad-norm message between every ordered pair of workers (role other).
MetricsSummary four_stage_job() {
  std::vector<WorkerStepMetrics> records;
  for (int step = 0; step < 8; ++step)
    for (int w = 0; w < 4; ++w) {
      WorkerStepMetrics m;
      m.step = step;
      m.worker = w;
      m.stage = w;
      if (w == 3) m.loss = 5.0 - 0.3 * step;
      const uint64_t raw = step == 4 ? 40000000 : 4000000;
      if (w < 3) {
        std::string codec = "int8";
        if (w == 0 && step >= 3) codec = "int4";
        if (w == 2 && step >= 5) codec = "int2";
        const uint64_t per = codec == "int8" ? 4 : codec == "int4" ? 8 : 16;
        m.links.push_back(sent(w, w + 1, "act", raw, raw / per + w, codec));
      }
      if (w > 0) m.links.push_back(sent(w, w - 1, "act_grad", 4000000, 2000000, "bf16"));
      for (int peer = 0; peer < 4; ++peer)
        if (peer != w) m.links.push_back(sent(w, peer, "other", 8, 8, ""));
      records.push_back(m);
    }
  return value_of(summarize_step_metrics(records));
}

// links.dat: one block per series of rows "step raw wire cumulative_raw cumulative_wire".
std::vector<std::vector<std::vector<double>>> read_blocks(const std::string& path) {
  std::vector<std::vector<std::vector<double>>> blocks;
  std::ifstream f(path);
  std::string line;
  bool fresh = true;
  while (std::getline(f, line)) {
    if (line.empty()) {
      fresh = true;
      continue;
    }
    if (line[0] == '#') continue;
    if (fresh) blocks.emplace_back();
    fresh = false;
    std::istringstream in(line);
    std::vector<double> row;
    double v;
    while (in >> v) row.push_back(v);
    blocks.back().push_back(row);
  }
  return blocks;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(MetricsPlot, BytesPanelIsCumulativePerLinkAndDirection) {
  const MetricsSummary s = four_stage_job();
  const std::string text = slurp(value_of(write_metrics_gnuplot(s, dir_, "o.png", "t")));
  const std::vector<LinkTotals> rows = folded_links(s);
  ASSERT_EQ(rows.size(), 7u);  // 3 fwd, 3 bwd, the 12 `other` pairs as one
  const auto blocks = read_blocks(dir_ + "/links.dat");
  ASSERT_EQ(blocks.size(), rows.size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    ASSERT_EQ(blocks[b].size(), 8u) << b;
    double raw = 0, wire = 0, prev_raw = -1, prev_wire = -1;
    for (const std::vector<double>& r : blocks[b]) {
      ASSERT_EQ(r.size(), 5u) << b;
      raw += r[1];
      wire += r[2];
      EXPECT_EQ(r[3], raw) << "block " << b << " step " << r[0];
      EXPECT_EQ(r[4], wire) << "block " << b << " step " << r[0];
      EXPECT_GT(r[3], prev_raw) << "block " << b << " step " << r[0];
      EXPECT_GT(r[4], prev_wire) << "block " << b << " step " << r[0];
      prev_raw = r[3];
      prev_wire = r[4];
    }
    EXPECT_EQ(blocks[b].back()[3], double(rows[b].raw_bytes)) << b;
    EXPECT_EQ(blocks[b].back()[4], double(rows[b].wire_bytes)) << b;
  }
  // 0→1: 7 steps of 4 MB and the evaluation's 40 MB raw; int8 for 3 steps, int4 for the other 5.
  EXPECT_EQ(blocks[0].back()[3], 68e6);
  EXPECT_EQ(blocks[0].back()[4], 3 * 1e6 + 4 * 5e5 + 5e6);
  EXPECT_EQ(blocks[6].back()[3], 12 * 8 * 8.0);  // other: 12 pairs, 8 bytes, 8 steps

  // One solid titled line and one dashed untitled line per row, in one colour per row.
  for (const char* title : {"'0→1 fwd int8→int4'", "'1→2 fwd int8'", "'2→3 fwd int8→int2'", "'1→0 bwd bf16'",
                            "'2→1 bwd bf16'", "'3→2 bwd bf16'", "'other (12 pairs)'"})
    EXPECT_EQ(count(text, "title " + std::string(title)), 1u) << title << " in\n" << text;
  EXPECT_EQ(count(text, "using 1:($5/1000000) with lines lw 2 dt 1"), 7u) << text;
  EXPECT_EQ(count(text, "using 1:($4/1000000) with lines lw 2 dt 2"), 7u) << text;
  std::set<std::string> colours;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string index = "index " + std::to_string(i) + " using";
    const size_t dashed = text.find(index + " 1:($4"), solid = text.find(index + " 1:($5");
    ASSERT_NE(dashed, std::string::npos) << i;
    ASSERT_NE(solid, std::string::npos) << i;
    auto colour_after = [&text](size_t at) { return text.substr(text.find("lc rgb '", at), 17); };
    EXPECT_EQ(colour_after(dashed), colour_after(solid)) << i;
    colours.insert(colour_after(solid));
  }
  EXPECT_EQ(colours.size(), rows.size());
  EXPECT_NE(text.find("title 'dashed: raw (fp32)'"), std::string::npos);

  // A dotted marker at each codec switch, labelled with the new codec, in the link's colour.
  ASSERT_EQ(s.codec_switches.size(), 2u);
  EXPECT_EQ(count(text, "set arrow"), 2u) << text;
  EXPECT_NE(text.find("set arrow from 3, graph 0 to 3, graph 1 nohead dt 3 lw 1.5 lc rgb '#1f77b4'"), std::string::npos)
      << text;
  EXPECT_NE(text.find("set label '0→1 fwd → int4' at 3, graph 0.95"), std::string::npos) << text;
  EXPECT_NE(text.find("set arrow from 5, graph 0 to 5, graph 1 nohead dt 3 lw 1.5 lc rgb '#2ca02c'"), std::string::npos)
      << text;
  EXPECT_NE(text.find("set label '2→3 fwd → int2' at 5, graph 0.89"), std::string::npos) << text;
  // The switches are drawn on the bytes panel only: after the loss plot.
  EXPECT_GT(text.find("set arrow"), text.find("loss.dat"));
}

// Evaluation activations travel as role `other` between pipeline neighbours: those pairs keep their
// own line, and the folded line holds only the remaining pairs, so every byte is drawn exactly once.
TEST_F(MetricsPlot, EvaluationPairsAreNotCountedTwice) {
  std::vector<WorkerStepMetrics> records;
  for (int step = 0; step < 4; ++step)
    for (int w = 0; w < 3; ++w) {
      WorkerStepMetrics m;
      m.step = step;
      m.worker = w;
      if (w < 2) m.links.push_back(sent(w, w + 1, "act", 4000000, 1000000, "int8"));
      for (int peer = 0; peer < 3; ++peer) {
        if (peer == w) continue;
        LinkTraffic t = sent(w, peer, "other", 8, 8, "");
        if (step == 2 && peer == w + 1) {  // evaluation: 4 activations of 64 KiB each
          t = sent(w, peer, "other", 4 * 65536, 4 * 16384, "int8");
          t.messages = 4;
        }
        m.links.push_back(t);
      }
      records.push_back(m);
    }
  const MetricsSummary s = value_of(summarize_step_metrics(records));
  (void)value_of(write_metrics_gnuplot(s, dir_, "o.png", "t"));
  const std::vector<LinkTotals> rows = folded_links(s);
  ASSERT_EQ(rows.size(), 5u);  // act 0→1, 1→2; other 0→1, 1→2 (evaluation); the other 4 pairs
  EXPECT_EQ(rows[4].pairs, 4);
  const auto blocks = read_blocks(dir_ + "/links.dat");
  ASSERT_EQ(blocks.size(), rows.size());
  double raw = 0, wire = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    EXPECT_EQ(blocks[b].back()[3], double(rows[b].raw_bytes)) << b;
    EXPECT_EQ(blocks[b].back()[4], double(rows[b].wire_bytes)) << b;
    raw += blocks[b].back()[3];
    wire += blocks[b].back()[4];
  }
  EXPECT_EQ(blocks[4].back()[3], 4 * 4 * 8.0);  // 4 pairs, 4 steps, 8 bytes
  EXPECT_EQ(raw, double(s.total.raw_bytes));
  EXPECT_EQ(wire, double(s.total.wire_bytes));
}

TEST_F(MetricsPlot, LinesPastThePaletteGetPointMarks) {
  // A 7-stage pipeline: 6 fwd and 6 bwd links, more than the 10 colours.
  std::vector<WorkerStepMetrics> records;
  for (int step = 0; step < 3; ++step)
    for (int w = 0; w < 7; ++w) {
      WorkerStepMetrics m;
      m.step = step;
      m.worker = w;
      if (w < 6) m.links.push_back(sent(w, w + 1, "act", 1000, 250, "int8"));
      if (w > 0) m.links.push_back(sent(w, w - 1, "act_grad", 1000, 500, "bf16"));
      records.push_back(m);
    }
  const std::string text =
      slurp(value_of(write_metrics_gnuplot(value_of(summarize_step_metrics(records)), dir_, "o.png", "t")));
  EXPECT_EQ(count(text, "($5/1000) with lines lw 2 dt 1"), 10u) << text;
  EXPECT_EQ(count(text, "with linespoints lw 2 pt 6 pi 1 dt 1"), 2u) << text;
  EXPECT_NE(text.find("set ylabel 'cumulative kB'"), std::string::npos) << text;
  EXPECT_NE(text.find("index 10 using 1:($5/1000) with linespoints lw 2 pt 6 pi 1 dt 1 lc rgb '#1f77b4'"),
            std::string::npos)
      << text;
}

TEST_F(MetricsPlot, MissingGnuplotIsAClearError) {
  Status s = render_metrics_png(job(true, true), dir_ + "/x.png", "t", "lh-no-such-gnuplot");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'lh-no-such-gnuplot' was not found"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("gnuplot-nox"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/x.png"));
}

TEST_F(MetricsPlot, GnuplotDrawsAPng) {
  if (system("command -v gnuplot >/dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot is not installed";
  const std::string png = dir_ + "/metrics.png";
  Status s = render_metrics_png(job(true, true), png, "test run");
  ASSERT_TRUE(s.ok()) << s.to_string();
  // gnuplot exits non-zero on an error in the script: the bytes panel with switches must parse.
  Status switches = render_metrics_png(four_stage_job(), dir_ + "/switches.png", "4 stages");
  ASSERT_TRUE(switches.ok()) << switches.to_string();
  std::ifstream f(png, std::ios::binary);
  char magic[4] = {};
  ASSERT_TRUE(f.read(magic, 4));
  EXPECT_EQ(std::string(magic, 4), "\x89PNG");
  Status bad = render_metrics_png(job(true, true), dir_ + "/no/such/dir/m.png", "t");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("no/such/dir/m.png"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace lh
