// Round trips and error bounds of every codec and chain on the CPU: shapes, dtypes, block sizes,
// int8/int4 error, fp16/bf16 bit-exactness, stochastic rounding bias, topk/randk selection,
// lowrank and subspace exactness. Label `compress`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "codec_test_util.h"
#include "compress/chain_internal.h"
#include "compress/device_kernels.h"
#include "core/hd.h"

namespace lh::compress {
namespace {

using testing::chain_of;
using testing::gaussian;
using testing::rel_rms;
using testing::round_trip;

const std::vector<Shape> kShapes = {{1}, {7}, {64}, {1000}, {3, 5}, {17, 33}, {2, 3, 65}, {4, 8, 16}, {0}, {2, 0, 3}};
const std::vector<std::string> kSpecs = {"none",
                                         "fp16",
                                         "bf16",
                                         "int8",
                                         "int4",
                                         "int2",
                                         "int8:block=32",
                                         "int4:block=128,scale=fp32",
                                         "int8:stochastic",
                                         "int2:block=4",
                                         "topk:ratio=0.1",
                                         "randk:ratio=0.25",
                                         "lowrank:rank=2",
                                         "lowrank:rank=8+int8",
                                         "subspace:k=8",
                                         "subspace:k=4+int8",
                                         "ef+int4",
                                         "ef+topk:ratio=0.01+int4",
                                         "ef+lowrank:rank=4,iters=2+bf16",
                                         "randk:ratio=0.1+topk:ratio=0.2+int4:block=128",
                                         "topk:ratio=0.5+fp16",
                                         "lowrank:rank=3+topk:ratio=0.5+int8",
                                         "spikes",
                                         "spikes:block=4,n=3+int4",
                                         "spikes:block=16,n=2,values=fp32+int2",
                                         "ef+spikes+int4:block=32",
                                         "spikes:block=8+topk:ratio=0.5+int8"};

TEST(Codecs, EveryChainRoundTripsEveryShapeAndPacketSizeIsExact) {
  for (const std::string& spec : kSpecs) {
    CodecChain chain = chain_of(spec);
    for (const Shape& shape : kShapes) {
      if (spec.rfind("subspace", 0) == 0 && (shape.back() == 0)) continue;
      StreamState tx, rx;
      Tensor x = gaussian(shape, 11);
      Packet p;
      Tensor y = round_trip(chain, x, tx, rx, &p);
      ASSERT_TRUE(y.defined()) << spec << " " << shape_string(shape);
      EXPECT_EQ(y.shape(), shape) << spec;
      EXPECT_EQ(y.dtype(), DType::f32);
      auto expect = chain.packet_bytes(shape);
      ASSERT_TRUE(expect.ok()) << expect.status().to_string();
      EXPECT_EQ(p.size(), *expect) << spec << " " << shape_string(shape);
      EXPECT_EQ(p.size() % 8, 0u);
      for (float v : y.to_vector()) EXPECT_TRUE(std::isfinite(v)) << spec;
    }
  }
}

TEST(Codecs, LosslessAndHalfPrecisionAreBitExact) {
  Tensor x = gaussian({5, 77}, 3, 100.0f);
  x.at(0) = 65519.0f;   // rounds to the largest fp16
  x.at(1) = 1e-7f;      // fp16 subnormal
  x.at(2) = -0.0f;
  for (const char* spec : {"none", "fp16", "bf16"}) {
    StreamState tx, rx;
    Tensor y = round_trip(chain_of(spec), x, tx, rx);
    for (int64_t i = 0; i < x.numel(); ++i) {
      float want = x.at(i);
      if (std::string(spec) == "fp16") want = fp16_to_float(float_to_fp16(want));
      if (std::string(spec) == "bf16") want = bf16_to_float(float_to_bf16(want));
      ASSERT_EQ(float_bits(y.at(i)), float_bits(want)) << spec << " at " << i;
    }
  }
}

TEST(Codecs, FastHalfConversionsMatchTheReferenceOnEveryInput) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float a = fp16_to_float(static_cast<uint16_t>(h)), b = kern::fp16_to_float_fast(static_cast<uint16_t>(h));
    if (std::isnan(a)) {
      ASSERT_TRUE(std::isnan(b)) << h;
    } else {
      ASSERT_EQ(float_bits(a), float_bits(b)) << h;
    }
  }
  // Every fp16 value, the midpoints between neighbours (ties to even) and their float neighbours,
  // plus random bit patterns over the whole float range.
  std::vector<float> probe = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e30f, -1e-30f, INFINITY, -INFINITY};
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    float v = fp16_to_float(static_cast<uint16_t>(h)), next = fp16_to_float(static_cast<uint16_t>(h + 1));
    float mid = 0.5f * (v + next);
    probe.insert(probe.end(), {v, -v, mid, -mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)});
  }
  Rng r(3);
  for (int i = 0; i < 200000; ++i) probe.push_back(bits_float(r.next_u32()));
  for (float f : probe) {
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_fp16(f), kern::fp16_from_float_fast(f)) << f;
  }
  EXPECT_TRUE(std::isnan(fp16_to_float(kern::fp16_from_float_fast(NAN))));
}

