// The main of a test executable whose tests start children of their own (tests/transport/child_process.h):
// `--lh-child NAME args...` runs the child entry registered as NAME, anything else runs the tests.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/transport/child_process.h"

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--lh-child") {
    auto it = lh::testing::child_entries().find(argv[2]);
    if (it == lh::testing::child_entries().end()) return 64;
    return it->second(std::vector<std::string>(argv + 3, argv + argc));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
