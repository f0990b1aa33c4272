// Runs the row functors of core/kernels.h the way the CUDA path does — a row split across 32 lanes
// whose sum/max are exchanged — with 32 CPU threads standing in for a warp, and compares with the
// one-thread-per-row CPU path (label core). It checks the lane decomposition the GPU relies on
// (strided loops, reductions, lane-0 writes, in-place rows) on machines without a GPU.
#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/kernels_cpu.h"
#include "tests/core/test_ops_util.h"

namespace lh {
namespace {

using testing::max_abs_diff;
using testing::rand_tokens;
using testing::randn;

// 32 threads run f(lanes, r) for every row in lockstep; each sum/max is an all-reduce through shared
// slots between two barriers, like a warp's butterfly shuffle (every lane gets the total).
class EmulatedWarp {
 public:
  static constexpr int kLanes = 32;

  struct Lanes {
    EmulatedWarp* warp;
    int l;
    int lane() const { return l; }
    int count() const { return kLanes; }
    float sum(float x) const { return warp->all_reduce(l, x, false); }
    float max(float x) const { return warp->all_reduce(l, x, true); }
  };

  template <class F>
  void run_rows(int64_t rows, const F& f) {
    std::vector<std::thread> threads;
    for (int l = 0; l < kLanes; ++l)
      threads.emplace_back([this, l, rows, &f] {
        Lanes lanes{this, l};
        for (int64_t r = 0; r < rows; ++r) f(lanes, r);
      });
    for (auto& t : threads) t.join();
  }

 private:
  void barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = generation_;
    if (++waiting_ == kLanes) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen; });
    }
  }
  float all_reduce(int lane, float x, bool is_max) {
    slots_[lane] = x;
    barrier();
    float r = slots_[0];
    for (int i = 1; i < kLanes; ++i) r = is_max ? std::max(r, slots_[i]) : r + slots_[i];
    barrier();  // nobody overwrites a slot before every lane has read them all
    return r;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
  float slots_[kLanes] = {};
};

template <class F>
void run_serial(int64_t rows, const F& f) {
  kern::SerialLanes lanes;
  for (int64_t r = 0; r < rows; ++r) f(lanes, r);
}

constexpr double kTol = 2e-5;  // only the summation order differs

TEST(OpsLanes, LayernormForwardAndBackward) {
  for (int C : {5, 45, 70}) {  // fewer columns than lanes, and ragged last strides
    const int N = 3;
    auto x = randn(N * C, 1, 2.0f), w = randn(C, 2), b = randn(C, 3), dout = randn(N * C, 4);
    std::vector<float> out1(N * C), mean1(N), rstd1(N), out2(N * C, 9.f), mean2(N, 9.f), rstd2(N, 9.f);
    run_serial(N, kern::LayerNormForwardRows{out1.data(), mean1.data(), rstd1.data(), x.data(), w.data(), b.data(), C});
    EmulatedWarp warp;
    warp.run_rows(N,
                  kern::LayerNormForwardRows{out2.data(), mean2.data(), rstd2.data(), x.data(), w.data(), b.data(), C});
    EXPECT_LT(max_abs_diff(out2, out1), kTol) << C;
    EXPECT_LT(max_abs_diff(mean2, mean1), kTol) << C;
    EXPECT_LT(max_abs_diff(rstd2, rstd1), kTol) << C;
    auto dx1 = randn(N * C, 5), dx2 = dx1;
    run_serial(N,
               kern::LayerNormBackwardRows{dx1.data(), dout.data(), x.data(), w.data(), mean1.data(), rstd1.data(), C});
    warp.run_rows(
        N, kern::LayerNormBackwardRows{dx2.data(), dout.data(), x.data(), w.data(), mean1.data(), rstd1.data(), C});
    EXPECT_LT(max_abs_diff(dx2, dx1), kTol) << C;
  }
}

TEST(OpsLanes, SoftmaxForwardAndBackward) {
  const int rows = 3, cols = 67;
  auto x = randn(rows * cols, 6, 3.0f), dout = randn(rows * cols, 7);
  std::vector<float> y1(rows * cols), y2(rows * cols);
  run_serial(rows, kern::SoftmaxForwardRows{y1.data(), x.data(), cols});
  EmulatedWarp warp;
  warp.run_rows(rows, kern::SoftmaxForwardRows{y2.data(), x.data(), cols});
  EXPECT_LT(max_abs_diff(y2, y1), 1e-6);
  auto d1 = randn(rows * cols, 8), d2 = d1;
  run_serial(rows, kern::SoftmaxBackwardRows{d1.data(), y1.data(), dout.data(), cols});
  warp.run_rows(rows, kern::SoftmaxBackwardRows{d2.data(), y1.data(), dout.data(), cols});
  EXPECT_LT(max_abs_diff(d2, d1), kTol);
}

TEST(OpsLanes, CausalSoftmaxInPlaceForwardAndBackward) {
  const int T = 40, rows = 2 * T;  // two (batch, head) blocks; row r sees r mod T + 1 keys
  auto s = randn(rows * T, 9, 2.0f), datt = randn(rows * T, 10);
  auto a1 = s, a2 = s;
  run_serial(rows, kern::CausalSoftmaxRows{a1.data(), T});
  EmulatedWarp warp;
  warp.run_rows(rows, kern::CausalSoftmaxRows{a2.data(), T});
  EXPECT_LT(max_abs_diff(a2, a1), 1e-6);
  for (int r = 0; r < rows; ++r)
    for (int j = r % T + 1; j < T; ++j) ASSERT_EQ(a2[r * T + j], 0.f);
  auto g1 = datt, g2 = datt;
  run_serial(rows, kern::CausalSoftmaxBackwardRows{g1.data(), a1.data(), T, 0.5f});
  warp.run_rows(rows, kern::CausalSoftmaxBackwardRows{g2.data(), a1.data(), T, 0.5f});
  EXPECT_LT(max_abs_diff(g2, g1), kTol);
}

TEST(OpsLanes, CrossEntropyForward) {
  const int N = 3, V = 100;
  auto logits = randn(N * V, 11, 4.0f);
  auto targets = rand_tokens(N, V, 12);
  std::vector<float> l1(N), p1(N * V), l2(N), p2(N * V);
  run_serial(N, kern::CrossEntropyForwardRows{l1.data(), p1.data(), logits.data(), targets.data(), V});
  EmulatedWarp warp;
  warp.run_rows(N, kern::CrossEntropyForwardRows{l2.data(), p2.data(), logits.data(), targets.data(), V});
  EXPECT_LT(max_abs_diff(l2, l1), kTol);
  EXPECT_LT(max_abs_diff(p2, p1), 1e-6);
}

}  // namespace
}  // namespace lh
