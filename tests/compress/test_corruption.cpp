// Randomized corruption test: thousands of mutated packets per codec (bit flips, byte writes,
// truncation, extension, header fields set to extremes, splices) must each decode to a Status or
// to a tensor within the limits — never a crash or an out-of-bounds access. scripts/sanitize_check.sh
// runs it under AddressSanitizer + UBSan. Label `compress`.
#include <gtest/gtest.h>

#include <cstring>

#include "codec_test_util.h"

namespace lh::compress {
namespace {

using testing::chain_of;
using testing::gaussian;

constexpr int kMutationsPerCodec = 4000;

struct Mutator {
  Rng rng;
  explicit Mutator(uint64_t seed) : rng(seed) {}
  uint64_t below(uint64_t n) { return n ? rng.below(n) : 0; }

  // Values that break bounds checks in interesting ways.
  uint64_t extreme() {
    static const uint64_t v[] = {0, 1, 2, 3, 4, 7, 8, 9, 15, 16, 63, 64, 65, 255, 256, 65535, 65536, 65537,
                                 0x7fffffffull, 0x80000000ull, 0xffffffffull, 1ull << 32, 1ull << 40,
                                 0x7fffffffffffffffull, 0x8000000000000000ull, ~0ull, ~0ull - 7};
    return rng.uniform() < 0.7f ? v[below(sizeof(v) / sizeof(v[0]))] : (uint64_t(rng.next_u32()) << 32 | rng.next_u32());
  }

