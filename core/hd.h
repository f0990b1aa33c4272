// defines: LH_HD (host+device qualifier) and the bf16/fp16 scalar conversions used by kernels
// on both device systems. Used by ops, codecs and the RNG.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LH_HD __host__ __device__
#define LH_INLINE __forceinline__
#else
#define LH_HD
#define LH_INLINE inline
#endif

namespace lh {

LH_HD LH_INLINE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

LH_HD LH_INLINE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// bf16 with round-to-nearest-even; NaN stays NaN (quiet).
LH_HD LH_INLINE uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
LH_HD LH_INLINE float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// IEEE binary16 with round-to-nearest-even, written out so both device systems give the same bits.
LH_HD LH_INLINE uint16_t float_to_fp16(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {                                                // subnormal half or zero
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);          // < 2^-25: rounds to 0
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;  // 14..24
    uint32_t hm = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (hm & 1u))) ++hm;
    return static_cast<uint16_t>(sign | hm);
  }
  uint32_t r = ax - 0x38000000u;  // rebias exponent 127 -> 15
  uint32_t hm = r >> 13;
  uint32_t rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (hm & 1u))) ++hm;
  return static_cast<uint16_t>(sign | hm);
}

LH_HD LH_INLINE float fp16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    // subnormal: value = m * 2^-24
    float v = static_cast<float>(m) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace lh
