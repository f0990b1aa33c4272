// defines: lh::temp_dir — a fresh, empty directory for a test (the one copy of what the train, checkpoint and script
// tests each had). Used by tests/core and tests/integration.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace lh {

// A new directory <gtest temp dir>/lh_<name>_XXXXXX (mkdtemp: a stale one of an earlier run cannot leak in); "" and
// a test failure naming it if it cannot be made.
inline std::string temp_dir(const std::string& name) {
  std::string t = ::testing::TempDir() + "lh_" + name + "_XXXXXX";
  if (::mkdtemp(t.data()) != nullptr) return t;
  ADD_FAILURE() << "mkdtemp " << t;
  return "";
}

}  // namespace lh
