// defines: lh::Philox — the counter-based Philox4x32-10 generator (Salmon et al. 2011). The same
// (seed, offset) gives the same numbers on CPU and GPU. Used by init, dropout-free sampling,
// stochastic rounding, randk and seeded bases.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace lh {

struct Philox4 {
  uint32_t v[4];
};

LH_HD LH_INLINE uint32_t mulhilo32(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// One Philox4x32-10 block: counter (4 words) under key (2 words).
LH_HD LH_INLINE Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo32(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = mulhilo32(0xCD9E8D57u, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0;
    uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The i-th 32-bit random word of stream `stream` under `seed`: a pure function, so any thread on
// any device can draw element i without coordinating with others.
LH_HD LH_INLINE uint32_t philox_u32(uint64_t seed, uint64_t stream, uint64_t i) {
  uint64_t block = i >> 2;
  Philox4 r = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                            static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32),
                            static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return r.v[i & 3];
}

// Uniform in [0, 1) with 24 bits of precision.
LH_HD LH_INLINE float u32_to_unit(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

LH_HD LH_INLINE float philox_uniform(uint64_t seed, uint64_t stream, uint64_t i) {
  return u32_to_unit(philox_u32(seed, stream, i));
}

// Standard normal by Box-Muller from words 2i and 2i+1.
LH_HD LH_INLINE float philox_normal(uint64_t seed, uint64_t stream, uint64_t i) {
  float u1 = (static_cast<float>(philox_u32(seed, stream, 2 * i) >> 8) + 1.0f) * (1.0f / 16777217.0f);
  float u2 = u32_to_unit(philox_u32(seed, stream, 2 * i + 1));
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}

// Host-side sequential view of a Philox stream, for init and data sampling.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0, uint64_t stream = 0) : seed_(seed), stream_(stream) {}
  uint32_t next_u32() { return philox_u32(seed_, stream_, offset_++); }
  float uniform() { return u32_to_unit(next_u32()); }
  float normal() {
    float r = philox_normal(seed_, stream_ + 0x9E3779B97F4A7C15ull, normal_offset_++);
    return r;
  }
  // Uniform integer in [0, n) (n > 0), by 64-bit multiply-shift.
  uint64_t below(uint64_t n) {
    uint64_t x = (static_cast<uint64_t>(next_u32()) << 32) | next_u32();
    return static_cast<uint64_t>((static_cast<unsigned __int128>(x) * n) >> 64);
  }
  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }
  uint64_t offset() const { return offset_; }
  uint64_t normal_offset() const { return normal_offset_; }
  void set_position(uint64_t offset, uint64_t normal_offset) {
    offset_ = offset;
    normal_offset_ = normal_offset;
  }
  template <class Archive>
  void serialize(Archive& ar) { ar(seed_, stream_, offset_, normal_offset_); }

 private:
  uint64_t seed_, stream_;
  uint64_t offset_ = 0, normal_offset_ = 0;
};

}  // namespace lh
