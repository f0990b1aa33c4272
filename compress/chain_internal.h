// defines: the recursive encode/decode of a chain's nested packets and each stage's part of it.
// Internal to lh_compress: codec_chain.cpp drives it; stage_*.cpp implement the stages.
#pragma once

#include <string>
#include <vector>

#include "compress/codec_chain.h"
#include "core/exec.h"

namespace lh::compress::detail {

struct EncodeCtx {
  const std::vector<StageSpec>& stages;
  StreamState& st;
  Exec ex;
  const EncodeOptions& opts;
  uint64_t packet_seed;  // fresh per encode call: stochastic rounding and randk subsets
};

struct DecodeCtx {
  StreamState& st;
  Exec ex;
  const DecodeOptions& opts;
  Role role;
};

// A stage's own section and the shapes of the child tensors later stages encode.
struct Geometry {
  size_t own_bytes = 0;
  std::vector<Shape> children;
};

// The stage at pos, or the implicit `none` after the last transform.
StageSpec stage_at(const std::vector<StageSpec>& stages, size_t pos);
// Exact packet size stages[pos..] make of a tensor of `shape`; rejects shapes a stage cannot take.
Result<size_t> node_bytes(const std::vector<StageSpec>& stages, size_t pos, const Shape& shape);
// Encodes x (contiguous f32 on ctx.ex.device) with stages[pos..] into dst[0, size), size = node_bytes.
Status encode_node(EncodeCtx& ctx, size_t pos, const std::string& key, const Tensor& x, DType dtype, uint8_t* dst,
                   size_t size);
// Decodes the single packet data[0, size) into *out (f32 on ctx.ex.device; allocated when undefined,
// else its shape must match).
Status decode_node(DecodeCtx& ctx, const uint8_t* data, size_t size, int depth, Tensor* out);
// An f32 tensor on the device of ex.
Result<Tensor> device_tensor(const Exec& ex, const Shape& shape);

// --- terminal stages (stage_quant.cpp): none, fp16, bf16, int8, int4, int2
size_t terminal_payload_bytes(const StageSpec& s, int64_t n);
void fill_terminal_header(const StageSpec& s, PacketHeader* h);
// Payload size the header's codec and parameters imply; kCorrupt naming the field when inconsistent.
Result<size_t> terminal_payload_bytes(const PacketHeader& h);
Status encode_terminal(const Exec& ex, const StageSpec& s, const Tensor& x, uint64_t seed, uint8_t* payload);
Status decode_terminal(const Exec& ex, const PacketHeader& h, const uint8_t* payload, Tensor* out);

// --- transforms: geometry from the spec (encode) and from a received header (decode, validated)
Result<Geometry> spec_geometry(const StageSpec& s, const Shape& shape);
Result<Geometry> header_geometry(const PacketHeader& h, const WireLimits& limits);

// Each transform fills its header parameters and own section and produces the child tensors.
struct TransformOut {
  std::vector<Tensor> children;
};
Status encode_topk(EncodeCtx& ctx, const StageSpec& s, const Tensor& x, PacketHeader* h, uint8_t* own,
                   TransformOut* out);
Status encode_randk(EncodeCtx& ctx, const StageSpec& s, const std::string& key, const Tensor& x, PacketHeader* h,
                    TransformOut* out);
Status encode_lowrank(EncodeCtx& ctx, const StageSpec& s, const std::string& key, const Tensor& x, PacketHeader* h,
                      TransformOut* out);
Status encode_subspace(EncodeCtx& ctx, const StageSpec& s, const Tensor& x, PacketHeader* h, TransformOut* out);
Status encode_spikes(EncodeCtx& ctx, const StageSpec& s, const Tensor& x, PacketHeader* h, uint8_t* own,
                     TransformOut* out);

// Combine decoded children into the stage's output (out allocated to h.shape on the device).
Status decode_topk(const Exec& ex, const PacketHeader& h, const uint8_t* own, const std::vector<Tensor>& ch, Tensor* out);
Status decode_randk(const Exec& ex, const PacketHeader& h, const std::vector<Tensor>& ch, Tensor* out);
Status decode_lowrank(const Exec& ex, const PacketHeader& h, const std::vector<Tensor>& ch, Tensor* out);
Status decode_subspace(DecodeCtx& ctx, const PacketHeader& h, const std::vector<Tensor>& ch, Tensor* out);
// ch[0] is the decoded rest; decode_node decodes it into the caller's tensor when *out is defined.
Status decode_spikes(const Exec& ex, const PacketHeader& h, const uint8_t* own, const std::vector<Tensor>& ch,
                     Tensor* out);

// --- zstd (stage_zstd.cpp): the outer packet around a whole encoded packet
// The largest inner packet a zstd packet of this shape may carry (16 bytes per element + 64 KiB).
size_t zstd_max_inner_bytes(const Shape& shape);
// Largest zstd packet for an inner packet of inner_bytes.
size_t zstd_packet_bound(const Shape& shape, size_t inner_bytes);
// Compresses `inner` (a finished packet of this dtype, role and shape) into *out at s.level.
Status zstd_wrap(const StageSpec& s, Role role, DType dtype, const Shape& shape, const Packet& inner, Packet* out);
// Checks a parsed zstd header's parameters and padding (its length and role are checked by the caller) and
// decompresses its frame into *inner (8-aligned).
Status zstd_unwrap(const PacketHeader& h, const uint8_t* packet, std::vector<uint64_t>* inner, size_t* inner_bytes);

// Validation of a topk own section on the host: indices strictly increasing and < n.
Status check_topk_indices(const PacketHeader& h, const uint8_t* own);
// Size of a spikes own section, and its validation on the host (offsets ascending within each
// block and inside it, zero padding), for a header header_geometry accepted.
// Header flags bit 0: the values travel as fp32, not bf16.
constexpr uint16_t kSpikesFlagFp32 = 1;
size_t spikes_own_bytes(int64_t n, int block, int s, bool fp32);
Status check_spikes_section(const PacketHeader& h, const uint8_t* own);

// Seeded orthonormal basis (d×k, columns orthonormal), generated on the CPU so every end, on any
// device, gets the same bits; cached per device in the stream state.
Result<Tensor> subspace_basis(StreamState& st, const Exec& ex, int64_t d, int64_t k, uint64_t seed);
// Orthonormalises the r columns of the row-major n×r matrix p (on ex.device) in place.
Status orthonormalize_columns(const Exec& ex, float* p, int64_t n, int64_t r);

}  // namespace lh::compress::detail
