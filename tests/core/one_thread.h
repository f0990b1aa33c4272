// defines: LH_ONE_THREAD_IN_THIS_FILE() — the tests of the file that says it run with one thread (set_num_threads(1)
// before each, the count before it restored after), and no other test of the executable: the room's files share one
// test executable, where a global ::testing::Environment would set it for every file. Used by the train tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/exec.h"

namespace lh {

class OneThreadInFile : public ::testing::EmptyTestEventListener {
 public:
  explicit OneThreadInFile(const char* file) : file_(file) {}
  void OnTestStart(const ::testing::TestInfo& test) override {
    if (file_ != test.file()) return;
    saved_ = num_threads();
    set_num_threads(1);
  }
  void OnTestEnd(const ::testing::TestInfo& test) override {
    if (file_ == test.file() && saved_ > 0) set_num_threads(saved_);
    saved_ = 0;
  }

 private:
  std::string file_;
  int saved_ = 0;
};

inline bool one_thread_in_file(const char* file) {
  ::testing::UnitTest::GetInstance()->listeners().Append(new OneThreadInFile(file));
  return true;
}

}  // namespace lh

#define LH_ONE_THREAD_IN_THIS_FILE() const bool kOneThreadInThisFile = ::lh::one_thread_in_file(__FILE__)
