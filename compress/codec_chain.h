// defines: CodecChain (a parsed codec spec that encodes tensors into Packets and decodes them back),
// parse_codec_spec and decode_packet. The public face of lh_compress; used by parallel's links,
// collectives, `longhaul bench codecs` and the tests.
//
//   auto chain = parse_codec_spec("ef+topk:ratio=0.01+int4");   // Result<CodecChain>
//   StreamState tx(Role::kWeightGrad), rx(Role::kWeightGrad);  // one per stream end
//   Packet p;  LH_RETURN_IF_ERROR(chain->encode(grad, tx, &p));
//   Tensor g;  LH_RETURN_IF_ERROR(decode_packet(p.bytes.data(), p.size(), rx, &g));
//
// Decoding needs only the packet and the receiver's StreamState: the packet names its codecs and
// their parameters, so a receiver follows a sender that switches codecs between packets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compress/spec.h"
#include "compress/stream_state.h"
#include "compress/wire.h"
#include "core/tensor.h"

namespace lh::compress {

struct EncodeOptions {
  // delta: the id of each sample along dim 0 (x.dim(0) distinct ids). Other chains ignore it.
  const std::vector<int64_t>* sample_ids = nullptr;
};

struct DecodeOptions {
  WireLimits limits;
  // Where a fresh output tensor goes; when *out is already defined, its device (and shape) win.
  Device device = Device::cpu;
  // When set, a packet of any other shape is rejected (field 'shape').
  const Shape* expect_shape = nullptr;
  // Filled with the sample ids a delta packet carries.
  std::vector<int64_t>* sample_ids = nullptr;
};

class CodecChain {
 public:
  CodecChain() : stages_(1) {}  // `none`
  explicit CodecChain(std::vector<StageSpec> stages) : stages_(std::move(stages)) {}

  const std::vector<StageSpec>& stages() const { return stages_; }
  std::string spec() const { return stages_to_string(stages_); }
  bool needs_sample_ids() const { return !stages_.empty() && stages_[0].id == CodecId::delta; }
  // A final zstd stage, and the chain of the stages before it (whose packet zstd compresses).
  bool zstd_last() const;
  CodecChain before_zstd() const;

  // What an uncompressed fp32 send of x would cost: the "raw bytes" of link metering.
  static int64_t raw_bytes(const Tensor& x) { return x.numel() * 4; }
  static int64_t raw_bytes(const Shape& s) { return shape_numel(s) * 4; }
  // Exact size of the packet for a tensor of this shape (validates the shape for this chain); with a final
  // zstd stage, the largest it can be (zstd's bound on the packet before it).
  Result<size_t> packet_bytes(const Shape& shape) const;

  // x: f32, bf16 or f16, contiguous, on any device; the codecs run on x's device. `out` is
  // resized (its capacity reused) and written only on success. Updates st (ef, lowrank, delta).
  Status encode(const Tensor& x, StreamState& st, Packet* out, const EncodeOptions& opts = {}) const;
  // Same as decode_packet: the chain itself is not consulted, the packet says how it was made.
  Status decode(const Packet& p, StreamState& st, Tensor* out, const DecodeOptions& opts = {}) const;

 private:
  std::vector<StageSpec> stages_;
};

Result<CodecChain> parse_codec_spec(const std::string& spec);

// Decodes one packet. *out: when defined, receives the values in place (its shape and dtype must
// match the packet's); otherwise a new tensor of the packet's dtype on opts.device. Bad bytes give
// a kCorrupt Status naming the field and leave *out and st untouched... except that a delta
// packet's memories are updated only after the whole packet decoded.
Status decode_packet(const uint8_t* data, size_t size, StreamState& st, Tensor* out, const DecodeOptions& opts = {});

}  // namespace lh::compress
