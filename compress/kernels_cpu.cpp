// CPU instantiation of the codec kernels (Thrust on OpenMP) and the device dispatch behind
// device_kernels.h. Used by every codec stage; CUDA calls go to kernels_cuda.cu.
#include <thrust/system/cpp/execution_policy.h>
#include <thrust/system/omp/execution_policy.h>

#include <algorithm>
#include <functional>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "compress/device_kernels.h"
#include "compress/kernels_impl.h"

namespace lh::compress::kern {

namespace {
constexpr int kCpuChunk = 4096;  // elements per OpenMP work item: vectorisable inner loops, few items
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
}  // namespace

namespace cpu_quant {

// CPU fast path of QuantizeBlock for int8/int4 with nearest rounding, fused per block (scan, scale,
// codes while the block is in L1). On x86-64 the scan and the codes use SSE2 (part of the base
// ISA, no runtime dispatch); elsewhere, and for the last < 16 (int8) / 32 (int4) elements of a
// block, the portable helpers. The block size is a template constant for the common sizes, and a
// work item covers many blocks. The scale comes from the shared quant_block_scale and every code
// equals quant_code_nearest's, so the packets are the bits QuantizeBlock (and CUDA) produce; a test
// compares the fast path with QuantizeBlock and with a plain loop. Assumes the default MXCSR
// (round to nearest, no DAZ/FTZ), as the portable code's round_even_small does.
#if defined(__SSE2__)
// The block's absmax scan as pos/neg of quant_absmax_step. Float max/min (4 ops per 4 elements on
// SSE2, the integer scan needs ~10 without pmaxsd) give the same two integers when the block holds
// no NaN: pos = bits of max(+0, largest x), neg = bits of |smallest x| if it is < 0. A block with a
// NaN (the payload that wins matters for fp32 scales) takes the integer scan.
LH_INLINE void scan(const float* __restrict xb, int len, int32_t* pos_out, int32_t* neg_out) {
  __m128 mx = _mm_setzero_ps(), mn = _mm_setzero_ps(), nan = _mm_setzero_ps();
  int i = 0;
  for (; i + 4 <= len; i += 4) {
    const __m128 v = _mm_loadu_ps(xb + i);
    mx = _mm_max_ps(v, mx);  // v > mx ? v : mx: a NaN or -0 never enters
    mn = _mm_min_ps(v, mn);
    nan = _mm_or_ps(nan, _mm_cmpunord_ps(v, v));
  }
  // Lanes hold no NaN and no -0, so the order of the reduction does not matter.
  mx = _mm_max_ps(mx, _mm_shuffle_ps(mx, mx, 0x4E));
  mx = _mm_max_ps(mx, _mm_shuffle_ps(mx, mx, 0xB1));
  mn = _mm_min_ps(mn, _mm_shuffle_ps(mn, mn, 0x4E));
  mn = _mm_min_ps(mn, _mm_shuffle_ps(mn, mn, 0xB1));
  float p = _mm_cvtss_f32(mx), m = _mm_cvtss_f32(mn);
  bool has_nan = _mm_movemask_ps(nan) != 0;
  for (; i < len; ++i) {
    const float v = xb[i];
    has_nan |= v != v;
    p = v > p ? v : p;
    m = v < m ? v : m;
  }
  if (has_nan) {
    int32_t pos = 0, neg = 0;
    for (int j = 0; j < len; ++j) quant_absmax_step(xb[j], &pos, &neg);
    *pos_out = pos;
    *neg_out = neg;
    return;
  }
  *pos_out = static_cast<int32_t>(float_bits(p));
  *neg_out = m < 0.0f ? static_cast<int32_t>(float_bits(m) ^ 0x80000000u) : 0;
}

// Codes of 16 elements as int8: clamp (NaN -> lo, as clampf) then convert with the current rounding
// mode (nearest even): round and clamp commute for integer bounds, so this is quant_code_nearest.
LH_INLINE __m128i codes16(const float* __restrict p, __m128 inv, __m128 lo, __m128 hi) {
  auto q4 = [&](int k) {
    __m128 y = _mm_mul_ps(_mm_loadu_ps(p + 4 * k), inv);
    y = _mm_min_ps(_mm_max_ps(y, lo), hi);  // max(y, lo) is lo for a NaN y
    return _mm_cvtps_epi32(y);
  };
  return _mm_packs_epi16(_mm_packs_epi32(q4(0), q4(1)), _mm_packs_epi32(q4(2), q4(3)));  // in range: no saturation
}
#endif

template <int kBits, int kLen>
LH_INLINE void block(const float* __restrict xb, int len_rt, int64_t b, const QuantSpec& q, uint8_t* scales,
                     uint8_t* __restrict codes) {
  const int len = kLen > 0 ? kLen : len_rt;
  int32_t pos = 0, neg = 0;
#if defined(__SSE2__)
  scan(xb, len, &pos, &neg);
#else
  for (int i = 0; i < len; ++i) quant_absmax_step(xb[i], &pos, &neg);
#endif
  const float inv = quant_block_scale(pos, neg, q, scales, b);
  constexpr float lo = kBits == 8 ? -128.0f : -8.0f, hi = kBits == 8 ? 127.0f : 7.0f;
  int i = 0;
#if defined(__SSE2__)
  const __m128 vinv = _mm_set1_ps(inv), vlo = _mm_set1_ps(lo), vhi = _mm_set1_ps(hi);
#endif
  if constexpr (kBits == 8) {
    int8_t* __restrict c = reinterpret_cast<int8_t*>(codes) + b * q.block;
#if defined(__SSE2__)
    for (; i + 16 <= len; i += 16)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(c + i), codes16(xb + i, vinv, vlo, vhi));
#endif
    for (; i < len; ++i) c[i] = static_cast<int8_t>(quant_code_nearest(xb[i], inv, lo, hi));
  } else {
    // Code q in [-8, 7] is stored as the nibble q + 8 = (q & 15) ^ 8, element 2j in the low nibble.
    uint8_t* __restrict c = codes + b * q.block / 2;
#if defined(__SSE2__)
    const __m128i m_lo = _mm_set1_epi16(0x000F), m_hi = _mm_set1_epi16(0x00F0), flip = _mm_set1_epi16(0x0088);
    auto nibbles = [&](__m128i w) {  // 16-bit lanes holding codes (2j, 2j+1) -> byte j in the low half
      return _mm_xor_si128(_mm_or_si128(_mm_and_si128(w, m_lo), _mm_and_si128(_mm_srli_epi16(w, 4), m_hi)), flip);
    };
    for (; i + 32 <= len; i += 32) {
      const __m128i r =
          _mm_packus_epi16(nibbles(codes16(xb + i, vinv, vlo, vhi)), nibbles(codes16(xb + i + 16, vinv, vlo, vhi)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(c + i / 2), r);
    }
#endif
    for (; i + 2 <= len; i += 2) {
      const int c0 = quant_code_nearest(xb[i], inv, lo, hi), c1 = quant_code_nearest(xb[i + 1], inv, lo, hi);
      c[i / 2] = static_cast<uint8_t>(((c0 & 0xF) | ((c1 & 0xF) << 4)) ^ 0x88);
    }
    if (i < len) c[i / 2] = static_cast<uint8_t>((quant_code_nearest(xb[i], inv, lo, hi) & 0xF) ^ 0x8);
  }
}

// Blocks [b0, b1) of which all but possibly the last (the tensor's tail) are full.
template <int kBits, int kLen>
void blocks(const float* x, int64_t n, const QuantSpec& q, uint8_t* scales, uint8_t* codes, int64_t b0, int64_t b1) {
  const int64_t bs = q.block;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t start = b * bs;
    const int64_t len = n - start < bs ? n - start : bs;
    if (kLen > 0 && len == kLen)
      block<kBits, kLen>(x + start, kLen, b, q, scales, codes);
    else
      block<kBits, 0>(x + start, static_cast<int>(len), b, q, scales, codes);
  }
}

template <int kBits>
struct Group {
  const float* x;
  int64_t n;
  QuantSpec q;
  uint8_t* scales;
  uint8_t* codes;
  int64_t per_group, nblocks;
  void operator()(int64_t g) const {
    const int64_t b0 = g * per_group, b1 = b0 + per_group < nblocks ? b0 + per_group : nblocks;
    switch (q.block) {
      case 32: blocks<kBits, 32>(x, n, q, scales, codes, b0, b1); break;
      case 64: blocks<kBits, 64>(x, n, q, scales, codes, b0, b1); break;
      case 128: blocks<kBits, 128>(x, n, q, scales, codes, b0, b1); break;
      case 256: blocks<kBits, 256>(x, n, q, scales, codes, b0, b1); break;
      default: blocks<kBits, 0>(x, n, q, scales, codes, b0, b1); break;
    }
  }
};

constexpr int64_t kGroupElems = 1 << 15;  // elements per OpenMP work item

template <int kBits, class Policy>
void run(Policy&& p, const float* x, int64_t n, const QuantSpec& q, uint8_t* scales, uint8_t* codes) {
  const int64_t nblocks = quant_blocks(n, q.block);
  const int64_t per_group = std::max<int64_t>(1, kGroupElems / q.block);
  impl::for_each_index(p, (nblocks + per_group - 1) / per_group,
                       Group<kBits>{x, n, q, scales, codes, per_group, nblocks});
}

}  // namespace cpu_quant

