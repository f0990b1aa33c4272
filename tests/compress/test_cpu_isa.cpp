// The CPU codec loops of every instruction set this CPU runs (compress/cpu_isa.h) against the portable
// functors of kernels.h, bit for bit, on data with NaN (both signs, several payloads), infinities,
// signed zeros, subnormals, huge values, scale saturation and ties; plus whole packets, the
// segmented checksum, and the choice of ISA (LH_CPU_ISA, set_cpu_isa) with its errors.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "compress/codec_chain.h"
#include "compress/cpu_isa.h"
#include "compress/device_kernels.h"
#include "compress/stream_state.h"
#include "compress/wire.h"
#include "core/hd.h"

namespace lh::compress {
namespace {

using kern::CpuIsa;

struct Lcg {
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
};

// Mostly ordinary values, with every special class sprinkled in, and some blocks that are all ties,
// all subnormal, all zero or whose extreme saturates the fp16 scale.
std::vector<float> tricky(int64_t n, uint64_t seed) {
  Lcg r{seed};
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t kind = r.next() % 80;
    const float g = static_cast<float>(static_cast<int32_t>(r.next() % 2001) - 1000) / 100.0f;
    switch (kind) {
      case 0:
        x[i] = NAN;
        break;
      case 1:
        x[i] = -NAN;
        break;
      case 2:
        x[i] = bits_float(0x7f800001u + r.next() % 0x3fffffu);
        break;  // signalling NaN payloads
      case 3:
        x[i] = INFINITY;
        break;
      case 4:
        x[i] = -INFINITY;
        break;
      case 5:
        x[i] = 0.0f;
        break;
      case 6:
        x[i] = -0.0f;
        break;
      case 7:
        x[i] = 1e-40f * g;
        break;  // subnormal
      case 8:
        x[i] = 3.3e38f * (g > 0 ? 1 : -1);
        break;
      case 9:
        x[i] = bits_float(r.next());
        break;  // any bit pattern
      default:
        x[i] = kind < 30 ? 0.5f * static_cast<float>(static_cast<int32_t>(r.next() % 511) - 255) : g;
    }
  }
  for (int64_t b = 0; b + 64 <= n && b < 64 * 16; b += 64) {
    switch ((b / 64) % 8) {
      case 0:
        x[b] = -128.0f;
        break;  // int8 scale exactly 1: halves are ties
      case 1:
        x[b] = -8.0f;
        break;  // int4 scale exactly 1
      case 2:
        for (int i = 0; i < 64; ++i) x[b + i] = 0.0f;
        break;  // zero scale
      case 3:
        for (int i = 0; i < 64; ++i) x[b + i] = 1e-41f * i;
        break;  // subnormal scale
      case 4:
        x[b] = 65504.0f * 128.0f * 1.5f;
        break;  // fp16 scale saturates
      case 5:
        x[b] = -65504.0f * 8.0f;
        break;  // exactly the largest fp16 scale
      case 6:
        for (int i = 0; i < 64; ++i) x[b + i] = i % 2 ? 2.5f : -2.5f;
        break;  // |+| == |-|
      default:
        break;
    }
  }
  return x;
}

// Every ISA but the portable baseline has a dispatched copy to check; the baseline copy is itself
// checked against the functors too (it is SSE2 code on x86-64).
std::vector<CpuIsa> isas() {
  return kern::supported_cpu_isas();
}

std::string name(CpuIsa isa) {
  return kern::cpu_isa_name(isa);
}

TEST(CpuIsa, QuantizeEqualsThePortableFunctorOnEveryIsa) {
  for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{63}, int64_t{64}, int64_t{65}, int64_t{1001}, int64_t{8191}})
    for (uint64_t seed : {1ull, 2ull, 3ull}) {
      const std::vector<float> x = tricky(n, seed * 977 + n);
      for (int bits : {8, 4, 2})
        for (int block : {4, 8, 12, 32, 60, 64, 128, 256, 260})
          for (bool fp32 : {false, true}) {
            kern::QuantSpec q{bits, block, fp32, false, 0};
            const int64_t nb = kern::quant_blocks(n, block);
            const size_t sb = static_cast<size_t>(nb) * (fp32 ? 4 : 2), cb = kern::quant_code_bytes(n, bits);
            std::vector<uint8_t> s_ref(sb, 0), c_ref(cb, 0);
            kern::QuantizeBlock ref{x.data(), n, q, s_ref.data(), c_ref.data()};
            for (int64_t b = 0; b < nb; ++b) ref(b);
            for (CpuIsa isa : isas()) {
              std::vector<uint8_t> s(sb, 0), c(cb, 0);
              kern::cpu_loops_for(isa).quantize(x.data(), n, q, s.data(), c.data(), 0, nb);
              const std::string what = name(isa) + " int" + std::to_string(bits) + " block=" + std::to_string(block) +
                                       (fp32 ? " fp32" : " fp16") + " n=" + std::to_string(n);
              ASSERT_EQ(s, s_ref) << what;
              ASSERT_EQ(c, c_ref) << what;
            }
          }
    }
}