TEST(Codecs, QuantizerErrorBoundsOnGaussianData) {
  Tensor x = gaussian({256, 512}, 5);
  struct Case { const char* spec; double bound; };
  for (Case c : {Case{"int8", 0.01}, {"int8:block=32", 0.01}, {"int8:block=128,scale=fp32", 0.01},
                 Case{"int4", 0.10}, {"int4:block=32", 0.10},
                 // 128-wide blocks (CocktailSGD) have a larger absmax, so a coarser step: ~10.4%.
                 Case{"int4:block=128", 0.11}}) {
    StreamState tx, rx;
    Tensor y = round_trip(chain_of(c.spec), x, tx, rx);
    double e = rel_rms(x, y);
    EXPECT_LE(e, c.bound) << c.spec;
    EXPECT_GT(e, 0.0) << c.spec;  // it is lossy: a test that cannot fail is no test
  }
  StreamState tx, rx;
  double e2 = rel_rms(x, round_trip(chain_of("int2"), x, tx, rx));
  EXPECT_LT(e2, 0.75);
}

TEST(Codecs, QuantizedValuesStayWithinHalfAStepOfTheInput) {
  // Step d = absmax / 2^(b-1) for int8/int4 (the extreme sits on the extra negative level), absmax
  // for ternary int2. Values beyond the last positive level clamp to it.
  Tensor x = gaussian({3, 100}, 8);
  for (int bits : {8, 4, 2}) {
    std::string spec = "int" + std::to_string(bits) + ":block=32,scale=fp32";
    StreamState tx, rx;
    Tensor y = round_trip(chain_of(spec), x, tx, rx);
    const float levels = bits == 2 ? 1.0f : float(1 << (bits - 1));
    const float top = bits == 2 ? 1.0f : levels - 1.0f;  // last level on the far side of the extreme
    for (int64_t b = 0; b * 32 < x.numel(); ++b) {
      int64_t lo = b * 32, hi = std::min<int64_t>(x.numel(), lo + 32);
      float amax = 0;
      for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x.at(i)));
      const float d = amax / levels;
      for (int64_t i = lo; i < hi; ++i) {
        float bound = std::max(0.5f * d, std::fabs(x.at(i)) - top * d) * 1.0001f + 1e-7f;
        ASSERT_LE(std::fabs(x.at(i) - y.at(i)), bound) << spec << " at " << i;
      }
    }
  }
}

