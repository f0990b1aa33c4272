// The Packet header: writing, parsing with bounds checks, and the checksum over header and payload.
// Used by the codec chain, inspect_packet (metering) and the corruption/fuzz tests.
#include "compress/wire.h"

#include <algorithm>
#include <cstring>

#include "compress/cpu_isa.h"

namespace lh::compress {

const char* codec_name(CodecId id) {
  switch (id) {
    case CodecId::none: return "none";
    case CodecId::fp16: return "fp16";
    case CodecId::bf16: return "bf16";
    case CodecId::int8: return "int8";
    case CodecId::int4: return "int4";
    case CodecId::int2: return "int2";
    case CodecId::topk: return "topk";
    case CodecId::randk: return "randk";
    case CodecId::lowrank: return "lowrank";
    case CodecId::subspace: return "subspace";
    case CodecId::delta: return "delta";
    case CodecId::ef: return "ef";
    case CodecId::zstd:
      return "zstd";
    case CodecId::spikes:
      return "spikes";
  }
  return "?";
}

void write_header(const PacketHeader& h, uint8_t* dst) {
  store_le<uint32_t>(dst + 0, kWireMagic);
  store_le<uint16_t>(dst + 4, kWireVersion);
  dst[6] = static_cast<uint8_t>(h.codec);
  dst[7] = static_cast<uint8_t>(h.dtype);
  dst[8] = static_cast<uint8_t>(h.shape.size());
  dst[9] = static_cast<uint8_t>(h.role);
  store_le<uint16_t>(dst + 10, h.flags);
  store_le<uint32_t>(dst + 12, h.p0);
  store_le<uint32_t>(dst + 16, h.p1);
  store_le<uint32_t>(dst + 20, 0);
  store_le<uint64_t>(dst + 24, h.p2);
  store_le<uint64_t>(dst + 32, h.payload_bytes);
  store_le<uint64_t>(dst + 40, h.hash);
  for (size_t i = 0; i < h.shape.size(); ++i) store_le<int64_t>(dst + 48 + 8 * i, h.shape[i]);
}

uint64_t packet_hash(const uint8_t* packet, const PacketHeader& h) {
  // The hash covers the header too, so a flipped bit in a seed or a shape is caught, not decoded.
  // Payload segments are hashed independently (in parallel when there are several), then one XXH3
  // runs over the header bytes and the segment hashes: the same value on any thread count or ISA.
  const kern::CpuCodecLoops& k = kern::cpu_loops();
  const uint8_t* payload = packet + h.header_bytes();
  const int64_t segs = static_cast<int64_t>((h.payload_bytes + kHashSegmentBytes - 1) / kHashSegmentBytes);
  const size_t head = 40 + 8 * h.shape.size();
  std::vector<uint8_t> summary(head + 8 * static_cast<size_t>(segs));
  std::memcpy(summary.data(), packet, 40);
  std::memcpy(summary.data() + 40, packet + kFixedHeaderBytes, 8 * h.shape.size());
  uint8_t* out = summary.data() + head;
#pragma omp parallel for schedule(static) if (h.payload_bytes >= 4 * kHashSegmentBytes)
  for (int64_t i = 0; i < segs; ++i) {
    const uint64_t off = static_cast<uint64_t>(i) * kHashSegmentBytes;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kHashSegmentBytes, h.payload_bytes - off));
    store_le<uint64_t>(out + 8 * i, k.xxh3(payload + off, len, kHashSeed));
  }
  return k.xxh3(summary.data(), summary.size(), kHashSeed);
}

void seal_packet(uint8_t* packet, PacketHeader* h) {
  h->hash = packet_hash(packet, *h);
  store_le<uint64_t>(packet + 40, h->hash);
}

