// The spec parser's errors and the wire format's field checks: every bad token and every bad
// header field yields a Status that names it. Label `compress`.
#include <gtest/gtest.h>

#include <cstring>

#include "codec_test_util.h"
#include "compress/chain_internal.h"

namespace lh::compress {
namespace {

using testing::chain_of;
using testing::gaussian;

void expect_spec_error(const std::string& spec, const std::string& token, const std::string& hint) {
  auto r = parse_codec_spec(spec);
  ASSERT_FALSE(r.ok()) << spec;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'" + token + "'"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find(hint), std::string::npos) << r.status().to_string();
}

TEST(Spec, ParsesTheDesignExamples) {
  for (const char* s : {"none",
                        "fp16",
                        "bf16",
                        "int8",
                        "int4:block=32",
                        "int2:stochastic",
                        "topk:ratio=0.01",
                        "randk:ratio=0.1",
                        "lowrank:rank=8",
                        "subspace:k=32",
                        "delta+int4",
                        "ef+topk:ratio=0.01+int4",
                        "lowrank:rank=8+int8",
                        "subspace:k=32+int8",
                        "int8:block=128,scale=fp32,stochastic",
                        " ef + lowrank:rank=4,iters=2 + bf16 ",
                        "zstd",
                        "int4+zstd",
                        "ef+int4+zstd:level=9",
                        "delta+lowrank:rank=2+int8+zstd:level=1",
                        "spikes+int4+zstd",
                        "spikes:block=32,n=2,values=fp32+int4:block=32"}) {
    auto r = parse_codec_spec(s);
    ASSERT_TRUE(r.ok()) << s << ": " << r.status().to_string();
    // The canonical text parses to the same stages.
    auto again = parse_codec_spec(r->spec());
    ASSERT_TRUE(again.ok()) << r->spec();
    EXPECT_EQ(again->spec(), r->spec());
  }
  auto c = parse_codec_spec("ef+topk:ratio=0.01+int4:block=32,stochastic");
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->stages().size(), 3u);
  EXPECT_EQ(c->stages()[1].ratio, 0.01);
  EXPECT_EQ(c->stages()[2].block, 32);
  EXPECT_TRUE(c->stages()[2].stochastic);
  EXPECT_TRUE(parse_codec_spec("delta+int4")->needs_sample_ids());
  // Presets stand for their chains; the canonical text is the chain, so packets and metrics name real codecs.
  for (const CodecPreset& p : codec_presets()) {
    auto preset = parse_codec_spec(std::string("preset:") + p.name);
    ASSERT_TRUE(preset.ok()) << p.name << ": " << preset.status().to_string();
    EXPECT_EQ(preset->spec(), parse_codec_spec(p.spec)->spec()) << p.name;
  }
  EXPECT_EQ(parse_codec_spec(" preset:lossless ")->spec(), "zstd:level=3");
}

TEST(Spec, BadTokensAreNamedWithWhatIsAllowed) {
  expect_spec_error("int3", "int3", "allowed: none, fp16");
  expect_spec_error("ef+topk:ratio=0.01+int5", "int5", "allowed:");
  expect_spec_error("int8:block=30", "int8:block=30", "multiple of 4");
  expect_spec_error("int8:block=0", "int8:block=0", "4..65536");
  expect_spec_error("int8:block=abc", "int8:block=abc", "block='abc'");
  expect_spec_error("int4:scale=fp8", "int4:scale=fp8", "fp16 or fp32");
  expect_spec_error("int4:rank=3", "int4:rank=3", "allowed for int4: block=N");
  expect_spec_error("topk:ratio=0", "topk:ratio=0", "(0, 1]");
  expect_spec_error("topk:ratio=1.5", "topk:ratio=1.5", "(0, 1]");
  expect_spec_error("randk:ratio=x", "randk:ratio=x", "ratio='x'");
  expect_spec_error("lowrank:rank=0", "lowrank:rank=0", "1..1024");
  expect_spec_error("lowrank:iters=99", "lowrank:iters=99", "1..16");
  expect_spec_error("subspace:k=-1", "subspace:k=-1", "1..4096");
  expect_spec_error("subspace:seed=-5", "subspace:seed=-5", "unsigned");
  expect_spec_error("spikes:block=300", "spikes:block=300", "4..256");
  expect_spec_error("spikes:n=9", "spikes:n=9", "1..8");
  expect_spec_error("spikes:block=4,n=4", "spikes:block=4,n=4", "below block=4");
  expect_spec_error("spikes:values=fp8", "spikes:values=fp8", "bf16 or fp32");
  expect_spec_error("spikes:ratio=0.1", "spikes:ratio=0.1", "allowed for spikes: block=B");
  expect_spec_error("int4+spikes", "spikes", "terminal");
  expect_spec_error("int8+topk", "topk", "terminal");
  expect_spec_error("topk+ef", "ef", "first stage");
  expect_spec_error("int8+delta", "delta", "first stage");
  expect_spec_error("fp16:block=32", "fp16:block=32", "allowed for fp16: none");
  expect_spec_error("zstd+int8", "int8", "nothing may follow 'zstd'");
  expect_spec_error("preset:fastest", "fastest", "allowed: preset:lossless (zstd)");
  expect_spec_error("int8+zstd+zstd", "zstd", "nothing may follow 'zstd'");
  expect_spec_error("zstd:level=0", "zstd:level=0", "1..19");
  expect_spec_error("int4+zstd:level=20", "zstd:level=20", "1..19");
  expect_spec_error("zstd:block=4", "zstd:block=4", "allowed for zstd: level");
  expect_spec_error("int8+", "", "empty stage");
  expect_spec_error("int8:", "int8:", "no options");
  expect_spec_error("int8:block=32,,stochastic", "int8:block=32,,stochastic", "empty option");
  EXPECT_FALSE(parse_codec_spec("").ok());
}

TEST(Roles, ParseAndName) {
  for (const char* r : {"activation", "activation_grad", "weight_grad", "tp_partial"}) {
    auto role = parse_codec_role(r);
    ASSERT_TRUE(role.ok());
    EXPECT_STREQ(codec_role_name(*role), r);
  }
  EXPECT_NE(parse_codec_role("gradient").status().message().find("allowed"), std::string::npos);
}

Packet packet_of(const std::string& spec, const Shape& shape, Role role = Role::kActivation) {
  StreamState tx(role);
  Packet p;
  Status s = chain_of(spec).encode(gaussian(shape, 1), tx, &p);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return p;
}

// Decodes `p` and expects a kCorrupt error naming `field`.
void expect_corrupt(const Packet& p, const std::string& field, DecodeOptions o = {}, Role role = Role::kActivation) {
  StreamState rx(role);
  Tensor y;
  Status s = decode_packet(p.bytes.data(), p.size(), rx, &y, o);
  ASSERT_FALSE(s.ok()) << "expected an error about " << field;
  EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.to_string();
  EXPECT_NE(s.message().find(field), std::string::npos) << "wanted '" << field << "' in: " << s.to_string();
  EXPECT_FALSE(y.defined());
}

// Rewrites one header field and reseals the hash, so the field check itself is what must catch it.
template <class T>
Packet with_field(Packet p, size_t offset, T value, bool reseal = true) {
  store_le<T>(p.bytes.data() + offset, value);
  if (reseal) {
    auto h = parse_header(p.bytes.data(), p.size(), WireLimits{int64_t{1} << 40, false});
    if (h.ok()) seal_packet(p.bytes.data(), &*h);
  }
  return p;
}

TEST(Wire, HeaderFieldsAreCheckedAndNamed) {
  Packet p = packet_of("int8", {4, 16});
  expect_corrupt(with_field<uint32_t>(p, 0, 0x12345678u), "magic");
  expect_corrupt(with_field<uint16_t>(p, 4, 1), "version");  // the XXH64-sealed format before version 2
  expect_corrupt(with_field<uint16_t>(p, 4, 3), "version");
  expect_corrupt(with_field<uint8_t>(p, 6, 200), "codec");
  expect_corrupt(with_field<uint8_t>(p, 7, 99), "dtype");
  expect_corrupt(with_field<uint8_t>(p, 7, static_cast<uint8_t>(DType::i32)), "dtype");
  expect_corrupt(with_field<uint8_t>(p, 8, 9), "ndim");
  expect_corrupt(with_field<uint8_t>(p, 9, 7), "role");
  expect_corrupt(with_field<uint16_t>(p, 10, 0x80), "flags");
  expect_corrupt(with_field<uint32_t>(p, 12, 30), "block");
  expect_corrupt(with_field<uint32_t>(p, 20, 1), "reserved");
  expect_corrupt(with_field<uint64_t>(p, 32, 8), "payload_length");
  expect_corrupt(with_field<uint64_t>(p, 32, 12), "payload_length");
  expect_corrupt(with_field<uint64_t>(p, 32, ~uint64_t{0} - 7), "payload_length");
  expect_corrupt(with_field<int64_t>(p, 48, -4), "shape[0]");
  expect_corrupt(with_field<int64_t>(p, 48, 8), "payload_length");  // shape and payload disagree
  expect_corrupt(with_field<int64_t>(p, 56, int64_t{1} << 40), "shape[1]");
  // Unchanged fields but a changed byte: the hash catches it.
  Packet flipped = p;
  flipped.bytes.back() ^= 1;
  expect_corrupt(flipped, "hash");
  expect_corrupt(with_field<uint64_t>(p, 24, 5, false), "hash");
}

TEST(Wire, TruncatedAndOversizedPacketsAreRejected) {
  Packet p = packet_of("ef+topk:ratio=0.2+int4", {3, 50});
  for (size_t n : {size_t(0), size_t(10), size_t(47), size_t(50), p.size() - 8, p.size() - 1}) {
    Packet t = p;
    t.bytes.resize(n);
    expect_corrupt(t, "truncated");
  }
  Packet longer = p;
  longer.bytes.resize(p.size() + 8, 0);
  expect_corrupt(longer, "payload_length");
  DecodeOptions small;
  small.limits.max_numel = 100;
  expect_corrupt(p, "max_numel", small);
}

TEST(Wire, NestedFieldsAreCheckedToo) {
  DecodeOptions nohash;  // so that the nested checks, not the hash, must catch these
  nohash.limits.verify_hash = false;
  Packet topk = packet_of("topk:ratio=0.1", {100});
  // Indices start right after the topk header (48 + 8 bytes); make the second one repeat the first.
  Packet dup = topk;
  std::memcpy(dup.bytes.data() + 58, dup.bytes.data() + 56, 2);
  expect_corrupt(dup, "topk indices", nohash);
  expect_corrupt(with_field<uint16_t>(topk, 56, 100), "topk indices", nohash);
  expect_corrupt(with_field<uint64_t>(topk, 24, 101), "topk k");
  expect_corrupt(with_field<uint64_t>(topk, 24, 0), "topk k");
  expect_corrupt(with_field<uint32_t>(topk, 12, 4), "topk index width");
  Packet low = packet_of("lowrank:rank=2", {10, 6});
  expect_corrupt(with_field<uint32_t>(low, 12, 7), "lowrank rank");
  expect_corrupt(with_field<uint32_t>(low, 16, 0), "lowrank iters");
  // spikes: block 8, 2 per block over 20 elements = 2 + 2 + 2 offsets from byte 56, then 6 bf16 values.
  Packet sp = packet_of("spikes:block=8,n=2", {20});
  expect_corrupt(with_field<uint32_t>(sp, 12, 300), "spikes block");
  expect_corrupt(with_field<uint32_t>(sp, 12, 2), "spikes block");
  expect_corrupt(with_field<uint32_t>(sp, 16, 9), "spikes per block");
  expect_corrupt(with_field<uint32_t>(sp, 16, 0), "spikes per block");
  expect_corrupt(with_field<uint16_t>(sp, 10, 2), "flags");
  expect_corrupt(with_field<uint64_t>(sp, 24, 1), "unused parameters");
  Packet sp_dup = sp;
  sp_dup.bytes[57] = sp_dup.bytes[56];
  expect_corrupt(sp_dup, "spikes offsets", nohash);
  expect_corrupt(with_field<uint8_t>(sp, 57, 8), "spikes offsets", nohash);  // beyond a block of 8
  expect_corrupt(with_field<uint8_t>(sp, 61, 4), "spikes offsets", nohash);  // the last block holds 4
  expect_corrupt(with_field<uint8_t>(sp, 62, 1), "spikes offsets' has nonzero padding", nohash);
  expect_corrupt(with_field<uint8_t>(sp, 64 + 12, 1), "spikes values' has nonzero padding", nohash);
  Packet sub = packet_of("subspace:k=4", {3, 16});
  expect_corrupt(with_field<uint32_t>(sub, 12, 17), "subspace k");
  // A nested packet's shape must be what its parent implies.
  Packet ef = packet_of("ef+int8", {4, 8});
  const size_t child = 48 + 16;  // the ef header with its 2-D shape
  expect_corrupt(with_field<int64_t>(ef, child + 48, 2), "shape", nohash);
  expect_corrupt(with_field<uint8_t>(ef, child + 7, static_cast<uint8_t>(DType::bf16)), "dtype", nohash);
  expect_corrupt(with_field<uint8_t>(ef, child + 6, static_cast<uint8_t>(CodecId::ef)), "codec", nohash);
}

TEST(Wire, ZstdFieldsAreCheckedAndNamed) {
  DecodeOptions nohash;
  nohash.limits.verify_hash = false;
  Packet p = packet_of("int8+zstd", {4, 64});
  const uint32_t frame = load_le<uint32_t>(p.bytes.data() + 16);
  const uint64_t inner = load_le<uint64_t>(p.bytes.data() + 24);
  expect_corrupt(with_field<uint32_t>(p, 12, 0), "zstd level");
  expect_corrupt(with_field<uint32_t>(p, 12, 20), "zstd level");
  expect_corrupt(with_field<uint16_t>(p, 10, 1), "flags");
  expect_corrupt(with_field<uint32_t>(p, 16, frame + 8), "zstd frame bytes");
  expect_corrupt(with_field<uint32_t>(p, 16, 0), "zstd frame bytes");
  // A small packet may not claim a huge inner packet (a decompression bomb), nor one its frame does not hold.
  expect_corrupt(with_field<uint64_t>(p, 24, uint64_t{1} << 40), "zstd inner bytes");
  expect_corrupt(with_field<uint64_t>(p, 24, inner - 8), "zstd frame");
  expect_corrupt(with_field<uint64_t>(p, 24, 8), "zstd inner bytes");
  // Garbage where the frame should be.
  Packet junk = p;
  for (size_t i = 64; i < 64 + 16; ++i) junk.bytes[i] = static_cast<uint8_t>(0xA5 ^ i);
  expect_corrupt(junk, "zstd frame", nohash);
  expect_corrupt(junk, "hash");
  // Non-zero padding after the frame: find a shape whose frame does not end on 8 bytes.
  bool padded = false;
  for (int64_t n = 16; n <= 64 && !padded; n += 4) {
    Packet q = packet_of("int8+zstd", {n});
    const uint32_t f = load_le<uint32_t>(q.bytes.data() + 16);
    if (f % 8 == 0) continue;
    padded = true;
    q.bytes.back() = 1;
    auto h = parse_header(q.bytes.data(), q.size(), WireLimits{int64_t{1} << 40, false});
    ASSERT_TRUE(h.ok());
    seal_packet(q.bytes.data(), &*h);
    expect_corrupt(q, "zstd padding");
  }
  EXPECT_TRUE(padded);
  // The packet inside must be the tensor the zstd header names, and not zstd again.
  StageSpec z;
  z.id = CodecId::zstd;
  Packet other = packet_of("int8", {64, 4}), wrapped, twice;
  ASSERT_TRUE(detail::zstd_wrap(z, Role::kActivation, DType::f32, {4, 64}, other, &wrapped).ok());
  expect_corrupt(wrapped, "inside zstd");
  ASSERT_TRUE(detail::zstd_wrap(z, Role::kActivation, DType::f32, {4, 64}, p, &twice).ok());
  expect_corrupt(twice, "another zstd");
  expect_corrupt(p, "role", {}, Role::kWeightGrad);
  // zstd inside a chain's nested packet.
  Packet ef = packet_of("ef+int8", {4, 8});
  expect_corrupt(with_field<uint8_t>(ef, 48 + 16 + 6, static_cast<uint8_t>(CodecId::zstd)), "outermost", nohash);
}

TEST(Wire, StreamAndOutputMismatchesAreRejected) {
  Packet p = packet_of("int8", {4, 16}, Role::kActivation);
  expect_corrupt(p, "role", {}, Role::kWeightGrad);
  Shape want{4, 15};
  DecodeOptions o;
  o.expect_shape = &want;
  expect_corrupt(p, "shape", o);
  StreamState rx;
  Tensor wrong = Tensor::empty({16, 4});
  Status s = decode_packet(p.bytes.data(), p.size(), rx, &wrong);
  EXPECT_NE(s.message().find("shape"), std::string::npos) << s.to_string();
  // A right-shaped output is filled in place.
  Tensor right = Tensor::zeros({4, 16});
  void* before = right.raw_data();
  ASSERT_TRUE(decode_packet(p.bytes.data(), p.size(), rx, &right).ok());
  EXPECT_EQ(right.raw_data(), before);
  EXPECT_NE(right.at(0), 0.0f);
}

TEST(Wire, UnalignedPacketsDecode) {
  Packet p = packet_of("ef+topk:ratio=0.3+int4", {5, 9});
  std::vector<uint8_t> shifted(p.size() + 3);
  std::memcpy(shifted.data() + 3, p.bytes.data(), p.size());
  StreamState rx;
  Tensor a, b;
  ASSERT_TRUE(decode_packet(shifted.data() + 3, p.size(), rx, &a).ok());
  ASSERT_TRUE(decode_packet(p.bytes.data(), p.size(), rx, &b).ok());
  EXPECT_EQ(a.to_vector(), b.to_vector());
}

TEST(Wire, InspectReportsRawAndWireBytes) {
  Packet p = packet_of("int4", {32, 32});
  auto info = inspect_packet(p.bytes.data(), p.size());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->raw_bytes, 32 * 32 * 4);
  EXPECT_EQ(info->wire_bytes, static_cast<int64_t>(p.size()));
  EXPECT_EQ(info->header.codec, CodecId::int4);
  EXPECT_EQ(CodecChain::raw_bytes(Tensor::empty({32, 32})), 4096);
}

TEST(Encode, RejectsTensorsItCannotCarry) {
  StreamState tx;
  Packet p;
  EXPECT_FALSE(chain_of("int8").encode(Tensor(), tx, &p).ok());
  EXPECT_FALSE(chain_of("int8").encode(Tensor::empty({4}, DType::i32), tx, &p).ok());
  EXPECT_FALSE(chain_of("int8").encode(Tensor::empty({1, 1, 1, 1, 1, 1, 1, 1, 1}), tx, &p).ok());
  Tensor base = Tensor::empty({4, 4});
  Tensor strided = base.view({16});
  EXPECT_TRUE(chain_of("int8").encode(strided, tx, &p).ok());
}

}  // namespace
}  // namespace lh::compress
