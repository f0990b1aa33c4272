// CPU instantiation of the codec kernels (Thrust on OpenMP) and the device dispatch behind
// device_kernels.h. Used by every codec stage; CUDA calls go to kernels_cuda.cu.
#include <thrust/system/cpp/execution_policy.h>
#include <thrust/system/omp/execution_policy.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "compress/cpu_isa.h"
#include "compress/device_kernels.h"
#include "compress/kernels_impl.h"
#include "core/ops.h"

namespace lh::compress::kern {

namespace {
// Below this many elements an OpenMP fork/join costs more than the work: run on the calling thread.
constexpr int64_t kParallelMin = 1 << 16;

// Calls f with the sequential or the OpenMP policy, by size.
template <class F>
void on_cpu(int64_t n, F&& f) {
  if (n < kParallelMin)
    f(thrust::cpp::par);
  else
    f(thrust::omp::par);
}

#if defined(LH_USE_CUDA)
#define LH_KERN_DISPATCH(ex, call)                                \
  do {                                                            \
    if ((ex).device == Device::cuda) return cuda::call;           \
  } while (0)
#else
#define LH_KERN_DISPATCH(ex, call) \
  LH_ASSERT((ex).device == Device::cpu, "CUDA codec kernel in a build without CUDA")
#endif

// Splits [0, n) into work items of kGroupElems elements (whole blocks for the quantizers) and runs
// f(lo, hi) on each, on the calling thread or across OpenMP threads by size.
constexpr int64_t kGroupElems = 1 << 15;

template <class F>
void in_groups(int64_t items, int64_t per_group, int64_t n_elems, const F& f) {
  const int64_t groups = (items + per_group - 1) / per_group;
  on_cpu(n_elems, [&](auto p) {
    impl::for_each_index(p, groups, [&](int64_t g) {
      const int64_t lo = g * per_group, hi = lo + per_group < items ? lo + per_group : items;
      f(lo, hi);
    });
  });
}

void quant_groups(const QuantSpec& q, int64_t n, const std::function<void(int64_t, int64_t)>& f) {
  in_groups(quant_blocks(n, q.block), std::max<int64_t>(1, kGroupElems / q.block), n, f);
}

// The low-rank products take BLAS (cuBLAS) off the CPU and beyond kLowRankMaxR, where BLAS wins.
bool low_rank_on_blas(const Exec& ex, int64_t r) {
  return ex.device != Device::cpu || r > kLowRankMaxR;
}

// Rows of m floats per OpenMP work item.
int64_t rows_per_group(int64_t m) {
  return std::max<int64_t>(1, kGroupElems / std::max<int64_t>(1, m));
}

// The row stride of a transposed r × m factor: m padded by a cache line. With m a multiple of 1024 the
// r rows would otherwise sit 4 KiB apart, in one L1 set, and evict each other beyond r = 8.
int64_t padded_ld(int64_t m) {
  return m + 16;
}

// x (m × r) transposed into r rows of padded_ld(m) floats, so each column of x is contiguous.
const float* transposed(const float* x, int64_t m, int64_t r, std::vector<float>* t) {
  const int64_t ld = padded_ld(m);
  t->resize(static_cast<size_t>(r * ld));
  for (int64_t j = 0; j < m; ++j)
    for (int64_t k = 0; k < r; ++k) (*t)[k * ld + j] = x[j * r + k];
  return t->data();
}
}  // namespace

// The CPU path of quantize without the fast path (tests compare the two).
void quantize_reference_cpu(const float* x, int64_t n, const QuantSpec& q, uint8_t* scales, uint8_t* codes) {
  impl::quantize(thrust::cpp::par, x, n, q, scales, codes);
}

void quantize(const Exec& ex, const float* x, int64_t n, const QuantSpec& q, uint8_t* scales, uint8_t* codes) {
  LH_KERN_DISPATCH(ex, quantize(ex.stream, x, n, q, scales, codes));
  if (q.stochastic) {
    on_cpu(n, [&](auto p) { impl::quantize(p, x, n, q, scales, codes); });
    return;
  }
  const CpuCodecLoops& k = cpu_loops();
  quant_groups(q, n, [&](int64_t b0, int64_t b1) { k.quantize(x, n, q, scales, codes, b0, b1); });
}
void dequantize(const Exec& ex, const uint8_t* scales, const uint8_t* codes, int64_t n, const QuantSpec& q, float* y) {
  LH_KERN_DISPATCH(ex, dequantize(ex.stream, scales, codes, n, q, y));
  const CpuCodecLoops& k = cpu_loops();
  quant_groups(q, n, [&](int64_t b0, int64_t b1) { k.dequantize(scales, codes, n, q, y, b0, b1); });
}
void to_half(const Exec& ex, const float* x, int64_t n, bool bf16, uint16_t* y) {
  LH_KERN_DISPATCH(ex, to_half(ex.stream, x, n, bf16, y));
  const CpuCodecLoops& k = cpu_loops();
  in_groups(n, kGroupElems, n, [&](int64_t lo, int64_t hi) { k.to_half(x, lo, hi, bf16, y); });
}
void from_half(const Exec& ex, const uint16_t* x, int64_t n, bool bf16, float* y) {
  LH_KERN_DISPATCH(ex, from_half(ex.stream, x, n, bf16, y));
  const CpuCodecLoops& k = cpu_loops();
  in_groups(n, kGroupElems, n, [&](int64_t lo, int64_t hi) { k.from_half(x, lo, hi, bf16, y); });
}
void low_rank_product(const Exec& ex, const float* a, const float* b, int64_t rows, int64_t m, int64_t r, float* y) {
  if (low_rank_on_blas(ex, r)) {
    matmul(ex, false, true, static_cast<int>(rows), static_cast<int>(m), static_cast<int>(r), 1.0f, a,
           static_cast<int>(r), b, static_cast<int>(r), 0.0f, y, static_cast<int>(m));
    return;
  }
  thread_local std::vector<float> bt;
  const float* btp = transposed(b, m, r, &bt);
  const CpuCodecLoops& k = cpu_loops();
  in_groups(rows, rows_per_group(m), rows * m,
            [&](int64_t lo, int64_t hi) { k.low_rank_rows(a, btp, padded_ld(m), m, r, y, lo, hi); });
}
void project(const Exec& ex, const float* M, int64_t rows, int64_t m, const float* q, int64_t r, float* p) {
  if (low_rank_on_blas(ex, r)) {
    matmul(ex, false, false, static_cast<int>(rows), static_cast<int>(r), static_cast<int>(m), 1.0f, M,
           static_cast<int>(m), q, static_cast<int>(r), 0.0f, p, static_cast<int>(r));
    return;
  }
  thread_local std::vector<float> qt;
  const float* qtp = transposed(q, m, r, &qt);
  const CpuCodecLoops& k = cpu_loops();
  in_groups(rows, rows_per_group(m), rows * m,
            [&](int64_t lo, int64_t hi) { k.project_rows(M, m, qtp, padded_ld(m), r, p, lo, hi); });
}
void back_project(const Exec& ex, const float* M, int64_t rows, int64_t m, const float* p, int64_t r, float* q) {
  if (low_rank_on_blas(ex, r)) {
    matmul(ex, true, false, static_cast<int>(m), static_cast<int>(r), static_cast<int>(rows), 1.0f, M,
           static_cast<int>(m), p, static_cast<int>(r), 0.0f, q, static_cast<int>(r));
    return;
  }
  // Column tiles of 256 (r × 256 floats of qt stay in L1), each summed over all rows by one thread.
  const int64_t ld = padded_ld(m);
  thread_local std::vector<float> qt;
  qt.resize(static_cast<size_t>(r * ld));
  const CpuCodecLoops& k = cpu_loops();
  float* qtp = qt.data();
  in_groups(m, 256, rows * m, [&](int64_t lo, int64_t hi) { k.back_project_cols(M, rows, m, p, r, qtp, ld, lo, hi); });
  for (int64_t j = 0; j < m; ++j)
    for (int64_t c = 0; c < r; ++c) q[j * r + c] = qt[c * ld + j];
}
void copy_host(void* dst, const void* src, size_t bytes) {
  const int64_t n = static_cast<int64_t>(bytes);
  in_groups(n, int64_t{4} * kGroupElems, n / 4, [&](int64_t lo, int64_t hi) {
    std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, static_cast<size_t>(hi - lo));
  });
}
void axpby(const Exec& ex, float* y, const float* a, const float* b, float s, int64_t n) {
  LH_KERN_DISPATCH(ex, axpby(ex.stream, y, a, b, s, n));
  const CpuCodecLoops& k = cpu_loops();
  in_groups(n, kGroupElems, n, [&](int64_t lo, int64_t hi) { k.axpby(y, a, b, s, lo, hi); });
}
void randk_gather(const Exec& ex, const float* x, uint64_t n, uint64_t seed, int64_t k, float* v) {
  LH_KERN_DISPATCH(ex, randk_gather(ex.stream, x, n, seed, k, v));
  on_cpu(k, [&](auto p) { impl::randk_gather(p, x, n, seed, k, v); });
}
void randk_scatter(const Exec& ex, const float* v, uint64_t n, uint64_t seed, int64_t k, float* y) {
  LH_KERN_DISPATCH(ex, randk_scatter(ex.stream, v, n, seed, k, y));
  on_cpu(k, [&](auto p) { impl::randk_scatter(p, v, n, seed, k, y); });
}
void index_gather(const Exec& ex, const float* x, const uint32_t* idx, int64_t k, float* v) {
  LH_KERN_DISPATCH(ex, index_gather(ex.stream, x, idx, k, v));
  on_cpu(k, [&](auto p) { impl::index_gather(p, x, idx, k, v); });
}
void index_scatter(const Exec& ex, const float* v, const uint32_t* idx, int64_t k, float* y) {
  LH_KERN_DISPATCH(ex, index_scatter(ex.stream, v, idx, k, y));
  on_cpu(k, [&](auto p) { impl::index_scatter(p, v, idx, k, y); });
}

