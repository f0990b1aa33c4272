// defines: the per-element and per-block math of every codec as __host__ __device__ functors, written
// once and launched by Thrust on the OpenMP (CPU) and CUDA device systems (see kernels_impl.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"
#include "core/rng.h"

namespace lh::compress::kern {

// Multiplication/addition that nvcc must not contract into an FMA, so the CPU and the GPU round alike.
LH_HD LH_INLINE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LH_HD LH_INLINE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Round half to even for |y| < 2^22 without SSE4.1 rounding instructions (vectorises on SSE2).
LH_HD LH_INLINE float round_even_small(float y) { return add_rn(add_rn(y, 12582912.0f), -12582912.0f); }

// Clamp written as compares (maxss/minss, vectorisable; fminf/fmaxf are library calls on x86).
// NaN maps to lo, so the int conversion after it is always defined.
LH_HD LH_INLINE float clampf(float v, float lo, float hi) {
  float t = v > lo ? v : lo;
  return t < hi ? t : hi;
}

// The fp16 block scale: the fp16 of the same sign whose magnitude is the smallest >= |s|, so
// x/scale never leaves the code range. Non-finite s stays non-finite (the block then decodes to
// NaN); finite |s| above the fp16 range saturates at 65504.
LH_HD LH_INLINE uint16_t fp16_scale_up(float s) {
  if (s != s) return 0x7e00u;
  const uint16_t sign = s < 0.0f ? 0x8000u : 0u;
  const float a = fabsf(s);
  if (a > 3.0e38f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a >= 65504.0f) return static_cast<uint16_t>(sign | 0x7bffu);
  uint16_t h = float_to_fp16(a);
  if (fp16_to_float(h) < a) ++h;  // positive fp16 bit patterns are ordered like their values
  return static_cast<uint16_t>(sign | h);
}

constexpr uint64_t kStochasticStream = 0x5354524Eull;  // Philox stream for stochastic rounding

// Block-wise absmax quantization to `bits` (8, 4, 2) with one scale per block (fp16 or fp32).
// int8 and int4 use the whole two's-complement range [-2^(b-1), 2^(b-1)-1] with a signed scale
// d = v / -2^(b-1), v the block's value of largest magnitude (as llama.cpp's Q4_0): the extreme
// lands exactly on the extra negative level, buying a quarter bit over the symmetric range.
// int2 is ternary, q in {-1, 0, 1}, d = absmax. Codes are stored as q (int8 byte), q+8 (int4
// nibble) and q+1 (int2 pair of bits), element 0 in the low bits. Blocks are multiples of 4
// elements, so every block starts on a byte of the code array.
struct QuantSpec {
  int bits = 8;
  int block = 64;
  bool fp32_scale = false;
  bool stochastic = false;
  uint64_t seed = 0;
};

// Code range [qlo, qhi] and the level the extreme value maps to.
LH_HD LH_INLINE int quant_qlo(int bits) { return bits == 2 ? -1 : -(1 << (bits - 1)); }
LH_HD LH_INLINE int quant_qhi(int bits) { return bits == 2 ? 1 : (1 << (bits - 1)) - 1; }

// One step of a block's absmax scan. Float bits read as int32 order like the floats for x >= 0 (NaN
// above inf), and bits ^ sign order like |x| for x <= 0. Two integer max reductions (which
// vectorise) thus give the largest positive and the largest negative magnitude; a NaN wins, so a
// block holding NaN decodes to NaN. Start from pos = neg = 0.
LH_HD LH_INLINE void quant_absmax_step(float x, int32_t* pos, int32_t* neg) {
  int32_t v = static_cast<int32_t>(float_bits(x));
  int32_t f = static_cast<int32_t>(static_cast<uint32_t>(v) ^ 0x80000000u);
  *pos = v > *pos ? v : *pos;
  *neg = f > *neg ? f : *neg;
}

// From a block's absmax scan: writes block b's scale (fp16 or fp32) and returns the reciprocal the
// codes are computed with (0 for zero, NaN and inf scales). Shared by the CUDA kernel and the CPU
// fast path (kernels_cpu.cpp), so both produce the same bits.
LH_HD LH_INLINE float quant_block_scale(int32_t pos, int32_t neg, const QuantSpec& q, uint8_t* scales, int64_t b) {
  const float amax = bits_float(static_cast<uint32_t>(pos >= neg ? pos : neg));
  const float vmax = pos >= neg ? amax : -amax;  // the signed value of largest magnitude
  const float lo = static_cast<float>(quant_qlo(q.bits));
  float s = q.bits == 2 ? amax : vmax / lo;
  if (q.fp32_scale) {
    reinterpret_cast<float*>(scales)[b] = s;
  } else {
    uint16_t h = fp16_scale_up(s);
    reinterpret_cast<uint16_t*>(scales)[b] = h;
    s = fp16_to_float(h);
  }
  const float as = fabsf(s);
  return (as > 0.0f && as <= 3.0e38f) ? 1.0f / s : 0.0f;
}

// The code of v under round-to-nearest-even, clamped to [lo, hi] (NaN -> lo).
LH_HD LH_INLINE int quant_code_nearest(float v, float inv, float lo, float hi) {
  return static_cast<int>(clampf(round_even_small(mul_rn(v, inv)), lo, hi));
}

struct QuantizeBlock {
  const float* x;
  int64_t n;
  QuantSpec q;
  uint8_t* scales;
  uint8_t* codes;