TEST(Codecs, StochasticRoundingIsUnbiased) {
  // One block; the values sit between quantization levels. Averaged over N packets with fresh
  // seeds, stochastic rounding converges to x (standard error ~ step/(2·sqrt(N))), nearest does not.
  const int N = 4000;
  Tensor x = Tensor::empty({32});
  for (int i = 0; i < 32; ++i) x.at(i) = (i == 0) ? 1.0f : 0.3f + 0.011f * i;
  for (const char* spec : {"int4:block=32,scale=fp32,stochastic", "int2:block=32,scale=fp32,stochastic"}) {
    CodecChain chain = chain_of(spec);
    StreamState tx(Role::kWeightGrad, 99), rx(Role::kWeightGrad);
    std::vector<double> mean(32, 0.0);
    for (int t = 0; t < N; ++t) {
      Tensor y = round_trip(chain, x, tx, rx);
      for (int i = 0; i < 32; ++i) mean[i] += y.at(i) / N;
    }
    double step = std::string(spec).rfind("int4", 0) == 0 ? 1.0 / 8 : 1.0;
    for (int i = 1; i < 32; ++i)
      EXPECT_NEAR(mean[i], x.at(i), 5.0 * step / (2.0 * std::sqrt(double(N)))) << spec << " at " << i;
  }
  // Nearest rounding of the same data is biased: its error does not average out.
  StreamState tx, rx;
  Tensor y = round_trip(chain_of("int4:block=32,scale=fp32"), x, tx, rx);
  double bias = 0;
  for (int i = 1; i < 32; ++i) bias = std::max(bias, std::fabs(double(y.at(i)) - x.at(i)));
  EXPECT_GT(bias, 0.02);
}

TEST(Codecs, NonFiniteInputsPropagateWithoutUndefinedBehaviour) {
  Tensor x = gaussian({200}, 1);
  x.at(5) = NAN;
  x.at(100) = INFINITY;
  for (const char* spec : {"int8", "int4:scale=fp32", "int2", "fp16", "topk:ratio=0.05"}) {
    StreamState tx, rx;
    Tensor y = round_trip(chain_of(spec), x, tx, rx);
    ASSERT_TRUE(y.defined());
    EXPECT_FALSE(std::isfinite(y.at(5))) << spec;  // NaN must not turn into a plausible number
  }
}

TEST(Codecs, HalfPrecisionInputsRoundTripInTheirOwnDtype) {
  Tensor x32 = gaussian({6, 40}, 4);
  for (DType dt : {DType::bf16, DType::f16}) {
    Tensor x = Tensor::empty({6, 40}, dt);
    kern::to_half(Exec::cpu(), x32.data<float>(), x32.numel(), dt == DType::bf16, static_cast<uint16_t*>(x.raw_data()));
    for (const char* spec : {"none", "int8", "ef+topk:ratio=0.3+int4", "lowrank:rank=6", "zstd", "int8+zstd"}) {
      StreamState tx, rx;
      Packet p;
      ASSERT_TRUE(chain_of(spec).encode(x, tx, &p).ok());
      Tensor y;
      ASSERT_TRUE(decode_packet(p.bytes.data(), p.size(), rx, &y).ok());
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_EQ(y.shape(), x.shape());
      if (std::string(spec) == "none" || std::string(spec) == "zstd") {
        EXPECT_EQ(0, std::memcmp(x.raw_data(), y.raw_data(), x.nbytes())) << "lossless on " << dtype_name(dt);
      }
    }
  }
}

