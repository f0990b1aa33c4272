// CUDA instantiation of the codec kernels: the functors of kernels.h launched by Thrust on a CUDA
// stream, plus topk selection by sort. Used through the dispatch in kernels_cpu.cpp (LH_USE_CUDA).
#include <thrust/copy.h>
#include <thrust/count.h>
#include <thrust/functional.h>
#include <thrust/merge.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/system/cuda/execution_policy.h>
#include <thrust/transform.h>

#include "compress/device_kernels.h"
#include "compress/kernels_impl.h"
#include "core/cuda_runtime.h"
#include "core/tensor.h"

namespace lh::compress::kern::cuda {

namespace {
constexpr int kGpuChunk = 1;  // one element per thread: neighbouring threads touch neighbouring words

auto policy(void* stream) { return thrust::cuda::par.on(static_cast<cudaStream_t>(stream)); }
void check_launch() { LH_CUDA_CHECK_FATAL(cudaGetLastError()); }

struct KeyOf {
  LH_HD float operator()(float x) const { return topk_key(x); }
};
struct KeyAbove {
  float t;
  LH_HD bool operator()(float x) const { return topk_key(x) > t; }
};
struct KeyEquals {
  float t;
  LH_HD bool operator()(float x) const { return topk_key(x) == t; }
};
}  // namespace

void quantize(void* s, const float* x, int64_t n, const QuantSpec& q, uint8_t* scales, uint8_t* codes) {
  impl::quantize(policy(s), x, n, q, scales, codes);
  check_launch();
}
void dequantize(void* s, const uint8_t* scales, const uint8_t* codes, int64_t n, const QuantSpec& q, float* y) {
  impl::dequantize(policy(s), scales, codes, n, q, y);
  check_launch();
}
void to_half(void* s, const float* x, int64_t n, bool bf16, uint16_t* y) {
  impl::to_half<kGpuChunk>(policy(s), x, n, bf16, y);
  check_launch();
}
void from_half(void* s, const uint16_t* x, int64_t n, bool bf16, float* y) {
  impl::from_half<kGpuChunk>(policy(s), x, n, bf16, y);
  check_launch();
}
void axpby(void* s, float* y, const float* a, const float* b, float sc, int64_t n) {
  impl::axpby<kGpuChunk>(policy(s), y, a, b, sc, n);
  check_launch();
}
void randk_gather(void* s, const float* x, uint64_t n, uint64_t seed, int64_t k, float* v) {
  impl::randk_gather(policy(s), x, n, seed, k, v);
  check_launch();
}
void randk_scatter(void* s, const float* v, uint64_t n, uint64_t seed, int64_t k, float* y) {
  impl::randk_scatter(policy(s), v, n, seed, k, y);
  check_launch();
}
void index_gather(void* s, const float* x, const uint32_t* idx, int64_t k, float* v) {
  impl::index_gather(policy(s), x, idx, k, v);
  check_launch();
}
void index_scatter(void* s, const float* v, const uint32_t* idx, int64_t k, float* y) {
  impl::index_scatter(policy(s), v, idx, k, y);
  check_launch();
}

void spikes_extract(void* s, const float* x, int64_t n, int block, int sp, float* rest, uint8_t* offs, float* vals) {
  impl::spikes_extract(policy(s), x, n, block, sp, rest, offs, vals);
  check_launch();
}
void spikes_restore(void* s, const uint8_t* offs, const float* vals, int64_t n, int block, int sp, float* y) {
  impl::spikes_restore(policy(s), offs, vals, n, block, sp, y);
  check_launch();
}

// Same selection rule as the CPU (kernels_cpu.cpp): threshold t = k-th largest key, every key > t,
// then the lowest-index keys equal to t; ascending indices.
Status topk_indices(void* s, const float* x, int64_t n, int64_t k, uint32_t* idx) {
  auto p = policy(s);
  if (k <= 0) return Status::Ok();
  if (k >= n) {
    thrust::sequence(p, idx, idx + n, 0u);
    check_launch();
    return Status::Ok();
  }
  LH_ASSIGN_OR_RETURN(Tensor keys, Tensor::create({n}, DType::f32, Device::cuda));
  float* kp = keys.data<float>();
  thrust::transform(p, x, x + n, kp, KeyOf{});
  thrust::sort(p, kp, kp + n, thrust::greater<float>());
  float t = 0;
  LH_CUDA_CHECK(cudaMemcpyAsync(&t, kp + (k - 1), sizeof(float), cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s)));
  LH_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s)));
  LH_ASSIGN_OR_RETURN(Tensor above_t, Tensor::create({k}, DType::i32, Device::cuda));
  LH_ASSIGN_OR_RETURN(Tensor ties_t, Tensor::create({n}, DType::i32, Device::cuda));
  uint32_t* above = static_cast<uint32_t*>(above_t.raw_data());
  uint32_t* ties = static_cast<uint32_t*>(ties_t.raw_data());
  thrust::counting_iterator<uint32_t> first(0), last(static_cast<uint32_t>(n));
  uint32_t* above_end = thrust::copy_if(p, first, last, x, above, KeyAbove{t});
  uint32_t* ties_end = thrust::copy_if(p, first, last, x, ties, KeyEquals{t});
  int64_t na = above_end - above, nt = std::min<int64_t>(ties_end - ties, k - na);
  thrust::merge(p, above, above + na, ties, ties + nt, idx);
  check_launch();
  if (na + nt != k) return internal_error("topk on CUDA selected " + std::to_string(na + nt) + " of " + std::to_string(k));
  return Status::Ok();
}

}  // namespace lh::compress::kern::cuda