  LH_HD void operator()(int64_t b) const {
    const int64_t start = b * q.block;
    const int len = static_cast<int>(n - start < q.block ? n - start : q.block);
    const float* xb = x + start;
    int32_t pos = 0, neg = 0;
    for (int i = 0; i < len; ++i) quant_absmax_step(xb[i], &pos, &neg);
    const float inv = quant_block_scale(pos, neg, q, scales, b);
    const float lo = static_cast<float>(quant_qlo(q.bits)), hi = static_cast<float>(quant_qhi(q.bits));
    if (q.stochastic)
      pack<true>(xb, len, start, inv, lo, hi);
    else
      pack<false>(xb, len, start, inv, lo, hi);
  }

  // Rounds and packs one block. The rounding mode is a template parameter so the nearest-rounding
  // loops carry no branch and vectorise.
  template <bool kStochastic>
  LH_HD LH_INLINE int code_of(float v, int64_t i, float inv, float lo, float hi) const {
    if constexpr (kStochastic) {
      // floor(y + u), u ~ U[0,1): E[r] = y, so the rounding is unbiased.
      const float y = mul_rn(v, inv);
      const float r = floorf(add_rn(y, philox_uniform(q.seed, kStochasticStream, static_cast<uint64_t>(i))));
      return static_cast<int>(clampf(r, lo, hi));
    } else {
      return quant_code_nearest(v, inv, lo, hi);
    }
  }

  template <bool kStochastic>
  LH_HD void pack(const float* xb, int len, int64_t start, float inv, float lo, float hi) const {
    if (q.bits == 8) {
      int8_t* c = reinterpret_cast<int8_t*>(codes) + start;
      for (int i = 0; i < len; ++i) c[i] = static_cast<int8_t>(code_of<kStochastic>(xb[i], start + i, inv, lo, hi));
    } else if (q.bits == 4) {
      uint8_t* c = codes + start / 2;
      const int pairs = len / 2;
      for (int j = 0; j < pairs; ++j) {
        int c0 = code_of<kStochastic>(xb[2 * j], start + 2 * j, inv, lo, hi) + 8;
        int c1 = code_of<kStochastic>(xb[2 * j + 1], start + 2 * j + 1, inv, lo, hi) + 8;
        c[j] = static_cast<uint8_t>(c0 | (c1 << 4));
      }
      if (len & 1) c[pairs] = static_cast<uint8_t>(code_of<kStochastic>(xb[len - 1], start + len - 1, inv, lo, hi) + 8);
    } else {
      uint8_t* c = codes + start / 4;
      const int quads = len / 4;
      for (int j = 0; j < quads; ++j) {
        int v = 0;
        for (int t = 0; t < 4; ++t) v |= (code_of<kStochastic>(xb[4 * j + t], start + 4 * j + t, inv, lo, hi) + 1) << (2 * t);
        c[j] = static_cast<uint8_t>(v);
      }
      if (len & 3) {
        int v = 0;
        for (int t = 0; t < (len & 3); ++t)
          v |= (code_of<kStochastic>(xb[4 * quads + t], start + 4 * quads + t, inv, lo, hi) + 1) << (2 * t);
        c[quads] = static_cast<uint8_t>(v);
      }
    }
  }
};

// The CPU's plain QuantizeBlock loop, one block per call on the calling thread: the reference the
// CPU fast path of quantize (kernels_cpu.cpp) is tested against. Host only.
void quantize_reference_cpu(const float* x, int64_t n, const QuantSpec& q, uint8_t* scales, uint8_t* codes);

struct DequantizeBlock {
  const uint8_t* scales;
  const uint8_t* codes;
  int64_t n;
  QuantSpec q;
  float* y;