// zstd is lossless over the whole packet before it: the same stream of tensors through X and X+zstd decodes to
// the same bits, stream state (ef residuals, PowerSGD warm starts, delta memories) included.
TEST(Codecs, ZstdDecodesToTheBitsOfTheChainBeforeIt) {
  for (const std::string inner : {"none", "int8", "int4:block=32", "int2", "ef+int4", "lowrank:rank=2+int8",
                                  "ef+topk:ratio=0.1+int4", "delta+int8", "bf16", "subspace:k=4+int8"}) {
    for (const std::string level : {"", ":level=1", ":level=19"}) {
      const std::string spec = (inner == "none" ? std::string("zstd") : inner + "+zstd") + level;
      CodecChain plain = chain_of(inner), packed = chain_of(spec);
      ASSERT_TRUE(packed.zstd_last()) << spec;
      EXPECT_EQ(packed.before_zstd().spec(), plain.spec());
      StreamState tx_a(Role::kActivation, 3), rx_a(Role::kActivation, 3), tx_b(Role::kActivation, 3),
          rx_b(Role::kActivation, 3);
      std::vector<int64_t> ids = {7, 2, 9, 4};
      EncodeOptions eo;
      eo.sample_ids = &ids;
      for (int t = 0; t < 3; ++t) {
        Tensor x = gaussian({4, 6, 16}, 40 + t);
        Packet pa, pb;
        Tensor a = round_trip(plain, x, tx_a, rx_a, &pa, eo), b = round_trip(packed, x, tx_b, rx_b, &pb, eo);
        ASSERT_TRUE(a.defined() && b.defined()) << spec;
        ASSERT_EQ(0, std::memcmp(a.raw_data(), b.raw_data(), a.nbytes())) << spec << " step " << t;
        auto bound = packed.packet_bytes(x.shape());
        ASSERT_TRUE(bound.ok());
        EXPECT_LE(pb.size(), *bound) << spec;
        EXPECT_EQ(pb.size() % 8, 0u);
        auto info = inspect_packet(pb.bytes.data(), pb.size());
        ASSERT_TRUE(info.ok()) << info.status().to_string();
        EXPECT_EQ(info->header.codec, CodecId::zstd);
        EXPECT_EQ(info->raw_bytes, x.numel() * 4);  // metering sees the tensor, not the packet inside
      }
    }
  }
}

TEST(Codecs, ZstdShrinksCodesWithStructure) {
  // Half the activations are exact zeros (after a ReLU, say): their int8 codes are one repeated byte.
  Tensor x = gaussian({8, 128, 64}, 5);
  for (int64_t i = 0; i < x.numel(); i += 2) x.at(i) = std::max(0.0f, x.at(i));
  for (int64_t i = 1; i < x.numel(); i += 2) x.at(i) = 0.0f;
  StreamState a, b;
  Packet plain, packed;
  ASSERT_TRUE(chain_of("int8").encode(x, a, &plain).ok());
  ASSERT_TRUE(chain_of("int8+zstd").encode(x, b, &packed).ok());
  EXPECT_LT(double(packed.size()), 0.6 * double(plain.size())) << plain.size() << " -> " << packed.size();
}

TEST(Codecs, TopkKeepsTheLargestMagnitudesExactly) {
  Tensor x = gaussian({10000}, 21);
  StreamState tx, rx;
  Tensor y = round_trip(chain_of("topk:ratio=0.01"), x, tx, rx);
  std::vector<float> mags;
  for (int64_t i = 0; i < x.numel(); ++i) mags.push_back(std::fabs(x.at(i)));
  std::sort(mags.rbegin(), mags.rend());
  float thr = mags[99];
  int kept = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::fabs(x.at(i)) >= thr) {
      EXPECT_EQ(y.at(i), x.at(i));
      ++kept;
    } else {
      EXPECT_EQ(y.at(i), 0.0f);
    }
  }
  EXPECT_EQ(kept, 100);
}

TEST(Codecs, TopkBreaksTiesByLowestIndex) {
  Tensor x = Tensor::zeros({100});
  for (int i = 0; i < 100; ++i) x.at(i) = (i % 2 ? -1.0f : 1.0f);
  StreamState tx, rx;
  Tensor y = round_trip(chain_of("topk:ratio=0.1"), x, tx, rx);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(y.at(i), i < 10 ? x.at(i) : 0.0f) << i;
}

