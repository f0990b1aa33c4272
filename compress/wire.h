// defines: the Packet wire format — a fixed little-endian header, its bounds checks and the xxHash
// checksum that covers header and payload. Used by the codec chain (encode/decode), transport and the fuzz target.
//
// Layout of one packet (all integers little-endian, every offset a multiple of 8):
//
//   off size field
//     0    4 magic "LHPK"
//     4    2 format version (kWireVersion)
//     6    1 codec id (CodecId)
//     7    1 dtype of the decoded tensor (DType)
//     8    1 ndim (<= kMaxNdim)
//     9    1 role (Role of the stream)
//    10    2 flags (codec specific, e.g. quantizer scale width)
//    12    4 p0       codec parameters (meaning per codec: see stage_*.cpp)
//    16    4 p1       codec parameters
//    20    4 reserved, must be zero
//    24    8 p2       codec parameter: a seed or a count
//    32    8 payload length in bytes (a multiple of 8)
//    40    8 checksum of bytes [0, 40), the shape and the payload: XXH3-64 (seed kHashSeed) of
//            bytes [0, 40) ‖ shape ‖ h_0 ‖ h_1 ‖ …, h_i = XXH3-64 of the payload's i-th segment of
//            kHashSegmentBytes (the last may be shorter), each as 8 little-endian bytes; segments
//            are hashed in parallel, and XXH3 runs at the CPU's vector width (cpu_isa.h)
//    48 8*nd shape (int64 per dimension)
//  48+8nd  … payload
//
// Stages with inputs for later stages ("children": topk values, lowrank factors …) write their own
// section (indices, sample ids), padded to 8 bytes, followed by one complete child packet per
// child, so a chain nests: `ef+topk+int4` is an ef packet holding a topk packet holding an int4
// packet. Each nested packet carries its own header and hash. A final zstd stage is the exception:
// its payload is the zstd frame of the whole packet the chain before it made (stage_zstd.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/role.h"
#include "core/status.h"
#include "core/tensor.h"

namespace lh::compress {

constexpr uint32_t kWireMagic = 0x4B50484Cu;  // "LHPK" read as little-endian u32
constexpr uint16_t kWireVersion = 2;          // 2: the segmented XXH3 checksum (1 was XXH64 of the whole)
constexpr uint64_t kHashSeed = 0x4C4850ull;
constexpr uint64_t kHashSegmentBytes = 256 * 1024;
constexpr int kMaxNdim = 8;
constexpr size_t kFixedHeaderBytes = 48;
constexpr int kMaxNesting = 8;

// Values are part of the wire format: append only, never renumber.
enum class CodecId : uint8_t {
  none = 0,
  fp16 = 1,
  bf16 = 2,
  int8 = 3,
  int4 = 4,
  int2 = 5,
  topk = 6,
  randk = 7,
  lowrank = 8,
  subspace = 9,
  delta = 10,
  ef = 11,
  zstd = 12,
  spikes = 13,
};
constexpr int kNumCodecIds = 14;
const char* codec_name(CodecId id);

// Which tensor a stream carries: lh::Role (core/role.h). Part of the wire format (a packet names its stream's
// role in byte 9: the Role's value, one of the kNumCodecRoles codec roles; names: codec_role_name()).

// One self-contained encoded tensor. `bytes` is what travels.
struct Packet {
  std::vector<uint8_t> bytes;
  size_t size() const { return bytes.size(); }
};

struct PacketHeader {
  CodecId codec = CodecId::none;
  DType dtype = DType::f32;
  Role role = Role::kActivation;
  uint16_t flags = 0;
  uint32_t p0 = 0, p1 = 0;
  uint64_t p2 = 0;
  Shape shape;
  uint64_t payload_bytes = 0;
  uint64_t hash = 0;

  size_t header_bytes() const { return kFixedHeaderBytes + 8 * shape.size(); }
  size_t total_bytes() const { return header_bytes() + payload_bytes; }
  int64_t numel() const { return shape_numel(shape); }
};

inline constexpr size_t pad8(size_t n) { return (n + 7) & ~size_t{7}; }

// Bounds a receiver applies before allocating anything for a packet.
struct WireLimits {
  int64_t max_numel = int64_t{1} << 28;  // per packet (1 GiB of fp32)
  bool verify_hash = true;
};

// Writes the header for `h` (hash and payload length included) at dst, which has h.header_bytes().
void write_header(const PacketHeader& h, uint8_t* dst);
// The hash of a packet whose header (without the hash field) and payload are already in place.
uint64_t packet_hash(const uint8_t* packet, const PacketHeader& h);
// Fills the hash field of a finished packet at `packet` described by h.
void seal_packet(uint8_t* packet, PacketHeader* h);

// Parses and bounds-checks the header at data[0, size): magic, version, codec, dtype, ndim, role,
// reserved bits, every dimension, numel against limits, payload length against `size`. With
// limits.verify_hash it also checks the hash. Errors are kCorrupt and name the field.
Result<PacketHeader> parse_header(const uint8_t* data, size_t size, const WireLimits& limits);

// Summary of a packet for metering: raw bytes = what an uncompressed fp32 send of it would cost.
struct PacketInfo {
  PacketHeader header;
  int64_t raw_bytes = 0;
  int64_t wire_bytes = 0;
};
Result<PacketInfo> inspect_packet(const uint8_t* data, size_t size, const WireLimits& limits = {});

// Little-endian scalar access on raw bytes (x86 and aarch64 are little-endian; the format is fixed LE).
template <class T>
inline T load_le(const uint8_t* p) {
  T v;
  __builtin_memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
inline void store_le(uint8_t* p, T v) {
  __builtin_memcpy(p, &v, sizeof(T));
}

}  // namespace lh::compress
