// defines: value_of(Result<T>) for tests — the value, or an abort naming the Status when there is none — and
// expect_error(Status, says): an error whose message holds `says`.
// Used by the tests of grid, metrics, comm, runtime, plan and job.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "core/status.h"

namespace lh {

template <class T>
T value_of(Result<T> r) {
  LH_ASSERT(r.ok(), "expected a value, got " + r.status().to_string());
  return std::move(r).value();
}

// `s` is an error whose message holds `says` (a test failure naming both otherwise).
inline void expect_error(const Status& s, const std::string& says) {
  ASSERT_FALSE(s.ok()) << "expected an error saying '" << says << "'";
  EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
}

}  // namespace lh
