// defines: the Thrust launches of the codec functors, templated on the execution policy, so the same
// source runs as thrust::omp::par (kernels_cpu.cpp) and thrust::cuda::par.on(stream) (kernels_cuda.cu).
#pragma once

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include "compress/kernels.h"

namespace lh::compress::kern::impl {

// kChunk: elements per functor call in the elementwise kernels (tuning knob, see kernels.h).
template <int kChunk, class Policy, class F>
void for_each_chunk(Policy&& p, int64_t n, const F& f) {
  int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks > 0) thrust::for_each(p, thrust::counting_iterator<int64_t>(0), thrust::counting_iterator<int64_t>(chunks), f);
}

template <class Policy, class F>
void for_each_index(Policy&& p, int64_t n, const F& f) {
  if (n > 0) thrust::for_each(p, thrust::counting_iterator<int64_t>(0), thrust::counting_iterator<int64_t>(n), f);
}

template <class Policy>
void quantize(Policy&& p, const float* x, int64_t n, const QuantSpec& q, uint8_t* scales, uint8_t* codes) {
  for_each_index(p, (n + q.block - 1) / q.block, QuantizeBlock{x, n, q, scales, codes});
}
template <class Policy>
void dequantize(Policy&& p, const uint8_t* scales, const uint8_t* codes, int64_t n, const QuantSpec& q, float* y) {
  for_each_index(p, (n + q.block - 1) / q.block, DequantizeBlock{scales, codes, n, q, y});
}
template <int kChunk, class Policy>
void to_half(Policy&& p, const float* x, int64_t n, bool bf16, uint16_t* y) {
  for_each_chunk<kChunk>(p, n, ToHalf<kChunk>{x, y, n, bf16});
}
template <int kChunk, class Policy>
void from_half(Policy&& p, const uint16_t* x, int64_t n, bool bf16, float* y) {
  for_each_chunk<kChunk>(p, n, FromHalf<kChunk>{x, y, n, bf16});
}
template <int kChunk, class Policy>
void axpby(Policy&& p, float* y, const float* a, const float* b, float s, int64_t n) {
  for_each_chunk<kChunk>(p, n, Axpby<kChunk>{y, a, b, s, n});
}
template <class Policy>
void randk_gather(Policy&& p, const float* x, uint64_t n, uint64_t seed, int64_t k, float* v) {
  for_each_index(p, k, RandkGather{x, v, RandomPermutation(n, seed)});
}
template <class Policy>
void randk_scatter(Policy&& p, const float* v, uint64_t n, uint64_t seed, int64_t k, float* y) {
  for_each_index(p, k, RandkScatter{v, y, RandomPermutation(n, seed)});
}
template <class Policy>
void index_gather(Policy&& p, const float* x, const uint32_t* idx, int64_t k, float* v) {
  for_each_index(p, k, IndexGather{x, idx, v});
}
template <class Policy>
void spikes_extract(Policy&& p, const float* x, int64_t n, int block, int s, float* rest, uint8_t* offs, float* vals) {
  for_each_index(p, (n + block - 1) / block, SpikesExtract{x, n, block, s, rest, offs, vals});
}
template <class Policy>
void spikes_restore(Policy&& p, const uint8_t* offs, const float* vals, int64_t n, int block, int s, float* y) {
  for_each_index(p, (n + block - 1) / block, SpikesRestore{offs, vals, n, block, s, y});
}
template <class Policy>
void index_scatter(Policy&& p, const float* v, const uint32_t* idx, int64_t k, float* y) {
  for_each_index(p, k, IndexScatter{v, idx, y});
}

}  // namespace lh::compress::kern::impl