Result<PacketHeader> parse_header(const uint8_t* data, size_t size, const WireLimits& limits) {
  if (size < kFixedHeaderBytes)
    return corrupt("packet truncated: " + std::to_string(size) + " bytes, the header alone needs " +
                   std::to_string(kFixedHeaderBytes));
  if (load_le<uint32_t>(data) != kWireMagic) return corrupt("packet field 'magic' is not LHPK");
  uint16_t version = load_le<uint16_t>(data + 4);
  if (version != kWireVersion)
    return corrupt("packet field 'version' is " + std::to_string(version) + ", this build reads version " +
                   std::to_string(kWireVersion));
  PacketHeader h;
  if (data[6] >= kNumCodecIds) return corrupt("packet field 'codec' has unknown id " + std::to_string(data[6]));
  h.codec = static_cast<CodecId>(data[6]);
  if (!dtype_valid(data[7])) return corrupt("packet field 'dtype' has unknown id " + std::to_string(data[7]));
  h.dtype = static_cast<DType>(data[7]);
  if (h.dtype != DType::f32 && h.dtype != DType::bf16 && h.dtype != DType::f16)
    return corrupt(std::string("packet field 'dtype' is ") + dtype_name(h.dtype) + ", codecs carry f32, bf16 or f16");
  int ndim = data[8];
  if (ndim > kMaxNdim)
    return corrupt("packet field 'ndim' is " + std::to_string(ndim) + ", at most " + std::to_string(kMaxNdim));
  if (data[9] >= kNumCodecRoles) return corrupt("packet field 'role' has unknown id " + std::to_string(data[9]));
  h.role = static_cast<Role>(data[9]);
  h.flags = load_le<uint16_t>(data + 10);
  h.p0 = load_le<uint32_t>(data + 12);
  h.p1 = load_le<uint32_t>(data + 16);
  if (load_le<uint32_t>(data + 20) != 0) return corrupt("packet field 'reserved' is not zero");
  h.p2 = load_le<uint64_t>(data + 24);
  h.payload_bytes = load_le<uint64_t>(data + 32);
  h.hash = load_le<uint64_t>(data + 40);
  size_t hb = kFixedHeaderBytes + 8 * static_cast<size_t>(ndim);
  if (size < hb)
    return corrupt("packet truncated: " + std::to_string(size) + " bytes, the header with its shape needs " +
                   std::to_string(hb));
  h.shape.resize(ndim);
  int64_t numel = 1;
  for (int i = 0; i < ndim; ++i) {
    int64_t d = load_le<int64_t>(data + 48 + 8 * i);
    if (d < 0 || d > limits.max_numel)
      return corrupt("packet field 'shape[" + std::to_string(i) + "]' is " + std::to_string(d) + ", allowed 0.." +
                     std::to_string(limits.max_numel));
    h.shape[i] = d;
    // Multiply only while the product stays within the limit, so the check cannot overflow.
    if (d != 0 && numel > limits.max_numel / d)
      return corrupt("packet field 'shape' " + shape_string(Shape(h.shape.begin(), h.shape.begin() + i + 1)) +
                     " has more than max_numel=" + std::to_string(limits.max_numel) + " elements");
    numel *= d;
  }
  if (h.payload_bytes % 8 != 0)
    return corrupt("packet field 'payload_length' " + std::to_string(h.payload_bytes) + " is not a multiple of 8");
  if (h.payload_bytes > size - hb)
    return corrupt("packet field 'payload_length' says " + std::to_string(h.payload_bytes) + " bytes but only " +
                   std::to_string(size - hb) + " follow the header (truncated)");
  if (limits.verify_hash && packet_hash(data, h) != h.hash)
    return corrupt("packet field 'hash': checksum mismatch (bytes changed in transit)");
  return h;
}

Result<PacketInfo> inspect_packet(const uint8_t* data, size_t size, const WireLimits& limits) {
  PacketInfo info;
  LH_ASSIGN_OR_RETURN(info.header, parse_header(data, size, limits));
  info.raw_bytes = info.header.numel() * 4;
  info.wire_bytes = static_cast<int64_t>(size);
  return info;
}

}  // namespace lh::compress