TEST(CpuIsa, DequantizeEqualsThePortableFunctorOnEveryIsa) {
  Lcg r{99};
  for (int64_t n : {int64_t{3}, int64_t{64}, int64_t{67}, int64_t{4100}})
    for (int bits : {8, 4, 2})
      for (int block : {4, 12, 32, 64, 256})
        for (bool fp32 : {false, true}) {
          kern::QuantSpec q{bits, block, fp32, false, 0};
          const int64_t nb = kern::quant_blocks(n, block);
          std::vector<uint8_t> scales(static_cast<size_t>(nb) * (fp32 ? 4 : 2)), codes(kern::quant_code_bytes(n, bits));
          for (auto& c : codes) c = static_cast<uint8_t>(r.next());  // every code, even int2's unused 3
          for (int64_t b = 0; b < nb; ++b) {
            const uint32_t k = r.next() % 8;
            if (fp32) {
              const float s = k == 0   ? NAN
                              : k == 1 ? -INFINITY
                              : k == 2 ? 1e-42f
                              : k == 3 ? -0.0f
                                       : bits_float(r.next());
              std::memcpy(scales.data() + 4 * b, &s, 4);
            } else {
              const uint16_t h = k == 0 ? 0x7e01 : k == 1 ? 0xfc00 : k == 2 ? 0x0001 : static_cast<uint16_t>(r.next());
              std::memcpy(scales.data() + 2 * b, &h, 2);
            }
          }
          std::vector<float> ref(n, 0.0f);
          kern::DequantizeBlock f{scales.data(), codes.data(), n, q, ref.data()};
          for (int64_t b = 0; b < nb; ++b) f(b);
          for (CpuIsa isa : isas()) {
            std::vector<float> y(n, 1.0f);
            kern::cpu_loops_for(isa).dequantize(scales.data(), codes.data(), n, q, y.data(), 0, nb);
            ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), n * 4))
                << name(isa) << " int" << bits << " block=" << block << (fp32 ? " fp32" : " fp16") << " n=" << n;
          }
        }
}

// The casts see every high half-word with low bits at the rounding boundaries of fp16 (bit 12) and
// bf16 (bit 15), and random ones: NaN payloads, overflow to inf, subnormal results, ties.
TEST(CpuIsa, HalfCastsEqualThePortableFunctorsOnEveryIsa) {
  std::vector<float> x;
  const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x2000, 0x3000, 0x7fff, 0x8000, 0x8001, 0xffff};
  Lcg r{7};
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint32_t lo : lows) x.push_back(bits_float(hi << 16 | lo));
    x.push_back(bits_float(hi << 16 | (r.next() & 0xffff)));
  }
  const int64_t n = static_cast<int64_t>(x.size());
  for (bool bf16 : {false, true}) {
    std::vector<uint16_t> ref(n);
    kern::ToHalf<1> to{x.data(), ref.data(), n, bf16};
    for (int64_t i = 0; i < n; ++i) to(i);
    std::vector<uint16_t> all(65536);
    for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
    std::vector<float> back(65536);
    kern::FromHalf<1> from{all.data(), back.data(), 65536, bf16};
    for (int64_t i = 0; i < 65536; ++i) from(i);
    for (CpuIsa isa : isas()) {
      const std::string what = name(isa) + (bf16 ? " bf16" : " fp16");
      std::vector<uint16_t> y(n, 0xdead);
      kern::cpu_loops_for(isa).to_half(x.data(), 0, n, bf16, y.data());
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(y[i], ref[i]) << what << " of float bits 0x" << std::hex << float_bits(x[i]);
      std::vector<float> z(65536, 1.0f);
      kern::cpu_loops_for(isa).from_half(all.data(), 0, 65536, bf16, z.data());
      for (int64_t i = 0; i < 65536; ++i)
        ASSERT_EQ(float_bits(z[i]), float_bits(back[i])) << what << " of half bits 0x" << std::hex << i;
      // A range that starts and ends mid-vector leaves its neighbours alone.
      std::vector<uint16_t> part(64, 0x1234);
      kern::cpu_loops_for(isa).to_half(x.data(), 3, 61, bf16, part.data());
      EXPECT_EQ(part[2], 0x1234) << what;
      EXPECT_EQ(part[61], 0x1234) << what;
      EXPECT_EQ(part[60], ref[60]) << what;
    }
  }
}

