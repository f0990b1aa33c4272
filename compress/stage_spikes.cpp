// The spikes transform ("spike reserving", Flash Communication v2): each block's few largest |x|
// travel apart, exactly placed and in bf16 (or fp32), so the stages after it quantize a tensor
// without its outliers. Used by the chain recursion (`spikes+int4`).
//
// Header: p0 = block (4..256), p1 = spikes per block s (1..8, below the block), flags bit0 = fp32
// values, p2 = 0. Own section: k one-byte offsets in their block (ascending within each block;
// block b's at [b·s, …), only the last block may hold fewer than s), padded to 8, then the k values
// (bf16 or fp32), padded to 8. Child packet: the tensor with the spikes set to 0, same shape.
#include <algorithm>
#include <string>
#include <vector>

#include "compress/chain_internal.h"
#include "compress/device_kernels.h"

namespace lh::compress::detail {

namespace {
size_t value_bytes(bool fp32) {
  return fp32 ? 4 : 2;
}

// A u8 (or f32) scratch tensor of k elements on the device (k may be 0).
Result<Tensor> scratch(const Exec& ex, int64_t k, DType dt) {
  return Tensor::create({k}, dt, ex.device);
}
}  // namespace

size_t spikes_own_bytes(int64_t n, int block, int s, bool fp32) {
  const size_t k = static_cast<size_t>(spike_count(n, block, s));
  return pad8(k) + pad8(k * value_bytes(fp32));
}

Status encode_spikes(EncodeCtx& ctx, const StageSpec& s, const Tensor& x, PacketHeader* h, uint8_t* own,
                     TransformOut* out) {
  const int64_t n = x.numel(), k = spike_count(n, s.spike_block, s.spikes);
  const Exec& ex = ctx.ex;
  LH_ASSIGN_OR_RETURN(Tensor rest, device_tensor(ex, x.shape()));
  LH_ASSIGN_OR_RETURN(Tensor offs, scratch(ex, k, DType::u8));
  LH_ASSIGN_OR_RETURN(Tensor vals, device_tensor(ex, {k}));
  uint8_t* op = static_cast<uint8_t*>(offs.raw_data());
  kern::spikes_extract(ex, x.data<float>(), n, s.spike_block, s.spikes, rest.data<float>(), op, vals.data<float>());
  LH_RETURN_IF_ERROR(copy_bytes(own, Device::cpu, op, ex.device, static_cast<size_t>(k)));
  uint8_t* vdst = own + pad8(static_cast<size_t>(k));
  if (s.spike_fp32) {
    LH_RETURN_IF_ERROR(copy_bytes(vdst, Device::cpu, vals.raw_data(), ex.device, static_cast<size_t>(k) * 4));
  } else {
    LH_ASSIGN_OR_RETURN(Tensor half, scratch(ex, k * 2, DType::u8));
    kern::to_half(ex, vals.data<float>(), k, /*bf16=*/true, static_cast<uint16_t*>(half.raw_data()));
    LH_RETURN_IF_ERROR(copy_bytes(vdst, Device::cpu, half.raw_data(), ex.device, static_cast<size_t>(k) * 2));
  }
  h->p0 = static_cast<uint32_t>(s.spike_block);
  h->p1 = static_cast<uint32_t>(s.spikes);
  h->flags = s.spike_fp32 ? kSpikesFlagFp32 : 0;
  out->children = {rest};
  return Status::Ok();
}

Status check_spikes_section(const PacketHeader& h, const uint8_t* own) {
  const int64_t n = h.numel();
  const int block = static_cast<int>(h.p0), s = static_cast<int>(h.p1);
  const int64_t blocks = (n + block - 1) / block;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t len = std::min<int64_t>(block, n - b * block), cnt = kern::spikes_in_block(n, block, s, b);
    int prev = -1;
    for (int64_t j = 0; j < cnt; ++j) {
      const int off = own[b * s + j];
      if (off >= len || off <= prev)
        return corrupt(
            "packet field 'spikes offsets': block " + std::to_string(b) + " entry " + std::to_string(j) + " is " +
            std::to_string(off) +
            (off >= len ? ", beyond the block's " + std::to_string(len) + " elements" : ", not above the one before"));
      prev = off;
    }
  }
  const size_t k = static_cast<size_t>(spike_count(n, block, s));
  const size_t vend = pad8(k) + k * value_bytes(h.flags & kSpikesFlagFp32);
  for (size_t i = k; i < pad8(k); ++i)
    if (own[i] != 0) return corrupt("packet field 'spikes offsets' has nonzero padding");
  for (size_t i = vend; i < pad8(vend); ++i)
    if (own[i] != 0) return corrupt("packet field 'spikes values' has nonzero padding");
  return Status::Ok();
}

Status decode_spikes(const Exec& ex, const PacketHeader& h, const uint8_t* own, const std::vector<Tensor>& ch,
                     Tensor* out) {
  const int64_t n = h.numel();
  const int block = static_cast<int>(h.p0), s = static_cast<int>(h.p1);
  const int64_t k = spike_count(n, block, s);
  const bool fp32 = h.flags & kSpikesFlagFp32;
  const uint8_t* vsrc = own + pad8(static_cast<size_t>(k));
  // The rest decoded by the later stages (into the caller's tensor when it gave one) is the answer, with the
  // spikes written over it.
  *out = ch[0];
  LH_ASSIGN_OR_RETURN(Tensor offs, scratch(ex, k, DType::u8));
  LH_ASSIGN_OR_RETURN(Tensor vals, device_tensor(ex, {k}));
  LH_RETURN_IF_ERROR(copy_bytes(offs.raw_data(), ex.device, own, Device::cpu, static_cast<size_t>(k)));
  if (fp32) {
    LH_RETURN_IF_ERROR(copy_bytes(vals.raw_data(), ex.device, vsrc, Device::cpu, static_cast<size_t>(k) * 4));
  } else {
    LH_ASSIGN_OR_RETURN(Tensor half, scratch(ex, k * 2, DType::u8));
    LH_RETURN_IF_ERROR(copy_bytes(half.raw_data(), ex.device, vsrc, Device::cpu, static_cast<size_t>(k) * 2));
    kern::from_half(ex, static_cast<const uint16_t*>(half.raw_data()), k, /*bf16=*/true, vals.data<float>());
  }
  kern::spikes_restore(ex, static_cast<const uint8_t*>(offs.raw_data()), vals.data<float>(), n, block, s,
                       out->data<float>());
  return Status::Ok();
}

}  // namespace lh::compress::detail
