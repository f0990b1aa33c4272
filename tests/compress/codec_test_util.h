// Shared helpers of the compress tests: seeded tensors, error measures, encode+decode in one call.
// Used by tests/compress/test_*.cpp.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "compress/codec_chain.h"
#include "core/rng.h"

namespace lh::compress::testing {

inline Tensor gaussian(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape);
  Rng r(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = scale * r.normal();
  return t;
}

inline double rel_rms(const Tensor& ref, const Tensor& got) {
  std::vector<float> a = ref.to_vector(), b = got.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(a[i]) * a[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to_vector(), y = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(double(x[i]) - y[i]));
  return m;
}

inline CodecChain chain_of(const std::string& spec) {
  auto c = parse_codec_spec(spec);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? *c : CodecChain();
}

// Encodes with tx, decodes with rx; fails the test on any error.
inline Tensor round_trip(const CodecChain& chain, const Tensor& x, StreamState& tx, StreamState& rx,
                         Packet* packet_out = nullptr, const EncodeOptions& eo = {}) {
  Packet p;
  Status s = chain.encode(x, tx, &p, eo);
  EXPECT_TRUE(s.ok()) << chain.spec() << ": " << s.to_string();
  Tensor y;
  if (s.ok()) {
    Status d = chain.decode(p, rx, &y);
    EXPECT_TRUE(d.ok()) << chain.spec() << ": " << d.to_string();
  }
  if (packet_out) *packet_out = p;
  return y;
}

}  // namespace lh::compress::testing