  LH_HD void operator()(int64_t b) const {
    const int64_t start = b * q.block;
    const int len = static_cast<int>(n - start < q.block ? n - start : q.block);
    const float s = q.fp32_scale ? reinterpret_cast<const float*>(scales)[b]
                                 : fp16_to_float(reinterpret_cast<const uint16_t*>(scales)[b]);
    float* yb = y + start;
    if (q.bits == 8) {
      const int8_t* c = reinterpret_cast<const int8_t*>(codes) + start;
      for (int i = 0; i < len; ++i) yb[i] = mul_rn(static_cast<float>(c[i]), s);
    } else if (q.bits == 4) {
      const uint8_t* c = codes + start / 2;
      const int pairs = len / 2;
      for (int j = 0; j < pairs; ++j) {
        yb[2 * j] = mul_rn(static_cast<float>((c[j] & 0xF) - 8), s);
        yb[2 * j + 1] = mul_rn(static_cast<float>((c[j] >> 4) - 8), s);
      }
      if (len & 1) yb[len - 1] = mul_rn(static_cast<float>((c[pairs] & 0xF) - 8), s);
    } else {
      const uint8_t* c = codes + start / 4;
      for (int i = 0; i < len; ++i) {
        int v = (c[i >> 2] >> ((i & 3) * 2)) & 0x3;
        yb[i] = mul_rn(static_cast<float>(v - 1), s);
      }
    }
  }
};

// fp32 <-> IEEE fp16 without branches (after Maratyszcza's FP16 library), so the CPU loop
// vectorises on SSE2: round to nearest even by letting a float addition do the rounding. Same
// results as core/hd.h's float_to_fp16 / fp16_to_float for every non-NaN input (a test checks all
// of them); NaN becomes the quiet NaN 0x7e00.
LH_HD LH_INLINE uint16_t fp16_from_float_fast(float f) {
  float base = mul_rn(mul_rn(fabsf(f), 0x1.0p+112f), 0x1.0p-110f);  // overflows to inf exactly when fp16 does
  const uint32_t w = float_bits(f);
  const int32_t aw = static_cast<int32_t>(w & 0x7fffffffu);  // signed compares below: SSE2 has no unsigned ones
  int32_t e = aw >> 23;
  e = e < 0x71 ? 0x71 : e;
  base = add_rn(bits_float(static_cast<uint32_t>(e << 23) + 0x07800000u), base);
  const uint32_t bits = float_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  const uint32_t sign = (w >> 16) & 0x8000u;
  const uint32_t nan = 0u - static_cast<uint32_t>(aw > 0x7f800000);  // a mask, not a branch: GCC vectorises it
  return static_cast<uint16_t>(sign | (nan & 0x7E00u) | (~nan & nonsign));
}

LH_HD LH_INLINE float fp16_to_float_fast(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = mul_rn(bits_float((two_w >> 4) + (0xE0u << 23)), 0x1.0p-112f);
  const float denormalized = add_rn(bits_float((two_w >> 17) | (126u << 23)), -0.5f);
  const int32_t ah = h & 0x7fff;
  const uint32_t sub = 0u - static_cast<uint32_t>(ah < 0x400);
  return bits_float(sign | (sub & float_bits(denormalized)) | (~sub & float_bits(normalized)));
}

// Elementwise work in chunks of kChunk elements per call: a large chunk lets the CPU compiler
// vectorise the inner loop; the GPU uses kChunk = 1 so neighbouring threads touch neighbouring words.
template <int kChunk>
struct ToHalf {
  const float* x;
  uint16_t* y;
  int64_t n;
  bool bf16;
  LH_HD void operator()(int64_t c) const {
    int64_t b = c * kChunk, e = b + kChunk < n ? b + kChunk : n;
    if (bf16)
      for (int64_t i = b; i < e; ++i) y[i] = float_to_bf16(x[i]);
    else
      for (int64_t i = b; i < e; ++i) y[i] = fp16_from_float_fast(x[i]);
  }
};

template <int kChunk>
struct FromHalf {
  const uint16_t* x;
  float* y;
  int64_t n;
  bool bf16;
  LH_HD void operator()(int64_t c) const {
    int64_t b = c * kChunk, e = b + kChunk < n ? b + kChunk : n;
    if (bf16)
      for (int64_t i = b; i < e; ++i) y[i] = bf16_to_float(x[i]);
    else
      for (int64_t i = b; i < e; ++i) y[i] = fp16_to_float_fast(x[i]);
  }
};

// y = a + s·b, elementwise (ef: x + e; delta: a − m, m + d).
template <int kChunk>
struct Axpby {
  float* y;
  const float* a;
  const float* b;
  float s;
  int64_t n;
  LH_HD void operator()(int64_t c) const {
    int64_t lo = c * kChunk, hi = lo + kChunk < n ? lo + kChunk : n;
    for (int64_t i = lo; i < hi; ++i) y[i] = add_rn(a[i], mul_rn(s, b[i]));
  }
};

LH_HD LH_INLINE uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A seeded bijection of [0, n): a 4-round Feistel network on the smallest even-bit power-of-two
// domain >= n, cycle-walked back into range. randk takes perm(0..k-1): k distinct indices that
// both ends compute from the seed alone, on any device.
struct RandomPermutation {
  uint64_t n = 1;
  uint64_t seed = 0;
  int half_bits = 1;
  uint64_t mask = 1;

