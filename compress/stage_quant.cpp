// Terminal stages: none (fp32), fp16, bf16 and the block-wise absmax quantizers int8/int4/int2.
// Used by the chain recursion (codec_chain.cpp) for the last stage of every chain.
//
// Header parameters: int8/int4/int2 put the block size in p0 and flags bit0 = fp32 scales,
// bit1 = stochastic rounding (informational); every other parameter is zero. Payload: the block
// scales (fp16 or fp32), padded to 8 bytes, then the packed codes, padded to 8 bytes.
#include <cstring>

#include "compress/chain_internal.h"
#include "compress/device_kernels.h"

namespace lh::compress::detail {

namespace {
constexpr uint16_t kFlagFp32Scale = 1;
constexpr uint16_t kFlagStochastic = 2;

int bits_of(CodecId id) { return id == CodecId::int8 ? 8 : id == CodecId::int4 ? 4 : id == CodecId::int2 ? 2 : 0; }

struct QuantLayout {
  size_t scale_bytes, code_bytes;  // unpadded
  size_t code_offset, total;
};

QuantLayout quant_layout(int64_t n, int bits, int block, bool fp32_scale) {
  QuantLayout l;
  l.scale_bytes = static_cast<size_t>(kern::quant_blocks(n, block)) * (fp32_scale ? 4 : 2);
  l.code_bytes = static_cast<size_t>(kern::quant_code_bytes(n, bits));
  l.code_offset = pad8(l.scale_bytes);
  l.total = l.code_offset + pad8(l.code_bytes);
  return l;
}

// Writes a payload produced on ex.device into the host packet: directly on the CPU, through a
// device staging buffer on CUDA.
template <class F>
Status produce(const Exec& ex, uint8_t* host_dst, size_t bytes, F&& kernel) {
  if (ex.device == Device::cpu) {
    kernel(host_dst);
    return Status::Ok();
  }
  LH_ASSIGN_OR_RETURN(Tensor stage, Tensor::create({static_cast<int64_t>(bytes)}, DType::u8, ex.device));
  kernel(static_cast<uint8_t*>(stage.raw_data()));
  return copy_bytes(host_dst, Device::cpu, stage.raw_data(), ex.device, bytes);
}

// The payload bytes as seen from ex.device: the host packet itself on the CPU, a device copy on CUDA.
Result<Tensor> payload_on_device(const Exec& ex, const uint8_t* payload, size_t bytes, const uint8_t** dev_ptr) {
  if (ex.device == Device::cpu) {
    *dev_ptr = payload;
    return Tensor();
  }
  LH_ASSIGN_OR_RETURN(Tensor t, Tensor::create({static_cast<int64_t>(bytes)}, DType::u8, ex.device));
  LH_RETURN_IF_ERROR(copy_bytes(t.raw_data(), ex.device, payload, Device::cpu, bytes));
  *dev_ptr = static_cast<const uint8_t*>(t.raw_data());
  return t;
}

Status check_zero_pad(const uint8_t* p, size_t from, size_t to, const char* what) {
  for (size_t i = from; i < to; ++i)
    if (p[i] != 0) return corrupt(std::string("packet field 'payload' has nonzero padding after the ") + what);
  return Status::Ok();
}
}  // namespace

size_t terminal_payload_bytes(const StageSpec& s, int64_t n) {
  switch (s.id) {
    case CodecId::none: return pad8(static_cast<size_t>(n) * 4);
    case CodecId::fp16:
    case CodecId::bf16: return pad8(static_cast<size_t>(n) * 2);
    default: return quant_layout(n, s.bits(), s.block, s.fp32_scale).total;
  }
}

void fill_terminal_header(const StageSpec& s, PacketHeader* h) {
  h->codec = s.id;
  if (s.bits() > 0) {
    h->p0 = static_cast<uint32_t>(s.block);
    h->flags = static_cast<uint16_t>((s.fp32_scale ? kFlagFp32Scale : 0) | (s.stochastic ? kFlagStochastic : 0));
  }
}

Result<size_t> terminal_payload_bytes(const PacketHeader& h) {
  const int64_t n = h.numel();
  const int bits = bits_of(h.codec);
  if (bits == 0) {
    if (h.flags != 0) return corrupt(std::string("packet field 'flags' must be 0 for ") + codec_name(h.codec));
    if (h.p0 != 0 || h.p1 != 0 || h.p2 != 0)
      return corrupt(std::string("packet field 'params' must be 0 for ") + codec_name(h.codec));
    return pad8(static_cast<size_t>(n) * (h.codec == CodecId::none ? 4 : 2));
  }
  if (h.flags & ~(kFlagFp32Scale | kFlagStochastic))
    return corrupt("packet field 'flags' has unknown bits " + std::to_string(h.flags));
  if (h.p0 < 4 || h.p0 > 65536 || h.p0 % 4 != 0)
    return corrupt("packet field 'block' is " + std::to_string(h.p0) + ", allowed 4..65536 in steps of 4");
  if (h.p1 != 0 || h.p2 != 0) return corrupt(std::string("packet field 'params' p1/p2 must be 0 for ") + codec_name(h.codec));
  return quant_layout(n, bits, static_cast<int>(h.p0), (h.flags & kFlagFp32Scale) != 0).total;
}

Status encode_terminal(const Exec& ex, const StageSpec& s, const Tensor& x, uint64_t seed, uint8_t* payload) {
  const int64_t n = x.numel();
  const float* xp = x.data<float>();
  if (s.id == CodecId::none) {
    size_t bytes = static_cast<size_t>(n) * 4;
    std::memset(payload + bytes, 0, pad8(bytes) - bytes);
    if (ex.device == Device::cpu) {
      kern::copy_host(payload, xp, bytes);
      return Status::Ok();
    }
    return copy_bytes(payload, Device::cpu, xp, ex.device, bytes);
  }
  if (s.id == CodecId::fp16 || s.id == CodecId::bf16) {
    size_t bytes = static_cast<size_t>(n) * 2;
    std::memset(payload + bytes, 0, pad8(bytes) - bytes);
    bool bf16 = s.id == CodecId::bf16;
    return produce(ex, payload, bytes, [&](uint8_t* dst) {
      kern::to_half(ex, xp, n, bf16, reinterpret_cast<uint16_t*>(dst));
    });
  }
  QuantLayout l = quant_layout(n, s.bits(), s.block, s.fp32_scale);
  std::memset(payload + l.scale_bytes, 0, l.code_offset - l.scale_bytes);
  std::memset(payload + l.code_offset + l.code_bytes, 0, l.total - l.code_offset - l.code_bytes);
  kern::QuantSpec q{s.bits(), s.block, s.fp32_scale, s.stochastic, seed};
  // On CUDA the staging buffer's pad bytes are garbage, so copy the two sections, not the whole.
  if (ex.device == Device::cpu) {
    kern::quantize(ex, xp, n, q, payload, payload + l.code_offset);
    return Status::Ok();
  }
  LH_ASSIGN_OR_RETURN(Tensor stage, Tensor::create({static_cast<int64_t>(l.total)}, DType::u8, ex.device));
  uint8_t* dst = static_cast<uint8_t*>(stage.raw_data());
  kern::quantize(ex, xp, n, q, dst, dst + l.code_offset);
  LH_RETURN_IF_ERROR(copy_bytes(payload, Device::cpu, dst, ex.device, l.scale_bytes));
  return copy_bytes(payload + l.code_offset, Device::cpu, dst + l.code_offset, ex.device, l.code_bytes);
}

Status decode_terminal(const Exec& ex, const PacketHeader& h, const uint8_t* payload, Tensor* out) {
  const int64_t n = h.numel();
  float* y = out->data<float>();
  if (h.codec == CodecId::none) {
    size_t bytes = static_cast<size_t>(n) * 4;
    LH_RETURN_IF_ERROR(check_zero_pad(payload, bytes, pad8(bytes), "values"));
    if (ex.device == Device::cpu) {
      kern::copy_host(y, payload, bytes);
      return Status::Ok();
    }
    return copy_bytes(y, ex.device, payload, Device::cpu, bytes);
  }
  const uint8_t* dev = nullptr;
  if (h.codec == CodecId::fp16 || h.codec == CodecId::bf16) {
    size_t bytes = static_cast<size_t>(n) * 2;
    LH_RETURN_IF_ERROR(check_zero_pad(payload, bytes, pad8(bytes), "values"));
    LH_ASSIGN_OR_RETURN(Tensor keep, payload_on_device(ex, payload, bytes, &dev));
    kern::from_half(ex, reinterpret_cast<const uint16_t*>(dev), n, h.codec == CodecId::bf16, y);
    return Status::Ok();
  }
  const int bits = bits_of(h.codec);
  const bool fp32_scale = (h.flags & kFlagFp32Scale) != 0;
  QuantLayout l = quant_layout(n, bits, static_cast<int>(h.p0), fp32_scale);
  LH_RETURN_IF_ERROR(check_zero_pad(payload, l.scale_bytes, l.code_offset, "scales"));
  LH_RETURN_IF_ERROR(check_zero_pad(payload, l.code_offset + l.code_bytes, l.total, "codes"));
  LH_ASSIGN_OR_RETURN(Tensor keep, payload_on_device(ex, payload, l.total, &dev));
  kern::QuantSpec q{bits, static_cast<int>(h.p0), fp32_scale, false, 0};
  kern::dequantize(ex, dev, dev + l.code_offset, n, q, y);
  return Status::Ok();
}

}  // namespace lh::compress::detail