TEST(Codecs, SpikesKeepEachBlocksLargestAndQuantizeTheRestWithoutIt) {
  // Gaussian values with a large outlier in every other 64-element block, as trained residual streams have.
  Tensor x = gaussian({8, 256}, 21);
  const int64_t blocks = x.numel() / 64;
  std::vector<int64_t> outliers;
  for (int64_t b = 0; b < blocks; b += 2) {
    outliers.push_back(b * 64 + (b * 7) % 64);
    x.at(outliers.back()) = b % 4 ? 40.0f : -40.0f;
  }
  StreamState t1, r1, t2, r2, t3, r3;
  Tensor plain = round_trip(chain_of("int4:block=64"), x, t1, r1);
  Tensor exact = round_trip(chain_of("spikes:values=fp32+int4:block=64"), x, t2, r2);
  Tensor bf = round_trip(chain_of("spikes+int4:block=64"), x, t3, r3);
  for (int64_t i : outliers) {
    EXPECT_EQ(exact.at(i), x.at(i)) << i;
    EXPECT_LE(std::fabs(bf.at(i) - x.at(i)), std::fabs(x.at(i)) / 256) << i;  // bf16: 8 significant bits
  }
  for (int64_t b = 0; b < blocks; ++b) {
    // The block's largest |x| travels apart; int4 steps by the next largest / 8 (fp16 scale rounded up). Values
    // round to the nearest step, within one where the side opposite the signed maximum clamps at code 7.
    std::vector<float> mags;
    for (int64_t i = b * 64; i < (b + 1) * 64; ++i) mags.push_back(std::fabs(x.at(i)));
    std::sort(mags.rbegin(), mags.rend());
    const double step = mags[1] / 8 * 1.002;
    for (int64_t i = b * 64; i < (b + 1) * 64; ++i) {
      if (std::fabs(x.at(i)) == mags[0]) {
        EXPECT_EQ(exact.at(i), x.at(i)) << i;
      } else {
        ASSERT_LE(std::fabs(exact.at(i) - x.at(i)), step) << "block " << b << " element " << i;
      }
    }
  }
  // Plain int4 spends its 16 levels on the outliers: most of the rest of those blocks round to 0.
  EXPECT_LT(rel_rms(x, exact), 0.3 * rel_rms(x, plain));
  EXPECT_LT(rel_rms(x, bf), 0.3 * rel_rms(x, plain));
}

TEST(Codecs, SpikesPickByMagnitudeThenLowestIndexWithOffsetsAscending) {
  // Blocks of 4, two spikes each, 13 elements: the last block holds one.
  const std::vector<float> x = {1, -5, 5, 2, 0.5f, 4, -4, 7, 3, std::nanf(""), -9, 0, 6};
  const int64_t n = static_cast<int64_t>(x.size());
  ASSERT_EQ(spike_count(n, 4, 2), 7);
  std::vector<float> rest(n, -1.0f), vals(7, 0.0f);
  std::vector<uint8_t> offs(7, 99);
  kern::spikes_extract(Exec::cpu(), x.data(), n, 4, 2, rest.data(), offs.data(), vals.data());
  EXPECT_EQ(offs, (std::vector<uint8_t>{1, 2, 1, 3, 1, 2, 0}));  // 4 and -4 tie: the lower index wins
  EXPECT_EQ(vals[0], -5.0f);
  EXPECT_EQ(vals[1], 5.0f);
  EXPECT_EQ(vals[2], 4.0f);
  EXPECT_EQ(vals[3], 7.0f);
  EXPECT_TRUE(std::isnan(vals[4]));  // NaN ranks first, so it travels instead of hiding in a scale
  EXPECT_EQ(vals[5], -9.0f);
  EXPECT_EQ(vals[6], 6.0f);
  const std::vector<float> want_rest = {1, 0, 0, 2, 0.5f, 0, -4, 0, 3, 0, 0, 0, 0};
  EXPECT_EQ(rest, want_rest);
  std::vector<float> y = want_rest;
  kern::spikes_restore(Exec::cpu(), offs.data(), vals.data(), n, 4, 2, y.data());
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isnan(x[i])) {
      EXPECT_EQ(y[i], x[i]) << i;
    }
  }
  EXPECT_TRUE(std::isnan(y[9]));
}

