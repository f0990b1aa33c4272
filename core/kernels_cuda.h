// defines: the CUDA launchers for the functors of core/kernels.h — Thrust on the given stream for
// elementwise work, one warp per row for row functors, tiled column sums. Used by core/ops_*.cu only.
#pragma once

#include <cuda_runtime_api.h>
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <cstdint>

#include "core/cuda_runtime.h"
#include "core/kernels.h"

namespace lh::kern {

// A warp holds one row: lane i takes elements i, i+32, …; sum and max are butterfly shuffles, so every
// lane ends with the full result.
struct WarpLanes {
  int l;
  LH_HD LH_INLINE int lane() const { return l; }
  LH_HD LH_INLINE int count() const { return 32; }
  LH_HD LH_INLINE float sum(float x) const {
#if defined(__CUDA_ARCH__)
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
#endif
    return x;
  }
  LH_HD LH_INLINE float max(float x) const {
#if defined(__CUDA_ARCH__)
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
#endif
    return x;
  }
};

struct LaunchConfig {
  static constexpr int kRowBlock = 256;     // threads per block for row kernels (8 warps = 8 rows)
  static constexpr int kColTile = 32;       // columns per block in column sums
  static constexpr int kColLanes = 8;       // row lanes per block in column sums
  static constexpr int64_t kColRows = 512;  // rows per block in column sums
};

inline cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

// f(i) for i in [0, n) on `stream`, without a host synchronisation.
template <class F>
void gpu_for_each(void* stream, int64_t n, const F& f) {
  if (n <= 0) return;
  thrust::for_each(thrust::cuda::par_nosync.on(as_stream(stream)), thrust::counting_iterator<int64_t>(0),
                   thrust::counting_iterator<int64_t>(n), f);
  LH_CUDA_CHECK_FATAL(cudaGetLastError());
}

template <class F>
__global__ void rows_kernel(int64_t rows, F f) {
  int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (row >= rows) return;  // whole warps leave together, so the shuffles see 32 live lanes
  f(WarpLanes{static_cast<int>(threadIdx.x % 32)}, row);
}

// f(WarpLanes, r) for every row r in [0, rows).
template <class F>
void gpu_rows(void* stream, int64_t rows, const F& f) {
  if (rows <= 0) return;
  constexpr int kBlock = LaunchConfig::kRowBlock;
  const int64_t blocks = (rows * 32 + kBlock - 1) / kBlock;
  rows_kernel<<<static_cast<unsigned>(blocks), kBlock, 0, as_stream(stream)>>>(rows, f);
  LH_CUDA_CHECK_FATAL(cudaGetLastError());
}

// Block (kColTile × kColLanes) sums value(r, c) for its 32 columns over a chunk of rows, then adds the
// chunk total to out[c] — with atomicAdd when several row chunks share a column (order then varies).
template <class F>
__global__ void column_sum_kernel(float* out, int64_t N, int C, F value, int64_t rows_per_block, bool atomic) {
  constexpr int kTile = LaunchConfig::kColTile, kLanes = LaunchConfig::kColLanes;
  __shared__ float part[kLanes][kTile + 1];
  const int c = blockIdx.x * kTile + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  float acc = 0.f;
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kLanes) acc += value(r, c);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = 0.f;
    for (int i = 0; i < kLanes; ++i) s += part[i][threadIdx.x];
    if (atomic)
      atomicAdd(out + c, s);
    else
      out[c] += s;
  }
}

template <class F>
void gpu_column_sum(void* stream, float* out, int64_t N, int C, const F& value) {
  if (N <= 0 || C <= 0) return;
  constexpr int kTile = LaunchConfig::kColTile;
  int64_t rows_per_block = LaunchConfig::kColRows;
  int64_t chunks = (N + rows_per_block - 1) / rows_per_block;
  if (chunks > 65535) {  // gridDim.y limit
    chunks = 65535;
    rows_per_block = (N + chunks - 1) / chunks;
  }
  dim3 grid((C + kTile - 1) / kTile, static_cast<unsigned>(chunks));
  dim3 block(kTile, LaunchConfig::kColLanes);
  column_sum_kernel<<<grid, block, 0, as_stream(stream)>>>(out, N, C, value, rows_per_block, chunks > 1);
  LH_CUDA_CHECK_FATAL(cudaGetLastError());
}

// dwte[token, c] += dout[bt, c]: repeated tokens collide, so the adds are atomic (GPU only; the CPU
// twin in ops_pointwise.cpp owns column blocks instead).
struct EmbeddingTokenGradAtomic {
  float* dwte;
  const float* dout;
  const int32_t* tokens;
  int C;
  __device__ void operator()(int64_t i) const {
    int64_t bt = i / C;
    int c = static_cast<int>(i % C);
    atomicAdd(dwte + int64_t(tokens[bt]) * C + c, dout[i]);
  }
};

}  // namespace lh::kern
