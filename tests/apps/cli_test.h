// defines: lh::testing::CliTest — the fixture of the tests that run a `longhaul` command through the binary named by
// LH_BIN (which ctest sets): skipped without it, a directory of its own for the files a test writes (removed after),
// and the command run with its output captured. Used by the plan and report CLI tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "tests/common/run_command.h"

namespace lh::testing {

class CliTest : public ::testing::Test {
 protected:
  // `name`: the directory's, <gtest temp dir>/lh_<name>_<pid>.
  explicit CliTest(std::string name) : name_(std::move(name)) {}
  void SetUp() override {
    const char* bin = std::getenv("LH_BIN");
    if (!bin || !*bin) GTEST_SKIP() << "LH_BIN is not set (ctest sets it)";
    bin_ = bin;
    if (!std::filesystem::exists(bin_)) GTEST_SKIP() << "LH_BIN " << bin_ << " does not exist";
    dir_ = ::testing::TempDir() + "lh_" + name_ + "_" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // Writes `text` to the file `name` of the test's directory; its path.
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
    return dir_ + "/" + name;
  }
  // `$LH_BIN args` (args as the shell splits them).
  CommandRun run_bin(const std::string& args) { return run_command("'" + bin_ + "' " + args); }
  std::string bin_, dir_;

 private:
  std::string name_;
};

}  // namespace lh::testing