TEST(Codecs, RandkKeepsKDistinctValuesAndVariesBetweenPackets) {
  Tensor x = Tensor::empty({5000});
  for (int i = 0; i < 5000; ++i) x.at(i) = float(i + 1);
  CodecChain chain = chain_of("randk:ratio=0.02");
  StreamState tx, rx;
  Tensor a = round_trip(chain, x, tx, rx), b = round_trip(chain, x, tx, rx);
  int na = 0, same = 0;
  for (int i = 0; i < 5000; ++i) {
    if (a.at(i) != 0) {
      EXPECT_EQ(a.at(i), x.at(i));
      ++na;
      same += b.at(i) != 0;
    }
  }
  EXPECT_EQ(na, 100);
  EXPECT_LT(same, 30);  // independent 2% subsets share ~2 elements
  Packet p;
  ASSERT_TRUE(chain.encode(x, tx, &p).ok());
  EXPECT_LT(p.size(), 100 * 4 + 200u);  // values only: no indices travel
}

TEST(Codecs, RandomPermutationIsABijection) {
  for (uint64_t n : {1ull, 2ull, 3ull, 17ull, 1000ull, 4097ull}) {
    kern::RandomPermutation perm(n, 1234 + n);
    std::vector<int> hit(n, 0);
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t v = perm(i);
      ASSERT_LT(v, n);
      ++hit[v];
    }
    for (uint64_t i = 0; i < n; ++i) EXPECT_EQ(hit[i], 1);
  }
}

TEST(Codecs, LowrankIsExactOnARankRMatrix) {
  const int n = 60, m = 45, R = 3;
  Tensor a = gaussian({n, R}, 1), b = gaussian({R, m}, 2), x = Tensor::zeros({n, m});
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j)
      for (int r = 0; r < R; ++r) x.at(i * m + j) += a.at(i * R + r) * b.at(r * m + j);
  for (const char* spec : {"lowrank:rank=3", "lowrank:rank=5", "lowrank:rank=3,iters=3"}) {
    StreamState tx, rx;
    Tensor y = round_trip(chain_of(spec), x, tx, rx);
    EXPECT_LT(rel_rms(x, y), 1e-4) << spec;
  }
  // A full-rank matrix is not exact at rank 3, but warm starts improve the approximation.
  Tensor g = gaussian({n, m}, 9);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j) g.at(i * m + j) += 5 * x.at(i * m + j);
  StreamState tx, rx;
  CodecChain chain = chain_of("lowrank:rank=3");
  double first = rel_rms(g, round_trip(chain, g, tx, rx)), later = first;
  for (int t = 0; t < 5; ++t) later = rel_rms(g, round_trip(chain, g, tx, rx));
  EXPECT_GT(first, 0.01);
  EXPECT_LE(later, first);
}

TEST(Codecs, SubspaceIsExactInTheSpanOfTheBasis) {
  const int64_t d = 64, k = 8, rows = 20;
  StreamState tx, rx;
  auto basis = compress::detail::subspace_basis(tx, Exec::cpu(), d, k, StageSpec{}.seed);
  ASSERT_TRUE(basis.ok());
  const Tensor& u = *basis;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) {
      double dot = 0;
      for (int64_t r = 0; r < d; ++r) dot += double(u.at(r * k + i)) * u.at(r * k + j);
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5);
    }
  Tensor c = gaussian({rows, k}, 3), x = Tensor::zeros({rows, d});
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < d; ++j)
      for (int64_t r = 0; r < k; ++r) x.at(i * d + j) += c.at(i * k + r) * u.at(j * k + r);
  Packet p;
  Tensor y = round_trip(chain_of("subspace:k=8"), x, tx, rx, &p);
  EXPECT_LT(rel_rms(x, y), 1e-5);
  EXPECT_LT(p.size(), size_t(rows * k * 4 + 200));
  // Off the span the projection loses most of a random vector (k/d of its energy is kept).
  Tensor z = gaussian({rows, d}, 4);
  EXPECT_GT(rel_rms(z, round_trip(chain_of("subspace:k=8"), z, tx, rx)), 0.8);
}