  // Header-sized fields at the offsets of wire.h, here and in nested packets.
  void set_field(std::vector<uint8_t>& b) {
    static const int offs[] = {0, 4, 6, 7, 8, 9, 10, 12, 16, 20, 24, 32, 40, 48, 56, 64};
    static const int widths[] = {4, 2, 1, 1, 1, 1, 2, 4, 4, 4, 8, 8, 8, 8, 8, 8};
    size_t base = 0;
    if (rng.uniform() < 0.5f && b.size() > 64) base = below(b.size() / 8) * 8;  // maybe a nested header
    int f = static_cast<int>(below(16));
    size_t at = base + offs[f];
    uint64_t v = extreme();
    for (int i = 0; i < widths[f] && at + i < b.size(); ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
  }

  std::vector<uint8_t> mutate(const std::vector<uint8_t>& in, const std::vector<uint8_t>& other) {
    std::vector<uint8_t> b = in;
    int edits = 1 + static_cast<int>(below(3));
    for (int e = 0; e < edits; ++e) {
      switch (below(7)) {
        case 0:
          if (!b.empty()) b[below(b.size())] ^= static_cast<uint8_t>(1u << below(8));
          break;
        case 1:
          if (!b.empty()) b[below(b.size())] = static_cast<uint8_t>(rng.next_u32());
          break;
        case 2: b.resize(below(b.size() + 1)); break;
        case 3: {
          size_t extra = 1 + below(64);
          for (size_t i = 0; i < extra; ++i) b.push_back(static_cast<uint8_t>(rng.next_u32()));
          break;
        }
        case 4:
        case 5: set_field(b); break;
        default: {  // splice a run of another packet in
          if (b.empty() || other.empty()) break;
          size_t from = below(other.size()), to = below(b.size());
          size_t len = std::min({size_t(1 + below(64)), other.size() - from, b.size() - to});
          std::memcpy(b.data() + to, other.data() + from, len);
        }
      }
    }
    return b;
  }
};

// Re-seals a (mutated) packet's root hash where its header still parses, so the deep checks
// behind the hash are what must reject it.
void reseal(std::vector<uint8_t>& b) {
  WireLimits loose{int64_t{1} << 62, false};
  auto h = parse_header(b.data(), b.size(), loose);
  if (h.ok()) seal_packet(b.data(), &*h);
}

struct Corpus {
  std::string spec;
  std::vector<std::vector<uint8_t>> packets;
};

Corpus make_corpus(const std::string& spec) {
  Corpus c{spec, {}};
  CodecChain chain = chain_of(spec);
  std::vector<int64_t> ids = {3, 1, 4, 5};
  EncodeOptions eo;
  eo.sample_ids = &ids;
  for (const Shape& shape : {Shape{4, 24}, Shape{4, 3, 5}, Shape{4, 64}}) {
    StreamState tx(Role::kActivationGrad, 5);
    for (int t = 0; t < 2; ++t) {
      Packet p;
      Status s = chain.encode(gaussian(shape, 10 + t), tx, &p, eo);
      EXPECT_TRUE(s.ok()) << spec << ": " << s.to_string();
      if (s.ok()) c.packets.push_back(p.bytes);
    }
  }
  return c;
}

class Corruption : public ::testing::TestWithParam<std::string> {};

TEST_P(Corruption, MutatedPacketsNeverCrashAndHashedOnesAreRejected) {
  Corpus c = make_corpus(GetParam());
  ASSERT_FALSE(c.packets.empty());
  Mutator m(0xC0DEC + std::hash<std::string>()(GetParam()));
  StreamState rx(Role::kActivationGrad);
  // The intact packets decode (this also seeds delta memories, as on a live stream).
  for (const auto& p : c.packets) {
    Tensor y;
    ASSERT_TRUE(decode_packet(p.data(), p.size(), rx, &y).ok());
  }
  DecodeOptions hashed, unhashed;
  hashed.limits.max_numel = unhashed.limits.max_numel = 1 << 16;
  unhashed.limits.verify_hash = false;
  int rejected = 0, accepted_unhashed = 0;
  for (int i = 0; i < kMutationsPerCodec; ++i) {
    const auto& src = c.packets[m.below(c.packets.size())];
    std::vector<uint8_t> b = m.mutate(src, c.packets[m.below(c.packets.size())]);
    const bool changed = b != src;
    // Half the time re-seal and skip the hash check: the field checks behind it must hold alone.
    bool deep = (i & 1) != 0;
    if (deep) reseal(b);
    Tensor y;
    Status s = decode_packet(b.data(), b.size(), rx, &y, deep ? unhashed : hashed);
    if (s.ok()) {
      ASSERT_TRUE(y.defined());
      ASSERT_LE(y.numel(), hashed.limits.max_numel);
      ASSERT_TRUE(deep || !changed) << GetParam() << " mutation " << i << ": a changed packet passed the hash";
      accepted_unhashed += deep;
    } else {
      ++rejected;
      ASSERT_EQ(s.code(), StatusCode::kCorrupt) << s.to_string();
      ASSERT_NE(s.message().find("packet"), std::string::npos) << s.to_string();
      ASSERT_FALSE(y.defined());
    }
  }
  EXPECT_GT(rejected, kMutationsPerCodec / 2) << GetParam();
  RecordProperty("accepted_unhashed", accepted_unhashed);
}

// Found by fuzz_decode: an empty packet at an odd address once reached memcpy(nullptr, …, 0), which
// UBSan reports (this test runs under it in scripts/sanitize_check.sh).
TEST(CorruptionEdges, EmptyAndShortPacketsAtOddAddresses) {
  std::vector<uint8_t> storage(64, 0);
  StreamState rx;
  for (size_t offset : {1, 3, 7}) {
    for (size_t n : {0, 1, 8, 47}) {
      Tensor y;
      Status s = decode_packet(storage.data() + offset, n, rx, &y);
      EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.to_string();
      EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.to_string();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, Corruption,
                         ::testing::Values("none", "fp16", "bf16", "int8", "int4:block=32,scale=fp32", "int2",
                                           "topk:ratio=0.2", "randk:ratio=0.3", "lowrank:rank=2", "subspace:k=4",
                                           "ef+topk:ratio=0.1+int4", "delta+int8", "lowrank:rank=3+int8",
                                           "randk:ratio=0.5+topk:ratio=0.5+int2", "subspace:k=8+fp16", "int8+zstd",
                                           "ef+int4+zstd:level=1", "delta+int8+zstd", "spikes:block=16,n=2+int4",
                                           "spikes:values=fp32+int4+zstd"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n;
                           for (char ch : info.param) n += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

}  // namespace
}  // namespace lh::compress
