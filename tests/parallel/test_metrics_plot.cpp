// Tests for the gnuplot script and data files of `report --png`, and for running gnuplot (skipped
// where gnuplot is not installed). Label `parallel`.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "parallel/metrics_plot.h"
#include "tests/parallel/result_value.h"

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
  EXPECT_NE(text.find("title '0→1 act (fwd)'"), std::string::npos);
  const std::string wire = slurp(dir_ + "/wire.dat");
  EXPECT_NE(wire.find("4 1000004"), std::string::npos) << wire;
  const std::string loss = slurp(dir_ + "/loss.dat");
  EXPECT_NE(loss.find("0 5.0"), std::string::npos) << loss;
}

TEST_F(MetricsPlot, LeavesOutEmptyPanels) {
  const std::string loss_only = slurp(value_of(write_metrics_gnuplot(job(true, false), dir_, "o.png", "t")));
  EXPECT_EQ(loss_only.find("multiplot"), std::string::npos);
  EXPECT_EQ(loss_only.find("wire.dat"), std::string::npos);
  const std::string links_only = slurp(value_of(write_metrics_gnuplot(job(false, true), dir_, "o.png", "t")));
  EXPECT_EQ(links_only.find("loss.dat"), std::string::npos);
  auto none = write_metrics_gnuplot(job(false, false), dir_, "o.png", "t");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("nothing to plot"), std::string::npos);
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