  RandomPermutation() = default;
  LH_HD RandomPermutation(uint64_t n_, uint64_t seed_) : n(n_), seed(seed_) {
    int bits = 2;
    while (bits < 64 && (uint64_t{1} << bits) < n) bits += 2;
    half_bits = bits / 2;
    mask = (uint64_t{1} << half_bits) - 1;
  }
  LH_HD LH_INLINE uint64_t once(uint64_t v) const {
    uint64_t l = v >> half_bits, r = v & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      uint64_t f = mix64(r ^ mix64(seed + round * 0x9E3779B97F4A7C15ull)) & mask;
      uint64_t nl = r;
      r = l ^ f;
      l = nl;
    }
    return (l << half_bits) | r;
  }
  LH_HD uint64_t operator()(uint64_t i) const {
    uint64_t v = once(i);
    while (v >= n) v = once(v);
    return v;
  }
};

struct RandkGather {
  const float* x;
  float* v;
  RandomPermutation perm;
  LH_HD void operator()(int64_t j) const { v[j] = x[perm(static_cast<uint64_t>(j))]; }
};
struct RandkScatter {
  const float* v;
  float* y;
  RandomPermutation perm;
  LH_HD void operator()(int64_t j) const { y[perm(static_cast<uint64_t>(j))] = v[j]; }
};

struct IndexGather {
  const float* x;
  const uint32_t* idx;
  float* v;
  LH_HD void operator()(int64_t j) const { v[j] = x[idx[j]]; }
};
struct IndexScatter {
  const float* v;
  const uint32_t* idx;
  float* y;
  LH_HD void operator()(int64_t j) const { y[idx[j]] = v[j]; }
};

// topk's order key: NaN ranks above everything, so it travels instead of hiding.
LH_HD LH_INLINE float topk_key(float x) { return x != x ? INFINITY : fabsf(x); }

// Values block b of n keeps as spikes: s, or the length of a short last block when that is less.
LH_HD LH_INLINE int spikes_in_block(int64_t n, int block, int s, int64_t b) {
  const int64_t left = n - b * block;
  return left < s ? static_cast<int>(left) : s;
}

// spikes (spike reserving): per block of `block` elements, the s (<= 8) largest under topk's order
// (key desc, index asc) by one block-wide scan each; their offsets in the block ascending. Block b's
// spikes sit at [b·s, b·s + its count): only the last block can hold fewer than s.
struct SpikesExtract {
  const float* x;
  int64_t n;
  int block, s;
  float* rest;    // x with the spikes set to 0
  uint8_t* offs;  // offset of each spike in its block
  float* vals;    // the spikes' values
  LH_HD void operator()(int64_t b) const {
    const int64_t start = b * block;
    const int len = n - start < block ? static_cast<int>(n - start) : block;
    const int cnt = spikes_in_block(n, block, s, b);
    int sel[8];
    for (int j = 0; j < cnt; ++j) {
      int best = -1;
      float best_key = 0;
      for (int i = 0; i < len; ++i) {
        bool taken = false;
        for (int t = 0; t < j; ++t) taken = taken || sel[t] == i;
        const float key = topk_key(x[start + i]);
        if (!taken && (best < 0 || key > best_key)) {
          best = i;
          best_key = key;
        }
      }
      sel[j] = best;
    }
    for (int j = 1; j < cnt; ++j) {  // insertion sort: ascending offsets
      const int v = sel[j];
      int t = j - 1;
      while (t >= 0 && sel[t] > v) {
        sel[t + 1] = sel[t];
        --t;
      }
      sel[t + 1] = v;
    }
    for (int i = 0; i < len; ++i) rest[start + i] = x[start + i];
    for (int j = 0; j < cnt; ++j) {
      offs[b * s + j] = static_cast<uint8_t>(sel[j]);
      vals[b * s + j] = x[start + sel[j]];
      rest[start + sel[j]] = 0.0f;
    }
  }
};
// Writes the spikes back over y (the decoded rest).
struct SpikesRestore {
  const uint8_t* offs;
  const float* vals;
  int64_t n;
  int block, s;
  float* y;
  LH_HD void operator()(int64_t b) const {
    const int64_t start = b * block;
    const int cnt = spikes_in_block(n, block, s, b);
    for (int j = 0; j < cnt; ++j) y[start + offs[b * s + j]] = vals[b * s + j];
  }
};

}  // namespace lh::compress::kern