TEST(Codecs, CompressionRatiosMatchTheFormats) {
  Shape s{1024, 1024};
  auto bytes = [&](const char* spec) { return double(chain_of(spec).packet_bytes(s).value()); };
  double raw = 4.0 * 1024 * 1024;
  EXPECT_NEAR(raw / bytes("fp16"), 2.0, 0.01);
  EXPECT_NEAR(raw / bytes("int8"), 32.0 / 8.25, 0.01);
  EXPECT_NEAR(raw / bytes("int4"), 32.0 / 4.25, 0.01);
  EXPECT_NEAR(raw / bytes("int2:block=32,scale=fp32"), 32.0 / 3.0, 0.01);
  EXPECT_NEAR(raw / bytes("int4:block=32"), 32.0 / 4.5, 0.01);
  EXPECT_GT(raw / bytes("ef+topk:ratio=0.01+int4"), 50.0);
  // One spike per 64 values: a byte of offset and a bf16 value (or fp32) on top of int4's 4.25 bits.
  EXPECT_NEAR(raw / bytes("spikes+int4"), 32.0 / (4.25 + 24.0 / 64), 0.01);
  EXPECT_NEAR(raw / bytes("spikes:block=32,n=2,values=fp32+int4:block=32"), 32.0 / (4.5 + 2 * 40.0 / 32), 0.01);
  EXPECT_GT(raw / bytes("lowrank:rank=8+int8"), 200.0);
}

// A plain scalar int8/int4 block quantizer written from the format's description: vmax the value of
// largest magnitude (+ wins a tie with -, a NaN wins outright), scale vmax / qlo (rounded up to fp16
// unless fp32), codes round-half-even(x / scale via its reciprocal), clamped, NaN -> qlo.
void quantize_plain(const std::vector<float>& x, int bits, int block, bool fp32_scale, std::vector<uint8_t>* scales,
                    std::vector<uint8_t>* codes) {
  const int64_t n = static_cast<int64_t>(x.size()), nb = (n + block - 1) / block;
  const float lo = bits == 8 ? -128.0f : -8.0f, hi = bits == 8 ? 127.0f : 7.0f;
  scales->assign(nb * (fp32_scale ? 4 : 2), 0);
  codes->assign((n * bits + 7) / 8, 0);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t start = b * block, end = std::min(n, start + block);
    float vmax = 0.0f;
    bool nan = false;
    for (int64_t i = start; i < end; ++i) {
      if (std::isnan(x[i])) nan = true;
      else if (std::fabs(x[i]) > std::fabs(vmax) || (std::fabs(x[i]) == std::fabs(vmax) && x[i] > 0)) vmax = x[i];
    }
    float s = nan ? NAN : vmax / lo;
    if (fp32_scale) {
      std::memcpy(scales->data() + 4 * b, &s, 4);
    } else {
      uint16_t h = kern::fp16_scale_up(s);
      std::memcpy(scales->data() + 2 * b, &h, 2);
      s = fp16_to_float(h);
    }
    const float inv = (std::fabs(s) > 0.0f && std::fabs(s) <= 3.0e38f) ? 1.0f / s : 0.0f;
    for (int64_t i = start; i < end; ++i) {
      float r = std::nearbyint(x[i] * inv);
      int q = std::isnan(r) ? static_cast<int>(lo) : static_cast<int>(std::min(std::max(r, lo), hi));
      if (bits == 8) (*codes)[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
      else (*codes)[i / 2] |= static_cast<uint8_t>((q + 8) << (4 * (i & 1)));
    }
  }
}