void spikes_extract(const Exec& ex, const float* x, int64_t n, int block, int s, float* rest, uint8_t* offs,
                    float* vals) {
  LH_KERN_DISPATCH(ex, spikes_extract(ex.stream, x, n, block, s, rest, offs, vals));
  on_cpu(n, [&](auto p) { impl::spikes_extract(p, x, n, block, s, rest, offs, vals); });
}
void spikes_restore(const Exec& ex, const uint8_t* offs, const float* vals, int64_t n, int block, int s, float* y) {
  LH_KERN_DISPATCH(ex, spikes_restore(ex.stream, offs, vals, n, block, s, y));
  on_cpu(n, [&](auto p) { impl::spikes_restore(p, offs, vals, n, block, s, y); });
}

Status topk_indices(const Exec& ex, const float* x, int64_t n, int64_t k, uint32_t* idx) {
  LH_KERN_DISPATCH(ex, topk_indices(ex.stream, x, n, k, idx));
  if (k <= 0) return Status::Ok();
  if (k >= n) {
    for (int64_t i = 0; i < n; ++i) idx[i] = static_cast<uint32_t>(i);
    return Status::Ok();
  }
  // Threshold t = the k-th largest key; keep every key > t and the first (k − count(> t)) keys
  // equal to t in index order: exactly the top k of the order (key desc, index asc).
  thread_local std::vector<float> keys;
  keys.resize(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = topk_key(x[i]);
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<float>());
  const float t = keys[k - 1];
  int64_t above = 0;
  for (int64_t i = 0; i < n; ++i) above += topk_key(x[i]) > t;
  int64_t ties = k - above, out = 0;
  for (int64_t i = 0; i < n && out < k; ++i) {
    float key = topk_key(x[i]);
    if (key > t || (key == t && ties-- > 0)) idx[out++] = static_cast<uint32_t>(i);
  }
  LH_ASSERT(out == k, "topk selected " + std::to_string(out) + " of " + std::to_string(k));
  return Status::Ok();
}

}  // namespace lh::compress::kern