TEST(CpuIsa, AxpbyAndXxh3EqualThePortableCodeOnEveryIsa) {
  const int64_t n = 4099;
  const std::vector<float> a = tricky(n, 11), b = tricky(n, 12);
  std::vector<float> ref(n);
  kern::Axpby<1> f{ref.data(), a.data(), b.data(), -0.75f, n};
  for (int64_t i = 0; i < n; ++i) f(i);
  std::vector<uint8_t> bytes(3 << 20);
  Lcg r{5};
  for (auto& c : bytes) c = static_cast<uint8_t>(r.next());
  for (CpuIsa isa : isas()) {
    std::vector<float> y(n);
    kern::cpu_loops_for(isa).axpby(y.data(), a.data(), b.data(), -0.75f, 0, n);
    ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), n * 4)) << name(isa);
    for (size_t len : {size_t{0}, size_t{1}, size_t{17}, size_t{240}, size_t{241}, size_t{1000}, size_t{4096},
                       size_t{100000}, bytes.size()})
      ASSERT_EQ(kern::cpu_loops_for(isa).xxh3(bytes.data(), len, kHashSeed),
                XXH3_64bits_withSeed(bytes.data(), len, kHashSeed))  // the library's own value
          << name(isa) << " len " << len;
  }
}

// The low-rank product against a plain loop that sums in the same order, for ranks and widths that
// leave vector remainders, directly and through the dispatching entry point.
TEST(CpuIsa, LowRankProductEqualsThePlainLoopOnEveryIsa) {
  Lcg g{3};
  for (int64_t r : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{17}})
    for (int64_t m : {int64_t{1}, int64_t{7}, int64_t{40}, int64_t{100}}) {
      const int64_t rows = 5;
      std::vector<float> a(rows * r), bt(r * m);
      for (auto& v : a) v = static_cast<float>(static_cast<int32_t>(g.next() % 2001) - 1000) / 37.0f;
      for (auto& v : bt) v = static_cast<float>(static_cast<int32_t>(g.next() % 2001) - 1000) / 91.0f;
      a[0] = -0.0f;  // a first product of -0 stays -0 (no 0 + ... start)
      std::vector<float> ref(rows * m);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < m; ++j) {
          volatile float acc = a[i * r] * bt[j];
          for (int64_t k = 1; k < r; ++k) {
            volatile float p = a[i * r + k] * bt[k * m + j];
            acc = acc + p;
          }
          ref[i * m + j] = acc;
        }
      for (CpuIsa isa : isas()) {
        std::vector<float> y(rows * m, 1.0f);
        kern::cpu_loops_for(isa).low_rank_rows(a.data(), bt.data(), m, m, r, y.data(), 0, rows);
        ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * 4)) << name(isa) << " r=" << r << " m=" << m;
      }
      std::vector<float> b(m * r), y(rows * m);
      for (int64_t j = 0; j < m; ++j)
        for (int64_t k = 0; k < r; ++k) b[j * r + k] = bt[k * m + j];
      kern::low_rank_product(Exec::cpu(), a.data(), b.data(), rows, m, r, y.data());
      ASSERT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * 4)) << "low_rank_product r=" << r << " m=" << m;
    }
}