// The CPU fast path of int8/int4 nearest rounding (kernels_cpu.cpp) against the QuantizeBlock loop
// the CUDA kernel runs and against the plain loop above: the same bytes, on data with ties, NaN,
// infinities, zeros, signed zeros, subnormals, huge values and odd tail blocks, serial and OpenMP sizes.
TEST(Codecs, QuantizeFastPathIsBitIdenticalToTheReferenceLoops) {
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{63}, int64_t{64}, int64_t{65}, int64_t{1001}, int64_t{4099},
                    int64_t{(1 << 17) + 37}, int64_t{(1 << 17) + 64}}) {
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) {
      uint32_t r = next(), kind = r % 64;
      float g = static_cast<float>(static_cast<int32_t>(next() % 2001) - 1000) / 100.0f;
      if (kind == 0) x[i] = NAN;
      else if (kind == 1) x[i] = INFINITY;
      else if (kind == 2) x[i] = -INFINITY;
      else if (kind == 3) x[i] = 0.0f;
      else if (kind == 4) x[i] = -0.0f;
      else if (kind == 5) x[i] = 1e-40f * g;             // subnormal
      else if (kind == 6) x[i] = 3.3e38f * (g > 0 ? 1 : -1);  // near FLT_MAX
      else if (kind < 20) x[i] = 0.5f * static_cast<float>(static_cast<int32_t>(next() % 511) - 255);  // halves
      else x[i] = g * (1 + (r >> 20) % 3);
    }
    // Whole blocks of ties: a block of halves with -128 (int8) / -8 (int4) as its extreme has scale
    // exactly 1, so every .5 is a tie; others hold only zeros or a lone value.
    for (int64_t i = 0; i + 128 <= n && i < 2048; i += 128) x[i] = -128.0f;
    if (n >= 4096) {
      for (int64_t i = 2048; i < 2112; ++i) x[i] = 0.5f * static_cast<float>(static_cast<int32_t>(next() % 15) - 7);
      x[2048] = -8.0f;
      for (int64_t i = 2112; i < 2240; ++i) x[i] = 0.0f;
      for (int64_t i = 2240; i < 2368; ++i) x[i] = i == 2300 ? -1e-3f : 0.0f;
      for (int64_t i = 2368; i < 2496; ++i) x[i] = i % 2 ? 2.5f : -2.5f;  // |+| == |-|: + wins
    }
    for (int bits : {8, 4})
      for (int block : {4, 8, 32, 60, 64, 128, 256, 260, 1024})
        for (bool fp32 : {false, true}) {
          kern::QuantSpec q{bits, block, fp32, false, 0};
          const size_t sb = static_cast<size_t>((n + block - 1) / block) * (fp32 ? 4 : 2);
          const size_t cb = static_cast<size_t>((n * bits + 7) / 8);
          std::vector<uint8_t> s_fast(sb, 0xAB), c_fast(cb, 0xAB), s_ref(sb, 0xCD), c_ref(cb, 0xCD), s_plain, c_plain;
          kern::quantize(Exec::cpu(), x.data(), n, q, s_fast.data(), c_fast.data());
          kern::quantize_reference_cpu(x.data(), n, q, s_ref.data(), c_ref.data());
          quantize_plain(x, bits, block, fp32, &s_plain, &c_plain);
          const std::string what = "int" + std::to_string(bits) + " block=" + std::to_string(block) +
                                   (fp32 ? " fp32" : " fp16") + " n=" + std::to_string(n);
          ASSERT_EQ(s_fast, s_ref) << what;
          ASSERT_EQ(c_fast, c_ref) << what;
          ASSERT_EQ(s_fast, s_plain) << what;
          ASSERT_EQ(c_fast, c_plain) << what;
        }
  }
}

}  // namespace
}  // namespace lh::compress
