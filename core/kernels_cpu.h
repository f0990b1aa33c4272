// defines: the CPU launchers for the functors of core/kernels.h — Thrust on the OpenMP system for
// elementwise work, OpenMP loops over rows and column blocks. Used by core/ops_*.cpp only.
#pragma once

#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/system/omp/execution_policy.h>

#include <algorithm>
#include <cstdint>

#include "core/kernels.h"

namespace lh::kern {

// f(i) for i in [0, n), spread over the OpenMP threads.
template <class F>
void cpu_for_each(int64_t n, const F& f) {
  if (n <= 0) return;
  if (n < 4096) {  // a parallel region costs more than the work
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  thrust::for_each(thrust::omp::par, thrust::counting_iterator<int64_t>(0), thrust::counting_iterator<int64_t>(n), f);
}

// f(SerialLanes, r) for every row r in [0, rows): one thread per row.
template <class F>
void cpu_rows(int64_t rows, const F& f) {
  SerialLanes lanes;
#pragma omp parallel for schedule(static) if (rows > 1)
  for (int64_t r = 0; r < rows; ++r) f(lanes, r);
}

// out[c] += Σ_r value(r, c) over rows [0, N): threads own disjoint column blocks, so no two write the
// same output and the summation order is fixed (deterministic).
template <class F>
void cpu_column_sum(float* out, int64_t N, int C, const F& value) {
  constexpr int kBlock = 64;
  const int blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
    float acc[kBlock] = {};
    for (int64_t r = 0; r < N; ++r)
      for (int c = c0; c < c1; ++c) acc[c - c0] += value(r, c);
    for (int c = c0; c < c1; ++c) out[c] += acc[c - c0];
  }
}

}  // namespace lh::kern
