// Runs `longhaul report` (the binary named by LH_BIN, which ctest sets) on generated metrics files:
// tables, --png, and clear errors for bad files. Skips when LH_BIN is unset. Label `apps`.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/apps/cli_test.h"

namespace {

using CliRun = lh::testing::CommandRun;

class ReportCli : public lh::testing::CliTest {
 protected:
  ReportCli() : CliTest("report_cli") {}
  CliRun run(const std::string& args) { return run_bin("report " + args); }
};

std::string two_stage_lines() {
  std::string out;
  for (int step = 1; step <= 4; ++step) {
    const char* codec = step < 3 ? "int8" : "int4";
    const int wire = step < 3 ? 1000000 : 500000;
    out += "{\"step\":" + std::to_string(step) + ",\"worker\":0,\"stage\":0,\"tokens_per_s\":2000,\"links\":[" +
           "{\"src\":0,\"dst\":1,\"role\":\"act\",\"codec\":\"" + codec +
           "\",\"raw_bytes\":4000000,\"wire_bytes\":" + std::to_string(wire) + ",\"messages\":4,\"seconds\":0.25}]}\n";
    out += "{\"step\":" + std::to_string(step) + ",\"worker\":1,\"stage\":1,\"loss\":" + std::to_string(5.0 - step) +
           ",\"tokens_per_s\":1900,\"links\":[{\"src\":1,\"dst\":0,\"role\":\"act_grad\",\"codec\":\"bf16\"," +
           "\"raw_bytes\":4000000,\"wire_bytes\":2000000,\"messages\":4,\"seconds\":0.5}]}\n";
  }
  return out;
}

TEST_F(ReportCli, PrintsTablesAndSummary) {
  const std::string file = write("m.jsonl", two_stage_lines());
  CliRun r = run("'" + file + "'");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("0→1    act (fwd)             16   16.00     3.00  5.33x  81.2%    1.00  int8→int4"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("total"), std::string::npos);
  EXPECT_NE(r.output.find("loss: first 4.0000, last 1.0000"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("codec change: 0→1 act (fwd) int8 → int4 from step 3"), std::string::npos) << r.output;
}

TEST_F(ReportCli, FoldsGradNormTrafficIntoOneRow) {
  // Three workers, one step: act 0→1→2, and a 16-byte grad-norm message between each of the 6 ordered pairs.
  std::string lines;
  for (int w = 0; w < 3; ++w) {
    std::string links;
    if (w < 2)
      links += "{\"src\":" + std::to_string(w) + ",\"dst\":" + std::to_string(w + 1) +
               ",\"role\":\"act\",\"codec\":\"int8\",\"raw_bytes\":4000000,\"wire_bytes\":1000000,\"messages\":4}";
    for (int p = 0; p < 3; ++p)
      if (p != w)
        links += std::string(links.empty() ? "" : ",") + "{\"src\":" + std::to_string(w) +
                 ",\"dst\":" + std::to_string(p) +
                 ",\"role\":\"other\",\"raw_bytes\":16,\"wire_bytes\":16,\"messages\":1}";
    lines += "{\"step\":1,\"worker\":" + std::to_string(w) + ",\"links\":[" + links + "]}\n";
  }
  CliRun r = run("'" + write("norms.jsonl", lines) + "'");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\n6 pairs  other             6    0.00     0.00  1.00x   0.0%    0.00\n"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("\ntotal                     14    8.00     2.00  4.00x  75.0%"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("0→2"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("1→0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("other = 6 worker pairs of small messages (grad-norm exchanges), summed into one row"),
            std::string::npos)
      << r.output;
}

TEST_F(ReportCli, DrawsAPng) {
  if (system("command -v gnuplot >/dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot is not installed";
  const std::string file = write("m.jsonl", two_stage_lines());
  const std::string png = dir_ + "/plot.png";
  CliRun r = run("'" + file + "' --png '" + png + "'");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote " + png), std::string::npos);
  std::ifstream f(png, std::ios::binary);
  char magic[4] = {};
  ASSERT_TRUE(f.read(magic, 4));
  EXPECT_EQ(std::string(magic, 4), "\x89PNG");
}

TEST_F(ReportCli, BadFilesAreClearErrors) {
  CliRun missing = run("'" + dir_ + "/none.jsonl'");
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.output.find("none.jsonl' cannot be opened"), std::string::npos) << missing.output;

  const std::string bad =
      write("bad.jsonl", "{\"step\":1}\n{\"step\":2,\"links\":[{\"src\":0,\"dst\":1,\"role\":\"x\"}]}\n");
  CliRun r = run("'" + bad + "'");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("longhaul: error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad.jsonl line 2: field 'links[0].role'"), std::string::npos) << r.output;

  const std::string dup = write("dup.jsonl", "{\"step\":1}\n{\"step\":1}\n");
  CliRun d = run("'" + dup + "'");
  EXPECT_NE(d.code, 0);
  EXPECT_NE(d.output.find("line 2 repeats step 1 of worker 0 (first at line 1)"), std::string::npos) << d.output;

  const std::string empty = write("empty.jsonl", "");
  CliRun e = run("'" + empty + "' --png '" + dir_ + "/e.png'");
  EXPECT_NE(e.code, 0);
  EXPECT_NE(e.output.find("nothing to plot"), std::string::npos) << e.output;

  CliRun rows = run("'" + write("ok.jsonl", two_stage_lines()) + "' --rows 1");
  EXPECT_NE(rows.code, 0);
  EXPECT_NE(rows.output.find("--rows"), std::string::npos) << rows.output;
}

}  // namespace
