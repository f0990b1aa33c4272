// Tests for PowerSGD (parallel/powersgd): a matrix of rank r comes back exactly, before and after the warm
// start; error feedback makes the running sum of decoded gradients track the true sum; the orthonormalization;
// the spec grammar and its errors. Label `comm`.
#include <gtest/gtest.h>

#include <cmath>

#include "comm/dp_reducer.h"
#include "comm/powersgd.h"
#include "core/rng.h"
#include "tests/comm/param_group_util.h"
#include "tests/common/result_value.h"

namespace lh {
namespace {

// Sum of `rank` random outer products, then a bias of ones.
std::vector<float> low_rank_gradient(int64_t rows, int64_t cols, int rank, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> g(rows * cols + cols, 1.0f);
  for (int64_t k = 0; k < rows * cols; ++k) g[k] = 0;
  for (int q = 0; q < rank; ++q) {
    std::vector<float> u(rows), v(cols);
    for (auto& x : u) x = rng.normal();
    for (auto& x : v) x = rng.normal();
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) g[i * cols + j] += u[i] * v[j];
  }
  return g;
}

// One replica's full PowerSGD step (the all-reduces of a group of one are the identity).
std::vector<float> one_step(PowerSgdBucket& b, std::vector<float> g) {
  std::vector<float> p, q, rest;
  b.round1(g.data(), &p, &rest);
  b.round2(p, &q);
  b.finish(g.data(), q, rest);
  return g;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b, int64_t n) {
  double e = 0, s = 0;
  for (int64_t k = 0; k < n; ++k) {
    e += (double(a[k]) - b[k]) * (double(a[k]) - b[k]);
    s += double(b[k]) * b[k];
  }
  return std::sqrt(e / s);
}

TEST(PowerSgdTest, AMatrixOfRankRComesBackExactlyBeforeAndAfterTheWarmStart) {
  const int64_t rows = 64, cols = 48;
  ParamGroup g = matrix_and_bias_group(rows, cols);
  PowerSgdBucket b(g, /*rank=*/3, /*seed=*/5);
  EXPECT_EQ(b.matrices(), 1);
  EXPECT_EQ(b.p_values(), rows * 3);
  EXPECT_EQ(b.q_values(), cols * 3);
  EXPECT_EQ(b.rest_values(), cols);
  const std::vector<float> want = low_rank_gradient(rows, cols, 3, 100);
  for (int step = 0; step < 3; ++step) {  // step 0 from the seeded Q, then from the warm start
    const std::vector<float> got = one_step(b, want);
    EXPECT_LT(rel_err(got, want, rows * cols), 1e-4) << "step " << step;
    for (int64_t k = rows * cols; k < g.numel; ++k) EXPECT_EQ(got[k], want[k]);  // the bias goes uncompressed
    double e = 0;
    for (float x : b.error()) e = std::max(e, double(std::fabs(x)));
    EXPECT_LT(e, 1e-3) << "step " << step;
  }
  // A rank-1 compression of a rank-3 matrix is not exact: the test above can fail.
  PowerSgdBucket low(g, 1, 5);
  EXPECT_GT(rel_err(one_step(low, want), want, rows * cols), 0.1);
}

TEST(PowerSgdTest, ErrorFeedbackMakesTheRunningSumTrackTheTrueSum) {
  const int64_t rows = 64, cols = 48;
  ParamGroup g = matrix_and_bias_group(rows, cols);
  PowerSgdBucket b(g, 2, 9);
  std::vector<double> sum_true(rows * cols, 0.0), sum_got(rows * cols, 0.0);
  double first = 0, last = 0;
  const int steps = 400;
  Rng rng(700);
  std::vector<float> grad(g.numel);
  for (auto& x : grad) x = rng.normal();  // full rank, the same every step
  for (int step = 0; step < steps; ++step) {
    const std::vector<float> got = one_step(b, grad);
    double e = 0, s = 0;
    for (int64_t k = 0; k < rows * cols; ++k) {
      sum_true[k] += grad[k];
      sum_got[k] += got[k];
      e += (sum_got[k] - sum_true[k]) * (sum_got[k] - sum_true[k]);
      s += sum_true[k] * sum_true[k];
    }
    (step == 0 ? first : last) = std::sqrt(e / s);
  }
  // One rank-2 step of a random 64×48 matrix keeps little of it (without error feedback every step would send
  // that same part, and the running sum would stay that far off); with it, what a step leaves out is sent
  // later, so the error of the running sum stays bounded while the sum grows.
  EXPECT_GT(first, 0.7);
  EXPECT_LT(last, 0.1) << "first " << first << " last " << last;
}

TEST(PowerSgdTest, OrthonormalizesColumns) {
  const int64_t rows = 20;
  const int r = 4;
  Rng rng(3);
  std::vector<float> a(rows * r);
  for (auto& x : a) x = rng.normal();
  orthonormalize_columns(a.data(), rows, r);
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < r; ++j) {
      double dot = 0;
      for (int64_t k = 0; k < rows; ++k) dot += double(a[k * r + i]) * a[k * r + j];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5) << i << "," << j;
    }
}

TEST(PowerSgdTest, SpecGrammarAndErrors) {
  EXPECT_TRUE(is_powersgd_spec("powersgd:rank=4"));
  EXPECT_FALSE(is_powersgd_spec("int8"));
  PowerSgdConfig c = value_of(parse_powersgd("powersgd:rank=8+bf16"));
  EXPECT_EQ(c.rank, 8);
  EXPECT_EQ(c.wire, "bf16");
  EXPECT_EQ(value_of(parse_powersgd("powersgd")).rank, 4);
  EXPECT_TRUE(check_grad_codec_spec("powersgd:rank=2+fp16").ok());
  for (auto [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"powersgd:rank=0", "rank must be an integer in 1..1024"},
           {"powersgd:rank=x", "rank must be an integer in 1..1024"},
           {"powersgd:iters=2", "unknown option 'iters'"},
           {"powersgd:rank=4+", "nothing after '+'"},
           {"powersgd:rank=4+int9", "int9"},
           {"powersgd:rank=4+powersgd", "need a codec chain"},
       }) {
    Status s = check_grad_codec_spec(text);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace lh
