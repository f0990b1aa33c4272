// defines: helpers shared by the op tests — seeded random buffers, error measures and a central
// finite-difference gradient. Used by tests/core/test_ops*.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/rng.h"

namespace lh::testing {

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * r.normal();
  return v;
}

inline std::vector<int32_t> rand_tokens(size_t n, int V, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(r.next_u32() % static_cast<uint32_t>(V));
  return v;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// ‖a − b‖₂ / max(‖b‖₂, floor): one number for a whole gradient, robust to tiny entries.
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b, double floor = 1e-6) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

// Σ w·y accumulated in double: the scalar loss whose gradient w.r.t. y is w.
inline double weighted_sum(const std::vector<float>& y, const std::vector<float>& w) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += double(y[i]) * double(w[i]);
  return s;
}

// Central differences of loss() w.r.t. every element of x (perturbed in place, restored after).
inline std::vector<double> finite_diff(std::vector<float>& x, const std::function<double()>& loss, float h = 1e-2f) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    float x0 = x[i];
    x[i] = x0 + h;
    double lp = loss();
    x[i] = x0 - h;
    double lm = loss();
    x[i] = x0;
    // Divide by the step actually taken in fp32, not the nominal h.
    g[i] = (lp - lm) / (double(x0 + h) - double(x0 - h));
  }
  return g;
}

// The gradient an accumulating backward added on top of a pre-filled value `base`.
inline std::vector<double> minus(const std::vector<float>& g, float base) {
  std::vector<double> r(g.size());
  for (size_t i = 0; i < g.size(); ++i) r[i] = double(g[i]) - base;
  return r;
}

}  // namespace lh::testing
