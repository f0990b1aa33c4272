// defines: the one copy of what the UCX data plane tests each had: a plane on loopback, the TLS list the tests use,
// and `eventually` (polling a condition up to a limit each caller keeps). Used by tests/transport.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "transport/ucx_data_plane.h"

namespace lh::test {

// $LH_TEST_UCX_TLS, else `fallback`.
inline std::string test_tls(const char* fallback) {
  const char* env = std::getenv("LH_TEST_UCX_TLS");
  return env ? env : fallback;
}

// A UCX data plane on the loopback device only, with `o`'s other options; a failed create is a test failure (and
// nullptr).
inline std::unique_ptr<UcxDataPlane> loopback_plane(UcxOptions o) {
  o.net_devices = "lo";
  auto p = UcxDataPlane::create(o);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? std::move(p).value() : nullptr;
}

// Polls `cond` every 10 ms until it holds, for up to `limit`; then asks once more.
template <class F>
bool eventually(F cond, std::chrono::milliseconds limit) {
  for (auto waited = std::chrono::milliseconds(0); waited < limit; waited += std::chrono::milliseconds(10)) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

}  // namespace lh::test