// The CPU path of quantize without the fast path (tests compare the two).
void quantize_reference_cpu(const float* x, int64_t n, const QuantSpec& q, uint8_t* scales, uint8_t* codes) {
  impl::quantize(thrust::cpp::par, x, n, q, scales, codes);
}

void quantize(const Exec& ex, const float* x, int64_t n, const QuantSpec& q, uint8_t* scales, uint8_t* codes) {
  LH_KERN_DISPATCH(ex, quantize(ex.stream, x, n, q, scales, codes));
  if (!q.stochastic && q.bits == 8)
    on_cpu(n, [&](auto p) { cpu_quant::run<8>(p, x, n, q, scales, codes); });
  else if (!q.stochastic && q.bits == 4)
    on_cpu(n, [&](auto p) { cpu_quant::run<4>(p, x, n, q, scales, codes); });
  else
    on_cpu(n, [&](auto p) { impl::quantize(p, x, n, q, scales, codes); });
}
void dequantize(const Exec& ex, const uint8_t* scales, const uint8_t* codes, int64_t n, const QuantSpec& q, float* y) {
  LH_KERN_DISPATCH(ex, dequantize(ex.stream, scales, codes, n, q, y));
  on_cpu(n, [&](auto p) { impl::dequantize(p, scales, codes, n, q, y); });
}
void to_half(const Exec& ex, const float* x, int64_t n, bool bf16, uint16_t* y) {
  LH_KERN_DISPATCH(ex, to_half(ex.stream, x, n, bf16, y));
  on_cpu(n, [&](auto p) { impl::to_half<kCpuChunk>(p, x, n, bf16, y); });
}
void from_half(const Exec& ex, const uint16_t* x, int64_t n, bool bf16, float* y) {
  LH_KERN_DISPATCH(ex, from_half(ex.stream, x, n, bf16, y));
  on_cpu(n, [&](auto p) { impl::from_half<kCpuChunk>(p, x, n, bf16, y); });
}
void axpby(const Exec& ex, float* y, const float* a, const float* b, float s, int64_t n) {
  LH_KERN_DISPATCH(ex, axpby(ex.stream, y, a, b, s, n));
  on_cpu(n, [&](auto p) { impl::axpby<kCpuChunk>(p, y, a, b, s, n); });
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
