// Tests of the `longhaul train` command line through the built binary ($LH_BIN): a short run with
// metrics, checkpoint, resume and sample, and the error each bad flag or file gets (label apps).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "core/checkpoint.h"
#include "core/cuda_runtime.h"
#include "tests/common/run_command.h"

namespace lh {
namespace {

using CliResult = testing::CommandRun;

std::string bin() {
  const char* b = std::getenv("LH_BIN");
  return b ? b : "";
}

CliResult run(const std::string& args) {
  // --threads 1: a tiny model gains nothing from more, and the test may share the machine.
  return testing::run_command(bin() + " --threads 1 " + args);
}

class TrainCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (bin().empty() || ::access(bin().c_str(), X_OK) != 0)
      GTEST_SKIP() << "LH_BIN does not name the built longhaul binary (run through ctest)";
    dir_ = ::testing::TempDir() + "lh_cli_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ::mkdir(dir_.c_str(), 0755);
    data_ = dir_ + "/text.txt";
    std::ofstream out(data_);
    for (int i = 0; i < 400; ++i) out << "a line of text number " << i << ", with words in it\n";
  }
  std::string tiny() const { return "train --model tiny --seq 32 --batch 2 --data " + data_; }
  std::string dir_, data_;
};

int count_lines(const std::string& path) {
  std::ifstream in(path);
  int n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

TEST_F(TrainCli, ShortRunWithMetricsCheckpointResumeAndSample) {
  const std::string metrics = dir_ + "/m.jsonl", ckpt = dir_ + "/ckpt";
  CliResult a =
      run(tiny() + " --steps 4 --eval-every 2 --metrics " + metrics + " --checkpoint-dir " + ckpt + " --sample 20");
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_NE(a.output.find("step 4/4"), std::string::npos) << a.output;  // plain lines: not a terminal
  EXPECT_NE(a.output.find("--- sample (20 bytes"), std::string::npos) << a.output;
  EXPECT_EQ(count_lines(metrics), 4);
  EXPECT_EQ(::access((ckpt + "/" + checkpoint_filename(4)).c_str(), R_OK), 0);

  CliResult b = run(tiny() + " --steps 6 --metrics " + metrics + " --resume " + ckpt + " --sample 0");
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_NE(b.output.find("steps 6 (from 4)"), std::string::npos) << b.output;
  EXPECT_EQ(count_lines(metrics), 6);  // the resumed run appends
  EXPECT_EQ(b.output.find("--- sample"), std::string::npos);
}

TEST_F(TrainCli, ResumeTakesTheCheckpointsModelUnlessFlagsDiffer) {
  const std::string ckpt = dir_ + "/ckpt";
  ASSERT_EQ(run(tiny() + " --layers 1 --steps 2 --sample 0 --checkpoint-dir " + ckpt).code, 0);
  // No model flags: the checkpoint's (1 layer, seq 32) is used.
  CliResult ok = run("train --batch 2 --data " + data_ + " --steps 3 --sample 0 --resume " + ckpt);
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("layers=1"), std::string::npos) << ok.output;
  CliResult bad = run(tiny() + " --layers 2 --steps 3 --sample 0 --resume " + ckpt);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find("drop the model flags"), std::string::npos) << bad.output;
}

TEST_F(TrainCli, CorruptedCheckpointIsRefused) {
  const std::string ckpt = dir_ + "/ckpt";
  ASSERT_EQ(run(tiny() + " --steps 2 --sample 0 --checkpoint-dir " + ckpt).code, 0);
  const std::string file = ckpt + "/" + checkpoint_filename(2);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x01');
  }
  CliResult r = run(tiny() + " --steps 4 --sample 0 --resume " + file);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("checksum mismatch"), std::string::npos) << r.output;
  ::truncate(file.c_str(), 100);
  r = run(tiny() + " --steps 4 --sample 0 --resume " + file);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;
}

TEST_F(TrainCli, BadFlagsAndFilesAreNamed) {
  CliResult r = run("train --data " + dir_ + "/missing.txt --steps 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("missing.txt"), std::string::npos) << r.output;
  const std::string empty = dir_ + "/empty.txt";
  std::ofstream(empty).close();
  r = run("train --data " + empty + " --steps 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("is empty"), std::string::npos) << r.output;
  r = run("train --model huge");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("tiny|small|base"), std::string::npos) << r.output;
  r = run("train --device tpu");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("cpu or cuda"), std::string::npos) << r.output;
  r = run(tiny() + " --heads 5");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("heads=5"), std::string::npos) << r.output;
  r = run(tiny() + " --steps 0");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--steps"), std::string::npos) << r.output;
  r = run(tiny() + " --checkpoint-every 5");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--checkpoint-dir"), std::string::npos) << r.output;
  r = run(tiny() + " --resume " + dir_ + "/no-such-checkpoint");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("no-such-checkpoint"), std::string::npos) << r.output;
  if (!cuda_available()) {
    r = run(tiny() + " --device cuda");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.output.find("no CUDA device"), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace lh