// PowerSGD's products against plain loops in the documented order: 16 partial sums (column mod 16)
// joined by a fixed tree, then the remaining columns; and row sums in order.
TEST(CpuIsa, PowerSgdProductsEqualThePlainLoopsOnEveryIsa) {
  Lcg g{17};
  for (int64_t r : {int64_t{1}, int64_t{4}, int64_t{7}, int64_t{8}, int64_t{20}})
    for (int64_t m : {int64_t{5}, int64_t{16}, int64_t{45}, int64_t{300}}) {
      const int64_t rows = 9, ld = m + 3;
      std::vector<float> M(rows * m), qt(r * ld), p(rows * r);
      for (auto& v : M) v = static_cast<float>(static_cast<int32_t>(g.next() % 2001) - 1000) / 77.0f;
      for (auto& v : qt) v = static_cast<float>(static_cast<int32_t>(g.next() % 2001) - 1000) / 53.0f;
      for (auto& v : p) v = static_cast<float>(static_cast<int32_t>(g.next() % 2001) - 1000) / 29.0f;
      auto fma_free = [](float acc, float a, float b) {
        volatile float prod = a * b;
        volatile float sum = acc + prod;
        return static_cast<float>(sum);
      };
      std::vector<float> p_ref(rows * r), qt_ref(r * ld, 0.0f);
      const int64_t m16 = m - m % 16;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t k = 0; k < r; ++k) {
          float part[16] = {};
          for (int64_t j = 0; j < m16; ++j) part[j % 16] = fma_free(part[j % 16], M[i * m + j], qt[k * ld + j]);
          for (int w = 8; w >= 1; w /= 2)
            for (int l = 0; l < w; ++l) part[l] = fma_free(part[l], part[l + w], 1.0f);
          float t = part[0];
          for (int64_t j = m16; j < m; ++j) t = fma_free(t, M[i * m + j], qt[k * ld + j]);
          p_ref[i * r + k] = t;
        }
      for (int64_t k = 0; k < r; ++k)
        for (int64_t j = 0; j < m; ++j) {
          float t = 0.0f;
          for (int64_t i = 0; i < rows; ++i) t = fma_free(t, M[i * m + j], p[i * r + k]);
          qt_ref[k * ld + j] = t;
        }
      for (CpuIsa isa : isas()) {
        const std::string what = name(isa) + " r=" + std::to_string(r) + " m=" + std::to_string(m);
        std::vector<float> p_out(rows * r, 9.0f), qt_out(r * ld, 0.0f);
        kern::cpu_loops_for(isa).project_rows(M.data(), m, qt.data(), ld, r, p_out.data(), 0, rows);
        ASSERT_EQ(0, std::memcmp(p_out.data(), p_ref.data(), p_out.size() * 4)) << "project " << what;
        // In two column ranges, as two threads would.
        kern::cpu_loops_for(isa).back_project_cols(M.data(), rows, m, p.data(), r, qt_out.data(), ld, 0, m / 2);
        kern::cpu_loops_for(isa).back_project_cols(M.data(), rows, m, p.data(), r, qt_out.data(), ld, m / 2, m);
        ASSERT_EQ(0, std::memcmp(qt_out.data(), qt_ref.data(), qt_out.size() * 4)) << "back_project " << what;
      }
    }
}

// Whole packets: every ISA writes the same bytes (checksum included) and decodes them to the same
// floats, for every terminal codec and a chain.
TEST(CpuIsa, PacketsAreTheSameBytesOnEveryIsa) {
  const CpuIsa before = kern::active_cpu_isa();
  const std::vector<float> v = tricky(3 * 4096 + 64, 21);
  Tensor tricky_x = Tensor::empty({3 * 64 + 1, 64});
  std::memcpy(tricky_x.data<float>(), v.data(), tricky_x.nbytes());
  // The low-rank codecs get the same data made finite (subnormals and 1e30s stay): their sums meet
  // NaN with NaN, and which payload x86 keeps then depends on operand order, which the compiler may
  // swap. Their outputs on finite data are the same bits on every ISA.
  Tensor finite_x = Tensor::empty({3 * 64 + 1, 64});
  for (int64_t i = 0; i < finite_x.numel(); ++i)
    finite_x.data<float>()[i] = std::isfinite(v[i]) ? std::max(-1e30f, std::min(1e30f, v[i])) : 0.0f;
  for (const char* spec : {"none", "fp16", "bf16", "int8", "int4", "int2", "int4:block=32,scale=fp32", "ef+int4",
                           "lowrank:rank=4", "lowrank:rank=3,iters=2+bf16", "subspace:k=8"}) {
    auto chain = parse_codec_spec(spec);
    ASSERT_TRUE(chain.ok()) << chain.status().to_string();
    const Tensor& x =
        std::string(spec).rfind("lowrank", 0) == 0 || std::string(spec).rfind("subspace", 0) == 0 ? finite_x : tricky_x;
    std::vector<uint8_t> first_packet;
    std::vector<float> first_decoded;
    for (CpuIsa isa : isas()) {
      ASSERT_TRUE(kern::set_cpu_isa(isa).ok());
      StreamState tx(Role::kActivation, 1), rx(Role::kActivation);
      Packet p;
      ASSERT_TRUE(chain->encode(x, tx, &p).ok()) << spec;
      Tensor y;
      ASSERT_TRUE(chain->decode(p, rx, &y).ok()) << spec;
      std::vector<float> d = y.to_vector();
      if (first_packet.empty()) {
        first_packet = p.bytes;
        first_decoded = d;
        continue;
      }
      EXPECT_EQ(p.bytes, first_packet) << spec << " on " << name(isa);
      ASSERT_EQ(d.size(), first_decoded.size());
      EXPECT_EQ(0, std::memcmp(d.data(), first_decoded.data(), d.size() * 4)) << spec << " on " << name(isa);
    }
  }
  ASSERT_TRUE(kern::set_cpu_isa(before).ok());
}

// The checksum covers every payload segment, the header and the shape: one flipped bit anywhere in
// a packet of several segments is caught and named.
TEST(CpuIsa, TheSegmentedChecksumCatchesAFlipInAnySegment) {
  Tensor x = Tensor::empty({1024, 300});  // 1.2 MB of fp32: five segments
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = static_cast<float>(i % 1000) * 0.25f;
  auto chain = parse_codec_spec("none");
  ASSERT_TRUE(chain.ok());
  StreamState tx(Role::kActivation, 1);
  Packet packet;
  ASSERT_TRUE(chain->encode(x, tx, &packet).ok());
  auto h = parse_header(packet.bytes.data(), packet.size(), WireLimits{});
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_GT(h->payload_bytes, 4 * kHashSegmentBytes);
  const size_t hb = h->header_bytes();
  for (size_t off : {size_t{3}, size_t{44}, hb - 1, hb, hb + kHashSegmentBytes - 1, hb + kHashSegmentBytes,
                     hb + 3 * kHashSegmentBytes + 5, packet.size() - 1}) {
    std::vector<uint8_t> b = packet.bytes;
    b[off] ^= 0x10;
    auto bad = parse_header(b.data(), b.size(), WireLimits{});
    ASSERT_FALSE(bad.ok()) << "flip at byte " << off;
    if (off >= hb) {
      EXPECT_NE(bad.status().message().find("checksum mismatch"), std::string::npos) << bad.status().to_string();
    }
  }
}

TEST(CpuIsa, NamesParseAndUnsupportedOrUnknownOnesAreRefused) {
  for (CpuIsa isa : {CpuIsa::baseline, CpuIsa::avx2, CpuIsa::avx512}) {
    auto back = kern::parse_cpu_isa(name(isa));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, isa);
  }
  auto bad = kern::parse_cpu_isa("avx3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'avx3'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("baseline, avx2, avx512"), std::string::npos);
  EXPECT_EQ(isas().front(), CpuIsa::baseline);
  EXPECT_EQ(kern::best_cpu_isa(), isas().back());
  if (isas().size() < 3) {
    Status s = kern::set_cpu_isa(CpuIsa::avx512);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("cannot run avx512"), std::string::npos) << s.to_string();
  }
}

TEST(CpuIsaDeathTest, ABadLhCpuIsaStopsTheProcessNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child starts afresh, so it reads the variable
  EXPECT_EXIT(
      {
        setenv("LH_CPU_ISA", "sse9", 1);
        kern::active_cpu_isa();
      },
      testing::ExitedWithCode(2), "LH_CPU_ISA='sse9': unknown CPU instruction set 'sse9'");
}

TEST(CpuIsaDeathTest, LhCpuIsaPicksTheIsa) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("LH_CPU_ISA", "baseline", 1);
        std::exit(kern::active_cpu_isa() == CpuIsa::baseline ? 7 : 8);
      },
      testing::ExitedWithCode(7), "");
}

}  // namespace
}  // namespace lh::compress
